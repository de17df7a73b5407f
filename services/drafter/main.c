/*
 * main.c - tandem-drafter: proposes draft blocks for verifiers.
 *
 * Configuration (tables in common/service_config.c) -> --help / --check-config
 * -> serve Describe and Health, register with the gateway and heartbeat, until
 * SIGTERM/SIGINT.
 */
#include "service.h"
#include "service_config.h"

int main(int argc, char **argv)
{
    tdm_cfg *cfg = NULL;
    int rc = tdm_svc_config_main(&tdm_svc_drafter_schema, argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    return tdm_service_replica_main(cfg, "tandem.v1.Drafter", "/tandem.v1.Drafter/Describe", NULL,
                                    NULL);
}
