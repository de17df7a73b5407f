/*
 * draft.c - the drafter's Draft stream: sequences opened by a verifier, draft
 * blocks proposed for them, verdicts applied.
 *
 * One stream serves every sequence of one verifier. A reader thread queues
 * the verifier's messages (stamped with their arrival); the handler thread
 * takes everything queued, applies it (open, verdict, close), then drafts
 * for every sequence that wants a block in one batched model pass per draft
 * position, and writes the blocks. When nothing is queued it drafts ahead:
 * the next block of every sequence whose verdict is still out, assuming the
 * block is accepted whole (run-ahead, drafter.proto).
 *
 * The model of a sequence holds tokens[0..held) committed, then the rows of
 * the drafts it ran, pending in the engine (an appendable verify). A verdict
 * keeps the pending rows that agree with the verifier's tokens (one commit,
 * no recomputation) and drops the rest; the tokens the model then lacks (the
 * last draft of a fully accepted block, the next token, or what a run-ahead
 * dropped) run as the first step of the next block, all in one multi-row
 * step: a fully accepted block costs no extra step.
 *
 * An MTP drafter (drafter_kind mtp) holds per sequence the head's KV cache
 * primed with the verifier's hidden states of tokens[0..primed) (each row
 * with the token after it: primed = n - 1 once the rows of a message are in)
 * and the rows received but not yet primed (fin: an open's, a verdict's and
 * the FeatureChunks before them). A verdict rolls the head back to `primed`
 * (its draft rows go), then a pass primes the new rows and drafts k tokens,
 * all sequences of the pass batched (tdm_mtp_prime_n, then
 * tdm_mtp_draft_n: the head's argmax for greedy requests;
 * tdm_mtp_draft_sampled: sampled requests' drafts drawn on the device, as a
 * model drafter's chains do, and sent with their distributions).
 *
 * Colocated, the rows come through the verifier's shared-memory ring
 * (feature_shm.h): a FeatureShmOffer is answered once the segment is mapped
 * and its nonce checked; a Features message may then reference rows in the
 * ring, read (and checked) as its message is applied, and every response
 * carries the ring offset read up to (shm_consumed) so the verifier reuses
 * the space. With feature_transport shm set, a sequence with hidden states
 * on a stream without a ring is answered with a SequenceError naming the
 * setting; with grpc, an offer is refused.
 *
 * A malformed or inconsistent message for one sequence answers that sequence
 * with a SequenceError (the verifier then goes on without drafts for it); the
 * stream and its other sequences go on.
 */
#include "drafter.h"
#include "spin.h"

#include "alloc.h"
#include "capacity.h"
#include "defs.h"
#include "feature_stream.h"
#include "log.h"
#include "timing_lock.h"
#include "ngram.h"
#include "request_check.h"
#include "adaptive.h"
#include "sampling.h"
#include "tandem/v1/drafter.pb-c.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOG "drafter"
#define MAX_BLOCK TDM_MAX_DRAFT_BLOCK
/* Stochastic drafting draws from the drafter's distribution cut to its most
 * likely tokens, and sends exactly that distribution, so the verifier's
 * rejection sampling stays exact while blocks stay small. */
#define DRAFT_SUPPORT_MAX 256
/* Rows a sequence may hold pending: its block, and the next one drafted
 * ahead (with the tokens it runs first). */
#define MAX_PENDING (TDM_MAX_DRAFT_BLOCK + 1)

/* One drafted block, as sent. */
typedef struct dblock {
    int k;
    int32_t drafts[MAX_BLOCK];
    float probs[MAX_BLOCK];
    uint32_t *dist_ids[MAX_BLOCK];
    float *dist_probs[MAX_BLOCK];
    int dist_n[MAX_BLOCK];
} dblock;

typedef struct dseq {
    uint64_t id;
    int32_t *tokens; /* [cap] every committed token */
    int n, cap;
    tdm_seq *seq;              /* model drafter: tokens[0..held) committed, then prow pending */
    int held;                  /* committed tokens in the model */
    int32_t prow[MAX_PENDING]; /* tokens of the pending rows, in order */
    int np;
    tdm_mtp_seq *mseq; /* mtp: the head primed with the states of tokens[0..primed) */
    int primed;
    tdm_feat_in fin; /* mtp: states received, not yet primed */
    tdm_sampling sampling;
    uint64_t seed; /* the request's: draws are keyed by it and the position */
    bool greedy;
    bool run_ahead; /* the verifier takes ahead blocks and this drafter drafts them */
    /* the outstanding block (round `round`, continuing from position n) */
    bool want;      /* a block should be drafted */
    bool picked;    /* drafted by the pass under way: its block goes out with it */
    bool stuck;     /* catching up failed: answered with an empty block */
    bool sent;      /* it went out; its verdict is awaited */
    int block_size; /* drafts asked for */
    int answered;   /* drafts of the block the last verdict answered (0 after an open) */
    uint32_t round;
    dblock b;
    /* the block drafted ahead for round + 1 */
    bool ahead_want, ahead_sent;
    int32_t assumed;
    dblock a;
    double t_msg; /* arrival of the message the outstanding block answers (us) */
    /* A block that answers a verdict: when the handler took the verdict,
     * and the stages of the pass that drafted it (block_stages) */
    bool timed;
    double t_taken, t_pass0, t_chain, t_pass1;
    bool first_sight; /* its pass ran a step shape for the first time (DraftBlock) */
    bool prep_first;  /* so did its catch-up since its last block (model_prepare) */
    /* A scoring open (drafter.proto, DraftScore): positions from score_from
     * on are scored into hits (hits[0] at position hits_at) as its catch-up
     * reaches them. */
    bool scoring;
    int score_from, hits_at, n_hits, hits_cap;
    uint8_t *hits;
    struct dseq *next;
} dseq;

typedef struct dqueue_item {
    Tandem__V1__DraftRequest *msg;
    double t_arrived; /* us */
    struct dqueue_item *next;
} dqueue_item;

typedef struct dstream {
    drafter *d;
    struct dstream *next_open; /* d->open_streams (under d->streams_mu) */
    tdm_rpc_call *call;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t gen; /* bumped with every signal of cv (spin.h) */
    dqueue_item *head, *tail;
    bool ended;
    tdm_status end_status;
    dseq *seqs;
    int n_seqs;
    tdm_step_buf out; /* a draft pass's logits and argmaxes */
    float *probs;
    int *order;
    /* sampled draft chains (chain_probs): a uniform and a distribution of
     * a draft vocabulary a draft, settings a block */
    double *cu;
    int cu_cap;
    tdm_draft_sampling *csamp;
    int csamp_cap;
    float *cprobs;
    size_t cprobs_cap;
    /* one pass's scratch, sized for max_sequences */
    struct dtarget *targets;
    int *stepped;
    dseq **bs;
    tdm_seq **eseqs;
    int32_t *rows;
    const int32_t **tp;
    int *nrows;
    /* an MTP pass's (max_sequences each) */
    tdm_mtp_seq **mseqs;
    const float **mhid;
    int32_t **mdrafts;
    int *mk;
    /* the controlled-acceptance build's proposals ([max_sequences,
     * MAX_BLOCK], and one pointer a sequence); NULL in tandem-drafter */
    int32_t *mfbuf;
    const int32_t **mforced;
    int32_t *score_am; /* a scoring catch-up chunk's argmaxes [CATCH_UP_CHUNK] */
    /* The verifier's shared-memory ring, mapped once its offer checked out
     * (handler thread); shm_why: why there is none, when an offer failed. */
    tdm_feat_map shm;
    char shm_why[400];
    double t_taken; /* when the handler took the messages it applies (us) */
    /* The exchange lane (lane.h): mapped by the handler when it takes the
     * offer (published to the reader, which starts lane_reader at the
     * verifier's LaneSwitch); lane_tx: the handler's writes go into it (from
     * its answer on). wbuf: a response serialised for the lane. */
    tdm_lane *lane;
    bool lane_tx;
    pthread_t lane_th;
    bool has_lane_th;
    uint8_t *wbuf;
    size_t wbuf_cap;
    char end_msg[300]; /* why the stream ends with end_status, when not OK */
} dstream;

/* The stages of a block that answers a verdict, as the drafter's counters
 * block_<stage>_us_total sum them: the verdict waiting for the handler
 * (arrival to taken), applied and waiting for its pass (taken to the pass's
 * start: the settle's commit, other messages, catch-ups), the draft chain
 * on the device (tdm_seq_draft, graph launch to drafts on the host), the
 * rest of its pass, and the block's building and write. */
enum { STAGE_WAIT, STAGE_APPLY, STAGE_CHAIN, STAGE_PASS, STAGE_SEND, STAGES };
static const char *const stage_keys[STAGES] = {"block_wait_us_total", "block_apply_us_total",
                                               "block_chain_us_total", "block_pass_us_total",
                                               "block_send_us_total"};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* ---- sequences ------------------------------------------------------------- */

static void block_clear(dblock *b)
{
    for (int j = 0; j < b->k; j++) {
        free(b->dist_ids[j]);
        free(b->dist_probs[j]);
        b->dist_ids[j] = NULL;
        b->dist_probs[j] = NULL;
        b->dist_n[j] = 0;
    }
    b->k = 0;
}

static void ahead_clear(dseq *q)
{
    block_clear(&q->a);
    q->ahead_want = false;
    q->ahead_sent = false;
}

static void dseq_free(dstream *st, dseq *q)
{
    block_clear(&q->b);
    block_clear(&q->a);
    const double t0 = q->seq && tdm_log_get_level() <= TDM_LOG_DEBUG ? now_us() : 0;
    tdm_seq_destroy(q->seq);
    if (t0 > 0)
        tdm_log_debug(LOG, "sequence %llu: its model state freed in %.2f ms",
                      (unsigned long long)q->id, (now_us() - t0) * 1e-3);
    tdm_mtp_seq_destroy(q->mseq);
    tdm_feat_in_free(&q->fin);
    free(q->tokens);
    free(q->hits);
    free(q);
    st->n_seqs--;
    __atomic_fetch_sub(&st->d->open_sequences, 1, __ATOMIC_RELAXED);
}

static dseq *dseq_find(dstream *st, uint64_t id)
{
    for (dseq *q = st->seqs; q; q = q->next)
        if (q->id == id)
            return q;
    return NULL;
}

static void dseq_remove(dstream *st, dseq *q)
{
    for (dseq **pp = &st->seqs; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    dseq_free(st, q);
}

static bool dseq_reserve(dseq *q, int need)
{
    if (need <= q->cap)
        return true;
    int cap = q->cap ? q->cap : 256;
    while (cap < need)
        cap *= 2;
    int32_t *t = realloc(q->tokens, (size_t)cap * sizeof(int32_t));
    if (!t)
        return false;
    q->tokens = t;
    q->cap = cap;
    return true;
}

/* Writes one response on the stream, or into the lane once the answer to its
 * offer went out. */
static tdm_status dstream_write(dstream *st, const Tandem__V1__DraftResponse *r, tdm_error *err)
{
    if (!st->lane_tx)
        return tdm_rpc_call_write(st->call, &r->base, err);
    const size_t len = tandem__v1__draft_response__get_packed_size(r);
    if (len > st->wbuf_cap) {
        free(st->wbuf);
        st->wbuf_cap = len + 4096;
        st->wbuf = tdm_xmalloc(st->wbuf_cap);
    }
    const size_t n = tandem__v1__draft_response__pack(r, st->wbuf);
    return tdm_lane_send(st->lane, st->wbuf, n, err);
}

static tdm_status send_error(dstream *st, uint64_t id, const char *msg)
{
    Tandem__V1__SequenceError e = TANDEM__V1__SEQUENCE_ERROR__INIT;
    e.sequence_id = id;
    e.message = (char *)msg;
    Tandem__V1__DraftResponse r = TANDEM__V1__DRAFT_RESPONSE__INIT;
    r.kind_case = TANDEM__V1__DRAFT_RESPONSE__KIND_ERROR;
    r.error = &e;
    r.shm_consumed = st->shm.consumed;
    tdm_log_warn(LOG, "sequence %llu: %s", (unsigned long long)id, msg);
    tdm_error err = {0};
    return dstream_write(st, &r, &err);
}

/* Lets go of the pending rows that disagree with the committed tokens: one
 * commit keeps the leading rows that equal tokens[held..n) (at most n -
 * held of them), so the model holds tokens[0..held) with nothing pending. */
static tdm_status model_settle(dseq *q, tdm_error *err)
{
    if (!q->seq || q->np == 0)
        return TDM_OK;
    int keep = 0;
    while (keep < q->np && q->held + keep < q->n && q->prow[keep] == q->tokens[q->held + keep])
        keep++;
    /* The committed tokens are the verifier's (an open that went back
     * further dropped the model first); keep may be 0: a block drafted ahead
     * whose first draft was rejected. */
    tdm_status rc = tdm_seq_commit(q->seq, keep - 1, err);
    q->held += keep;
    q->np = 0;
    return rc;
}

/* Tokens a catch-up prefills between looks for waiting messages: the
 * verifier's own prefill chunk (prefill_chunk's default), so that a verdict
 * waits for at most one chunk of another sequence's prompt. */
#define CATCH_UP_CHUNK 256

/* Committed tokens a block's first step runs before its drafts, at most:
 * what a verdict adds (the accepted drafts of the block it answered, or of
 * one as long as this one, and the bonus token), within MAX_PENDING rows
 * with the drafts. A verdict that asks for a shorter block (a request's
 * last round) thus adds no prefill. A longer lead (a prompt after an
 * open, the tokens of a pause) is prefilled first, all but its last token:
 * the engine's prefill path takes many rows at once (on CUDA through cuBLAS
 * from 16 rows), where a draft step's rows take the exact kernel, and the
 * block's first step keeps room for a block drafted ahead. */
static int lead_max(const dseq *q)
{
    int lead = (q->answered > q->block_size ? q->answered : q->block_size) + 1;
    if (lead > MAX_PENDING - q->block_size)
        lead = MAX_PENDING - q->block_size;
    return lead < 1 ? 1 : lead;
}

/* The model's sequence for q, created (empty) where it has none. */
static tdm_status model_seq(drafter *d, dseq *q, tdm_error *err)
{
    if (q->seq)
        return TDM_OK;
    tdm_seq_params p = {.strategy = d->strategy, .max_draft = TDM_MAX_DRAFT_BLOCK};
    q->held = 0;
    return tdm_seq_create(d->rt->model, &p, &q->seq, err);
}

/* Before a block's first step: creates the model's sequence, and prefills
 * a lead longer than lead_max up to the last committed token, at most `max`
 * tokens at a time (0: all; catch_up). Nothing may be pending. */
static tdm_status model_prepare(drafter *d, dseq *q, int max, tdm_error *err)
{
    if (!d->rt)
        return TDM_OK;
    const bool timed = tdm_log_get_level() <= TDM_LOG_DEBUG;
    const double t0 = timed ? now_us() : 0;
    double t_created = t0;
    if (!q->seq) {
        tdm_status rc = model_seq(d, q, err);
        if (rc != TDM_OK)
            return rc;
        t_created = timed ? now_us() : 0;
    }
    if (q->n - q->held <= lead_max(q))
        return TDM_OK;
    int want = q->n - 1; /* the last token's row gives the first draft */
    if (max > 0 && want > q->held + max)
        want = q->held + max;
    const uint64_t fs = tdm_runtime_graph_first_sights(d->rt);
    tdm_status rc = tdm_seq_prefill(q->seq, q->tokens + q->held, want - q->held, NULL, err);
    if (rc != TDM_OK)
        return rc;
    /* A prompt length seen for the first time runs eagerly or is captured:
     * the open's wait then says nothing of what opens cost from now on. */
    q->prep_first |= tdm_runtime_graph_first_sights(d->rt) != fs;
    __atomic_fetch_add(&d->prefilled, (uint64_t)(want - q->held), __ATOMIC_RELAXED);
    if (timed)
        tdm_log_debug(LOG, "sequence %llu: created in %.2f ms, %d tokens prefilled in %.2f ms",
                      (unsigned long long)q->id, (t_created - t0) * 1e-3, want - q->held,
                      (now_us() - t_created) * 1e-3);
    q->held = want;
    return TDM_OK;
}

/* Whether a model drafter must first catch up on this sequence's tokens
 * (a prompt after an open, the tokens of a pause) before its block's first
 * step: model_prepare's prefill. */
static bool catching_up(const drafter *d, const dseq *q)
{
    if (!d->rt || d->head || q->stuck)
        return false;
    if (!q->seq)
        return true;
    return q->n - q->held > lead_max(q);
}

/* Whether a message (or the stream's end) waits for the stream thread. */
static bool message_waiting(dstream *st)
{
    pthread_mutex_lock(&st->mu);
    bool w = st->head != NULL || st->ended;
    pthread_mutex_unlock(&st->mu);
    return w;
}

/* Catches up on the sequences that want a block and lag behind, one at a
 * time and CATCH_UP_CHUNK tokens at a time, until none is left or a message
 * waits: a verdict's block must not wait for other sequences' prefills (an
 * open's prompt of thousands of tokens, or 32 opens at once, would hold
 * every round of the verifier's batch that waits for it). The sequences
 * caught up draft with the next pass. */
static void catch_up(dstream *st)
{
    for (dseq *q = st->seqs; q; q = q->next) {
        while (q->want && catching_up(st->d, q)) {
            tdm_error err = {0};
            if (model_prepare(st->d, q, CATCH_UP_CHUNK, &err) != TDM_OK) {
                tdm_log_error(LOG, "sequence %llu: %s", (unsigned long long)q->id, err.msg);
                q->stuck = true;
            }
            if (message_waiting(st))
                return;
        }
    }
}

#ifdef TANDEM_BENCH_ORACLE
#include "oracle.h"
#endif

/* The token the drafter proposes after q's first n tokens extended by `ext`
 * (n_ext of them): its own choice, or in the benchmark's controlled-acceptance
 * build the oracle's (-1 where no recorded run continues them). */
static int32_t propose_after(const dstream *st, const dseq *q, int n, const int32_t *ext, int n_ext,
                             int32_t own)
{
#ifdef TANDEM_BENCH_ORACLE
    return tdm_bench_oracle(q->tokens, n, ext, n_ext, own, st->d->vocab);
#else
    (void)st;
    (void)q;
    (void)n;
    (void)ext;
    (void)n_ext;
    return own;
#endif
}

/* Answers q's scoring open with the positions scored so far: the DraftScore
 * (drafter.proto). */
static tdm_status score_send(dstream *st, dseq *q, tdm_error *err)
{
    Tandem__V1__DraftScore sc = TANDEM__V1__DRAFT_SCORE__INIT;
    sc.sequence_id = q->id;
    sc.position = (uint32_t)q->hits_at;
    sc.hits.data = q->hits;
    sc.hits.len = (size_t)q->n_hits;
    Tandem__V1__DraftResponse r = TANDEM__V1__DRAFT_RESPONSE__INIT;
    r.kind_case = TANDEM__V1__DRAFT_RESPONSE__KIND_SCORE;
    r.score = &sc;
    q->scoring = false;
    __atomic_fetch_add(&st->d->scores, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&st->d->scored, (uint64_t)q->n_hits, __ATOMIC_RELAXED);
    return dstream_write(st, &r, err);
}

/* One chunk of q's scoring catch-up: prefills at most CATCH_UP_CHUNK of its
 * tokens up to the last (whose row predicts a token not decoded yet), the
 * rows that predict a position from score_from on with their argmax, each
 * scored against the token there (as the drafter's block would propose it:
 * propose_after); then, caught up, sends the DraftScore. */
static tdm_status score_chunk(dstream *st, dseq *q, tdm_error *err)
{
    drafter *d = st->d;
    tdm_status rc = model_seq(d, q, err);
    if (rc != TDM_OK)
        return rc;
    const int want = q->n - 1, first = q->score_from - 1; /* the row that predicts score_from */
    if (q->held < want) {
        /* Eagerly: its row counts and positions are new at every score, and
         * graphs captured for them evicted the draft chains' (the demo pair
         * on one H100: 104-133 graphs evicted a load of 192 requests, the
         * chains captured again). */
        tdm_model *mo = d->rt->model;
        const int graphs = tdm_model_graphs(mo);
        tdm_model_set_graphs(mo, 0);
        int end = want < q->held + CATCH_UP_CHUNK ? want : q->held + CATCH_UP_CHUNK;
        if (q->held < first && end > first)
            end = first; /* the rows before it need no argmax */
        const int m = end - q->held;
        if (q->held >= first) {
            if (!st->score_am)
                st->score_am = tdm_xmalloc(CATCH_UP_CHUNK * sizeof(int32_t));
            const tdm_step_out out = {.argmax = st->score_am};
            rc = tdm_seq_prefill_out(q->seq, q->tokens + q->held, m, &out, err);
            if (rc == TDM_OK && q->n_hits + m > q->hits_cap) {
                q->hits_cap = q->n_hits + m > 2 * q->hits_cap ? q->n_hits + m : 2 * q->hits_cap;
                q->hits = tdm_xrealloc(q->hits, (size_t)q->hits_cap);
            }
            for (int i = 0; rc == TDM_OK && i < m; i++) {
                const int pos = q->held + i + 1;
                if (q->n_hits == 0)
                    q->hits_at = pos;
                const int32_t own = st->score_am[i], f = propose_after(st, q, pos, NULL, 0, own);
                q->hits[q->n_hits++] = (f < 0 ? own : f) == q->tokens[pos];
            }
        } else {
            rc = tdm_seq_prefill(q->seq, q->tokens + q->held, m, NULL, err);
        }
        tdm_model_set_graphs(mo, graphs);
        if (rc != TDM_OK)
            return rc;
        __atomic_fetch_add(&d->prefilled, (uint64_t)m, __ATOMIC_RELAXED);
        q->held = end;
        if (q->held < want)
            return TDM_OK;
    }
    return score_send(st, q, err);
}

/* Scores the sequences that asked for it, a chunk at a time, until none is
 * left or a message waits (a verdict's block goes first). */
static void score_pending(dstream *st)
{
    for (dseq *q = st->seqs; q; q = q->next) {
        while (q->scoring) {
            tdm_error err = {0};
            if (score_chunk(st, q, &err) != TDM_OK) {
                q->scoring = false;
                send_error(st, q->id, err.msg);
                break;
            }
            if (message_waiting(st))
                return;
        }
    }
}

/* The sequence of id `id`, created empty when the stream does not hold it;
 * NULL (answered with a SequenceError) when max_sequences are held. */
static dseq *dseq_get(dstream *st, uint64_t id)
{
    drafter *d = st->d;
    dseq *q = dseq_find(st, id);
    if (q)
        return q;
    if (st->n_seqs >= d->max_sequences) {
        char m[120];
        snprintf(m, sizeof(m),
                 "this drafter serves at most %d sequences per stream (max_sequences)",
                 d->max_sequences);
        send_error(st, id, m);
        return NULL;
    }
    q = tdm_xcalloc(1, sizeof(*q));
    q->id = id;
    tdm_feat_in_init(&q->fin, d->hidden);
    q->next = st->seqs;
    st->seqs = q;
    st->n_seqs++;
    __atomic_fetch_add(&d->open_sequences, 1, __ATOMIC_RELAXED);
    return q;
}

/* Appends a message's rows to q's (inline, or read from the stream's ring)
 * and counts them by transport. */
static tdm_status feat_take(dstream *st, dseq *q, const Tandem__V1__Features *f, const char *what,
                            tdm_error *err)
{
    tdm_status rc = tdm_feat_in_append_shm(&q->fin, f, &st->shm, what, err);
    if (rc != TDM_OK)
        return rc;
    const uint64_t bytes = (uint64_t)f->rows * (uint64_t)f->width * tdm_feat_dtype_bytes(f->dtype);
    drafter *d = st->d;
    __atomic_fetch_add(f->shm ? &d->feat_rows_shm : &d->feat_rows_grpc, (uint64_t)f->rows,
                       __ATOMIC_RELAXED);
    __atomic_fetch_add(f->shm ? &d->feat_bytes_shm : &d->feat_bytes_grpc, bytes, __ATOMIC_RELAXED);
    return TDM_OK;
}

/* feature_transport shm on this drafter: a sequence with hidden states needs
 * the stream's ring (no quiet fallback to rows in messages). */
static tdm_status shm_required(const dstream *st, tdm_error *err)
{
    if (st->d->feat_transport != TDM_FEAT_TRANSPORT_SHM || st->shm.map)
        return TDM_OK;
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s on this drafter, but this Draft stream has no shared-memory ring: "
                         "%s (run the verifier on this host or in this pod with /dev/shm shared, "
                         "or set feature_transport auto or grpc)",
                         st->d->feat_setting,
                         st->shm_why[0] ? st->shm_why
                                        : "the verifier offered none (its feature_transport is "
                                          "grpc, or it predates the shared-memory transport)");
}

/* After the rows of a message are in: the head must hold, or get with
 * this pass's prime, the states of every token but the newest. */
static tdm_status mtp_check_rows(const dseq *q, const char *what, tdm_error *err)
{
    if (q->fin.rows > 0 && q->fin.position != q->primed)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.hidden starts at position %d, but this drafter holds the states "
                             "of positions 0..%d",
                             what, q->fin.position, q->primed - 1);
    if (q->primed + q->fin.rows != q->n - 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: the hidden states received cover positions 0..%d, but the "
                             "sequence's %d tokens need 0..%d (every token but the newest)",
                             what, q->primed + q->fin.rows - 1, q->n, q->n - 2);
    return TDM_OK;
}

/* An open for the MTP head: what it streams, and where its rows start (0:
 * from scratch; the primed length: a resume that keeps the head's cache,
 * when the tokens it was primed with are still the sequence's). */
static tdm_status mtp_open(dstream *st, dseq *q, const Tandem__V1__SequenceOpen *o, int lcp,
                           tdm_error *err)
{
    tdm_feat_request fr;
    tdm_status rc = tdm_feat_request_from_proto(o->features, "SequenceOpen.features", &fr, err);
    if (rc != TDM_OK)
        return rc;
    char want[160];
    if (fr.n != 1 || !fr.specs[0].final_layer || !fr.specs[0].normed)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "SequenceOpen.features asks for %s; this MTP drafter drafts from the "
                             "final layer after the norm alone",
                             tdm_feat_request_str(&fr, want, sizeof(want)));
    if ((rc = shm_required(st, err)) != TDM_OK)
        return rc;
    if (o->hidden && (rc = feat_take(st, q, o->hidden, "SequenceOpen.hidden", err)) != TDM_OK)
        return rc;
    const bool fresh = q->fin.rows > 0 && q->fin.position == 0;
    if (fresh || lcp < q->primed + 1)
        q->primed = 0; /* the head's cache is rebuilt from position 0 */
    if (!q->mseq && (rc = tdm_mtp_seq_create(st->d->head->mtp, 0, &q->mseq, err)) != TDM_OK)
        return rc;
    if ((rc = tdm_mtp_rollback(q->mseq, q->primed, err)) != TDM_OK)
        return rc;
    return mtp_check_rows(q, "SequenceOpen", err);
}

static void apply_open(dstream *st, const Tandem__V1__SequenceOpen *o, double t_arrived)
{
    drafter *d = st->d;
    tdm_error err = {0};
    if (tdm_req_check_sequence_open(o, d->vocab, MAX_BLOCK, &err) != TDM_OK) {
        send_error(st, o->sequence_id, err.msg);
        return;
    }
    if (o->score && (!d->rt || d->head)) {
        send_error(st, o->sequence_id,
                   "SequenceOpen.score: this drafter drafts without a model of its own, so it "
                   "scores no positions");
        return;
    }
    dseq *q = dseq_get(st, o->sequence_id);
    if (!q)
        return;
    if (q->scoring && score_send(st, q, &err) != TDM_OK)
        return; /* the stream ended under us */
    /* A resume keeps the model state of the common prefix (model_settle). */
    block_clear(&q->b);
    ahead_clear(q);
    if (!dseq_reserve(q, (int)o->n_tokens + MAX_BLOCK + 2)) {
        send_error(st, o->sequence_id, "out of memory for the sequence's tokens");
        dseq_remove(st, q);
        return;
    }
    int lcp = 0;
    while (lcp < q->n && lcp < (int)o->n_tokens && q->tokens[lcp] == (int32_t)o->tokens[lcp])
        lcp++;
    for (size_t i = 0; i < o->n_tokens; i++)
        q->tokens[i] = (int32_t)o->tokens[i];
    q->n = (int)o->n_tokens;
    if (q->held > lcp) {
        /* The model holds tokens the verifier no longer has: start over. */
        tdm_seq_destroy(q->seq);
        q->seq = NULL;
        q->held = 0;
        q->np = 0;
    }
    if (d->head && mtp_open(st, q, o, lcp, &err) != TDM_OK) {
        send_error(st, q->id, err.msg);
        dseq_remove(st, q);
        return;
    }
    const Tandem__V1__SamplingParams *sp = o->sampling;
    q->sampling = tdm_req_sampling(sp);
    q->greedy = tdm_sampling_is_greedy(&q->sampling);
    if (!q->greedy && (q->sampling.top_k == 0 || q->sampling.top_k > DRAFT_SUPPORT_MAX))
        q->sampling.top_k = DRAFT_SUPPORT_MAX;
    q->seed = sp && sp->seed_choice_case ? sp->seed : q->id;
    /* Ahead blocks only where the verifier takes them and the guess of its
     * next token is its argmax: greedy requests of a model drafter. */
    q->run_ahead = o->run_ahead && d->run_ahead && d->rt && q->greedy;
    q->round = o->round;
    q->block_size = (int)o->block_size;
    q->answered = 0;
    q->t_msg = t_arrived;
    q->timed = false;
    if (model_settle(q, &err) != TDM_OK) {
        send_error(st, q->id, err.msg);
        dseq_remove(st, q);
        return;
    }
    q->sent = false;
    if (o->score) {
        q->scoring = true;
        q->score_from = (int)o->score_from;
        q->hits_at = q->n;
        q->n_hits = 0;
        return;
    }
    q->want = true;
}

static void apply_verdict(dstream *st, const Tandem__V1__Verdict *v, double t_arrived)
{
    drafter *d = st->d;
    tdm_error err = {0};
    dseq *q = dseq_find(st, v->sequence_id);
    if (!q) {
        send_error(st, v->sequence_id, "Verdict for a sequence this stream does not know");
        return;
    }
    if (!q->sent || v->round != q->round || v->accepted > (uint32_t)q->b.k ||
        v->next_token >= (uint32_t)d->vocab || v->position != (uint32_t)(q->n + v->accepted + 1) ||
        v->block_size > MAX_BLOCK) {
        char m[200];
        snprintf(m, sizeof(m),
                 "Verdict does not match the outstanding block (round %u/%u, accepted %u of %d, "
                 "position %u/%d)",
                 v->round, q->round, v->accepted, q->b.k, v->position, q->n + (int)v->accepted + 1);
        send_error(st, q->id, m);
        dseq_remove(st, q);
        return;
    }
    if (!dseq_reserve(q, q->n + 2 * MAX_BLOCK + 4)) {
        send_error(st, q->id, "out of memory for the sequence's tokens");
        dseq_remove(st, q);
        return;
    }
    int a = (int)v->accepted;
    for (int j = 0; j < a; j++)
        q->tokens[q->n++] = q->b.drafts[j];
    q->tokens[q->n++] = (int32_t)v->next_token;
    if (d->head) {
        /* The head's draft rows go; the committed positions' states come. */
        tdm_status rc = tdm_mtp_rollback(q->mseq, q->primed, &err);
        if (rc == TDM_OK && !v->hidden)
            rc = tdm_error_set(&err, TDM_ERR_INVALID_ARGUMENT,
                               "Verdict.hidden is missing: an MTP drafter needs the hidden "
                               "states of the positions a verdict commits");
        if (rc == TDM_OK)
            rc = feat_take(st, q, v->hidden, "Verdict.hidden", &err);
        if (rc == TDM_OK)
            rc = mtp_check_rows(q, "Verdict", &err);
        if (rc != TDM_OK) {
            send_error(st, q->id, err.msg);
            dseq_remove(st, q);
            return;
        }
    }
    /* The verifier takes the ahead block when its verdict bears the block's
     * assumption out and it wants another block at all (drafter.proto). */
    bool confirmed =
        q->ahead_sent && a == q->b.k && (int32_t)v->next_token == q->assumed && v->block_size > 0;
    q->answered = q->b.k;
    block_clear(&q->b);
    if (confirmed) {
        /* The verifier takes the block drafted ahead: it is now the
         * outstanding one, and this verdict needs no new block. */
        q->b = q->a;
        memset(&q->a, 0, sizeof(q->a));
        q->ahead_want = q->ahead_sent = false;
        q->round = v->round + 1;
        q->block_size = (int)v->block_size; /* for the blocks after it */
        q->sent = true;
        q->ahead_want = q->run_ahead && q->b.k > 0;
        __atomic_fetch_add(&d->ahead_used, 1, __ATOMIC_RELAXED);
        /* Keep only what agrees with the tokens: the ahead block's own draft
         * rows run again with the next block's first step. */
        if (model_settle(q, &err) != TDM_OK) {
            send_error(st, q->id, err.msg);
            dseq_remove(st, q);
        }
        return;
    }
    if (q->ahead_sent)
        __atomic_fetch_add(&d->ahead_dropped, 1, __ATOMIC_RELAXED);
    ahead_clear(q);
    if (model_settle(q, &err) != TDM_OK) {
        send_error(st, q->id, err.msg);
        dseq_remove(st, q);
        return;
    }
    q->round = v->round + 1;
    q->block_size = (int)v->block_size;
    q->want = v->block_size > 0;
    q->sent = false;
    q->t_msg = t_arrived;
    q->timed = true;
    q->t_taken = st->t_taken;
    q->t_chain = 0;
}

/* Rows sent ahead of the open or verdict that completes them. */
static void apply_chunk(dstream *st, const Tandem__V1__FeatureChunk *c)
{
    tdm_error err = {0};
    if (!st->d->head) {
        send_error(st, c->sequence_id,
                   "FeatureChunk for a drafter that takes no hidden states (drafter_kind is "
                   "not mtp)");
        return;
    }
    dseq *q = dseq_get(st, c->sequence_id);
    if (!q)
        return;
    if (!c->hidden)
        tdm_error_set(&err, TDM_ERR_INVALID_ARGUMENT, "FeatureChunk.hidden is missing");
    if (!c->hidden || feat_take(st, q, c->hidden, "FeatureChunk.hidden", &err) != TDM_OK) {
        send_error(st, q->id, err.msg);
        dseq_remove(st, q);
    }
}

/* The verifier offers its shared-memory ring: mapped and its nonce checked,
 * or refused (another host, feature_transport grpc here), and answered. */
static void apply_shm_offer(dstream *st, const Tandem__V1__FeatureShmOffer *o)
{
    drafter *d = st->d;
    tdm_error err = {0};
    tdm_status rc = TDM_OK;
    if (st->shm.map)
        rc = tdm_error_set(&err, TDM_ERR_FAILED_PRECONDITION,
                           "this Draft stream has a shared-memory ring already");
    else if (d->feat_transport == TDM_FEAT_TRANSPORT_GRPC)
        rc = tdm_error_set(&err, TDM_ERR_FAILED_PRECONDITION, "%s on the drafter", d->feat_setting);
    else if (!d->head)
        rc = tdm_error_set(&err, TDM_ERR_FAILED_PRECONDITION,
                           "this drafter takes no hidden states (drafter_kind is not mtp)");
    else
        rc = tdm_feat_map_open(o, &st->shm, &err);
    Tandem__V1__FeatureShmAnswer a = TANDEM__V1__FEATURE_SHM_ANSWER__INIT;
    a.accepted = rc == TDM_OK;
    a.message = a.accepted ? "" : err.msg;
    if (a.accepted) {
        st->shm_why[0] = '\0';
        __atomic_fetch_add(&d->shm_accepted, 1, __ATOMIC_RELAXED);
        tdm_log_info(LOG,
                     "Draft stream: feature rows by shared memory (the verifier's %llu-byte ring, "
                     "nonce checked; %s)",
                     (unsigned long long)st->shm.ring_bytes, d->feat_setting);
    } else {
        snprintf(st->shm_why, sizeof(st->shm_why), "its offer was refused: %s", err.msg);
        __atomic_fetch_add(&d->shm_refused, 1, __ATOMIC_RELAXED);
        if (d->feat_transport == TDM_FEAT_TRANSPORT_SHM)
            tdm_log_error(LOG,
                          "Draft stream: %s, but the verifier's shared-memory ring cannot be "
                          "used: %s",
                          d->feat_setting, err.msg);
        else
            tdm_log_info(LOG,
                         "Draft stream: feature rows by grpc (the shared-memory ring "
                         "offered is refused: %s)",
                         err.msg);
    }
    Tandem__V1__DraftResponse r = TANDEM__V1__DRAFT_RESPONSE__INIT;
    r.kind_case = TANDEM__V1__DRAFT_RESPONSE__KIND_SHM_ANSWER;
    r.shm_answer = &a;
    tdm_error werr = {0};
    dstream_write(st, &r, &werr);
}

/* The verifier offers an exchange lane: mapped and its nonce checked, or
 * refused (another host, exchange_transport grpc here), and answered on the
 * stream; accepted, every later response goes into the lane. */
static void apply_lane_offer(dstream *st, const Tandem__V1__LaneOffer *o)
{
    drafter *d = st->d;
    tdm_error err = {0};
    tdm_status rc = TDM_OK;
    tdm_lane *lane = NULL;
    if (st->lane)
        rc = tdm_error_set(&err, TDM_ERR_FAILED_PRECONDITION,
                           "this Draft stream has an exchange lane already");
    else if (d->lane_transport == TDM_LANE_TRANSPORT_GRPC)
        rc = tdm_error_set(&err, TDM_ERR_FAILED_PRECONDITION, "%s on the drafter", d->lane_setting);
    else
        rc = tdm_lane_open(o, &lane, &err);
    Tandem__V1__LaneAnswer a = TANDEM__V1__LANE_ANSWER__INIT;
    a.accepted = rc == TDM_OK;
    a.message = a.accepted ? "" : err.msg;
    if (a.accepted) {
        __atomic_store_n(&st->lane, lane, __ATOMIC_RELEASE);
        __atomic_fetch_add(&d->lane_accepted, 1, __ATOMIC_RELAXED);
        tdm_log_info(LOG,
                     "Draft stream: exchange by shared memory (the verifier's lane, nonce "
                     "checked; %s)",
                     d->lane_setting);
    } else {
        __atomic_fetch_add(&d->lane_refused, 1, __ATOMIC_RELAXED);
        if (d->lane_transport == TDM_LANE_TRANSPORT_SHM)
            tdm_log_error(LOG,
                          "Draft stream: %s, but the verifier's shared-memory lane cannot be "
                          "used: %s",
                          d->lane_setting, err.msg);
        else
            tdm_log_info(LOG, "Draft stream: exchange by grpc (the lane offered is refused: %s)",
                         err.msg);
    }
    Tandem__V1__DraftResponse r = TANDEM__V1__DRAFT_RESPONSE__INIT;
    r.kind_case = TANDEM__V1__DRAFT_RESPONSE__KIND_LANE_ANSWER;
    r.lane_answer = &a;
    r.shm_consumed = st->shm.consumed;
    tdm_error werr = {0};
    dstream_write(st, &r, &werr);
    st->lane_tx = a.accepted; /* the answer was the last response on the stream */
}

static void apply(dstream *st, const Tandem__V1__DraftRequest *m, double t_arrived)
{
    switch (m->kind_case) {
    case TANDEM__V1__DRAFT_REQUEST__KIND_OPEN:
        apply_open(st, m->open, t_arrived);
        break;
    case TANDEM__V1__DRAFT_REQUEST__KIND_VERDICT:
        apply_verdict(st, m->verdict, t_arrived);
        break;
    case TANDEM__V1__DRAFT_REQUEST__KIND_FEATURES:
        apply_chunk(st, m->features);
        break;
    case TANDEM__V1__DRAFT_REQUEST__KIND_SHM_OFFER:
        apply_shm_offer(st, m->shm_offer);
        break;
    case TANDEM__V1__DRAFT_REQUEST__KIND_LANE_OFFER:
        apply_lane_offer(st, m->lane_offer);
        break;
    case TANDEM__V1__DRAFT_REQUEST__KIND_CLOSE: {
        dseq *q = dseq_find(st, m->close->sequence_id);
        if (q)
            dseq_remove(st, q);
        break;
    }
    default:
        tdm_log_warn(LOG, "a DraftRequest with no kind set; ignored");
        break;
    }
}

/* ---- drafting ------------------------------------------------------------- */

/* The uniform that draws a sampled request's draft at position pos. */
static double draft_uniform(const dseq *q, int pos)
{
    tdm_rng rng;
    tdm_rng_seed_at(&rng, q->seed, (uint64_t)pos, TDM_DRAW_DRAFT);
    return tdm_rng_uniform(&rng);
}

/* A drafted distribution's entries: the model's draft vocabulary, or the
 * MTP head's; the token of entry t. */
static int draft_width(const drafter *d)
{
    return d->rt ? tdm_model_draft_vocab_size(d->rt->model) : tdm_mtp_vocab_size(d->head->mtp);
}

static int32_t draft_id(const drafter *d, int t)
{
    return d->rt ? tdm_model_draft_vocab_id(d->rt->model, t) : tdm_mtp_vocab_id(d->head->mtp, t);
}

/* The drafting model's fastest host memory (pinned where it is on a GPU):
 * nbytes of it, or old freed (nbytes 0; NULL is fine). */
static void *draft_host(const drafter *d, void *old, size_t nbytes)
{
    if (nbytes == 0) {
        if (!old)
            return NULL;
        if (d->rt)
            tdm_model_host_free(d->rt->model, old);
        else
            tdm_mtp_host_free(d->head->mtp, old);
        return NULL;
    }
    return d->rt ? tdm_model_host_alloc(d->rt->model, nbytes)
                 : tdm_mtp_host_alloc(d->head->mtp, nbytes);
}

/* Keeps draft j's distribution in b: the tokens of p[0..n) with a
 * probability, in id order, entry t for d's draft_id t (d NULL: the id is
 * t), and the drawn token's probability. */
static void keep_dist(dblock *b, int j, const float *p, int n, const drafter *d)
{
    int support = 0;
    for (int t = 0; t < n; t++)
        support += p[t] > 0.0f;
    b->dist_ids[j] = tdm_xmalloc((size_t)(support ? support : 1) * sizeof(uint32_t));
    b->dist_probs[j] = tdm_xmalloc((size_t)(support ? support : 1) * sizeof(float));
    b->probs[j] = 0.0f;
    int k = 0;
    for (int t = 0; t < n && k < support; t++)
        if (p[t] > 0.0f) {
            const int32_t id = d ? draft_id(d, t) : t;
            b->dist_ids[j][k] = (uint32_t)id;
            b->dist_probs[j][k] = p[t];
            if (id == b->drafts[j])
                b->probs[j] = p[t];
            k++;
        }
    b->dist_n[j] = k;
}

/* Picks the next draft token into b at j, the token at `pos` of the
 * sequence: the row's argmax for greedy settings, else a draw from its
 * logits (with the distribution sent), keyed by the request's seed and pos. */
static void draw(dstream *st, dseq *q, dblock *b, const float *logits, int32_t argmax, int j,
                 int pos)
{
    int V = st->d->vocab;
    if (q->greedy) {
        b->drafts[j] = argmax;
        b->probs[j] = 1.0f;
        return;
    }
    tdm_sampling_probs(&q->sampling, logits, V, st->probs, st->order);
    b->drafts[j] = tdm_sampling_draw(st->probs, V, draft_uniform(q, pos));
    keep_dist(b, j, st->probs, V, NULL);
}

/* What a sequence drafts in a pass: its block (first step: the tokens the
 * model lacks, then one draft a step), or the one ahead (first step: what
 * the model lacks up to the block's last draft, whose row predicts the
 * verifier's next token; the chain's first token is that guess, the ones
 * after it the block drafted ahead). */
typedef struct dtarget {
    dseq *q;
    dblock *b;
    bool ahead;
    int k;     /* drafts wanted */
    int nlead; /* rows of the first step */
    const int32_t *lead;
    int32_t leadbuf[MAX_PENDING];
    int32_t chain[MAX_BLOCK + 1]; /* ahead: the guess, then the drafts */
    bool stop;
} dtarget;

/* The token the drafter proposes after q's tokens extended by `ext`. */
static int32_t propose(const dstream *st, const dseq *q, const int32_t *ext, int n_ext, int32_t own)
{
    return propose_after(st, q, q->n, ext, n_ext, own);
}

#ifdef TANDEM_BENCH_ORACLE
/* The oracle's chain of k proposals for q into f: false when no recorded
 * run continues q's tokens. After a wrong proposal no run continues the
 * context, and nothing past it can be accepted: the rest repeat it. An
 * ahead chain (after the block's drafts) is always forced: when its
 * context has no recorded run, the block holds a wrong draft and the chain
 * cannot stand, but the model still runs its rows. */
static bool oracle_block(const dstream *st, const dseq *q, bool ahead, int k, int32_t *f)
{
    int32_t ext[2 * MAX_BLOCK + 2];
    int ne = 0;
    if (ahead) {
        memcpy(ext, q->b.drafts, (size_t)q->b.k * sizeof(int32_t));
        ne = q->b.k;
    }
    for (int j = 0; j < k; j++) {
        f[j] = propose(st, q, ext, ne, -1);
        if (f[j] < 0) {
            if (j == 0 && !ahead)
                return false;
            f[j] = j > 0 ? f[j - 1] : q->b.drafts[q->b.k - 1];
        }
        ext[ne++] = f[j];
    }
    return true;
}

/* Moves the MTP pass's sequences (st->bs, mseqs, mk, mdrafts [0, n)) that
 * the oracle has proposals for to the front, their proposals in
 * st->mforced; returns how many. */
static int oracle_front(dstream *st, int n)
{
    int nf = 0;
    for (int i = 0; i < n; i++) {
        int32_t *f = st->mfbuf + (size_t)nf * MAX_BLOCK;
        if (!oracle_block(st, st->bs[i], false, st->mk[i], f))
            continue;
        dseq *q = st->bs[i];
        tdm_mtp_seq *ms = st->mseqs[i];
        int32_t *dr = st->mdrafts[i];
        const int kk = st->mk[i];
        st->bs[i] = st->bs[nf];
        st->mseqs[i] = st->mseqs[nf];
        st->mdrafts[i] = st->mdrafts[nf];
        st->mk[i] = st->mk[nf];
        st->bs[nf] = q;
        st->mseqs[nf] = ms;
        st->mdrafts[nf] = dr;
        st->mk[nf] = kk;
        st->mforced[nf++] = f;
    }
    return nf;
}
#endif

/* Room for the sampled chains of a pass: `blocks` of them, `drafts` in
 * all: their settings, uniforms and distributions (a draft vocabulary's
 * floats a draft, in the model's pinned host memory), grown on demand.
 * False when the host cannot hold them. */
static bool chain_probs(dstream *st, int blocks, int drafts)
{
    const size_t need = (size_t)drafts * (size_t)draft_width(st->d);
    if (st->cprobs_cap < need) {
        float *p = draft_host(st->d, NULL, need * sizeof(float));
        if (!p) {
            tdm_log_warn(LOG,
                         "no host memory for %d draft distributions of %d tokens: sampled "
                         "blocks go %s",
                         drafts, draft_width(st->d), st->d->rt ? "step by step" : "greedy");
            return false;
        }
        draft_host(st->d, st->cprobs, 0);
        st->cprobs = p;
        st->cprobs_cap = need;
    }
    if (st->cu_cap < drafts) {
        free(st->cu);
        st->cu = tdm_xmalloc((size_t)drafts * sizeof(double));
        st->cu_cap = drafts;
    }
    if (st->csamp_cap < blocks) {
        free(st->csamp);
        st->csamp = tdm_xmalloc((size_t)blocks * sizeof(*st->csamp));
        st->csamp_cap = blocks;
    }
    return true;
}

/* The blocks of a pass drafted on the device (tdm_seq_draft, or
 * tdm_seq_draft_sampled when some sample: the k steps of every sequence in
 * one launch, each step's argmax or draw fed to the next without a trip to
 * the host); those targets are marked done. An
 * ahead block's chain is one longer: its first token is the guess of the
 * verifier's next token. In the controlled-acceptance build the proposals
 * are worked out first and forced, so the model still runs every row; a
 * target whose proposals need the model's own choice is left to the
 * step-by-step loop. */
static void draft_chains(dstream *st, dtarget *tg, int live)
{
    int *idx = tdm_xmalloc((size_t)live * sizeof(int)),
        *kk = tdm_xmalloc((size_t)live * sizeof(int));
    int32_t **dp = tdm_xmalloc((size_t)live * sizeof(int32_t *));
    int32_t *fbuf = tdm_xmalloc((size_t)live * (MAX_BLOCK + 1) * sizeof(int32_t));
    const int32_t **fp = tdm_xmalloc((size_t)live * sizeof(int32_t *));
    const tdm_draft_sampling **sp = tdm_xcalloc((size_t)live, sizeof(*sp));
    const size_t Vl = (size_t)draft_width(st->d);
    bool forced = false;
    /* Sampled blocks as chains too, where the host holds their
     * distributions; else, and in the controlled-acceptance build (whose
     * proposals are greedy), step by step. */
#ifdef TANDEM_BENCH_ORACLE
    bool sampled = false;
#else
    bool sampled = true;
#endif
    int nblocks = 0, ndrafts = 0;
    for (int i = 0; i < live; i++)
        if (!tg[i].q->greedy && !tg[i].stop && !tg[i].ahead && tg[i].k >= 1) {
            nblocks++;
            ndrafts += tg[i].k;
        }
    sampled = sampled && nblocks > 0 && chain_probs(st, nblocks, ndrafts);
    int n = 0, ns = 0, nd = 0;
    for (int i = 0; i < live; i++) {
        dtarget *t = &tg[i];
        const int len = t->k + t->ahead; /* the chain's tokens */
        if (t->stop || t->k < 1)
            continue;
        int32_t *f = fbuf + (size_t)n * (MAX_BLOCK + 1);
        if (!t->q->greedy) {
            /* a sampled block (never drafted ahead): each draft drawn on
             * the device with the uniform its position gives it, its
             * distribution brought back with the drafts */
            if (t->ahead || !sampled)
                continue;
            tdm_draft_sampling *ds = &st->csamp[ns++];
            double *u = st->cu + nd;
            for (int j = 0; j < t->k; j++)
                u[j] = draft_uniform(t->q, t->q->n + j);
            *ds = (tdm_draft_sampling){t->q->sampling.temperature, t->q->sampling.top_p,
                                       t->q->sampling.top_k, u, st->cprobs + (size_t)nd * Vl};
            nd += t->k;
            sp[n] = ds;
        }
#ifdef TANDEM_BENCH_ORACLE
        if (!oracle_block(st, t->q, t->ahead, len, f))
            continue;
        forced = true;
#else
        (void)f;
#endif
        idx[n] = i;
        st->eseqs[n] = t->q->seq;
        st->tp[n] = t->lead;
        st->nrows[n] = t->nlead;
        kk[n] = len;
        dp[n] = t->ahead ? t->chain : t->b->drafts;
        fp[n] = f;
        n++;
    }
    if (n > 0) {
        tdm_error err = {0};
        const double t0 = now_us();
        tdm_status rc =
            ns > 0 ? tdm_seq_draft_sampled(st->eseqs, n, st->tp, st->nrows, kk, sp, dp, &err)
                   : tdm_seq_draft(st->eseqs, n, st->tp, st->nrows, kk, forced ? fp : NULL, dp,
                                   &err);
        const double chain = now_us() - t0;
        if (rc != TDM_OK)
            tdm_log_error(LOG, "draft pass failed: %s", err.msg);
        for (int x = 0; x < n; x++) {
            dtarget *t = &tg[idx[x]];
            dseq *q = t->q;
            t->stop = true;
            if (t->ahead) {
                if (rc != TDM_OK) {
                    q->ahead_want = false; /* its block's rows stay pending, as before */
                    continue;
                }
                q->assumed = t->chain[0];
                memcpy(t->b->drafts, t->chain + 1, (size_t)t->k * sizeof(int32_t));
            } else {
                q->t_chain += chain;
                if (rc != TDM_OK) {
                    q->np = 0; /* left at its committed position: answered with no drafts */
                    continue;
                }
            }
            /* the rows run: the lead, then every chain token but the last */
            const int len = t->k + t->ahead;
            memcpy(q->prow + q->np, t->lead, (size_t)t->nlead * sizeof(int32_t));
            q->np += t->nlead;
            for (int j = 0; j + 1 < len; j++)
                q->prow[q->np++] = t->ahead ? t->chain[j] : t->b->drafts[j];
            for (int j = 0; j < t->k; j++)
                if (sp[x])
                    keep_dist(t->b, j, sp[x]->probs + (size_t)j * Vl, (int)Vl, st->d);
                else
                    t->b->probs[j] = 1.0f;
            t->b->k = t->k;
        }
    }
    free(idx);
    free(kk);
    free(dp);
    free(fbuf);
    free(fp);
    free(sp);
}

/* The MTP head's pass over the nw sequences in st->bs: primes each one's
 * new rows, then drafts its block, both batched over the sequences. A
 * failure answers them with empty blocks; their next verdict then finds the
 * rows missing and the verifier goes on without drafts for them. */
static void mtp_pass(dstream *st, int nw)
{
    tdm_error err = {0};
    int n = 0;
    for (int i = 0; i < nw; i++) {
        dseq *q = st->bs[i];
        if (q->fin.rows == 0)
            continue;
        st->mseqs[n] = q->mseq;
        st->mhid[n] = q->fin.data;
        st->tp[n] = q->tokens + q->fin.position + 1; /* the token after each row's position */
        st->nrows[n] = q->fin.rows;
        n++;
    }
    tdm_status rc =
        n > 0 ? tdm_mtp_prime_n(st->mseqs, n, st->mhid, st->tp, st->nrows, NULL, &err) : TDM_OK;
    if (rc != TDM_OK)
        tdm_log_error(LOG, "MTP prime of %d sequences failed: %s", n, err.msg);
    n = 0;
    for (int i = 0; i < nw; i++) {
        dseq *q = st->bs[i];
        if (rc == TDM_OK)
            q->primed += q->fin.rows;
        tdm_feat_in_clear(&q->fin);
        if (rc != TDM_OK || q->primed == 0 || q->primed != q->n - 1)
            continue;
        st->mseqs[n] = q->mseq;
        st->mk[n] = q->block_size;
        st->mdrafts[n] = q->b.drafts;
        st->bs[n++] = q;
    }
    /* In the controlled-acceptance build, the sequences the oracle has
     * proposals for draft first, forced to them; then the others. */
    int nf = 0;
#ifdef TANDEM_BENCH_ORACLE
    nf = oracle_front(st, n);
#endif
    if (nf > 0 && (rc = tdm_mtp_draft_n(st->mseqs, nf, st->mk, st->mforced, st->mdrafts, NULL,
                                        &err)) != TDM_OK)
        tdm_log_error(LOG, "MTP draft pass of %d sequences failed: %s", nf, err.msg);
    /* The others' sampled requests draw their drafts, each with the uniform
     * its position gives it, where the host holds their distributions; else
     * they take greedy drafts as one-hot distributions (exact either way). */
    const size_t W = (size_t)draft_width(st->d);
    int nb = 0, nd = 0;
    for (int i = nf; i < n; i++)
        if (!st->bs[i]->greedy) {
            nb++;
            nd += st->mk[i];
        }
    const tdm_draft_sampling **sp = NULL;
    if (nb > 0 && chain_probs(st, nb, nd)) {
        sp = tdm_xcalloc((size_t)n, sizeof(*sp));
        for (int i = nf, ns = 0, at = 0; i < n; i++) {
            const dseq *q = st->bs[i];
            if (q->greedy)
                continue;
            double *u = st->cu + at;
            for (int j = 0; j < st->mk[i]; j++)
                u[j] = draft_uniform(q, q->n + j);
            st->csamp[ns] = (tdm_draft_sampling){q->sampling.temperature, q->sampling.top_p,
                                                 q->sampling.top_k, u, st->cprobs + (size_t)at * W};
            sp[i] = &st->csamp[ns++];
            at += st->mk[i];
        }
    }
    if (rc == TDM_OK && n > nf &&
        (rc = sp ? tdm_mtp_draft_sampled(st->mseqs + nf, n - nf, st->mk + nf, sp + nf,
                                         st->mdrafts + nf, &err)
                 : tdm_mtp_draft_n(st->mseqs + nf, n - nf, st->mk + nf, NULL, st->mdrafts + nf,
                                   NULL, &err)) != TDM_OK)
        tdm_log_error(LOG, "MTP draft pass of %d sequences failed: %s", n - nf, err.msg);
    for (int i = 0; i < n && rc == TDM_OK; i++) {
        dseq *q = st->bs[i];
        for (int j = 0; j < st->mk[i]; j++)
            if (sp && sp[i])
                keep_dist(&q->b, j, sp[i]->probs + (size_t)j * W, (int)W, st->d);
            else
                q->b.probs[j] = 1.0f; /* greedy: a one-hot distribution */
        q->b.k = st->mk[i];
    }
    free(sp);
}

/* Drafts for every sequence that wants a block (ahead: every sequence whose
 * verdict is out and that runs ahead): step s of all of them runs as one
 * batched pass. */
static void draft_pass(dstream *st, bool ahead)
{
    drafter *d = st->d;
    int nw = 0;
    for (dseq *q = st->seqs; q; q = q->next) {
        if (!(ahead ? q->ahead_want : q->want))
            continue;
        if (!ahead) {
            if (catching_up(d, q))
                continue; /* catch_up first; it drafts with a later pass */
            q->picked = true;
            tdm_error err = {0};
            block_clear(&q->b);
            if (model_prepare(d, q, 0, &err) != TDM_OK) {
                tdm_log_error(LOG, "sequence %llu: %s", (unsigned long long)q->id, err.msg);
                continue; /* answered with an empty block */
            }
        }
        st->bs[nw++] = q;
    }
    if (nw == 0)
        return;
    if (d->head) {
        mtp_pass(st, nw);
        return;
    }
    if (!d->rt) {
        for (int i = 0; i < nw; i++) {
            dseq *q = st->bs[i];
            uint32_t out[MAX_BLOCK];
            int k = tdm_ngram_propose((const uint32_t *)q->tokens, q->n, d->ngram_min, d->ngram_max,
                                      q->block_size, out);
            for (int j = 0; j < k; j++) {
                q->b.drafts[j] = (int32_t)out[j];
                q->b.probs[j] = 1.0f;
            }
            q->b.k = k;
        }
        return;
    }
    dtarget *tg = st->targets;
    int live = 0;
    for (int i = 0; i < nw; i++) {
        dseq *q = st->bs[i];
        dtarget *t = &tg[live];
        *t = (dtarget){.q = q, .k = q->block_size, .ahead = ahead};
        if (!ahead) {
            t->b = &q->b;
            t->nlead = q->n - q->held; /* 1, or more after a fully accepted block */
            t->lead = q->tokens + q->held;
            if (t->nlead < 1 || t->nlead + t->k > MAX_PENDING)
                continue;
        } else {
            /* The model holds tokens[0..held) and np pending rows of the
             * tokens, then of the block's drafts; it runs what follows them,
             * up to the block's last draft. */
            block_clear(&q->a);
            t->b = &q->a;
            int have = q->held + q->np; /* of tokens[0..n) + drafts[0..k) */
            t->nlead = 0;
            for (int x = have; x < q->n + q->b.k && t->nlead < MAX_PENDING; x++)
                t->leadbuf[t->nlead++] = x < q->n ? q->tokens[x] : q->b.drafts[x - q->n];
            t->lead = t->leadbuf;
            if (t->nlead < 1 || q->np + t->nlead + t->k > MAX_PENDING) {
                q->ahead_want = false;
                continue;
            }
        }
        live++;
    }
    /* Greedy blocks, and every ahead block (greedy requests only), as
     * chains on the device; sampled blocks, and in the controlled-acceptance
     * build blocks the oracle has no proposals for, step by step below. */
    draft_chains(st, tg, live);
    /* The rest go step by step, their rows' logits or argmaxes through the
     * step buffer (pinned host memory of vocab floats a row, grown as the
     * rows grow: a pass the chains served reserves none). */
    int rest = 0, sampled = 0;
    for (int i = 0; i < live; i++) {
        rest += !tg[i].stop;
        sampled += !tg[i].stop && !tg[i].q->greedy;
    }
    if (rest == 0)
        return;
    tdm_error err = {0};
    const size_t rows = (size_t)rest * MAX_PENDING;
    if (tdm_step_buf_reserve(&st->out, d->rt->model, rows, sampled ? rows : 0, &err) != TDM_OK) {
        tdm_log_error(LOG, "draft pass: %s", err.msg);
        return;
    }
    for (int s = 0;; s++) {
        int n = 0, r = 0;
        for (int i = 0; i < live; i++) {
            dtarget *t = &tg[i];
            if (t->stop || s >= t->k)
                continue;
            int32_t *row = st->rows + r;
            int nr = 1;
            if (s == 0) {
                memcpy(row, t->lead, (size_t)t->nlead * sizeof(int32_t));
                nr = t->nlead;
            } else {
                row[0] = t->b->drafts[s - 1];
            }
            st->stepped[n] = i;
            st->eseqs[n] = t->q->seq;
            st->tp[n] = row;
            st->nrows[n] = nr;
            st->out.want[n] = !t->q->greedy; /* greedy: argmax only */
            n++;
            r += nr;
        }
        if (n == 0)
            break;
        tdm_step_out o = tdm_step_buf_out(&st->out);
        if (tdm_seq_verify_out(st->eseqs, n, st->tp, st->nrows, &o, &err) != TDM_OK) {
            /* The failed pass left those sequences at their committed
             * position: they are answered with the drafts made so far. */
            tdm_log_error(LOG, "draft pass failed: %s", err.msg);
            for (int x = 0; x < n; x++) {
                dtarget *t = &tg[st->stepped[x]];
                t->q->np = 0;
                t->stop = true;
            }
            break;
        }
        for (int x = 0, row = 0; x < n; x++) {
            dtarget *t = &tg[st->stepped[x]];
            dseq *q = t->q;
            const int last = row + st->nrows[x] - 1; /* the row that predicts the next token */
            memcpy(q->prow + q->np, st->tp[x], (size_t)st->nrows[x] * sizeof(int32_t));
            q->np += st->nrows[x];
            row += st->nrows[x];
            const int32_t am = st->out.argmax[last];
            draw(st, q, t->b, q->greedy ? NULL : st->out.logits + (size_t)last * (size_t)d->vocab,
                 am, s, q->n + s);
            /* the tokens this draft follows, beyond the committed ones */
            t->b->drafts[s] = propose(st, q, t->b->drafts, s, t->b->drafts[s]);
            t->b->k = s + 1;
        }
    }
}

static tdm_status send_block(dstream *st, dseq *q, const dblock *b, uint32_t round,
                             uint32_t position, bool ahead, double t_msg, tdm_error *err)
{
    Tandem__V1__DraftBlock blk = TANDEM__V1__DRAFT_BLOCK__INIT;
    blk.sequence_id = q->id;
    blk.round = round;
    blk.n_tokens = (size_t)b->k;
    blk.tokens = (uint32_t *)b->drafts;
    blk.n_token_probs = (size_t)b->k;
    blk.token_probs = (float *)b->probs;
    blk.position = position;
    blk.ahead = ahead;
    blk.assumed_token = ahead ? (uint32_t)q->assumed : 0;
    blk.draft_micros = t_msg > 0 ? (uint32_t)(now_us() - t_msg) : 0;
    blk.first_sight = !ahead && q->first_sight;
    if (t_msg > 0 && b->k > 0)
        tdm_metric_observe(st->d->block_time, NULL, blk.draft_micros / 1e6);
    Tandem__V1__DraftDistribution dd[MAX_BLOCK];
    Tandem__V1__DraftDistribution *dp[MAX_BLOCK];
    if (b->k > 0 && b->dist_n[0] > 0) {
        for (int j = 0; j < b->k; j++) {
            tandem__v1__draft_distribution__init(&dd[j]);
            dd[j].n_ids = (size_t)b->dist_n[j];
            dd[j].ids = b->dist_ids[j];
            dd[j].n_probs = (size_t)b->dist_n[j];
            dd[j].probs = b->dist_probs[j];
            dp[j] = &dd[j];
        }
        blk.n_dists = (size_t)b->k;
        blk.dists = dp;
    }
    if (tdm_log_get_level() <= TDM_LOG_DEBUG) {
        char ids[MAX_BLOCK * 8 + 1] = "", dists[MAX_BLOCK * 12 + 32] = "";
        for (int j = 0, used = 0; j < b->k; j++)
            used += snprintf(ids + used, sizeof(ids) - (size_t)used, " %d", (int)b->drafts[j]);
        for (int j = 0, used = 0; blk.n_dists && j < b->k; j++)
            used += snprintf(dists + used, sizeof(dists) - (size_t)used, "%s %d",
                             j ? "" : "; supports of its distributions:", b->dist_n[j]);
        tdm_log_debug(LOG, "sequence %llu round %u: block at position %u:%s%s",
                      (unsigned long long)q->id, round, position, ids, dists);
    }
    Tandem__V1__DraftResponse r = TANDEM__V1__DRAFT_RESPONSE__INIT;
    r.kind_case = TANDEM__V1__DRAFT_RESPONSE__KIND_BLOCK;
    r.block = &blk;
    r.shm_consumed = st->shm.consumed;
    const double t_write = now_us();
    tdm_status rc = dstream_write(st, &r, err);
    tdm_metric_observe(st->d->write_time, NULL, (now_us() - t_write) / 1e6);
    if (rc == TDM_OK) {
        __atomic_fetch_add(&st->d->blocks, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&st->d->drafted, (uint64_t)b->k, __ATOMIC_RELAXED);
    }
    if (!ahead && q->timed && b->k > 0) {
        /* the block's stages, its send ending with the write */
        const double us[STAGES] = {q->t_taken - t_msg, q->t_pass0 - q->t_taken, q->t_chain,
                                   q->t_pass1 - q->t_pass0 - q->t_chain, now_us() - q->t_pass1};
        for (int i = 0; i < STAGES; i++)
            __atomic_fetch_add(&st->d->stage_us[i], (uint64_t)(us[i] > 0 ? us[i] : 0),
                               __ATOMIC_RELAXED);
        __atomic_fetch_add(&st->d->timed_blocks, 1, __ATOMIC_RELAXED);
        q->timed = false;
    }
    return rc;
}

/* Writes the blocks of this pass (ahead: the ahead ones). */
static tdm_status send_blocks(dstream *st, bool ahead, tdm_error *err)
{
    for (dseq *q = st->seqs; q; q = q->next) {
        tdm_status rc = TDM_OK;
        if (!ahead && q->want && q->picked) {
            q->want = q->picked = q->stuck = false;
            q->sent = true;
            rc = send_block(st, q, &q->b, q->round, (uint32_t)q->n, false, q->t_msg, err);
            /* Its verdict is out now: the next block may be drafted ahead. */
            q->ahead_want = q->run_ahead && q->b.k > 0 && q->b.k == q->block_size;
        } else if (ahead && q->ahead_want && q->a.k > 0) {
            q->ahead_want = false;
            q->ahead_sent = true;
            rc =
                send_block(st, q, &q->a, q->round + 1, (uint32_t)(q->n + q->b.k + 1), true, 0, err);
        } else if (ahead && q->ahead_want) {
            q->ahead_want = false;
        }
        if (rc != TDM_OK)
            return rc;
    }
    return TDM_OK;
}

/* ---- the stream ----------------------------------------------------------- */

/* Queues a verifier's message for the handler (under st->mu). */
static void enqueue_locked(dstream *st, Tandem__V1__DraftRequest *m)
{
    dqueue_item *it = tdm_xmalloc(sizeof(*it));
    it->msg = m;
    it->t_arrived = now_us();
    it->next = NULL;
    if (st->tail)
        st->tail->next = it;
    else
        st->head = it;
    st->tail = it;
}

/* Tells the handler that something changed (under st->mu): it polls gen,
 * then sleeps on cv. */
static void wake_locked(dstream *st)
{
    tdm_spin_bump(&st->gen);
    pthread_cond_broadcast(&st->cv);
}

/* Ends the stream for the handler (under st->mu): rc, and msg where rc is
 * not OK. */
static void end_locked(dstream *st, tdm_status rc, const char *msg)
{
    if (st->ended)
        return;
    st->ended = true;
    st->end_status = rc;
    snprintf(st->end_msg, sizeof(st->end_msg), "%s", msg ? msg : "");
}

/* The verifier's messages from its lane pipe (after its LaneSwitch), queued
 * as the stream's are, until the lane closes or fails. */
static void *lane_main(void *arg)
{
    dstream *st = arg;
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_error err = {0};
        tdm_status rc = tdm_lane_recv_msg(st->lane, st->d->max_message_bytes,
                                          &tandem__v1__draft_request__descriptor, &m, &err);
        if (rc == TDM_ERR_UNAVAILABLE)
            break; /* closed: the stream ended */
        if (rc != TDM_OK) {
            char msg[400];
            snprintf(msg, sizeof(msg), "exchange lane: %s", err.msg);
            tdm_log_error(LOG, "Draft stream: %s", msg);
            pthread_mutex_lock(&st->mu);
            end_locked(st, rc, msg);
            wake_locked(st);
            pthread_mutex_unlock(&st->mu);
            break;
        }
        if (!m) {
            /* Bytes that do not decode: say so, keep the stream (as on it). */
            tdm_log_warn(LOG, "Draft stream: a message on the exchange lane that does not decode "
                              "as a DraftRequest; ignored");
            continue;
        }
        pthread_mutex_lock(&st->mu);
        enqueue_locked(st, (Tandem__V1__DraftRequest *)m);
        wake_locked(st);
        pthread_mutex_unlock(&st->mu);
    }
    return NULL;
}

/* The verifier's LaneSwitch, its last message on the stream: the lane's
 * reader starts (every message before it is queued already). */
static void lane_switch(dstream *st)
{
    tdm_lane *lane = __atomic_load_n(&st->lane, __ATOMIC_ACQUIRE);
    if (!lane || st->has_lane_th) {
        tdm_log_warn(LOG, "Draft stream: a LaneSwitch %s; ignored",
                     lane ? "after the lane's start" : "with no lane accepted");
        return;
    }
    st->has_lane_th = pthread_create(&st->lane_th, NULL, lane_main, st) == 0;
    if (!st->has_lane_th) {
        pthread_mutex_lock(&st->mu);
        end_locked(st, TDM_ERR_RESOURCE_EXHAUSTED, "cannot start the exchange lane's reader");
        wake_locked(st);
        pthread_mutex_unlock(&st->mu);
    }
}

static void *reader_main(void *arg)
{
    dstream *st = arg;
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_error err = {0};
        tdm_status rc = tdm_rpc_call_read(st->call, &m, &err);
        if (rc == TDM_ERR_INVALID_ARGUMENT) {
            /* Bytes that do not decode: say so, keep the stream. */
            tdm_log_warn(LOG, "Draft stream: %s", err.msg);
            continue;
        }
        if (rc == TDM_OK && m &&
            ((Tandem__V1__DraftRequest *)m)->kind_case ==
                TANDEM__V1__DRAFT_REQUEST__KIND_LANE_SWITCH) {
            protobuf_c_message_free_unpacked(m, NULL);
            lane_switch(st);
            continue;
        }
        pthread_mutex_lock(&st->mu);
        if (rc != TDM_OK || !m) {
            end_locked(st, rc, NULL);
            /* a handler waiting for room in the lane, and the lane's reader, return */
            tdm_lane *lane = __atomic_load_n(&st->lane, __ATOMIC_ACQUIRE);
            if (lane)
                tdm_lane_close(lane);
        } else {
            enqueue_locked(st, (Tandem__V1__DraftRequest *)m);
        }
        wake_locked(st);
        bool end = st->ended && (rc != TDM_OK || !m);
        pthread_mutex_unlock(&st->mu);
        if (end)
            break;
    }
    return NULL;
}

/* Whether some sequence wants a block (one left by a catch-up that a
 * message cut short), or would draft ahead in an idle moment. */
static bool blocks_pending(const dstream *st)
{
    for (const dseq *q = st->seqs; q; q = q->next)
        if (q->want || q->ahead_want)
            return true;
    return false;
}

/* ... or a scoring open waits for its catch-up. */
static bool work_pending(const dstream *st)
{
    if (blocks_pending(st))
        return true;
    for (const dseq *q = st->seqs; q; q = q->next)
        if (q->scoring)
            return true;
    return false;
}

static tdm_status draft_stream(tdm_rpc_call *call, tdm_error *err, void *user)
{
    drafter *d = user;
    tdm_status trc = tdm_trust_check_internal(d->trust, call, "verifier", err);
    if (trc != TDM_OK)
        return trc;
    dstream st = {.d = d, .call = call};
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    if (d->rt || d->head) {
        /* a model's sampled drafts; an n-gram drafter draws none (and its
         * vocabulary may be every id, 1 << 30) */
        st.probs = tdm_xmalloc((size_t)d->vocab * sizeof(float));
        st.order = tdm_xmalloc((size_t)d->vocab * sizeof(int));
    }
    size_t cap = (size_t)d->max_sequences;
    st.bs = tdm_xcalloc(cap, sizeof(*st.bs));
    st.targets = tdm_xcalloc(cap, sizeof(*st.targets));
    st.stepped = tdm_xcalloc(cap, sizeof(*st.stepped));
    st.eseqs = tdm_xcalloc(cap, sizeof(*st.eseqs));
    st.rows = tdm_xcalloc(cap * MAX_PENDING, sizeof(*st.rows));
    st.tp = tdm_xcalloc(cap, sizeof(*st.tp));
    st.nrows = tdm_xcalloc(cap, sizeof(*st.nrows));
    st.mseqs = tdm_xcalloc(cap, sizeof(*st.mseqs));
    st.mhid = tdm_xcalloc(cap, sizeof(*st.mhid));
    st.mdrafts = tdm_xcalloc(cap, sizeof(*st.mdrafts));
    st.mk = tdm_xcalloc(cap, sizeof(*st.mk));
#ifdef TANDEM_BENCH_ORACLE
    st.mfbuf = tdm_xcalloc(cap * MAX_BLOCK, sizeof(*st.mfbuf));
    st.mforced = tdm_xcalloc(cap, sizeof(*st.mforced));
#endif
    pthread_t reader;
    if (pthread_create(&reader, NULL, reader_main, &st) != 0)
        TDM_ASSERT(!"cannot start a Draft stream reader");
    __atomic_fetch_add(&d->streams, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&d->streams_mu);
    bool draining = d->draining;
    if (!draining) {
        st.next_open = d->open_streams;
        d->open_streams = &st;
    }
    pthread_mutex_unlock(&d->streams_mu);
    if (draining)
        tdm_rpc_call_abort(call, TDM_ERR_UNAVAILABLE, "the drafter is draining");
    tdm_status rc = TDM_OK;
    for (;;) {
        pthread_mutex_lock(&st.mu);
        /* Wait for messages, unless there is a block to draft ahead;
         * polled first (spin.h), so a verdict is taken the moment it lands. */
        if (!st.head && !st.ended && !work_pending(&st)) {
            const uint64_t seen = atomic_load(&st.gen);
            pthread_mutex_unlock(&st.mu);
            tdm_spin_changed(&st.gen, seen);
            pthread_mutex_lock(&st.mu);
        }
        while (!st.head && !st.ended && !work_pending(&st))
            pthread_cond_wait(&st.cv, &st.mu);
        dqueue_item *items = st.head;
        st.head = st.tail = NULL;
        bool ended = st.ended;
        if (ended && st.end_status != TDM_OK && st.end_msg[0])
            rc = tdm_error_set(err, st.end_status, "%s", st.end_msg);
        pthread_mutex_unlock(&st.mu);
        st.t_taken = now_us();
        pthread_mutex_lock(&d->model_mu);
        while (items) {
            dqueue_item *next = items->next;
            apply(&st, items->msg, items->t_arrived);
            protobuf_c_message_free_unpacked(&items->msg->base, NULL);
            free(items);
            items = next;
        }
        if (ended) {
            pthread_mutex_unlock(&d->model_mu);
            break;
        }
        /* Blocks that answer a verdict first, then the sequences that
         * catch up (each of them in turn, as long as no message waits);
         * the ahead blocks only when no message waits (a verdict may make
         * them moot). */
        bool ahead = false;
        bool any = false, behind = false;
        for (dseq *q = st.seqs; q; q = q->next) {
            const bool late = q->want && catching_up(d, q);
            any |= q->want && !late;
            behind |= late;
        }
        if (!any && behind) {
            catch_up(&st);
            for (dseq *q = st.seqs; q; q = q->next)
                any |= q->want && !catching_up(d, q);
        }
        if (!any) {
            pthread_mutex_lock(&st.mu);
            ahead = !st.head && !behind && blocks_pending(&st);
            pthread_mutex_unlock(&st.mu);
            /* Scores last: nothing waits for them but the estimates. */
            if (!ahead && !behind && !message_waiting(&st))
                score_pending(&st);
        }
        if (any || ahead) {
            const uint64_t fs = tdm_runtime_graph_first_sights(d->rt ? d->rt : d->head);
            const double t0 = now_us();
            draft_pass(&st, ahead);
            const double t1 = now_us();
            tdm_metric_observe(d->pass_time, NULL, (t1 - t0) / 1e6);
            const bool first = tdm_runtime_graph_first_sights(d->rt ? d->rt : d->head) != fs;
            for (dseq *q = st.seqs; q && !ahead; q = q->next)
                if (q->picked) {
                    q->first_sight = first || q->prep_first;
                    q->prep_first = false;
                    q->t_pass0 = t0;
                    q->t_pass1 = t1;
                }
        }
        pthread_mutex_unlock(&d->model_mu);
        tdm_error werr = {0};
        if ((any || ahead) && send_blocks(&st, ahead, &werr) != TDM_OK) {
            /* The call ended under us; the reader sees the end too. */
            rc = tdm_error_set(err, werr.code, "%s", werr.msg);
            break;
        }
    }
    if (st.lane)
        tdm_lane_close(st.lane); /* its reader returns */
    if (rc != TDM_OK) /* the reader's read returns (a lane that failed leaves the stream up) */
        tdm_rpc_call_abort(call, rc, err ? err->msg : "the Draft stream failed");
    pthread_join(reader, NULL);
    if (st.has_lane_th)
        pthread_join(st.lane_th, NULL);
    tdm_lane_destroy(st.lane);
    free(st.wbuf);
    pthread_mutex_lock(&d->streams_mu);
    for (dstream **pp = &d->open_streams; *pp; pp = &(*pp)->next_open)
        if (*pp == &st) {
            *pp = st.next_open;
            break;
        }
    pthread_mutex_unlock(&d->streams_mu);
    pthread_mutex_lock(&d->model_mu);
    while (st.seqs)
        dseq_remove(&st, st.seqs);
    for (dqueue_item *it = st.head; it;) {
        dqueue_item *next = it->next;
        protobuf_c_message_free_unpacked(&it->msg->base, NULL);
        free(it);
        it = next;
    }
    tdm_step_buf_free(&st.out);
    free(st.score_am);
    draft_host(d, st.cprobs, 0);
    free(st.cu);
    free(st.csamp);
    tdm_feat_map_close(&st.shm);
    pthread_mutex_unlock(&d->model_mu);
    free(st.probs);
    free(st.order);
    free(st.bs);
    free(st.targets);
    free(st.stepped);
    free(st.eseqs);
    free(st.rows);
    free(st.tp);
    free(st.nrows);
    free(st.mseqs);
    free(st.mhid);
    free(st.mdrafts);
    free(st.mk);
    free(st.mfbuf);
    free(st.mforced);
    pthread_mutex_destroy(&st.mu);
    pthread_cond_destroy(&st.cv);
    __atomic_fetch_sub(&d->streams, 1, __ATOMIC_RELAXED);
    return rc;
}

static size_t counters(void *arg, tdm_service_counter *out, size_t max)
{
    drafter *d = arg;
    tdm_runtime_graph_stats gs;
    tdm_runtime_graph_stats_get(d->rt ? d->rt : d->head, &gs);
    tdm_service_counter all[] = {
        {"draft_streams", (double)__atomic_load_n(&d->streams, __ATOMIC_RELAXED)},
        {"open_sequences", (double)__atomic_load_n(&d->open_sequences, __ATOMIC_RELAXED)},
        {"blocks", (double)__atomic_load_n(&d->blocks, __ATOMIC_RELAXED)},
        {"drafted_tokens", (double)__atomic_load_n(&d->drafted, __ATOMIC_RELAXED)},
        {"ahead_blocks_used", (double)__atomic_load_n(&d->ahead_used, __ATOMIC_RELAXED)},
        {"ahead_blocks_dropped", (double)__atomic_load_n(&d->ahead_dropped, __ATOMIC_RELAXED)},
        {"prefilled_tokens", (double)__atomic_load_n(&d->prefilled, __ATOMIC_RELAXED)},
        {"scores", (double)__atomic_load_n(&d->scores, __ATOMIC_RELAXED)},
        {"scored_positions", (double)__atomic_load_n(&d->scored, __ATOMIC_RELAXED)},
        {"max_sequences", (double)d->max_sequences},
        {"feature_rows_shm", (double)__atomic_load_n(&d->feat_rows_shm, __ATOMIC_RELAXED)},
        {"feature_bytes_shm", (double)__atomic_load_n(&d->feat_bytes_shm, __ATOMIC_RELAXED)},
        {"feature_rows_grpc", (double)__atomic_load_n(&d->feat_rows_grpc, __ATOMIC_RELAXED)},
        {"feature_bytes_grpc", (double)__atomic_load_n(&d->feat_bytes_grpc, __ATOMIC_RELAXED)},
        {"feature_streams_shm", (double)__atomic_load_n(&d->shm_accepted, __ATOMIC_RELAXED)},
        {"feature_shm_refused", (double)__atomic_load_n(&d->shm_refused, __ATOMIC_RELAXED)},
        {"exchange_streams_shm", (double)__atomic_load_n(&d->lane_accepted, __ATOMIC_RELAXED)},
        {"exchange_lane_refused", (double)__atomic_load_n(&d->lane_refused, __ATOMIC_RELAXED)},
        TDM_GRAPH_COUNTERS(gs),
        {"timed_blocks", (double)__atomic_load_n(&d->timed_blocks, __ATOMIC_RELAXED)},
#define STAGE_COUNTER(i) {stage_keys[i], (double)__atomic_load_n(&d->stage_us[i], __ATOMIC_RELAXED)}
        STAGE_COUNTER(0),
        STAGE_COUNTER(1),
        STAGE_COUNTER(2),
        STAGE_COUNTER(3),
        STAGE_COUNTER(4),
#undef STAGE_COUNTER
    };
    return tdm_service_counters_copy(all, TDM_ARRAY_LEN(all), out, max);
}

static void load(void *arg, uint32_t *active, uint32_t *free_slots)
{
    drafter *d = arg;
    int open = __atomic_load_n(&d->open_sequences, __ATOMIC_RELAXED);
    *active = (uint32_t)(open > 0 ? open : 0);
    *free_slots = open < d->max_sequences ? (uint32_t)(d->max_sequences - open) : 0;
}

/* Draining: end every Draft stream at once, so that verifiers go on without
 * this drafter (plain decoding from their committed state) instead of the
 * process waiting its whole shutdown grace for streams that never end. */
static void drafter_on_shutdown(void *arg)
{
    drafter *d = arg;
    pthread_mutex_lock(&d->streams_mu);
    d->draining = true;
    for (dstream *st = d->open_streams; st; st = st->next_open)
        tdm_rpc_call_abort(st->call, TDM_ERR_UNAVAILABLE, "the drafter is draining");
    pthread_mutex_unlock(&d->streams_mu);
}

/* A model drafter on CUDA graphs, before it serves. Its workspace is set at
 * the rows of its largest step (a prompt's catch-up chunk, or the lead rows
 * of a pass over every sequence), so that it does not move later: a step's
 * graph is keyed by it, and each time it grew every graph was captured
 * again. Then each block length it may be asked for is drafted twice on a
 * throwaway sequence, after one lead row (a verdict that rejected a draft)
 * and after two (one that accepted its block whole, the last draft folded
 * in): the first sight of a chain's shape runs eagerly, the second
 * captures its graph. The first blocks of a fresh drafter then replay
 * graphs. Before, on one H200, some 40 of the ~560 rounds of a fresh
 * drafter's first adaptive load ran eagerly or captured (each new block
 * length a new shape), each a few ms slower. */
static tdm_status warm_chains(drafter *d, int block, tdm_error *err)
{
    tdm_model *m = d->rt->model;
    const int rows =
        TDM_PREFILL_ROWS > 2 * d->max_sequences ? TDM_PREFILL_ROWS : 2 * d->max_sequences;
    const double t0 = now_us();
    tdm_status rc = tdm_model_reserve_workspace(m, rows, err);
    if (rc != TDM_OK)
        return rc;
    tdm_seq_params p = {.strategy = d->strategy, .max_draft = TDM_MAX_DRAFT_BLOCK};
    tdm_seq *s = NULL;
    if ((rc = tdm_seq_create(m, &p, &s, err)) != TDM_OK)
        return rc;
    const int32_t tok[2] = {0, 0};
    int32_t drafts[MAX_BLOCK];
#ifdef TANDEM_BENCH_ORACLE
    /* its chains are forced (another graph key) */
    const int32_t forced[MAX_BLOCK] = {0}, *fp = forced, *const *fpp = &fp;
#else
    const int32_t *const *fpp = NULL;
#endif
    int chains = 0;
    rc = tdm_seq_prefill(s, tok, 1, NULL, err);
    for (int lead = 1; lead <= 2 && rc == TDM_OK; lead++)
        for (int k = 1; k <= block && rc == TDM_OK; k++)
            for (int sight = 0; sight < 2 && rc == TDM_OK; sight++) {
                const int32_t *lp = tok;
                int32_t *dp = drafts;
                rc = tdm_seq_draft(&s, 1, &lp, &lead, &k, fpp, &dp, err);
                if (rc == TDM_OK)
                    rc = tdm_seq_commit(s, 0, err);
                chains++;
            }
    tdm_seq_destroy(s);
    if (rc == TDM_OK)
        tdm_log_info(LOG,
                     "drafted %d warm-up chains (blocks of 1..%d after 1 and 2 lead rows) in "
                     "%.0f ms: their CUDA graphs are captured; workspace of %d rows",
                     chains, block, (now_us() - t0) * 1e-3, rows);
    return rc;
}

/* Prefills a prompt on a throwaway sequence (tdm_model_warm_prompt), then
 * times the model drafter's draft passes before it serves, for its
 * Descriptor's draft_pass_costs: a block of `block` tokens for each of n = 1,
 * 2, 4, 8, 16 throwaway sequences (at most max_sequences), after one lead
 * row, then (block > 1) a block of one token for one sequence: what a pass
 * costs whatever its length is the line through the two of one sequence,
 * which a verifier counts once a round, not once a draft (one H100: the
 * demo drafter 0.027 ms a pass and 0.092 a token, the 0.8B shape no pass
 * cost). Each shape runs until it runs without a first sight (on CUDA
 * graphs a chain runs eagerly, then is captured), then the median of three
 * is kept. A verifier's adaptive rule starts from them until its rounds
 * measure what a draft costs: without them, a fresh verifier's first
 * requests all open on the drafter to find out. A failure reports nothing (not an error:
 * the rule then starts from its own guess). */
static void time_passes(drafter *d, tdm_service *svc, int block)
{
    enum { MOST = 16 };
    tdm_model *m = d->rt->model;
    tdm_seq *seqs[MOST] = {0};
    const int32_t tok = 0, *leads[MOST];
    int32_t drafts[MOST][MAX_BLOCK], *dps[MOST];
    int nlead[MOST], ks[MOST], made = 0, sizes[MOST + 1], blocks[MOST + 1], n_sizes = 0;
    double ms[MOST + 1];
#ifdef TANDEM_BENCH_ORACLE
    const int32_t forced[MAX_BLOCK] = {0};
    const int32_t *fps[MOST];
    for (int i = 0; i < MOST; i++)
        fps[i] = forced;
    const int32_t *const *fpp = fps;
#else
    const int32_t *const *fpp = NULL;
#endif
    for (int i = 0; i < MOST; i++) {
        leads[i] = &tok;
        nlead[i] = 1;
        dps[i] = drafts[i];
    }
    tdm_error err = {0};
    tdm_status rc = TDM_OK;
    const int lock = tdm_timing_lock_acquire(d->rt->device_uuid, TDM_TIMING_LOCK_WAIT_MS, LOG);
    const double t_start = now_us();
    /* The first prompt's set-up, before the timings and the first open. */
    rc = tdm_model_warm_prompt(m, d->strategy, TDM_WARM_PROMPT_TOKENS, &err);
    /* the passes of `block` at n = 1, 2, 4, ...; then one of a block of one */
    int shape_n[MOST + 1], shape_k[MOST + 1], n_shapes = 0;
    for (int n = 1; n <= MOST && n <= d->max_sequences; n *= 2) {
        shape_n[n_shapes] = n;
        shape_k[n_shapes++] = block;
    }
    if (block > 1) {
        shape_n[n_shapes] = 1;
        shape_k[n_shapes++] = 1;
    }
    for (int sh = 0; sh < n_shapes && rc == TDM_OK; sh++) {
        const int n = shape_n[sh];
        for (; made < n && rc == TDM_OK; made++) {
            tdm_seq_params p = {.strategy = d->strategy, .max_draft = TDM_MAX_DRAFT_BLOCK};
            rc = tdm_seq_create(m, &p, &seqs[made], &err);
            if (rc == TDM_OK)
                rc = tdm_seq_prefill(seqs[made], &tok, 1, NULL, &err);
        }
        for (int i = 0; i < n; i++)
            ks[i] = shape_k[sh];
        double t[3];
        for (int j = 0, timed = 0; timed < 3 && rc == TDM_OK; j++) {
            const uint64_t fs = tdm_runtime_graph_first_sights(d->rt);
            const double t0 = now_us();
            rc = tdm_seq_draft(seqs, n, leads, nlead, ks, fpp, dps, &err);
            for (int i = 0; i < n && rc == TDM_OK; i++)
                rc = tdm_seq_commit(seqs[i], 0, &err);
            if (timed == 0 && tdm_runtime_graph_first_sights(d->rt) != fs && j < 3)
                continue;
            t[timed++] = (now_us() - t0) * 1e-3;
        }
        if (rc == TDM_OK) {
            sizes[n_sizes] = n;
            blocks[n_sizes] = shape_k[sh];
            ms[n_sizes++] = tdm_median3(t);
        }
    }
    for (int i = 0; i < made; i++)
        tdm_seq_destroy(seqs[i]);
    tdm_timing_lock_release(lock);
    if (rc != TDM_OK) {
        tdm_log_warn(LOG,
                     "draft passes could not be timed before serving (%s); verifiers start "
                     "from their own guess of what a draft costs",
                     err.msg);
        return;
    }
#ifdef TANDEM_BENCH_ORACLE
    /* The benchmark measures drafting ahead where a verifier would judge
     * that it does not pay, too: with no passes reported it cannot judge. */
    if (getenv("TANDEM_BENCH_HIDE_DEVICE"))
        n_sizes = 0;
#endif
    tdm_service_set_draft_costs(svc, sizes, blocks, ms, n_sizes);
    char line[320];
    size_t used = 0;
    for (int i = 0; i < n_sizes && used < sizeof(line); i++)
        used += (size_t)snprintf(line + used, sizeof(line) - used, "%s%d x %d: %.3f ms",
                                 i ? ", " : "", sizes[i], blocks[i], ms[i]);
    tdm_log_info(LOG, "draft passes timed in %.0f ms (sequences x tokens each: a pass): %s",
                 (now_us() - t_start) * 1e-3, line);
}

tdm_status drafter_setup(tdm_service *svc, void *arg, tdm_error *err)
{
    drafter *d = arg;
    const tdm_cfg *cfg = tdm_service_config(svc);
    const char *kind = tdm_cfg_str(cfg, "drafter_kind");
    d->trust = tdm_service_trust(svc);
    d->max_sequences = (int)tdm_cfg_int(cfg, "max_sequences");
    d->run_ahead = strcmp(tdm_cfg_str(cfg, "run_ahead"), "on") == 0;
    d->feat_transport = tdm_feat_transport_parse(tdm_cfg_str(cfg, "feature_transport"));
    tdm_cfg_describe(cfg, "feature_transport", d->feat_setting, sizeof(d->feat_setting));
    d->lane_transport = tdm_lane_transport_parse(tdm_cfg_str(cfg, "exchange_transport"));
    tdm_cfg_describe(cfg, "exchange_transport", d->lane_setting, sizeof(d->lane_setting));
    d->max_message_bytes = tdm_cfg_int(cfg, "max_message_size");
    d->ngram_min = 1;
    d->ngram_max = 4;
    if (tdm_drafter_kind_parse(kind) == TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MTP) {
        tdm_status rc = tdm_runtime_open_mtp_cfg(cfg, LOG, &d->head, err);
        if (rc == TDM_OK && strcmp(tdm_cfg_str(cfg, "weights"), "fp8") == 0)
            rc = tdm_runtime_set_weights_fp8(d->head, LOG, err);
        if (rc != TDM_OK)
            return rc;
        if (tdm_cfg_str(cfg, "draft_vocab")[0])
            tdm_service_set_draft_vocab(svc, tdm_mtp_vocab_size(d->head->mtp));
        const tdm_model_config *mc = tdm_mtp_get_config(d->head->mtp);
        d->vocab = mc->vocab_size;
        d->hidden = mc->hidden_size;
        tdm_service_set_device(svc, d->head->device_uuid, d->head->device_mps);
    } else if (tdm_drafter_kind_parse(kind) == TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MODEL) {
        tdm_status rc = tdm_runtime_open_cfg(cfg, LOG, &d->rt, err);
        if (rc == TDM_OK && strcmp(tdm_cfg_str(cfg, "weights"), "fp8") == 0)
            rc = tdm_runtime_set_weights_fp8(d->rt, LOG, err);
        if (rc == TDM_OK)
            rc = tdm_runtime_set_draft_vocab(d->rt, tdm_cfg_str(cfg, "draft_vocab"), LOG, err);
        if (rc != TDM_OK)
            return rc;
        if (tdm_cfg_str(cfg, "draft_vocab")[0])
            tdm_service_set_draft_vocab(svc, tdm_model_draft_vocab_size(d->rt->model));
        d->vocab = tdm_model_get_config(d->rt->model)->vocab_size;
        d->strategy = d->rt->strategy;
        const char *uuid = d->rt->device_uuid;
#ifdef TANDEM_BENCH_ORACLE
        /* The benchmark measures drafting ahead on a GPU shared with the
         * verifier too, which the verifier otherwise never asks for. */
        if (getenv("TANDEM_BENCH_HIDE_DEVICE"))
            uuid = "";
#endif
        tdm_service_set_device(svc, uuid, d->rt->device_mps);
    } else {
        /* Token ids are only compared: any id a verifier sends is valid. */
        const Tandem__V1__Descriptor *desc = tdm_service_descriptor(svc);
        d->vocab = desc->vocab_size ? (int)desc->vocab_size : 1 << 30;
        tdm_log_info(LOG, "n-gram drafter (prompt lookup, n = %d..%d)", d->ngram_min, d->ngram_max);
    }
    if (d->run_ahead)
        tdm_log_info(LOG, "drafting ahead of verdicts (greedy requests)");
#ifdef TANDEM_BENCH_ORACLE
    tdm_status orc = tdm_bench_oracle_load(err);
    if (orc != TDM_OK)
        return orc;
#endif
    if (d->rt && !strcmp(d->rt->backend_name, "cuda") && tdm_cfg_bool(cfg, "cuda_graphs") &&
        d->strategy != TDM_STATE_NO_BUFFER) {
        tdm_status wrc = warm_chains(d, (int)tdm_cfg_int(cfg, "draft_block_size"), err);
        if (wrc != TDM_OK)
            return wrc;
    }
    if (d->rt)
        time_passes(d, svc, (int)tdm_cfg_int(cfg, "draft_block_size"));
    d->block_time =
        tdm_metrics_histogram(tdm_service_metrics(svc), "tandem_drafter_block_duration_seconds",
                              "Time from a verdict (or open) to the block drafted for it.", NULL,
                              tdm_metrics_latency_buckets, tdm_metrics_n_latency_buckets);
    d->pass_time = tdm_metrics_histogram(
        tdm_service_metrics(svc), "tandem_drafter_pass_duration_seconds",
        "Time of a draft pass: the drafter's model or head over the stream's sequences that want "
        "a block (the rest of a block's duration is taking in the messages and sending).",
        NULL, tdm_metrics_latency_buckets, tdm_metrics_n_latency_buckets);
    d->write_time = tdm_metrics_histogram(
        tdm_service_metrics(svc), "tandem_drafter_block_write_duration_seconds",
        "Time of a block's gRPC write to its verifier (after its block duration).", NULL,
        tdm_metrics_latency_buckets, tdm_metrics_n_latency_buckets);
    tdm_service_set_counters(svc, counters, d);
    tdm_service_set_load(svc, load, d);
    tdm_rpc_server_on_shutdown(tdm_service_server(svc), drafter_on_shutdown, d);
    return tdm_rpc_server_add_bidi(tdm_service_server(svc), "/tandem.v1.Drafter/Draft",
                                   &tandem__v1__draft_request__descriptor, draft_stream, d, err);
}
