/*
 * health.h - the grpc.health.v1.Health service (Check and Watch).
 *
 * What it owns: a registry of per-service serving statuses ("" = the whole
 * process) shared by every server it is registered on: the main server and,
 * because Kubernetes gRPC probes cannot speak TLS, a separate plaintext
 * health-only server. Every registered service starts NOT_SERVING; it becomes
 * SERVING when the process marks it ready and NOT_SERVING again, for good, when
 * the process drains (tdm_health_drain, also run by the shutdown of any server
 * the registry is registered on).
 *
 * Check on an unknown service returns NOT_FOUND; Watch on an unknown service
 * streams SERVICE_UNKNOWN. Watch sends the current status at once and again on
 * every change, until the client cancels or the registry drains.
 *
 * Thread-safe. The registry must outlive the servers it is registered on.
 */
#ifndef TANDEM_COMMON_HEALTH_H
#define TANDEM_COMMON_HEALTH_H

#include <stdbool.h>

#include "rpc.h"
#include "status.h"

typedef struct tdm_health tdm_health;

/* Values are grpc.health.v1.HealthCheckResponse.ServingStatus. */
typedef enum tdm_health_status {
    TDM_HEALTH_UNKNOWN = 0,
    TDM_HEALTH_SERVING = 1,
    TDM_HEALTH_NOT_SERVING = 2,
    TDM_HEALTH_SERVICE_UNKNOWN = 3,
} tdm_health_status;

/* The registry starts with the "" service, NOT_SERVING. */
tdm_health *tdm_health_create(void);
void tdm_health_destroy(tdm_health *h);

/* Registers a service name (e.g. "tandem.v1.Gateway"), NOT_SERVING. Adding a
 * known name is a no-op. */
tdm_status tdm_health_add_service(tdm_health *h, const char *service, tdm_error *err);
/* Sets one service's status; NOT_FOUND for an unknown name. Ignored (returns
 * TDM_OK) once drained: a draining process stays NOT_SERVING. */
tdm_status tdm_health_set(tdm_health *h, const char *service, bool serving, tdm_error *err);
/* Sets every registered service (including ""). */
void tdm_health_set_all(tdm_health *h, bool serving);
/* Current status; TDM_HEALTH_SERVICE_UNKNOWN for an unknown name. */
tdm_health_status tdm_health_get(tdm_health *h, const char *service);
/* Marks everything NOT_SERVING for good and ends every Watch stream (after it
 * sent NOT_SERVING). */
void tdm_health_drain(tdm_health *h);

/* Adds /grpc.health.v1.Health/Check and /Watch to a server (before start) and
 * drains the registry when that server shuts down. */
tdm_status tdm_health_register(tdm_health *h, tdm_rpc_server *server, tdm_error *err);

/* Creates, registers and starts a plaintext server that serves only Health on
 * `listen` (port 0 picks one: tdm_rpc_server_port). The caller shuts it down
 * and destroys it like any server. */
tdm_status tdm_health_server_start(tdm_health *h, const char *listen, tdm_rpc_server **out,
                                   tdm_error *err);

#endif
