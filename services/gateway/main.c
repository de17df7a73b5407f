/*
 * main.c - tandem-gateway: the registry of drafters and verifiers, the
 * compatibility rules between them, and the public API.
 *
 * Configuration (tables in common/service_config.c) -> --help / --check-config
 * -> serve Registry, GetStatus and Health until SIGTERM/SIGINT.
 */
#include "gw_status.h"
#include "log.h"
#include "registry.h"
#include "service.h"
#include "service_config.h"

int main(int argc, char **argv)
{
    tdm_cfg *cfg = NULL;
    int rc = tdm_svc_config_main(&tdm_svc_gateway_schema, argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    tdm_rpc_signals_install();
    gw_registry *reg = gw_registry_create(tdm_cfg_int(cfg, "heartbeat_interval"),
                                          tdm_cfg_int(cfg, "replica_ttl"));
    tdm_service *svc = NULL;
    tdm_error err;
    if (!reg) {
        tdm_log_error("tandem-gateway", "cannot start the registry");
        tdm_cfg_destroy(cfg);
        return 1;
    }
    if (tdm_service_create(cfg, "tandem.v1.Gateway", &svc, &err) != TDM_OK ||
        gw_registry_add_methods(reg, tdm_service_server(svc), &err) != TDM_OK ||
        gw_status_add_method(svc, reg, &err) != TDM_OK || tdm_service_start(svc, &err) != TDM_OK) {
        tdm_log_error("tandem-gateway", "cannot start: %s", err.msg);
        tdm_service_destroy(svc);
        gw_registry_destroy(reg);
        return 1;
    }
    tdm_service_set_counters(svc, gw_status_counters, reg);
    tdm_service_wait_and_stop(svc, NULL, NULL);
    tdm_service_destroy(svc);
    gw_registry_destroy(reg);
    return 0;
}
