/*
 * main.c - tandem-gateway: the public API, the registry of drafters and
 * verifiers, and the compatibility rules between them.
 *
 * Configuration (tables in service/service_config.c) -> --help / --check-config
 * -> serve Generate, Tokenize, Detokenize, GetModelInfo, GetStatus, Registry
 * and Health until SIGTERM/SIGINT.
 */
#include "api.h"
#include "gw_status.h"
#include "log.h"
#include "openai.h"
#include "registry.h"
#include "service.h"
#include "service_config.h"

typedef struct gateway {
    gw_registry *reg;
    gw_api *api;
    gw_openai *http; /* NULL without http_listen */
} gateway;

static size_t counters(void *arg, tdm_service_counter *out, size_t max)
{
    gateway *g = arg;
    size_t n = gw_registry_counters(g->reg, out, max);
    return n + gw_api_counters(g->api, out + n, max - n);
}

int main(int argc, char **argv)
{
    tdm_cfg *cfg = NULL;
    int rc = tdm_svc_config_main(&tdm_svc_gateway_schema, argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    tdm_rpc_signals_install();
    gateway g = {0};
    tdm_service *svc = NULL;
    tdm_error err = {0};
    if (tdm_service_create(cfg, "tandem.v1.Gateway", &svc, &err) != TDM_OK) {
        tdm_log_error("tandem-gateway", "cannot start: %s", err.msg);
        return 1;
    }
    g.reg = gw_registry_create(tdm_service_trust(svc), tdm_cfg_int(cfg, "heartbeat_interval"),
                               tdm_cfg_int(cfg, "replica_ttl"),
                               (int)tdm_cfg_int(cfg, "prefix_affinity_slack"));
    if (gw_registry_add_methods(g.reg, tdm_service_server(svc), &err) != TDM_OK ||
        gw_status_add_method(svc, g.reg, &err) != TDM_OK ||
        gw_api_create(svc, g.reg, &g.api, &err) != TDM_OK) {
        tdm_log_error("tandem-gateway", "cannot start: %s", err.msg);
        tdm_service_destroy(svc);
        gw_registry_destroy(g.reg);
        return 1;
    }
    tdm_service_set_counters(svc, counters, &g);
    if (tdm_service_start(svc, &err) != TDM_OK) {
        tdm_log_error("tandem-gateway", "cannot start: %s", err.msg);
        tdm_service_destroy(svc);
        gw_api_destroy(g.api);
        gw_registry_destroy(g.reg);
        return 1;
    }
    if (gw_openai_create(cfg, g.api, tdm_service_trust(svc), &g.http, &err) != TDM_OK) {
        tdm_log_error("tandem-gateway", "cannot start: %s", err.msg);
        tdm_service_destroy(svc);
        gw_api_destroy(g.api);
        gw_registry_destroy(g.reg);
        return 1;
    }
    tdm_service_wait_and_stop(svc, NULL, NULL);
    gw_openai_destroy(g.http);
    tdm_service_destroy(svc);
    gw_api_destroy(g.api);
    gw_registry_destroy(g.reg);
    return 0;
}
