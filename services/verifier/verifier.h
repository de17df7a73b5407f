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

#include <stdatomic.h>

/* Fetching prompt prefixes from peers (prefix_fetch.c): the settings and
 * what was measured and counted (any thread). */
typedef struct verifier_fetch {
    int64_t
        bandwidth_prior; /* bytes per second until a fetch is measured (prefix_fetch_bandwidth) */
    int64_t latency_ms;  /* the fixed cost of a fetch (prefix_fetch_latency) */
    int64_t timeout_ms;  /* the longest a fetch may take (prefix_fetch_timeout) */
    const tdm_rpc_tls *tls;      /* for the calls to peers; NULL = plaintext */
    _Atomic double bytes_per_ms; /* measured bandwidth, a moving average; 0: none yet */
    _Atomic uint64_t fetches, failures, blocks, bytes, recomputed;
    _Atomic double ms_total; /* time spent fetching, failures included */
} verifier_fetch;

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
    verifier_fetch fetch;
} verifier;

/* Loads the model, starts the scheduler and registers Run (the `setup` step
 * of tdm_service_replica_main). */
tdm_status verifier_setup(tdm_service *svc, void *arg, tdm_error *err);

/* Registers ExportSnapshot and ImportSnapshot (snapshot_rpc.c). */
tdm_status verifier_snapshot_register(tdm_rpc_server *server, verifier *v, tdm_error *err);
/* The payload bytes per chunk for a caller that asked for `asked` (0: the
 * default), or INVALID_ARGUMENT past what fits under max_message_size. */
tdm_status verifier_chunk_bytes(const verifier *v, uint32_t asked, uint64_t *out, tdm_error *err);
/* Streams a snapshot on call: chunk 0 the layout (and cont, when not NULL),
 * then the payload in chunks of `chunk` bytes, each with its CRC32C (l
 * sealed: its sha256 set). *n gets the chunks sent or tried. */
tdm_status verifier_send_chunks(tdm_rpc_call *call, const char *id, const tdm_snap_layout *l,
                                const uint8_t *payload, uint64_t chunk,
                                Tandem__V1__SnapshotContinuation *cont, uint32_t *n,
                                tdm_error *err);

/* Registers FetchPrefix (prefix_fetch.c). */
tdm_status verifier_prefix_register(tdm_rpc_server *server, verifier *v, tdm_error *err);
/* Before a Run's request is queued, on its handler thread: when req names a
 * prefix_source holding more of the prompt than this cache and the cost
 * rule favours it, fetches that prefix into this cache. Never fails the
 * request: a failed fetch is counted and the prompt prefilled. */
void verifier_prefix_fetch(verifier *v, const Tandem__V1__RunRequest *req);
/* The cost rule's inputs now: fetch bandwidth in bytes per ms and prefill
 * throughput in tokens per ms (measured, else the priors). */
double verifier_fetch_bandwidth(const verifier *v);
double verifier_fetch_prefill_rate(verifier *v);

#endif
