/*
 * verifier.h - the pieces of tandem-verifier: the target model, the
 * scheduler, the Run method that feeds one request through them, and the
 * state snapshot methods that move a request's state between verifiers.
 */
#ifndef TANDEM_VERIFIER_H
#define TANDEM_VERIFIER_H

#include "capacity.h"
#include "runtime.h"
#include "service.h"
#include "vsched.h"

typedef struct verifier {
    tdm_runtime *rt;
    vsched *sched;
    const tdm_trust *trust; /* the service's: who may call Run */
    char replica_id[128];
    int max_sequences;
    int max_draft; /* max_draft_tokens: the positions whose acceptance is exported */
    /* Memory accounted at start (capacity.h), for the counters. */
    tdm_capacity_params cap_params;
    tdm_capacity cap;
    int max_context;
    int64_t max_message_bytes;
    size_t prefix_cache_memory; /* the prefix cache's budget (0: off), for the counters */
    char fingerprint[80];       /* the model's (Descriptor.model_fingerprint): snapshots carry it */
    /* metrics (families in the service's registry) */
    tdm_metrics_outcomes outcomes; /* Run requests by finish reason and error code */
    tdm_metric *queue_time;        /* from submission to a place in the batch */
} verifier;

/* Loads the model, starts the scheduler and registers Run (the `setup` step
 * of tdm_service_replica_main). */
tdm_status verifier_setup(tdm_service *svc, void *arg, tdm_error *err);

/* Registers ExportSnapshot and ImportSnapshot (snapshot_rpc.c). */
tdm_status verifier_snapshot_register(tdm_rpc_server *server, verifier *v, tdm_error *err);

#endif
