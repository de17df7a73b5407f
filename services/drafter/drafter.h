/*
 * drafter.h - the pieces of tandem-drafter: a draft model, an MTP head fed
 * with the verifier's hidden states, or none (the n-gram drafter), and the
 * Draft streams verifiers open.
 */
#ifndef TANDEM_DRAFTER_H
#define TANDEM_DRAFTER_H

#include "feature_shm.h"
#include "lane.h"
#include "runtime.h"
#include "service.h"

#include <pthread.h>
#include <stdint.h>

typedef struct drafter {
    tdm_runtime *rt;        /* drafter_kind model: the draft model; else NULL */
    tdm_runtime *head;      /* drafter_kind mtp: the MTP head (rt->mtp); else NULL */
    int hidden;             /* mtp: values per feature row (the target's hidden size) */
    const tdm_trust *trust; /* the service's: who may open Draft streams */
    /* The engine serves one caller at a time: each Draft stream (one per
     * verifier) holds this while it runs the model. */
    pthread_mutex_t model_mu;
    tdm_state_strategy strategy; /* how draft steps are rolled back */
    int vocab;
    int max_sequences; /* open sequences per stream */
    int ngram_min, ngram_max;
    bool run_ahead; /* draft ahead of verdicts where the verifier takes it */
    /* How hidden-state rows may come (feature_transport), and the setting
     * with its source for messages. */
    tdm_feat_transport feat_transport;
    char feat_setting[256];
    /* How a Draft stream's messages may travel (exchange_transport), and
     * the setting with its source. */
    tdm_lane_transport lane_transport;
    char lane_setting[256];
    int64_t max_message_bytes; /* max_message_size: a lane message's limit too */
    /* The open Draft streams (under streams_mu), ended when the process drains. */
    pthread_mutex_t streams_mu;
    struct dstream *open_streams;
    bool draining;
    /* counters (atomics) */
    int streams, open_sequences;
    uint64_t blocks, drafted, ahead_used, ahead_dropped;
    /* tokens a model drafter prefilled outside its draft passes (prompts,
     * catch-ups): about the prompts' sum while its sequences' states hold */
    uint64_t prefilled;
    /* scoring opens answered, and the positions they scored */
    uint64_t scores, scored;
    /* Where the blocks that answer verdicts spent their time, microseconds
     * summed over timed_blocks (block_stage_us_total: draft.c's stages). */
    uint64_t timed_blocks, stage_us[5];
    /* the feature stream: rows and bytes received by transport; Draft
     * streams whose shared-memory ring was accepted or refused */
    uint64_t feat_rows_shm, feat_bytes_shm, feat_rows_grpc, feat_bytes_grpc;
    uint64_t shm_accepted, shm_refused;
    /* Draft streams whose exchange lane was accepted or refused */
    uint64_t lane_accepted, lane_refused;
    tdm_metric *block_time; /* time to draft a block (the service's registry) */
    tdm_metric *pass_time;  /* time of a draft pass (the same) */
    tdm_metric *write_time; /* time of a block's write (the same) */
} drafter;

/* Loads the draft model (drafter_kind model) or the MTP head (mtp) and
 * registers Draft (the `setup` step of tdm_service_replica_main). */
tdm_status drafter_setup(tdm_service *svc, void *arg, tdm_error *err);

#endif
