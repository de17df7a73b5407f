/*
 * fuzz_service_config.c - a service's configuration as the binaries load it:
 * a config file (flat YAML, tdm_cfg_load_text) and then command-line flags
 * (tdm_cfg_load, without the environment), resolved and checked against the
 * gateway's, the verifier's or the drafter's table. Whatever the input, the
 * configuration prints, converts to its EffectiveConfig message, and every
 * error names something (a refusal is never empty).
 *
 * Input: one byte picks the table; the rest is NUL-separated: the config
 * file's text, then one command-line argument per field. Arguments that
 * name another config file (--config) are left out, so that a run reads no
 * file the input names.
 */
#include "fuzz.h"

#include "config.h"
#include "service_config.h"
#include "tandem/v1/common.pb-c.h"

#include <string.h>

static FILE *sink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    sink = fopen("/dev/null", "w");
    if (!sink)
        exit(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    static const tdm_cfg_schema *const schemas[] = {
        &tdm_svc_gateway_schema, &tdm_svc_verifier_schema, &tdm_svc_drafter_schema};
    const tdm_cfg_schema *schema = schemas[data[0] % 3];
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    const char *nul = memchr(p, 0, n);
    size_t yaml_len = nul ? (size_t)(nul - p) : n;

    /* The arguments, each NUL-terminated in a copy. */
    char *args = malloc(n + 1);
    if (!args)
        return 0;
    memcpy(args, p, n);
    args[n] = '\0';
    char *argv[33] = {"tandem-fuzz"};
    int argc = 1;
    for (size_t at = yaml_len + 1; at < n && argc < 33;) {
        char *a = args + at;
        at += strlen(a) + 1;
        if (strncmp(a, "--config", 8) == 0 && a[8] != '-')
            continue;
        argv[argc++] = a;
    }

    tdm_cfg *cfg = tdm_cfg_create(schema);
    FUZZ_CHECK(cfg, "out of memory");
    tdm_error err;
    tdm_status rc = tdm_cfg_load_text(cfg, p, yaml_len, "<fuzz>.yaml", &err);
    if (rc != TDM_OK)
        FUZZ_CHECK(err.msg[0] != '\0', "a refused file without a message");
    tdm_cfg_action action;
    rc = tdm_cfg_load(cfg, argc, argv, false, &action, &err);
    if (rc != TDM_OK)
        FUZZ_CHECK(err.msg[0] != '\0' && tdm_cfg_error_count(cfg) > 0,
                   "a refused configuration without a message");
    for (size_t i = 0; i < tdm_cfg_error_count(cfg); i++)
        FUZZ_CHECK(tdm_cfg_error_at(cfg, i)[0] != '\0', "an empty error");
    tdm_cfg_print(cfg, sink);
    Tandem__V1__EffectiveConfig ec = TANDEM__V1__EFFECTIVE_CONFIG__INIT;
    FUZZ_CHECK(tdm_cfg_to_proto(cfg, &ec, &err) == TDM_OK, "EffectiveConfig: %s", err.msg);
    FUZZ_CHECK(ec.n_entries == schema->n_keys, "%zu entries for %zu keys", ec.n_entries,
               schema->n_keys);
    tdm_cfg_proto_clear(&ec);
    tdm_cfg_destroy(cfg);
    free(args);
    return 0;
}
