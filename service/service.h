/*
 * service.h - what every tandem service process does around its own methods.
 *
 * Owns, for one process: its effective configuration, the main gRPC server
 * (bound to `listen`, TLS from tls_*, message limits from max_message_size),
 * the health registry served on the main port and on the separate plaintext
 * `health_listen` port, the process's Descriptor (built from the
 * configuration, with the bound port filled in when `advertise` was resolved
 * from a port-0 listen address), the Describe method, and the life cycle:
 * NOT_SERVING until started, SERVING while running, NOT_SERVING again while
 * draining after SIGTERM/SIGINT, then a shutdown bounded by shutdown_grace.
 * For drafters and verifiers it also runs the registration with the gateway
 * (registration.h). When `metrics_listen` is set, a plaintext HTTP port
 * serves /metrics in the Prometheus text format (metrics.h): build info, the
 * Describe counters under their metric names, and the role's own families.
 *
 * Ownership: tdm_service_create takes over the tdm_cfg; everything is freed by
 * tdm_service_destroy.
 */
#ifndef TANDEM_COMMON_SERVICE_H
#define TANDEM_COMMON_SERVICE_H

#include "config.h"
#include "health.h"
#include "metrics.h"
#include "rpc.h"
#include "status.h"
#include "tandem/v1/common.pb-c.h"
#include "trust.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tdm_service tdm_service;

/* A counter reported by Describe / GetStatus. */
typedef struct tdm_service_counter {
    const char *name; /* static string */
    double value;
} tdm_service_counter;

/* A runtime's CUDA graph outcomes (tdm_runtime_graph_stats, engine/runtime.h)
 * as counters of a service's list; metrics.c exports them (GRAPH_ROWS). */
#define TDM_GRAPH_COUNTERS(gs)                                                                     \
    {"graph_steps_captured", (double)(gs).captured},                                               \
        {"graph_steps_replayed", (double)(gs).replayed},                                           \
        {"graph_steps_refused", (double)(gs).refused}, {"graph_steps_eager", (double)(gs).eager},  \
    {                                                                                              \
        "graphs_evicted", (double)(gs).evicted                                                     \
    }

/* Fills up to max counters and returns how many. Called on RPC threads. */
typedef size_t (*tdm_service_counters_fn)(void *arg, tdm_service_counter *out, size_t max);

/* Copies up to max of the n counters in `all` to out; returns how many (the
 * body of most tdm_service_counters_fn). */
size_t tdm_service_counters_copy(const tdm_service_counter *all, size_t n, tdm_service_counter *out,
                                 size_t max);

/* Binds the main port, builds the Descriptor, logs the effective
 * configuration, and starts the health port (NOT_SERVING until
 * tdm_service_start). `service_name` is the gRPC service whose health is reported
 * ("tandem.v1.Drafter"). Takes over cfg (also on failure). Nothing is served
 * before tdm_service_start. */
tdm_status tdm_service_create(tdm_cfg *cfg, const char *service_name, tdm_service **out,
                              tdm_error *err);
void tdm_service_destroy(tdm_service *s);

tdm_rpc_server *tdm_service_server(tdm_service *s);
const tdm_cfg *tdm_service_config(const tdm_service *s);
const Tandem__V1__Descriptor *tdm_service_descriptor(const tdm_service *s);
/* Sets the descriptor's device_uuid (the GPU the replica's model runs on)
 * and device_mps (its work there goes through an MPS server); call from the
 * setup callback, before the service starts. */
void tdm_service_set_device(tdm_service *s, const char *uuid, bool mps);
/* Sets the descriptor's draft_pass_costs: a pass drafting blocks[i] tokens
 * for each of sequences[i] sequences took ms[i]; call from a model drafter's
 * setup callback, before the service starts. */
void tdm_service_set_draft_costs(tdm_service *s, const int *sequences, const int *blocks,
                                 const double *ms, int n);
/* Sets the descriptor's draft_vocab_size: the tokens a model or MTP drafter's
 * drafts come from, as its draft vocabulary loaded (0: the whole vocabulary);
 * call from the setup callback, before the service starts. */
void tdm_service_set_draft_vocab(tdm_service *s, int n);
/* A value a rule left to be measured at start (tdm_cfg_set_resolved),
 * reflected in the descriptor where it appears there (max_sequences); call
 * from the setup callback. Refuses an explicitly set value. */
tdm_status tdm_service_set_resolved(tdm_service *s, const char *key, const char *value,
                                    const char *reason, tdm_error *err);
/* The TLS settings from configuration, or NULL for plaintext. */
const tdm_rpc_tls *tdm_service_tls(const tdm_service *s);
/* Who may call this process, and the credential it presents to its peers. */
const tdm_trust *tdm_service_trust(const tdm_service *s);
/* The registry the role adds its metric families to (before start); they are
 * served on /metrics with the counters below. Lives as long as the service. */
tdm_metrics *tdm_service_metrics(tdm_service *s);
/* The bound metrics port, or 0 when metrics_listen is empty. */
int tdm_service_metrics_port(const tdm_service *s);
/* Seconds since tdm_service_create. */
double tdm_service_uptime_s(const tdm_service *s);

/* The role's occupancy, reported with every heartbeat (load balancing in
 * the gateway). Called on the registration thread. */
typedef void (*tdm_service_load_fn)(void *arg, uint32_t *active_sequences, uint32_t *free_slots);
void tdm_service_set_load(tdm_service *s, tdm_service_load_fn fn, void *arg);

/* The role's drain, run on SIGTERM/SIGINT (or Replica.Drain from the
 * gateway) after the replica deregistered and before the servers shut down:
 * it may take up to grace_ms to move or finish what is in flight, while the
 * servers still answer. */
typedef void (*tdm_service_drain_fn)(void *arg, int grace_ms);
void tdm_service_set_drain(tdm_service *s, tdm_service_drain_fn fn, void *arg);

/* The role's counters for Describe (uptime, and for replicas the
 * registration counters, are always reported besides). They also travel with
 * heartbeats, so the gateway's GetStatus shows every replica's counters. */
void tdm_service_set_counters(tdm_service *s, tdm_service_counters_fn fn, void *arg);
/* Fills a Counter array from the counters callback, with memory from the call. */
void tdm_service_counters_to_proto(tdm_service *s, tdm_rpc_call *call, Tandem__V1__Counter ***out,
                                   size_t *n);
/* Fills an EffectiveConfig with memory released when the call is freed. */
Tandem__V1__EffectiveConfig *tdm_service_config_to_proto(tdm_service *s, tdm_rpc_call *call);
/* Serves Describe (descriptor, effective configuration, counters) at path,
 * e.g. "/tandem.v1.Drafter/Describe". */
tdm_status tdm_service_add_describe(tdm_service *s, const char *path, tdm_error *err);

/* Starts serving and marks every health service SERVING. */
tdm_status tdm_service_start(tdm_service *s, tdm_error *err);
/* Blocks until SIGTERM or SIGINT, then drains: health NOT_SERVING, on_drain
 * (may be NULL; e.g. deregister from the gateway), then both servers shut
 * down within shutdown_grace. Returns the signal number. */
int tdm_service_wait_and_stop(tdm_service *s, void (*on_drain)(void *arg), void *arg);

/* The whole life of a drafter or verifier process after its configuration was
 * loaded: create, Describe at describe_path, `setup` (may add the role's
 * methods; may be NULL), start, register with the gateway and heartbeat,
 * wait for a signal, deregister, stop. Returns the process exit status. */
int tdm_service_replica_main(tdm_cfg *cfg, const char *service_name, const char *describe_path,
                             tdm_status (*setup)(tdm_service *s, void *arg, tdm_error *err),
                             void *arg);

#endif
