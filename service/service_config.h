/*
 * service_config.h - the configuration tables of tandem-gateway,
 * tandem-verifier and tandem-drafter, their `auto` rules and cross-setting
 * checks, and what a service derives from its effective configuration.
 *
 * This module owns the three tdm_cfg_schema tables (the single place where a
 * service's settings are declared: the binaries and the `tandem` CLI's offline
 * check-config read the same tables), the common start-up sequence of every
 * binary (--help, --check-config, errors) and the building of a service's
 * tandem.v1.Descriptor from its effective configuration.
 *
 * Ownership: schemas are static. Descriptors built here are heap-allocated and
 * freed with tdm_svc_descriptor_free.
 */
#ifndef TANDEM_COMMON_SERVICE_CONFIG_H
#define TANDEM_COMMON_SERVICE_CONFIG_H

#include "capacity.h"
#include "config.h"
#include "status.h"
#include "tandem/v1/common.pb-c.h"

#include <stdio.h>

extern const tdm_cfg_schema tdm_svc_gateway_schema;
extern const tdm_cfg_schema tdm_svc_verifier_schema;
extern const tdm_cfg_schema tdm_svc_drafter_schema;

/* Default ports of the local stack (scripts/run.sh and the defaults below). */
#define TDM_SVC_GATEWAY_PORT 7700
#define TDM_SVC_VERIFIER_PORT 7710
#define TDM_SVC_DRAFTER_PORT 7720

/* The start-up sequence every service binary runs first: loads the
 * configuration from argv, the environment and --config; answers --help and
 * --check-config; sets the log level. Returns -1 when the service should go
 * on serving with *out (the caller destroys it), or the exit status to return
 * from main (0 for --help or a passing --check-config; 1 for a failing check;
 * 2 for a configuration that cannot start). */
int tdm_svc_config_main(const tdm_cfg_schema *schema, int argc, char **argv, tdm_cfg **out);

#define TDM_SVC_WARNING_MAX 400

/* What the start-up sequence finds in a configuration: the code path of
 * --check-config, for tdm_svc_config_main and `tandem doctor`. */
typedef struct tdm_svc_check {
    tdm_cfg *cfg;          /* owned; NULL only when out of memory */
    tdm_cfg_action action; /* what argv asked for (--help, --check-config) */
    tdm_status loaded;     /* TDM_OK when valid; else errors in tdm_cfg_error_at */
    char warnings[8][TDM_SVC_WARNING_MAX];
    size_t n_warnings;
    /* With --check-config and a valid configuration: the Descriptor, built
     * from the model files as start-up would (NULL when that failed). */
    Tandem__V1__Descriptor *desc;
    tdm_status described; /* TDM_OK unless building it failed, then desc_err */
    tdm_error desc_err;
} tdm_svc_check;

/* Loads a configuration from argv (argv[0] the program; --config FILE,
 * flags, --check-config) and the environment exactly as the service binary
 * does, and runs its checks. The service would start when loaded and
 * described are both TDM_OK. Free with tdm_svc_check_clear. */
void tdm_svc_config_check(const tdm_cfg_schema *schema, int argc, char **argv, tdm_svc_check *out);
void tdm_svc_check_clear(tdm_svc_check *c);

/* TANDEM_* variables in the environment that no tandem service reads (likely
 * misspelt), as warning sentences; returns how many were written (<= max). */
size_t tdm_svc_env_warnings(const tdm_cfg *cfg, char (*out)[TDM_SVC_WARNING_MAX], size_t max);

/* Builds the Descriptor of a service (role from the schema) from its effective
 * configuration: replica id, advertised address, model name, model and
 * tokenizer fingerprints computed from the configured files, block size / max
 * draft tokens, state strategy, prefix cache, snapshot layout and protocol
 * versions, build info. Free with tdm_svc_descriptor_free. */
tdm_status tdm_svc_descriptor_build(const tdm_cfg *cfg, Tandem__V1__Descriptor **out,
                                    tdm_error *err);
void tdm_svc_descriptor_free(Tandem__V1__Descriptor *d);
/* A Descriptor of this build alone: role, replica id and address as given,
 * protocol and snapshot layout versions and build info; no model, tokenizer
 * or settings. What `tandem doctor` compares replicas against when it has no
 * configuration. Free with tdm_svc_descriptor_free. */
Tandem__V1__Descriptor *tdm_svc_descriptor_of_build(Tandem__V1__Role role, const char *replica_id,
                                                    const char *address);

/* The verifier's memory arithmetic (engine/capacity.h) from its effective
 * configuration: model (config.json, and the weights' storage dtype),
 * state_strategy, max_draft_tokens, max_context and gpu_memory as the
 * budget. Errors name the model when its config cannot be read. */
tdm_status tdm_svc_verifier_capacity(const tdm_cfg *cfg, tdm_capacity_params *p, tdm_capacity *c,
                                     tdm_error *err);
/* Prints a verifier's capacity arithmetic (tdm_capacity_format), each line
 * after `prefix`; nothing for another role or without a readable model. */
void tdm_svc_print_capacity(const tdm_cfg *cfg, const char *prefix, FILE *out);
/* FAILED_PRECONDITION when max_sequences exceeds c's count, naming both
 * values, their sources and the arithmetic. */
tdm_status tdm_svc_check_capacity(const tdm_cfg *cfg, const tdm_capacity *c, tdm_error *err);

/* The role a schema configures. */
Tandem__V1__Role tdm_svc_role_of(const tdm_cfg_schema *schema);

#endif
