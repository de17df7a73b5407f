/*
 * main.c - tandem-verifier: owns the target model and verifies draft blocks.
 *
 * Configuration (tables in service/service_config.c) -> --help / --check-config
 * -> load the model, serve Run, Describe and Health, register with the
 * gateway and heartbeat, until SIGTERM/SIGINT.
 */
#include "service_config.h"
#include "verifier.h"

int main(int argc, char **argv)
{
    tdm_cfg *cfg = NULL;
    int rc = tdm_svc_config_main(&tdm_svc_verifier_schema, argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    verifier v = {0};
    rc = tdm_service_replica_main(cfg, "tandem.v1.Verifier", "/tandem.v1.Verifier/Describe",
                                  verifier_setup, &v);
    vsched_destroy(v.sched);
    tdm_runtime_close(v.rt);
    return rc;
}
