/*
 * vsched.h - the verifier's scheduler: continuous batching of sequences over
 * the target model, speculative verification against drafters' blocks, and
 * the Draft streams to those drafters.
 *
 * Owns: the target model's sequences (one engine sequence per request) and
 * one scheduler thread that runs rounds; the Draft streams to drafters are
 * vlink.h's (one per drafter address, opened on first use, reopened after a
 * failure). The cost model of a drafted token lives beside the adaptive
 * rule (spec/adaptive.h).
 *
 * A round: admit waiting requests; take and place state snapshots (exports
 * of running requests, imports of received ones, both asked for by RPC
 * handlers and carried out here, between rounds, where the committed state
 * matches what was streamed); prefill prompts a chunk at a time
 * (prefill_chunk tokens a round over all of them, so one long prompt delays
 * the others' tokens by a chunk, not by its whole prefill); wait for the
 * blocks asked for last round (each at most draft_timeout_ms after it was
 * asked for); run one batched forward pass over all decoding sequences (1
 * row for plain ones, 1 + k rows for those with a block); verify, commit the
 * accepted prefix, stream the new tokens, and send each drafter its verdict.
 * Sequences join and leave between rounds; a request is cancelled between
 * chunks and rounds. A sequence ends at max_context positions (finish
 * reason CONTEXT).
 *
 * Prefix cache (prefix_cache on): a new request first looks for the longest
 * cached prefix of its prompt (whole blocks, leaving at least the prompt's
 * last token to run) and starts from its state; its prefill stops a chunk at
 * every block boundary and stores the state there, and so do its rounds at
 * the boundaries their committed tokens reach (inside a verified block: from
 * the verify's state there, before the commit), so that a later prompt that
 * holds this request's text (a conversation's next turn) starts after it.
 * Prefill calls then each cover one segment of a fixed grid (block
 * boundaries, multiples of prefill_chunk), a segment waiting for a round
 * whose budget holds it, so a hit runs the calls a miss ran from its
 * boundary on and gives its tokens to the bit.
 *
 * Fallback: a drafter that fails (stream broken, malformed or late block)
 * only turns speculation off for the sequences it served; they continue with
 * plain decoding from their committed state, so no token is lost or repeated.
 *
 * Threading: vsched_submit / vsched_next / vsched_cancel / vsched_export /
 * vsched_import / vsched_prefix_* are called from RPC handler threads; everything else
 * (including every engine call) runs on the scheduler thread.
 */
#ifndef TANDEM_VERIFIER_VSCHED_H
#define TANDEM_VERIFIER_VSCHED_H

#include "defs.h"
#include "engine.h"
#include "feature_shm.h"
#include "lane.h"
#include "rpc.h"
#include "sampling.h"
#include "snapshot.h"
#include "status.h"
#include "trust.h"
#include "tandem/v1/verifier.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct vsched vsched;
typedef struct vreq vreq;

typedef struct vsched_params {
    tdm_model *model;            /* borrowed; outlives the scheduler */
    /* The runtime that runs it (borrowed; NULL: none to ask): its CUDA
     * graph outcomes say which steps ran a shape for the first time, whose
     * time the timing models leave out. */
    const struct tdm_runtime *runtime;
    tdm_state_strategy strategy; /* how sequences commit */
    int max_draft;               /* most draft tokens per round (max_draft_tokens) */
    int max_sequences;           /* active at once; more wait in line */
    int draft_timeout_ms;        /* longest wait for a drafter's block */
    int drafter_reopen_tries;    /* re-opens of a sequence after its drafter failed; 0: none */
    int max_context;             /* most positions a sequence may reach (prompt + generated) */
    int prefill_chunk;           /* prompt tokens prefilled per round, over all new requests */
    const tdm_rpc_tls *tls;      /* for Draft streams; NULL = plaintext */
    const tdm_trust *trust;      /* the credential Draft streams carry; may be NULL */
    int64_t max_message_bytes;
    /* The GPU the model runs on ("" on the CPU; borrowed): a drafter on the
     * same one gets no run-ahead, whose steps would take this verifier's time.
     * device_mps: this verifier's work there goes through an MPS server. */
    const char *device_uuid;
    bool device_mps;
    /* On the CPU: its host and its process's CPUs (Descriptor.host_id, cpus;
     * borrowed): a drafter on the same cores gets no run-ahead either. */
    const char *host_id, *cpus;
    /* Memory (capacity.h). Admission reserves each request's state: the
     * bytes a sequence holds besides KV, plus KV for its most positions
     * (prompt + max_tokens + a block, at most max_context), which the
     * sequence holds from its creation; a request is admitted only when
     * that fits in seq_budget_bytes beside the running ones, so an admitted
     * request never runs out of memory mid-stream. seq_budget_bytes 0: no
     * accounting (max_sequences alone). */
    size_t seq_fixed_bytes, kv_bytes_per_position, seq_budget_bytes;
    int max_waiting;    /* requests waiting for a place; more are refused (RESOURCE_EXHAUSTED) */
    const char *limits; /* the limits with their sources, for refusals (copied) */
    /* State snapshots: the model's fingerprint (borrowed), and how long and
     * how many / how many bytes of imported snapshots wait for their Run. */
    const char *fingerprint;
    int64_t snapshot_ttl_ms;
    int max_snapshots;
    int64_t max_snapshot_bytes;
    /* The prefix cache (engine/prefix_cache.h): on or off, the tokens per
     * cached block and the host memory it may hold. */
    bool prefix_cache;
    int prefix_cache_block;
    size_t prefix_cache_memory;
    /* The feature stream's transport (feature_transport, feature_shm_size)
     * and the setting with its source for messages (borrowed, copied). */
    tdm_feat_transport feature_transport;
    uint64_t feature_shm_bytes;
    const char *feature_setting;
    /* The Draft streams' transport (exchange_transport) and the setting
     * with its source (borrowed, copied). */
    tdm_lane_transport exchange_transport;
    const char *exchange_setting;
} vsched_params;

tdm_status vsched_create(const vsched_params *p, vsched **out, tdm_error *err);
/* Stops the scheduler thread after failing every request still running. */
void vsched_destroy(vsched *s);

/* Validates a RunRequest and queues it. On success *out is the request handle
 * owned by the caller, who must drain it with vsched_next until it reports
 * the end and then call vsched_release. */
tdm_status vsched_submit(vsched *s, const Tandem__V1__RunRequest *req, vreq **out, tdm_error *err);

/* What vsched_next hands the Run handler. */
typedef struct vsched_output {
    int32_t *ids; /* new tokens (caller frees with free()); may be NULL */
    int n_ids;
    int index; /* position of ids[0] among the generated tokens */
    bool done; /* the request ended: finish_reason and stats are set */
    /* No tokens: the verifier drains, and this request may be moved now
     * (vsched_export with detach); otherwise it goes on here. Once. */
    bool draining;
    Tandem__V1__FinishReason finish_reason;
    Tandem__V1__RequestStats stats; /* string fields point into the request */
    tdm_status status;              /* != TDM_OK: the request failed (message in msg) */
    double queue_ms;                /* from submission to a place in the batch (0 if none) */
    /* stats are filled on every output: the request's progress so far */
    char msg[256];
} vsched_output;

/* Drain: from now on new requests and imports are refused (UNAVAILABLE),
 * and every running request's vsched_next says `draining` once, after its
 * first token, so that the Run handler can tell its caller to move it.
 * Requests already admitted or waiting go on here until they end or move. */
void vsched_drain(vsched *s);
/* Requests running or waiting. */
int vsched_in_flight(vsched *s);

/* Blocks until there are new tokens or the request ended (or, draining,
 * until the request should hear so). */
void vsched_next(vsched *s, vreq *r, vsched_output *out);
/* The client went away: the sequence is freed (on the verifier and on its
 * drafter) at the start of the next round. Safe from any thread, any time
 * before vsched_release. */
void vsched_cancel(vsched *s, vreq *r);
/* Waits until the scheduler has let go of the request, then frees it. */
void vsched_release(vsched *s, vreq *r);

/* The phases of a round, in the order they run (sched_round). */
typedef enum {
    VSCHED_IDLE,    /* waiting for work */
    VSCHED_ADMIT,   /* admitting and retiring requests */
    VSCHED_PREFILL, /* prompt chunks */
    VSCHED_WAIT,    /* waiting for drafters' blocks and checking them */
    VSCHED_STEP,    /* the batched forward pass */
    VSCHED_COMMIT,  /* verifying, committing, streaming tokens, retiring */
    VSCHED_SEND,    /* verdicts and opens to drafters */
    VSCHED_PHASES
} vsched_phase;

/* The commit phase's parts, in the order they run. */
typedef enum {
    VSCHED_COMMIT_VERDICTS, /* the step's outputs read into verdicts (a sampled
                               rejection's row fetched, its residual drawn) */
    VSCHED_COMMIT_EMIT,     /* per sequence: tokens out, stats, the adaptive rule,
                               the drafter's next message planned */
    VSCHED_COMMIT_RETIRE,   /* finished requests retired, memory counted */
    VSCHED_COMMIT_STATES,   /* accepted drafts committed into the states */
    VSCHED_COMMIT_PARTS
} vsched_commit_part;

typedef struct vsched_counters {
    uint64_t requests, active, waiting, rounds, spec_rounds, drafted, accepted, tokens;
    uint64_t drafter_failures, cancelled;
    uint64_t drafter_reopens;  /* sequences re-opened on a drafter's address after it failed */
    uint64_t malformed_blocks; /* blocks refused as malformed (speculation off for the sequence) */
    uint64_t draft_streams;    /* Draft streams open now */
    uint64_t ahead_used;       /* blocks drafted ahead of their verdict that stood */
    uint64_t ahead_dropped;    /* ... that the verdict did not bear out */
    /* Drafter exchange overhead per block over the last 4096 blocks: time
     * from asking to receiving, minus the drafter's own drafting time. */
    double overhead_p50_us, overhead_p99_us;
    /* The drafter's own time per draft token (DraftBlock.draft_micros over
     * its drafts), over the last 4096 blocks. */
    double draft_token_p50_us, draft_token_p99_us;
    /* Their sums since the start (a benchmark's own means from the growth):
     * the exchange over exchange_blocks blocks, the drafter's own time over
     * its draft tokens. */
    double exchange_us_total, draft_us_total;
    uint64_t exchange_blocks, draft_tokens_total;
    /* A request's first block, asked for with its open as its prefill
     * started: what it kept the request waiting beyond its prefill, summed
     * over open_waits such blocks since the start (not in the exchange). */
    double open_wait_us_total;
    uint64_t open_waits;
    /* The verifier's parts of the exchange, summed since the start: building
     * and queueing verdicts and opens (sends), their wait for the link's
     * writer, its gRPC writes (writes), and drafters' messages from their
     * read to the scheduler (delivers). What is left of the exchange is the
     * transport both ways and the drafter's own reading and writing. */
    double send_us_total, queue_us_total, write_us_total, deliver_us_total;
    uint64_t sends, writes, delivers;
    /* The round's timeline: total time in each phase since the start, and
     * each phase's median and 99th percentile over the last 4096 rounds.
     * The totals add up to uptime_us but for the round in progress. */
    double phase_total_us[VSCHED_PHASES];
    double phase_p50_us[VSCHED_PHASES], phase_p99_us[VSCHED_PHASES];
    /* The commit phase's total by part (vsched_commit_part); the parts add
     * up to phase_total_us[VSCHED_COMMIT]. */
    double commit_part_us[VSCHED_COMMIT_PARTS];
    double uptime_us; /* since the scheduler thread started */
    /* For metrics: rounds that verified at least one block; sequence rounds
     * decoded plainly while the adaptive rule had speculation off, and the
     * times it switched it off; how often the draft at each position was
     * accepted (accepted_at[j]: blocks that accepted more than j drafts);
     * rounds run plainly to measure a plain round (the adaptive rule's
     * baseline), their blocks unverified. */
    uint64_t speculative_steps, adaptive_off_rounds, adaptive_switch_offs, plain_measure_rounds;
    /* Scores of paused greedy sequences' drafters weighed, the positions
     * they scored, and the scores that restarted speculation; requests
     * whose start relaxed measured costs that lost even with every draft
     * accepted (relax_costs_locked). */
    uint64_t scores, scored_positions, score_restarts, cost_relaxes;
    uint64_t accepted_at[TDM_MAX_DRAFT_BLOCK];
    /* State snapshots: exported, imported, dropped unused after
     * snapshot_ttl, and imported ones waiting for their Run now. */
    uint64_t snapshots_exported, snapshots_imported, snapshots_expired, snapshots_waiting;
    /* Memory the active sequences hold, as of the last round's end. */
    uint64_t kv_bytes, recurrent_bytes, conv_bytes, strategy_bytes;
    /* Bytes reserved by admitted requests; requests refused for a full line. */
    uint64_t reserved_bytes, refused;
    /* The prefix cache: requests whose prompt (one block or longer) started
     * from a cached prefix or found none, the prompt tokens those hits did
     * not prefill; blocks stored, evicted for room, and held now, with
     * their bytes. */
    uint64_t prefix_hits, prefix_misses, prefix_tokens_saved;
    uint64_t prefix_stored, prefix_evictions, prefix_blocks, prefix_bytes;
    /* The feature stream: hidden-state rows sent to drafters, and their
     * bytes, in all and by transport (shm: by reference into a Draft
     * stream's shared-memory ring; grpc: inline in its messages); messages
     * whose rows went inline because the ring lacked room; the messages
     * that carried rows by transport with the time spent putting their rows
     * out (encoding them at the round's end, then the ring copy or the
     * message's serialisation: the verifier's cost of the feature stream);
     * Draft streams settled on shm and on grpc. */
    uint64_t feature_rows, feature_bytes;
    uint64_t feature_rows_shm, feature_bytes_shm, feature_rows_grpc, feature_bytes_grpc;
    uint64_t feature_ring_full;
    uint64_t feature_puts_shm, feature_puts_grpc;
    double feature_put_us_shm, feature_put_us_grpc;
    uint64_t feature_streams_shm, feature_streams_grpc;
    uint64_t exchange_streams_shm, exchange_streams_grpc;
} vsched_counters;

void vsched_get_counters(vsched *s, vsched_counters *c);

/* ---- state snapshots ---------------------------------------------------- */

/* What continuing a request needs besides its state (snapshot.proto's
 * SnapshotContinuation). */
typedef struct vsched_continuation {
    char request_id[96];
    uint32_t prompt_tokens, max_tokens, generated;
    int32_t next_token; /* the newest generated token, not yet in the state */
    tdm_sampling sampling;
    uint64_t seed; /* the draws are keyed by it and the position */
    int32_t stop_ids[64];
    int n_stop;
} vsched_continuation;

/* A request's state as exported: layout, payload and continuation (the
 * caller frees it with vsched_snapshot_free). */
typedef struct vsched_snapshot {
    tdm_snap_layout layout;
    uint8_t *payload;
    vsched_continuation cont;
} vsched_snapshot;

void vsched_snapshot_free(vsched_snapshot *x);

/* Takes the state of the running request request_id at its committed
 * position, between two rounds on the scheduler thread (so it is
 * consistent with what was streamed), and blocks until it is taken.
 * detach: the request then ends here (its Run fails with ABORTED naming
 * snapshot_id). NOT_FOUND when no such request runs; FAILED_PRECONDITION
 * while it has not generated its first token. */
tdm_status vsched_export(vsched *s, const char *request_id, bool detach, const char *snapshot_id,
                         vsched_snapshot *out, tdm_error *err);

/* Creates a sequence from a received snapshot (layout and payload checked by
 * the assembler; they move to the scheduler whatever the outcome) on the
 * scheduler thread, and keeps it under snapshot_id for a Run with that
 * snapshot_id, for snapshot_ttl_ms. Refuses a continuation that does not fit
 * the layout or this verifier (INVALID_ARGUMENT), an id in use
 * (ALREADY_EXISTS), more than max_snapshots or max_snapshot_bytes waiting
 * (RESOURCE_EXHAUSTED). */
tdm_status vsched_import(vsched *s, const char *snapshot_id, tdm_snap_layout *layout,
                         uint8_t *payload, const vsched_continuation *c, tdm_error *err);

/* ---- the prefix cache between verifiers ------------------------------------ */

/* These run on the caller's thread (an RPC handler's) under the cache's own
 * lock, which the scheduler thread takes for each of its cache calls: host
 * copies only, so a round waits at most for one of them. */

/* prefix_cache_block, 0 with the cache off. */
int vsched_prefix_block(const vsched *s);
/* The tokens of the longest cached prefix of tokens within max_tokens (0
 * with the cache off). */
int vsched_prefix_cached(vsched *s, const int32_t *tokens, int max_tokens);
/* tdm_prefix_cache_export of this verifier's cache (layout unsealed; the
 * caller frees both). FAILED_PRECONDITION with the cache off. */
tdm_status vsched_prefix_export(vsched *s, const int32_t *tokens, int max_tokens,
                                tdm_snap_layout *layout, uint8_t **payload, tdm_error *err);
/* tdm_prefix_cache_import into this verifier's cache (layout verified by
 * the assembler; both stay the caller's): *covered gets the tokens of the
 * prefix cached afterwards. */
tdm_status vsched_prefix_import(vsched *s, const tdm_snap_layout *layout, const uint8_t *payload,
                                int *covered, tdm_error *err);
/* Measured prefill throughput, prompt tokens per ms (a moving average over
 * prefill calls); 0 while none ran. */
double vsched_prefill_rate(vsched *s);

#endif
