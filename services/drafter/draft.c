/*
 * draft.c - the drafter's Draft stream: sequences opened by a verifier, draft
 * blocks proposed for them, verdicts applied.
 *
 * One stream serves every sequence of one verifier. A reader thread queues
 * the verifier's messages; the handler thread takes everything queued,
 * applies it (open, verdict, close), then drafts for every sequence that
 * wants a block in one batched model pass per draft position, and writes the
 * blocks. Draft steps stay pending in the engine (appendable verify), so a
 * verdict rolls the draft model back to the accepted prefix exactly, with the
 * configured state strategy.
 *
 * A malformed or inconsistent message for one sequence answers that sequence
 * with a SequenceError (the verifier then goes on without drafts for it); the
 * stream and its other sequences go on.
 */
#include "drafter.h"

#include "alloc.h"
#include "defs.h"
#include "log.h"
#include "request_check.h"
#include "ngram.h"
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

typedef struct dseq {
    uint64_t id;
    int32_t *tokens; /* every committed token; the last one is not yet in the model */
    int n, cap;
    tdm_seq *seq; /* model drafter: holds tokens[0..n-1) when nothing is pending */
    tdm_sampling sampling;
    tdm_rng rng;
    /* the outstanding block */
    bool want; /* a block should be drafted in this pass */
    int block_size;
    uint32_t round;
    int k;    /* drafts in the outstanding block */
    int rows; /* model rows pending in the engine for it */
    int32_t drafts[MAX_BLOCK];
    float probs[MAX_BLOCK];
    uint32_t *dist_ids[MAX_BLOCK];
    float *dist_probs[MAX_BLOCK];
    int dist_n[MAX_BLOCK];
    struct dseq *next;
} dseq;

typedef struct dqueue_item {
    Tandem__V1__DraftRequest *msg;
    struct dqueue_item *next;
} dqueue_item;

typedef struct dstream {
    drafter *d;
    struct dstream *next_open; /* d->open_streams (under d->streams_mu) */
    tdm_rpc_call *call;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dqueue_item *head, *tail;
    bool ended;
    tdm_status end_status;
    dseq *seqs;
    int n_seqs;
    tdm_step_buf out; /* a draft pass's logits and argmaxes */
    float *probs;
    int *order;
    uint32_t draft_us; /* time of the last drafting pass */
} dstream;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* ---- sequences ------------------------------------------------------------- */

static void block_clear(dseq *q)
{
    for (int j = 0; j < q->k; j++) {
        free(q->dist_ids[j]);
        free(q->dist_probs[j]);
        q->dist_ids[j] = NULL;
        q->dist_probs[j] = NULL;
        q->dist_n[j] = 0;
    }
    q->k = 0;
}

static void dseq_free(dstream *st, dseq *q)
{
    block_clear(q);
    tdm_seq_destroy(q->seq);
    free(q->tokens);
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

static tdm_status send_error(dstream *st, uint64_t id, const char *msg)
{
    Tandem__V1__SequenceError e = TANDEM__V1__SEQUENCE_ERROR__INIT;
    e.sequence_id = id;
    e.message = (char *)msg;
    Tandem__V1__DraftResponse r = TANDEM__V1__DRAFT_RESPONSE__INIT;
    r.kind_case = TANDEM__V1__DRAFT_RESPONSE__KIND_ERROR;
    r.error = &e;
    tdm_log_warn(LOG, "sequence %llu: %s", (unsigned long long)id, msg);
    tdm_error err = {0};
    return tdm_rpc_call_write(st->call, &r.base, &err);
}

/* Brings the model to tokens[0..n-1): keeps what it already holds of a common
 * prefix, runs the rest. Nothing may be pending. */
static tdm_status model_sync(dstream *st, dseq *q, int held, tdm_error *err)
{
    drafter *d = st->d;
    if (!d->rt)
        return TDM_OK;
    int want = q->n - 1;
    if (q->seq && held > want) {
        /* The verifier went back further than a commit can: start over. */
        tdm_seq_destroy(q->seq);
        q->seq = NULL;
        held = 0;
    }
    if (!q->seq) {
        tdm_seq_params p = {.strategy = d->strategy, .max_draft = MAX_BLOCK};
        tdm_status rc = tdm_seq_create(d->rt->model, &p, &q->seq, err);
        if (rc != TDM_OK)
            return rc;
        held = 0;
    }
    if (want > held)
        return tdm_seq_prefill(q->seq, q->tokens + held, want - held, NULL, err);
    return TDM_OK;
}

static void apply_open(dstream *st, const Tandem__V1__SequenceOpen *o)
{
    drafter *d = st->d;
    tdm_error err = {0};
    if (o->n_tokens == 0) {
        send_error(st, o->sequence_id, "SequenceOpen.tokens is empty");
        return;
    }
    for (size_t i = 0; i < o->n_tokens; i++)
        if (o->tokens[i] >= (uint32_t)d->vocab) {
            char m[160];
            snprintf(m, sizeof(m),
                     "SequenceOpen.tokens[%zu] = %u is outside the vocabulary (0..%d)", i,
                     o->tokens[i], d->vocab - 1);
            send_error(st, o->sequence_id, m);
            return;
        }
    if (o->block_size < 1 || o->block_size > MAX_BLOCK) {
        char m[120];
        snprintf(m, sizeof(m), "SequenceOpen.block_size %u is outside 1..%d", o->block_size,
                 MAX_BLOCK);
        send_error(st, o->sequence_id, m);
        return;
    }
    dseq *q = dseq_find(st, o->sequence_id);
    int held = 0;
    if (q) {
        /* Resume: keep the model state of the common prefix. */
        if (q->rows > 0 && q->seq) {
            tdm_seq_commit(q->seq, 0, &err); /* drop the unanswered block's drafts */
            q->rows = 0;
            held = q->n; /* that commit kept tokens[n-1] */
        } else {
            held = q->n - 1;
        }
        int lcp = 0;
        int lim = q->n < (int)o->n_tokens ? q->n : (int)o->n_tokens;
        while (lcp < lim && q->tokens[lcp] == (int32_t)o->tokens[lcp])
            lcp++;
        if (!q->seq || lcp < held) {
            /* The model holds tokens the verifier no longer has: start over. */
            tdm_seq_destroy(q->seq);
            q->seq = NULL;
            held = 0;
        }
        block_clear(q);
    } else {
        if (st->n_seqs >= d->max_sequences) {
            char m[120];
            snprintf(m, sizeof(m),
                     "this drafter serves at most %d sequences per stream (max_sequences)",
                     d->max_sequences);
            send_error(st, o->sequence_id, m);
            return;
        }
        q = tdm_xcalloc(1, sizeof(*q));
        q->id = o->sequence_id;
        q->next = st->seqs;
        st->seqs = q;
        st->n_seqs++;
        __atomic_fetch_add(&d->open_sequences, 1, __ATOMIC_RELAXED);
    }
    if (!dseq_reserve(q, (int)o->n_tokens + MAX_BLOCK + 2)) {
        send_error(st, o->sequence_id, "out of memory for the sequence's tokens");
        dseq_remove(st, q);
        return;
    }
    for (size_t i = 0; i < o->n_tokens; i++)
        q->tokens[i] = (int32_t)o->tokens[i];
    q->n = (int)o->n_tokens;
    const Tandem__V1__SamplingParams *sp = o->sampling;
    q->sampling = tdm_req_sampling(sp);
    if (!tdm_sampling_is_greedy(&q->sampling) &&
        (q->sampling.top_k == 0 || q->sampling.top_k > DRAFT_SUPPORT_MAX))
        q->sampling.top_k = DRAFT_SUPPORT_MAX;
    tdm_rng_seed(&q->rng, sp && sp->seed_choice_case ? sp->seed : q->id);
    if (model_sync(st, q, held, &err) != TDM_OK) {
        send_error(st, q->id, err.msg);
        dseq_remove(st, q);
        return;
    }
    q->round = o->round;
    q->block_size = (int)o->block_size;
    q->want = true;
}

static void apply_verdict(dstream *st, const Tandem__V1__Verdict *v)
{
    drafter *d = st->d;
    tdm_error err = {0};
    dseq *q = dseq_find(st, v->sequence_id);
    if (!q) {
        send_error(st, v->sequence_id, "Verdict for a sequence this stream does not know");
        return;
    }
    char m[200];
    if (v->round != q->round || v->accepted > (uint32_t)q->k ||
        v->next_token >= (uint32_t)d->vocab || v->position != (uint32_t)(q->n + v->accepted + 1) ||
        v->block_size > MAX_BLOCK) {
        snprintf(m, sizeof(m),
                 "Verdict does not match the outstanding block (round %u/%u, accepted %u of %d, "
                 "position %u/%d)",
                 v->round, q->round, v->accepted, q->k, v->position, q->n + (int)v->accepted + 1);
        send_error(st, q->id, m);
        dseq_remove(st, q);
        return;
    }
    int a = (int)v->accepted;
    tdm_status rc = TDM_OK;
    /* Model rows pending: tokens[n-1] (the last committed) and drafts 1..rows-1. */
    int held = q->n - 1;
    if (q->seq && q->rows > 0) {
        int keep = a < q->rows - 1 ? a : q->rows - 1;
        rc = tdm_seq_commit(q->seq, keep, &err);
        held = q->n + keep;
        q->rows = 0;
    }
    for (int j = 0; j < a; j++)
        q->tokens[q->n++] = q->drafts[j];
    q->tokens[q->n++] = (int32_t)v->next_token;
    block_clear(q);
    if (rc == TDM_OK)
        rc = model_sync(st, q, held, &err);
    if (rc != TDM_OK) {
        send_error(st, q->id, err.msg);
        dseq_remove(st, q);
        return;
    }
    if (!dseq_reserve(q, q->n + MAX_BLOCK + 2)) {
        send_error(st, q->id, "out of memory for the sequence's tokens");
        dseq_remove(st, q);
        return;
    }
    q->round = v->round + 1;
    q->block_size = (int)v->block_size;
    q->want = v->block_size > 0;
}

static void apply(dstream *st, const Tandem__V1__DraftRequest *m)
{
    switch (m->kind_case) {
    case TANDEM__V1__DRAFT_REQUEST__KIND_OPEN:
        apply_open(st, m->open);
        break;
    case TANDEM__V1__DRAFT_REQUEST__KIND_VERDICT:
        apply_verdict(st, m->verdict);
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

/* Picks the next draft token, recording q: the row's argmax for greedy
 * settings, else a draw from its logits. */
static void draw(dstream *st, dseq *q, const float *logits, int32_t argmax, int j)
{
    int V = st->d->vocab;
    if (tdm_sampling_is_greedy(&q->sampling)) {
        q->drafts[j] = argmax;
        q->probs[j] = 1.0f;
        return;
    }
    int support = tdm_sampling_probs(&q->sampling, logits, V, st->probs, st->order);
    int x = tdm_sampling_draw(st->probs, V, tdm_rng_uniform(&q->rng));
    q->drafts[j] = x;
    q->probs[j] = st->probs[x];
    q->dist_ids[j] = malloc((size_t)support * sizeof(uint32_t));
    q->dist_probs[j] = malloc((size_t)support * sizeof(float));
    int n = 0;
    if (q->dist_ids[j] && q->dist_probs[j])
        for (int t = 0; t < V && n < support; t++)
            if (st->probs[t] > 0.0f) {
                q->dist_ids[j][n] = (uint32_t)t;
                q->dist_probs[j][n] = st->probs[t];
                n++;
            }
    q->dist_n[j] = n;
}

/* Drafts a block for every sequence that wants one: draft position j of all
 * of them runs as one batched pass. */
static void draft_all(dstream *st)
{
    drafter *d = st->d;
    int nw = 0;
    for (dseq *q = st->seqs; q; q = q->next)
        if (q->want) {
            q->k = 0;
            q->rows = 0;
            nw++;
        }
    if (nw == 0)
        return;
    if (!d->rt) {
        for (dseq *q = st->seqs; q; q = q->next)
            if (q->want) {
                uint32_t out[MAX_BLOCK];
                int k = tdm_ngram_propose((const uint32_t *)q->tokens, q->n, d->ngram_min,
                                          d->ngram_max, q->block_size, out);
                for (int j = 0; j < k; j++) {
                    q->drafts[j] = (int32_t)out[j];
                    q->probs[j] = 1.0f;
                }
                q->k = k;
            }
        return;
    }
    dseq **bs = malloc((size_t)nw * sizeof(*bs));
    tdm_seq **seqs = malloc((size_t)nw * sizeof(*seqs));
    int32_t *tok = malloc((size_t)nw * sizeof(int32_t));
    const int32_t **tp = malloc((size_t)nw * sizeof(*tp));
    int *one = malloc((size_t)nw * sizeof(int));
    tdm_error rerr = {0};
    if (!bs || !seqs || !tok || !tp || !one ||
        tdm_step_buf_reserve(&st->out, d->rt->model, (size_t)nw, &rerr) != TDM_OK) {
        tdm_log_error(LOG, "draft pass: %s", rerr.msg[0] ? rerr.msg : "out of memory");
        goto out;
    }
    for (int j = 0; j < MAX_BLOCK; j++) {
        int n = 0;
        for (dseq *q = st->seqs; q; q = q->next) {
            if (!q->want || q->k < j || j >= q->block_size)
                continue;
            bs[n] = q;
            seqs[n] = q->seq;
            tok[n] = j == 0 ? q->tokens[q->n - 1] : q->drafts[j - 1];
            tp[n] = &tok[n];
            one[n] = 1;
            st->out.want[n] = !tdm_sampling_is_greedy(&q->sampling); /* greedy: argmax only */
            n++;
        }
        if (n == 0)
            break;
        tdm_error err = {0};
        const tdm_step_out o = tdm_step_buf_out(&st->out);
        if (tdm_seq_verify_out(seqs, n, tp, one, &o, &err) != TDM_OK) {
            /* The failed pass left those sequences at their committed
             * position: answer them with no drafts this round. */
            tdm_log_error(LOG, "draft pass failed: %s", err.msg);
            for (int i = 0; i < n; i++) {
                block_clear(bs[i]);
                bs[i]->rows = 0;
            }
            break;
        }
        for (int i = 0; i < n; i++) {
            bs[i]->rows++;
            draw(st, bs[i], st->out.logits + (size_t)i * (size_t)d->vocab, st->out.argmax[i], j);
            bs[i]->k = j + 1;
        }
    }
out:
    free(bs);
    free(seqs);
    free(tok);
    free(tp);
    free(one);
}

static tdm_status send_blocks(dstream *st, tdm_error *err)
{
    for (dseq *q = st->seqs; q; q = q->next) {
        if (!q->want)
            continue;
        q->want = false;
        Tandem__V1__DraftBlock b = TANDEM__V1__DRAFT_BLOCK__INIT;
        b.sequence_id = q->id;
        b.round = q->round;
        b.n_tokens = (size_t)q->k;
        b.tokens = (uint32_t *)q->drafts;
        b.n_token_probs = (size_t)q->k;
        b.token_probs = q->probs;
        b.position = (uint32_t)q->n;
        b.draft_micros = st->draft_us; /* one batched pass drafted every block */
        Tandem__V1__DraftDistribution dd[MAX_BLOCK];
        Tandem__V1__DraftDistribution *dp[MAX_BLOCK];
        if (q->k > 0 && q->dist_n[0] > 0) {
            for (int j = 0; j < q->k; j++) {
                tandem__v1__draft_distribution__init(&dd[j]);
                dd[j].n_ids = (size_t)q->dist_n[j];
                dd[j].ids = q->dist_ids[j];
                dd[j].n_probs = (size_t)q->dist_n[j];
                dd[j].probs = q->dist_probs[j];
                dp[j] = &dd[j];
            }
            b.n_dists = (size_t)q->k;
            b.dists = dp;
        }
        Tandem__V1__DraftResponse r = TANDEM__V1__DRAFT_RESPONSE__INIT;
        r.kind_case = TANDEM__V1__DRAFT_RESPONSE__KIND_BLOCK;
        r.block = &b;
        tdm_status rc = tdm_rpc_call_write(st->call, &r.base, err);
        if (rc != TDM_OK)
            return rc;
        __atomic_fetch_add(&st->d->blocks, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&st->d->drafted, (uint64_t)q->k, __ATOMIC_RELAXED);
    }
    return TDM_OK;
}

/* ---- the stream ----------------------------------------------------------- */

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
        pthread_mutex_lock(&st->mu);
        if (rc != TDM_OK || !m) {
            st->ended = true;
            st->end_status = rc;
        } else {
            dqueue_item *it = malloc(sizeof(*it));
            if (it) {
                it->msg = (Tandem__V1__DraftRequest *)m;
                it->next = NULL;
                if (st->tail)
                    st->tail->next = it;
                else
                    st->head = it;
                st->tail = it;
            } else {
                protobuf_c_message_free_unpacked(m, NULL);
            }
        }
        pthread_cond_broadcast(&st->cv);
        bool end = st->ended;
        pthread_mutex_unlock(&st->mu);
        if (end)
            break;
    }
    return NULL;
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
    st.probs = malloc((size_t)d->vocab * sizeof(float));
    st.order = malloc((size_t)d->vocab * sizeof(int));
    pthread_t reader;
    if (!st.probs || !st.order || pthread_create(&reader, NULL, reader_main, &st) != 0) {
        free(st.probs);
        free(st.order);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "cannot start a Draft stream");
    }
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
        while (!st.head && !st.ended)
            pthread_cond_wait(&st.cv, &st.mu);
        dqueue_item *items = st.head;
        st.head = st.tail = NULL;
        bool ended = st.ended;
        pthread_mutex_unlock(&st.mu);
        pthread_mutex_lock(&d->model_mu);
        while (items) {
            dqueue_item *next = items->next;
            apply(&st, items->msg);
            protobuf_c_message_free_unpacked(&items->msg->base, NULL);
            free(items);
            items = next;
        }
        if (ended) {
            pthread_mutex_unlock(&d->model_mu);
            break;
        }
        double t0 = now_us();
        draft_all(&st);
        st.draft_us = (uint32_t)(now_us() - t0);
        pthread_mutex_unlock(&d->model_mu);
        tdm_error werr = {0};
        if (send_blocks(&st, &werr) != TDM_OK) {
            /* The call ended under us; the reader sees the end too. */
            rc = tdm_error_set(err, werr.code, "%s", werr.msg);
            break;
        }
    }
    pthread_join(reader, NULL);
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
    pthread_mutex_unlock(&d->model_mu);
    free(st.probs);
    free(st.order);
    pthread_mutex_destroy(&st.mu);
    pthread_cond_destroy(&st.cv);
    __atomic_fetch_sub(&d->streams, 1, __ATOMIC_RELAXED);
    return rc;
}

static size_t counters(void *arg, tdm_service_counter *out, size_t max)
{
    drafter *d = arg;
    tdm_service_counter all[] = {
        {"draft_streams", (double)__atomic_load_n(&d->streams, __ATOMIC_RELAXED)},
        {"open_sequences", (double)__atomic_load_n(&d->open_sequences, __ATOMIC_RELAXED)},
        {"blocks", (double)__atomic_load_n(&d->blocks, __ATOMIC_RELAXED)},
        {"drafted_tokens", (double)__atomic_load_n(&d->drafted, __ATOMIC_RELAXED)},
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

tdm_status drafter_setup(tdm_service *svc, void *arg, tdm_error *err)
{
    drafter *d = arg;
    const tdm_cfg *cfg = tdm_service_config(svc);
    const char *kind = tdm_cfg_str(cfg, "drafter_kind");
    d->trust = tdm_service_trust(svc);
    d->max_sequences = (int)tdm_cfg_int(cfg, "max_sequences");
    d->ngram_min = 1;
    d->ngram_max = 4;
    if (tdm_drafter_kind_parse(kind) == TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MODEL) {
        tdm_status rc = tdm_runtime_open_cfg(cfg, LOG, &d->rt, err);
        if (rc != TDM_OK)
            return rc;
        d->vocab = tdm_model_get_config(d->rt->model)->vocab_size;
        d->strategy = d->rt->strategy;
    } else {
        /* Token ids are only compared: any id a verifier sends is valid. */
        const Tandem__V1__Descriptor *desc = tdm_service_descriptor(svc);
        d->vocab = desc->vocab_size ? (int)desc->vocab_size : 1 << 30;
        tdm_log_info(LOG, "n-gram drafter (prompt lookup, n = %d..%d)", d->ngram_min, d->ngram_max);
    }
    tdm_service_set_counters(svc, counters, d);
    tdm_service_set_load(svc, load, d);
    tdm_rpc_server_on_shutdown(tdm_service_server(svc), drafter_on_shutdown, d);
    return tdm_rpc_server_add_bidi(tdm_service_server(svc), "/tandem.v1.Drafter/Draft",
                                   &tandem__v1__draft_request__descriptor, draft_stream, d, err);
}
