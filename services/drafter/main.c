/*
 * main.c - tandem-drafter: proposes draft blocks for verifiers.
 *
 * Configuration (tables in service/service_config.c) -> --help / --check-config
 * -> load the draft model (or the MTP head, or none for the n-gram drafter), serve Draft,
 * Describe and Health, register with the gateway and heartbeat, until
 * SIGTERM/SIGINT.
 */
#include "drafter.h"
#include "service_config.h"

int main(int argc, char **argv)
{
    tdm_cfg *cfg = NULL;
    int rc = tdm_svc_config_main(&tdm_svc_drafter_schema, argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    drafter d = {0};
    pthread_mutex_init(&d.model_mu, NULL);
    pthread_mutex_init(&d.streams_mu, NULL);
    rc = tdm_service_replica_main(cfg, "tandem.v1.Drafter", "/tandem.v1.Drafter/Describe",
                                  drafter_setup, &d);
    tdm_runtime_close(d.rt);
    tdm_runtime_close(d.head);
    pthread_mutex_destroy(&d.model_mu);
    pthread_mutex_destroy(&d.streams_mu);
    return rc;
}
