/*
 * cli_check_config.c - `tandem check-config`: the compatibility rules, run
 * offline on configuration files before anything is started.
 *
 * Each file is loaded with the same table, rules and checks its service uses
 * at start-up (defaults < file; the environment of this command is not read,
 * since it is not the services' environment), each side's Descriptor is built
 * from its effective configuration (fingerprints from the configured model
 * files), and the gateway's rule table is applied to every verifier/drafter
 * pair and to replicas of one role.
 */
#include "defs.h"
#include "cli.h"

#include "compat.h"
#include "config.h"
#include "service_config.h"

#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 16

typedef struct side {
    const char *path;
    const tdm_cfg_schema *schema;
    tdm_cfg *cfg;
    Tandem__V1__Descriptor *desc; /* NULL when the configuration is invalid */
} side;

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem check-config --verifier FILE [--verifier FILE ...]\n"
                 "                           --drafter FILE [--drafter FILE ...]\n"
                 "                           [--gateway FILE] [--verbose]\n\n"
                 "Loads each service's YAML configuration file the way the service would (its\n"
                 "defaults, then the file; not this shell's environment), validates it, builds\n"
                 "its self-description and applies the gateway's compatibility rules to every\n"
                 "verifier/drafter pair and to replicas of one role. Exits 0 when every file is\n"
                 "valid and every pair compatible; 1 otherwise, naming the rule.\n"
                 "--verbose prints each effective configuration with the source of every value.\n");
}

/* Loads one file; prints its errors. Returns true when it would start. */
static bool load_side(side *s, bool verbose)
{
    s->cfg = tdm_cfg_create(s->schema);
    if (!s->cfg) {
        fprintf(stderr, "tandem check-config: out of memory\n");
        return false;
    }
    /* Without an explicit replica_id, name the replica after its file so the
     * verdicts below say which file is which. */
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", s->path);
    if (tdm_cfg_has(s->cfg, "replica_id")) /* a gateway has none */
        tdm_cfg_set(s->cfg, "replica_id", basename(copy), 0, "default (file name)", NULL);
    tdm_cfg_load_file(s->cfg, s->path, NULL);
    tdm_error err;
    tdm_status st = tdm_cfg_finish(s->cfg, &err);
    const char *role = tdm_role_name(tdm_svc_role_of(s->schema));
    if (verbose) {
        printf("\n");
        tdm_cfg_print(s->cfg, stdout);
    }
    if (st == TDM_OK) {
        if (tdm_svc_descriptor_build(s->cfg, &s->desc, &err) != TDM_OK) {
            printf("%s %s: invalid: %s\n", role, s->path, err.msg);
            return false;
        }
        printf("%s %s: valid\n", role, s->path);
        tdm_svc_print_capacity(s->cfg, "  ", stdout);
        return true;
    }
    printf("%s %s: invalid\n", role, s->path);
    for (size_t i = 0; i < tdm_cfg_error_count(s->cfg); i++)
        printf("  error: %s\n", tdm_cfg_error_at(s->cfg, i));
    return false;
}

static void print_refusals(const tdm_compat_refusal *r, size_t n)
{
    for (size_t i = 0; i < n && i < 8; i++)
        printf("  refused by rule %s: %s\n", r[i].rule, r[i].message);
}

int cli_check_config(int argc, char **argv)
{
    side sides[MAX_FILES];
    size_t n = 0;
    bool verbose = false;
    int n_verifiers = 0, n_drafters = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            if (i + 1 < argc) {
                fprintf(stderr, "tandem check-config: takes no arguments, got '%s'\n", argv[i + 1]);
                return 2;
            }
            break;
        }
        const tdm_cfg_schema *schema = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--verbose") == 0) {
            verbose = true;
            continue;
        } else if (strcmp(a, "--verifier") == 0) {
            schema = &tdm_svc_verifier_schema;
            n_verifiers++;
        } else if (strcmp(a, "--drafter") == 0) {
            schema = &tdm_svc_drafter_schema;
            n_drafters++;
        } else if (strcmp(a, "--gateway") == 0) {
            schema = &tdm_svc_gateway_schema;
        } else {
            fprintf(stderr, "tandem check-config: unknown argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tandem check-config: %s needs a file name\n", a);
            return 2;
        }
        if (n == MAX_FILES) {
            fprintf(stderr, "tandem check-config: at most %d files\n", MAX_FILES);
            return 2;
        }
        sides[n++] = (side){argv[++i], schema, NULL, NULL};
    }
    if (n_verifiers == 0 || n_drafters == 0) {
        fprintf(stderr, "tandem check-config: give at least one --verifier and one --drafter\n\n");
        usage(stderr);
        return 2;
    }

    bool ok = true;
    for (size_t i = 0; i < n; i++)
        ok = load_side(&sides[i], verbose) && ok;

    tdm_compat_refusal r[8];
    size_t formed = 0, refused = 0;
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < n; j++) {
            if (sides[i].schema != &tdm_svc_verifier_schema ||
                sides[j].schema != &tdm_svc_drafter_schema)
                continue;
            if (!sides[i].desc || !sides[j].desc) {
                printf("pair verifier %s + drafter %s: not checked (invalid configuration)\n",
                       sides[i].path, sides[j].path);
                continue;
            }
            size_t k = tdm_compat_check_pair(sides[i].desc, sides[j].desc, r, 8);
            if (k == 0) {
                printf("pair verifier %s + drafter %s: compatible\n", sides[i].path, sides[j].path);
                formed++;
            } else {
                printf("pair verifier %s + drafter %s: REFUSED\n", sides[i].path, sides[j].path);
                print_refusals(r, k);
                refused++;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = i + 1; j < n; j++) {
            if (sides[i].schema != sides[j].schema || !sides[i].desc || !sides[j].desc ||
                sides[i].schema == &tdm_svc_gateway_schema)
                continue;
            size_t k = tdm_compat_check_replicas(sides[i].desc, sides[j].desc, r, 8);
            if (k) {
                printf("replicas %s and %s: REFUSED\n", sides[i].path, sides[j].path);
                print_refusals(r, k);
                refused++;
            }
        }
    }
    printf("\n%zu pair(s) compatible, %zu refused%s\n", formed, refused,
           ok ? "" : "; some configurations are invalid");
    for (size_t i = 0; i < n; i++) {
        tdm_svc_descriptor_free(sides[i].desc);
        tdm_cfg_destroy(sides[i].cfg);
    }
    return ok && refused == 0 ? 0 : 1;
}
