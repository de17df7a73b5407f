/*
 * vsched.c - see vsched.h. Read a round top to bottom in sched_round().
 */
#include "vsched.h"

#include "adaptive.h"
#include "compat.h"
#include "log.h"
#include "request_check.h"
#include "sampling.h"
#include "tandem/v1/drafter.pb-c.h"
#include "verify.h"

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOG "verifier"

/* ---- types ------------------------------------------------------------------ */

/* One Draft stream to one drafter, shared by every sequence it serves. */
typedef struct vlink {
    char address[256];
    tdm_rpc_channel *ch;
    tdm_rpc_stream *stream;
    bool broken;   /* no new sequences; sequences on it fall back to plain */
    char why[256]; /* why it broke */
    int refs;      /* the link table, each sequence on it, the reader thread */
    struct vlink *next;
    struct vsched *sched;
} vlink;

typedef enum { REQ_WAITING, REQ_ACTIVE, REQ_DONE } req_state;

struct vreq {
    uint64_t id; /* sequence id on the Draft stream */
    char request_id[96];
    /* what to generate */
    int32_t *tokens; /* [cap] prompt, then every committed generated token */
    int n_tokens, cap, prompt_len, max_tokens;
    int32_t *stop_ids;
    int n_stop;
    tdm_sampling sampling;
    tdm_rng rng;
    uint64_t seed;
    bool seeded; /* the client chose the seed */
    /* model state (scheduler thread only) */
    tdm_seq *seq;
    int32_t last; /* newest token, not yet run through the model */
    bool fresh;   /* admitted, prompt not yet run */
    /* speculation (scheduler thread, except the block fields: under mu) */
    vlink *link;
    char drafter_id[128];
    bool spec;             /* speculating with link */
    bool opened;           /* the drafter knows this sequence */
    bool awaiting;         /* a block was asked for and has not arrived */
    bool after_open;       /* the awaited block follows an open: its wait includes a prefill */
    double t_asked, t_got; /* when the awaited block was asked for and arrived */
    uint32_t round;        /* the round number the awaited block must carry */
    tdm_adaptive ad;
    Tandem__V1__DraftResponse *block; /* delivered by the reader, under mu */
    char spec_note[200];
    /* life cycle (under mu) */
    req_state state;
    bool cancelled;
    bool released; /* the scheduler will not touch it again */
    /* output (under mu) */
    int32_t *out;
    int n_out, out_cap, out_taken;
    bool finished;
    Tandem__V1__FinishReason reason;
    tdm_status fail;
    char fail_msg[256];
    pthread_cond_t cv;
    /* stats */
    double t_submit, t_first, t_end;
    uint32_t rounds, spec_rounds, drafted, accepted;
    struct vreq *next_waiting;
};

/* The time of one forward step as a function of its rows, t = a + b * rows,
 * fitted by least squares with exponential forgetting. A GPU streaming
 * weights has a large a (rows are nearly free); a compute-bound CPU has a
 * small a. Speculation's cost is judged against the plain step this predicts,
 * measured on the very rounds it runs, so no plain round is needed. */
typedef struct steptime {
    double s0, s1, s2, t0, t1; /* sums of w, w*R, w*R^2, w*t, w*R*t */
} steptime;

static void steptime_add(steptime *m, int rows, double ms)
{
    const double keep = 0.97;
    double R = rows;
    m->s0 = keep * m->s0 + 1;
    m->s1 = keep * m->s1 + R;
    m->s2 = keep * m->s2 + R * R;
    m->t0 = keep * m->t0 + ms;
    m->t1 = keep * m->t1 + R * ms;
}

/* Predicted time of a plain round of n rows; false until there is data. */
static bool steptime_plain(const steptime *m, int n, double *out)
{
    if (m->s0 < 1.0)
        return false;
    double det = m->s0 * m->s2 - m->s1 * m->s1;
    double meanR = m->s1 / m->s0, mean_t = m->t0 / m->s0;
    double b, a;
    if (det > 1e-6 * m->s0 * m->s0) {
        b = (m->s0 * m->t1 - m->s1 * m->t0) / det;
        a = (m->t0 - b * m->s1) / m->s0;
    } else {
        /* One row count seen so far: assume time proportional to rows. */
        b = mean_t / meanR;
        a = 0;
    }
    if (b < 0)
        b = 0;
    if (a < 0)
        a = 0;
    double t = a + b * n;
    if (!(t > 0))
        return false;
    *out = t;
    return true;
}

struct vsched {
    vsched_params p;
    int vocab;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* new work, blocks, cancellations */
    pthread_cond_t idle_cv; /* readers exiting */
    vreq *wait_head, *wait_tail;
    vreq **active; /* [max_sequences] */
    int n_active;
    vlink *links;
    int readers;
    bool stop;
    pthread_t thread;
    uint64_t next_id;
    vsched_counters counters;
    steptime st;             /* how a step's time grows with its rows */
    _Atomic double cost_ema; /* measured cost per drafted token, over recent rounds; 0 = none */
    /* Exchange overhead per block (wait minus the drafter's own time), us. */
    float overhead_us[4096];
    uint64_t n_overhead;
    /* scheduler-thread scratch */
    float *logits;   /* [logits_rows, vocab]: rows of sampling requests */
    int32_t *argmax; /* [logits_rows]: every row's argmax (greedy requests) */
    uint8_t *want;   /* [logits_rows]: per sequence of a step, logits wanted */
    size_t logits_rows;
    void *vscratch;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- links ------------------------------------------------------------------ */

static void link_unref_locked(vsched *s, vlink *l);

/* Marks a link broken and turns speculation off for every sequence on it. */
static void link_break_locked(vsched *s, vlink *l, const char *why)
{
    if (!l->broken) {
        l->broken = true;
        snprintf(l->why, sizeof(l->why), "%s", why);
        tdm_log_warn(LOG, "drafter %s: %s; its sequences continue without speculation", l->address,
                     why);
        s->counters.drafter_failures++;
        /* Leave the table: new requests get a fresh stream. */
        for (vlink **pp = &s->links; *pp; pp = &(*pp)->next)
            if (*pp == l) {
                *pp = l->next;
                link_unref_locked(s, l);
                break;
            }
        if (l->stream)
            tdm_rpc_stream_cancel(l->stream);
    }
    pthread_cond_broadcast(&s->cv);
}

static void link_unref_locked(vsched *s, vlink *l)
{
    (void)s;
    if (--l->refs > 0)
        return;
    if (l->stream)
        tdm_rpc_stream_destroy(l->stream);
    if (l->ch)
        tdm_rpc_channel_destroy(l->ch);
    free(l);
}

static vreq *find_active_locked(vsched *s, vlink *l, uint64_t id)
{
    for (int i = 0; i < s->n_active; i++)
        if (s->active[i]->id == id && s->active[i]->link == l)
            return s->active[i];
    return NULL;
}

static void req_drop_spec_locked(vreq *r, const char *fmt, const char *detail)
{
    if (!r->spec)
        return;
    r->spec = false;
    r->awaiting = false;
    snprintf(r->spec_note, sizeof(r->spec_note), fmt, detail);
}

/* Reader thread: delivers blocks to their sequences. */
static void *link_reader(void *arg)
{
    vlink *l = arg;
    vsched *s = l->sched;
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_error err = {0};
        tdm_status rc = tdm_rpc_stream_read(l->stream, &m, &err);
        pthread_mutex_lock(&s->mu);
        if (rc != TDM_OK || !m) {
            char why[300];
            snprintf(why, sizeof(why), "Draft stream ended (%s%s%s)", tdm_status_name(rc),
                     err.msg[0] ? ": " : "", err.msg);
            link_break_locked(s, l, why);
            for (int i = 0; i < s->n_active; i++)
                if (s->active[i]->link == l)
                    req_drop_spec_locked(s->active[i], "off: drafter failed (%s)", l->why);
            pthread_mutex_unlock(&s->mu);
            if (m)
                protobuf_c_message_free_unpacked(m, NULL);
            break;
        }
        Tandem__V1__DraftResponse *resp = (Tandem__V1__DraftResponse *)m;
        uint64_t id =
            resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_BLOCK   ? resp->block->sequence_id
            : resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_ERROR ? resp->error->sequence_id
                                                                        : 0;
        vreq *r = find_active_locked(s, l, id);
        bool keep = false;
        if (r && r->spec && r->awaiting) {
            if (resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_BLOCK &&
                resp->block->round == r->round) {
                if (r->block)
                    protobuf_c_message_free_unpacked(&r->block->base, NULL);
                r->block = resp;
                r->t_got = now_ms();
                keep = true;
            } else if (resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_ERROR) {
                req_drop_spec_locked(r, "off: drafter reported: %s", resp->error->message);
            }
            pthread_cond_broadcast(&s->cv);
        }
        pthread_mutex_unlock(&s->mu);
        if (!keep)
            protobuf_c_message_free_unpacked(m, NULL);
    }
    pthread_mutex_lock(&s->mu);
    link_unref_locked(s, l);
    s->readers--;
    pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* The live link to `address`, opened if needed. Returns a new reference, or
 * NULL with err set. */
static vlink *link_get_locked(vsched *s, const char *address, tdm_error *err)
{
    for (vlink *l = s->links; l; l = l->next)
        if (!l->broken && strcmp(l->address, address) == 0) {
            l->refs++;
            return l;
        }
    vlink *l = calloc(1, sizeof(*l));
    if (!l) {
        tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    snprintf(l->address, sizeof(l->address), "%s", address);
    l->sched = s;
    tdm_rpc_channel_options co = {
        .target = address, .tls = s->p.tls, .max_message_bytes = s->p.max_message_bytes};
    if (tdm_rpc_channel_create(&co, &l->ch, err) != TDM_OK ||
        tdm_rpc_stream_open(l->ch, "/tandem.v1.Drafter/Draft", NULL,
                            &tandem__v1__draft_response__descriptor, NULL, &l->stream,
                            err) != TDM_OK) {
        if (l->ch)
            tdm_rpc_channel_destroy(l->ch);
        free(l);
        return NULL;
    }
    l->refs = 3; /* table, caller, reader */
    pthread_t t;
    if (pthread_create(&t, NULL, link_reader, l) != 0) {
        tdm_rpc_stream_destroy(l->stream);
        tdm_rpc_channel_destroy(l->ch);
        free(l);
        tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "cannot start a Draft stream reader");
        return NULL;
    }
    pthread_detach(t);
    s->readers++;
    l->next = s->links;
    s->links = l;
    tdm_log_info(LOG, "opened a Draft stream to drafter %s", address);
    return l;
}

/* Sends one message on a link (scheduler thread, without mu). A failure
 * breaks the link. */
static void link_send(vsched *s, vlink *l, const Tandem__V1__DraftRequest *msg)
{
    tdm_error err = {0};
    if (tdm_rpc_stream_write(l->stream, &msg->base, &err) == TDM_OK)
        return;
    pthread_mutex_lock(&s->mu);
    char why[300];
    snprintf(why, sizeof(why), "write failed (%s: %s)", tdm_status_name(err.code), err.msg);
    link_break_locked(s, l, why);
    for (int i = 0; i < s->n_active; i++)
        if (s->active[i]->link == l)
            req_drop_spec_locked(s->active[i], "off: drafter failed (%s)", l->why);
    pthread_mutex_unlock(&s->mu);
}

static void send_open(vsched *s, vreq *r, int block)
{
    Tandem__V1__SequenceOpen open = TANDEM__V1__SEQUENCE_OPEN__INIT;
    Tandem__V1__SamplingParams sp = TANDEM__V1__SAMPLING_PARAMS__INIT;
    open.sequence_id = r->id;
    /* Every committed token, `last` included (it sits right after them). */
    r->tokens[r->n_tokens] = r->last;
    open.n_tokens = (size_t)r->n_tokens + 1;
    open.tokens = (uint32_t *)r->tokens; /* ids are non-negative: same bits */
    open.block_size = (uint32_t)block;
    sp.temperature = r->sampling.temperature;
    sp.top_p = r->sampling.top_p;
    sp.top_k = r->sampling.top_k;
    sp.seed_choice_case = TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED;
    sp.seed = r->seed ^ 0x5eedd4a7f7e5ull; /* the drafter's own stream of randomness */
    open.sampling = &sp;
    open.round = r->round;
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_OPEN;
    m.open = &open;
    link_send(s, r->link, &m);
}

static void send_verdict(vsched *s, vreq *r, int accepted, int32_t next, int block)
{
    Tandem__V1__Verdict v = TANDEM__V1__VERDICT__INIT;
    v.sequence_id = r->id;
    v.round = r->round - 1;
    v.accepted = (uint32_t)accepted;
    v.next_token = (uint32_t)next;
    v.block_size = (uint32_t)block;
    v.position = (uint32_t)r->n_tokens + 1;
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_VERDICT;
    m.verdict = &v;
    link_send(s, r->link, &m);
}

static void send_close(vsched *s, vlink *l, uint64_t id, const char *reason)
{
    Tandem__V1__SequenceClose c = TANDEM__V1__SEQUENCE_CLOSE__INIT;
    c.sequence_id = id;
    c.reason = (char *)reason;
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_CLOSE;
    m.close = &c;
    link_send(s, l, &m);
}

/* ---- requests ---------------------------------------------------------------- */

static void req_free(vreq *r)
{
    if (!r)
        return;
    if (r->block)
        protobuf_c_message_free_unpacked(&r->block->base, NULL);
    free(r->tokens);
    free(r->stop_ids);
    free(r->out);
    pthread_cond_destroy(&r->cv);
    free(r);
}

tdm_status vsched_submit(vsched *s, const Tandem__V1__RunRequest *req, vreq **out, tdm_error *err)
{
    *out = NULL;
    if (req->n_prompt_ids == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "prompt_ids is empty");
    for (size_t i = 0; i < req->n_prompt_ids; i++)
        if (req->prompt_ids[i] >= (uint32_t)s->vocab)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "prompt_ids[%zu] = %u is outside the vocabulary (0..%d)", i,
                                 req->prompt_ids[i], s->vocab - 1);
    if (req->max_tokens == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "max_tokens must be at least 1");
    const Tandem__V1__SamplingParams *sp = req->sampling;
    tdm_status crc = tdm_req_check_max_tokens(req->max_tokens, err);
    if (crc == TDM_OK)
        crc = tdm_req_check_sampling(sp, err);
    if (crc != TDM_OK)
        return crc;
    const Tandem__V1__DrafterAssignment *da = req->drafter;
    if (da && da->address[0] &&
        tdm_compat_check_request_block(da->block_size, "drafter.block_size", "(this verifier)",
                                       (uint32_t)s->p.max_draft, err) != TDM_OK)
        return err->code;
    if (req->snapshot_id && req->snapshot_id[0])
        return tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                             "snapshot_id: resuming from state snapshots is not supported by "
                             "this verifier yet");

    vreq *r = calloc(1, sizeof(*r));
    if (!r)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    r->prompt_len = (int)req->n_prompt_ids;
    r->max_tokens = (int)req->max_tokens;
    r->cap = r->prompt_len + r->max_tokens + s->p.max_draft + 2;
    r->tokens = malloc((size_t)r->cap * sizeof(int32_t));
    r->out_cap = r->max_tokens + s->p.max_draft + 2;
    r->out = malloc((size_t)r->out_cap * sizeof(int32_t));
    r->n_stop = (int)req->n_stop_token_ids;
    r->stop_ids = malloc(((size_t)r->n_stop + 1) * sizeof(int32_t));
    if (!r->tokens || !r->out || !r->stop_ids) {
        req_free(r);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_cond_init(&r->cv, NULL);
    for (int i = 0; i < r->prompt_len; i++)
        r->tokens[i] = (int32_t)req->prompt_ids[i];
    r->n_tokens = r->prompt_len;
    for (int i = 0; i < r->n_stop; i++)
        r->stop_ids[i] = (int32_t)req->stop_token_ids[i];
    snprintf(r->request_id, sizeof(r->request_id), "%s", req->request_id ? req->request_id : "");
    if (sp) {
        r->sampling.temperature = sp->temperature;
        r->sampling.top_p = sp->top_p;
        r->sampling.top_k = sp->top_k;
    }
    if (sp && sp->seed_choice_case == TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED) {
        r->seed = sp->seed;
        r->seeded = true;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->seed = (uint64_t)ts.tv_nsec * 6364136223846793005ull ^ (uint64_t)ts.tv_sec ^
                  (uint64_t)(uintptr_t)r;
    }
    tdm_rng_seed(&r->rng, r->seed);
    if (da && da->address[0]) {
        snprintf(r->drafter_id, sizeof(r->drafter_id), "%s", da->replica_id);
        tdm_adaptive_params ap = {.k_max = (int)da->block_size, /* the drafter's limit too */
                                  .k_initial = (int)da->block_size,
                                  .min_gain = 0.05,
                                  .pause_tokens = 32,
                                  .min_rounds = 4,
                                  /* What speculation costs here is known from earlier
                                   * requests; seeded ones keep the fixed prior. */
                                  .cost_prior = r->seeded ? -1.0 : atomic_load(&s->cost_ema),
                                  .fixed = da->fixed_block_size};
        tdm_adaptive_init(&r->ad, &ap);
    }
    r->t_submit = now_ms();

    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE, "the verifier is shutting down");
    }
    r->id = ++s->next_id;
    if (da && da->address[0]) {
        tdm_error lerr = {0};
        r->link = link_get_locked(s, da->address, &lerr);
        if (r->link) {
            r->spec = true;
            snprintf(r->spec_note, sizeof(r->spec_note), "on");
        } else {
            snprintf(r->spec_note, sizeof(r->spec_note), "off: cannot reach drafter %s (%s)",
                     da->address, lerr.msg);
        }
    } else {
        snprintf(r->spec_note, sizeof(r->spec_note), "off: no drafter assigned");
    }
    r->state = REQ_WAITING;
    if (s->wait_tail)
        s->wait_tail->next_waiting = r;
    else
        s->wait_head = r;
    s->wait_tail = r;
    s->counters.requests++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    *out = r;
    return TDM_OK;
}

static void fill_stats(vreq *r, vsched_output *o)
{
    Tandem__V1__RequestStats *st = &o->stats;
    tandem__v1__request_stats__init(st);
    st->prompt_tokens = (uint32_t)r->prompt_len;
    st->generated_tokens = (uint32_t)r->n_out;
    st->rounds = r->rounds;
    st->speculative_rounds = r->spec_rounds;
    st->drafted_tokens = r->drafted;
    st->accepted_tokens = r->accepted;
    st->mean_accepted = r->spec_rounds ? (double)r->accepted / r->spec_rounds : 0.0;
    st->time_to_first_token_ms = r->t_first > 0 ? r->t_first - r->t_submit : 0.0;
    double decode_ms = r->t_end - (r->t_first > 0 ? r->t_first : r->t_submit);
    st->tokens_per_second = decode_ms > 0 && r->n_out > 1 ? (r->n_out - 1) * 1e3 / decode_ms : 0.0;
    st->total_ms = r->t_end - r->t_submit;
    st->drafter = r->drafter_id;
    if (r->spec && r->ad.pauses > 0)
        snprintf(r->spec_note, sizeof(r->spec_note),
                 "on, switched off %d time(s) by the adaptive rule (%d probe(s), %d speculative "
                 "rounds)",
                 r->ad.pauses, r->ad.probes, r->ad.rounds);
    st->speculation = r->spec_note;
    st->seed = r->seed;
}

void vsched_next(vsched *s, vreq *r, vsched_output *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_lock(&s->mu);
    while (r->out_taken == r->n_out && !r->finished && !r->released)
        pthread_cond_wait(&r->cv, &s->mu);
    int n = r->n_out - r->out_taken;
    if (n > 0) {
        o->ids = malloc((size_t)n * sizeof(int32_t));
        if (o->ids) {
            memcpy(o->ids, r->out + r->out_taken, (size_t)n * sizeof(int32_t));
            o->n_ids = n;
            o->index = r->out_taken;
            r->out_taken = r->n_out;
        }
    } else if (r->finished || r->released) {
        o->done = true;
        o->finish_reason = r->reason;
        o->status = r->finished ? r->fail : TDM_ERR_CANCELLED;
        snprintf(o->msg, sizeof(o->msg), "%s", r->finished ? r->fail_msg : "cancelled");
        fill_stats(r, o);
    }
    pthread_mutex_unlock(&s->mu);
}

void vsched_cancel(vsched *s, vreq *r)
{
    pthread_mutex_lock(&s->mu);
    if (!r->released) {
        r->cancelled = true;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

void vsched_release(vsched *s, vreq *r)
{
    pthread_mutex_lock(&s->mu);
    if (!r->released && r->state == REQ_WAITING) {
        /* Never admitted: take it out of the line ourselves. */
        vreq **pp = &s->wait_head;
        vreq *prev = NULL;
        for (; *pp && *pp != r; prev = *pp, pp = &(*pp)->next_waiting)
            ;
        if (*pp) {
            *pp = r->next_waiting;
            if (s->wait_tail == r)
                s->wait_tail = prev;
            r->released = true;
            if (r->link)
                link_unref_locked(s, r->link);
            r->link = NULL;
        }
    }
    r->cancelled = true;
    pthread_cond_broadcast(&s->cv);
    while (!r->released)
        pthread_cond_wait(&r->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    req_free(r);
}

/* ---- the scheduler thread ----------------------------------------------------- */

/* Ends a request (under mu): frees its model state and its drafter link
 * reference; the Run handler is woken. Returns the link a Close must be sent
 * on (with a reference the caller drops), or NULL. */
static vlink *req_retire_locked(vsched *s, vreq *r)
{
    vlink *close_on = NULL;
    if (r->link) {
        if (r->opened && !r->link->broken)
            close_on = r->link; /* keeps this request's reference until sent */
        else
            link_unref_locked(s, r->link);
        r->link = NULL;
    }
    tdm_seq_destroy(r->seq);
    r->seq = NULL;
    r->state = REQ_DONE;
    r->released = true;
    if (!r->t_end)
        r->t_end = now_ms();
    pthread_cond_broadcast(&r->cv);
    return close_on;
}

static void req_finish_locked(vreq *r, Tandem__V1__FinishReason reason, tdm_status fail,
                              const char *msg)
{
    r->finished = true;
    r->reason = reason;
    r->fail = fail;
    snprintf(r->fail_msg, sizeof(r->fail_msg), "%s", msg ? msg : "");
    r->t_end = now_ms();
}

typedef struct pending_close {
    vlink *link;
    uint64_t id;
    const char *reason;
} pending_close;

/* The logits of a round, in the model's host memory (pinned on CUDA: the
 * download is one DMA). Grown without a copy: a round reads only the logits
 * it wrote. */
static bool ensure_logits(vsched *s, size_t rows)
{
    if (rows <= s->logits_rows)
        return true;
    float *p = tdm_model_host_alloc(s->p.model, rows * (size_t)s->vocab * sizeof(float));
    int32_t *a = malloc(rows * sizeof(int32_t));
    uint8_t *w = malloc(rows);
    if (!p || !a || !w) {
        tdm_model_host_free(s->p.model, p);
        free(a);
        free(w);
        return false;
    }
    tdm_model_host_free(s->p.model, s->logits);
    free(s->argmax);
    free(s->want);
    s->logits = p;
    s->argmax = a;
    s->want = w;
    s->logits_rows = rows;
    return true;
}

/* Appends the round's new tokens to r, applying EOS and max_tokens. Returns
 * true when the request finished. Under mu. */
static bool emit_tokens_locked(vreq *r, const int32_t *toks, int n)
{
    for (int i = 0; i < n; i++) {
        int32_t t = toks[i];
        for (int j = 0; j < r->n_stop; j++)
            if (r->stop_ids[j] == t) {
                req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_EOS, TDM_OK, NULL);
                return true;
            }
        r->out[r->n_out++] = t;
        r->tokens[r->n_tokens++] = t;
        if (r->n_out >= r->max_tokens) {
            req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_LENGTH, TDM_OK, NULL);
            return true;
        }
    }
    return false;
}

/* One round. Returns false when the scheduler should stop. */
static bool sched_round(vsched *s)
{
    tdm_error err = {0};
    int cap = s->p.max_sequences;
    pending_close *closes = calloc((size_t)cap * 2 + 1, sizeof(*closes));
    int n_closes = 0;

    /* 1. Admit waiting requests, retire cancelled ones. */
    pthread_mutex_lock(&s->mu);
    while (!s->stop && !s->wait_head && s->n_active == 0)
        pthread_cond_wait(&s->cv, &s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        free(closes);
        return false;
    }
    for (int i = 0; i < s->n_active;) {
        vreq *r = s->active[i];
        if (r->cancelled) {
            vlink *l = req_retire_locked(s, r);
            if (l)
                closes[n_closes++] = (pending_close){l, r->id, "cancelled"};
            s->counters.cancelled++;
            s->active[i] = s->active[--s->n_active];
            continue;
        }
        i++;
    }
    while (s->wait_head && s->n_active < cap) {
        vreq *r = s->wait_head;
        s->wait_head = r->next_waiting;
        if (!s->wait_head)
            s->wait_tail = NULL;
        r->next_waiting = NULL;
        if (r->cancelled) {
            vlink *l = req_retire_locked(s, r);
            if (l)
                link_unref_locked(s, l);
            continue;
        }
        r->state = REQ_ACTIVE;
        r->fresh = true;
        s->active[s->n_active++] = r;
    }
    int n = s->n_active;
    vreq **batch = malloc((size_t)(n ? n : 1) * sizeof(*batch));
    memcpy(batch, s->active, (size_t)n * sizeof(*batch));
    pthread_mutex_unlock(&s->mu);

    for (int i = 0; i < n_closes; i++) {
        send_close(s, closes[i].link, closes[i].id, closes[i].reason);
        pthread_mutex_lock(&s->mu);
        link_unref_locked(s, closes[i].link);
        pthread_mutex_unlock(&s->mu);
    }
    n_closes = 0;

    /* 2. Prefill admitted requests: every prompt token but the last, which
     * runs in the batched step below and yields the first generated token. */
    int live = 0;
    for (int i = 0; i < n; i++) {
        vreq *r = batch[i];
        if (r->fresh) {
            tdm_seq_params sp = {.strategy = s->p.strategy, .max_draft = s->p.max_draft};
            tdm_status rc = tdm_seq_create(s->p.model, &sp, &r->seq, &err);
            if (rc == TDM_OK && r->prompt_len > 1)
                rc = tdm_seq_prefill(r->seq, r->tokens, r->prompt_len - 1, NULL, &err);
            if (rc != TDM_OK) {
                tdm_log_error(LOG, "request %s: %s", r->request_id, err.msg);
                pthread_mutex_lock(&s->mu);
                req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED, rc,
                                  err.msg);
                pthread_cond_broadcast(&r->cv);
                pthread_mutex_unlock(&s->mu);
                r->fresh = false;
                continue;
            }
            r->last = r->tokens[r->prompt_len - 1];
            r->n_tokens = r->prompt_len - 1; /* `last` is committed after the step */
        }
        batch[live++] = r;
    }
    /* Requests that failed are retired below together with finished ones. */

    /* 3. Wait for the blocks asked for in the previous round. */
    double t_wait0 = now_ms();
    pthread_mutex_lock(&s->mu);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += s->p.draft_timeout_ms / 1000;
    deadline.tv_nsec += (long)(s->p.draft_timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    /* A block that follows an open costs the drafter a prefill of the
     * sequence so far: its sequence sits this round out rather than holding
     * the whole batch (up to draft_timeout, like any block). */
    int held_out = 0;
    for (int i = 0; i < live;) {
        vreq *r = batch[i];
        if (r->spec && r->awaiting && r->after_open && !r->block && !r->cancelled && !r->finished &&
            t_wait0 - r->t_asked < s->p.draft_timeout_ms) {
            batch[i] = batch[--live];
            held_out++;
            continue;
        }
        i++;
    }
    if (live == 0 && held_out > 0) {
        /* Nothing else to run: wait for one of those blocks (or anything). */
        struct timespec soon;
        clock_gettime(CLOCK_REALTIME, &soon);
        soon.tv_nsec += 2000000L;
        if (soon.tv_nsec >= 1000000000L) {
            soon.tv_sec++;
            soon.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &soon);
    }
    for (;;) {
        bool missing = false;
        for (int i = 0; i < live; i++) {
            vreq *r = batch[i];
            if (r->spec && r->awaiting && !r->block && !r->cancelled && !r->finished)
                missing = true;
        }
        if (!missing || s->stop)
            break;
        if (pthread_cond_timedwait(&s->cv, &s->mu, &deadline) == ETIMEDOUT) {
            for (int i = 0; i < live; i++) {
                vreq *r = batch[i];
                if (r->spec && r->awaiting && !r->block) {
                    char d[64];
                    snprintf(d, sizeof(d), "%d ms", s->p.draft_timeout_ms);
                    req_drop_spec_locked(r, "off: drafter sent no block within %s", d);
                    s->counters.drafter_failures++;
                    if (r->link && r->opened)
                        closes[n_closes++] = (pending_close){r->link, r->id, "timeout"};
                    if (r->link)
                        r->link->refs++;
                }
            }
            break;
        }
    }
    /* Take the blocks; validate them against what we committed. */
    int rows = 0;
    int *k = calloc((size_t)(live ? live : 1), sizeof(int));
    Tandem__V1__DraftBlock **blk = calloc((size_t)(live ? live : 1), sizeof(*blk));
    Tandem__V1__DraftResponse **held = calloc((size_t)(live ? live : 1), sizeof(*held));
    bool *got = calloc((size_t)(live ? live : 1), sizeof(bool)); /* a valid block, maybe empty */
    for (int i = 0; i < live; i++) {
        vreq *r = batch[i];
        if (r->block) {
            held[i] = r->block;
            r->block = NULL;
            Tandem__V1__DraftBlock *b = held[i]->block;
            bool ok = r->spec && b->position == (uint32_t)(r->n_tokens + 1) &&
                      b->n_tokens <= (size_t)s->p.max_draft &&
                      (b->n_token_probs == 0 || b->n_token_probs == b->n_tokens) &&
                      (b->n_dists == 0 || b->n_dists == b->n_tokens);
            for (size_t j = 0; ok && j < b->n_dists; j++)
                ok = b->dists[j]->n_ids == b->dists[j]->n_probs;
            if (!ok) {
                char d[160];
                snprintf(d, sizeof(d), "malformed block for position %u (expected %d)", b->position,
                         r->n_tokens + 1);
                req_drop_spec_locked(r, "off: drafter sent a %s", d);
                if (r->link && r->opened) {
                    closes[n_closes++] = (pending_close){r->link, r->id, "malformed block"};
                    r->link->refs++;
                }
            } else {
                k[i] = (int)b->n_tokens;
                blk[i] = b;
                got[i] = true;
                /* After an open the wait includes the drafter's prefill. */
                if (!r->after_open && r->t_asked > 0 && r->t_got >= r->t_asked) {
                    double us = (r->t_got - r->t_asked) * 1e3 - (double)b->draft_micros;
                    s->overhead_us[s->n_overhead++ % TDM_ARRAY_LEN(s->overhead_us)] =
                        (float)(us > 0 ? us : 0);
                }
            }
        }
        r->awaiting = false;
        rows += 1 + k[i];
    }
    pthread_mutex_unlock(&s->mu);
    double t_wait = now_ms() - t_wait0;

    /* 4. One batched forward pass over every live sequence. */
    double t_step0 = now_ms();
    tdm_status rc = TDM_OK;
    int32_t **toks = calloc((size_t)(live ? live : 1), sizeof(*toks));
    int *ntok = calloc((size_t)(live ? live : 1), sizeof(int));
    tdm_seq **seqs = calloc((size_t)(live ? live : 1), sizeof(*seqs));
    if (live > 0 && (!ensure_logits(s, (size_t)rows) || !toks || !ntok || !seqs))
        rc = tdm_error_set(&err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory for %d rows", rows);
    for (int i = 0; rc == TDM_OK && i < live; i++) {
        /* Greedy requests need only each row's argmax, not its logits. */
        s->want[i] = !tdm_sampling_is_greedy(&batch[i]->sampling);
        toks[i] = malloc((size_t)(1 + k[i]) * sizeof(int32_t));
        toks[i][0] = batch[i]->last;
        for (int j = 0; j < k[i]; j++)
            toks[i][1 + j] = (int32_t)blk[i]->tokens[j];
        ntok[i] = 1 + k[i];
        seqs[i] = batch[i]->seq;
    }
    if (rc == TDM_OK && live > 0)
        rc = tdm_seq_step_out(seqs, live, (const int32_t *const *)toks, ntok,
                              &(tdm_step_out){s->logits, s->want, s->argmax}, &err);
    double t_step = now_ms() - t_step0;
    int drafted_total = 0;
    for (int i = 0; i < live; i++)
        drafted_total += k[i];
    /* Cost of one drafted token relative to a plain step (adaptive.h), from
     * the step-time model t = a + b * rows fitted over recent rounds. */
    if (rc == TDM_OK && live > 0) {
        steptime_add(&s->st, rows, t_step);
        tdm_log_debug(LOG, "step: %d sequences, %d rows, %.3f ms", live, rows, t_step);
    }
    double cost = -1.0;
    double plain_round = 0, plain_seq = 0;
    if (drafted_total > 0 && steptime_plain(&s->st, live, &plain_round)) {
        plain_seq = plain_round / live;
        cost = (t_wait + t_step - plain_round) / (drafted_total * plain_seq);
        if (cost < 0)
            cost = 0;
        double prev = atomic_load(&s->cost_ema);
        atomic_store(&s->cost_ema, prev > 0 ? 0.9 * prev + 0.1 * cost : cost);
    }

    /* 5. Verify, commit, stream, and answer the drafters. */
    typedef struct {
        vreq *r;
        int kind; /* 0 none, 1 open, 2 verdict */
        int accepted, next, block;
    } msg_out;
    msg_out *msgs = calloc((size_t)(live ? live : 1), sizeof(*msgs));
    int row = 0;
    for (int i = 0; i < live; i++) {
        vreq *r = batch[i];
        const float *lg = s->logits + (size_t)row * (size_t)s->vocab;
        const int32_t *am = s->argmax + row;
        const bool greedy = tdm_sampling_is_greedy(&r->sampling); /* as want[i] */
        row += ntok[i];
        if (rc != TDM_OK) {
            pthread_mutex_lock(&s->mu);
            req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED, rc, err.msg);
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        tdm_verdict v;
        int32_t newt[80];
        int nn = 0;
        if (k[i] > 0) {
            tdm_draft_dist dd[64];
            for (int j = 0; j < k[i]; j++) {
                dd[j].n = 0;
                if (blk[i]->n_dists) {
                    dd[j].n = (int)blk[i]->dists[j]->n_ids;
                    dd[j].ids = blk[i]->dists[j]->ids;
                    dd[j].probs = blk[i]->dists[j]->probs;
                }
            }
            const int bad =
                greedy ? tdm_verify_block_argmax(am, s->vocab, blk[i]->tokens, k[i], dd, &v)
                       : tdm_verify_block(&r->sampling, &r->rng, lg, s->vocab, blk[i]->tokens, k[i],
                                          dd, s->vscratch, &v);
            if (bad != 0) {
                /* A token outside the vocabulary: no draft is used. */
                v.accepted = 0;
                v.next_token = greedy ? am[0]
                                      : tdm_verify_sample_one(&r->sampling, &r->rng, lg, s->vocab,
                                                              s->vscratch);
                pthread_mutex_lock(&s->mu);
                req_drop_spec_locked(r, "off: drafter sent a token outside the %s", "vocabulary");
                pthread_mutex_unlock(&s->mu);
            }
            if (tdm_log_get_level() <= TDM_LOG_DEBUG)
                tdm_log_debug(LOG,
                              "request %s round %u: %d drafts from position %u, accepted %d; "
                              "wait %.2f ms, step %.2f ms, plain step %.2f ms/sequence, cost %.2f, "
                              "acceptance estimate %.2f",
                              r->request_id, blk[i]->round, k[i], blk[i]->position, v.accepted,
                              t_wait, t_step, plain_seq, cost, r->ad.accept_rate);
            tdm_error cerr = {0};
            if (tdm_seq_commit(r->seq, v.accepted, &cerr) != TDM_OK) {
                pthread_mutex_lock(&s->mu);
                req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED,
                                  cerr.code, cerr.msg);
                pthread_cond_broadcast(&r->cv);
                pthread_mutex_unlock(&s->mu);
                continue;
            }
            for (int j = 0; j < v.accepted; j++)
                newt[nn++] = (int32_t)blk[i]->tokens[j];
        } else {
            v.accepted = 0;
            v.next_token =
                greedy ? am[0]
                       : tdm_verify_sample_one(&r->sampling, &r->rng, lg, s->vocab, s->vscratch);
        }
        newt[nn++] = v.next_token;

        pthread_mutex_lock(&s->mu);
        r->tokens[r->n_tokens++] = r->last; /* the token the step ran */
        bool first = r->fresh;
        r->fresh = false;
        if (first)
            r->t_first = now_ms();
        r->rounds++;
        if (k[i] > 0) {
            r->spec_rounds++;
            r->drafted += (uint32_t)k[i];
            r->accepted += (uint32_t)v.accepted;
            s->counters.spec_rounds++;
            s->counters.drafted += (uint64_t)k[i];
            s->counters.accepted += (uint64_t)v.accepted;
        }
        int before = r->n_out;
        bool done = emit_tokens_locked(r, newt, nn);
        s->counters.tokens += (uint64_t)(r->n_out - before);
        /* The last emitted token is the next input; it is not yet in the
         * model, so it is not yet committed in r->tokens. */
        if (!done) {
            r->n_tokens--;
            r->last = r->tokens[r->n_tokens];
        }
        pthread_cond_broadcast(&r->cv);
        if (!done && r->spec && r->link) {
            /* A request with an explicit seed must give the same output every
             * time: its block lengths follow acceptance only (the cost stays
             * at its prior), so wall-clock timing never shifts its random
             * stream. */
            if (got[i])
                tdm_adaptive_on_round(&r->ad, k[i], v.accepted,
                                      r->after_open || r->seeded ? -1.0 : cost);
            else
                tdm_adaptive_on_plain_token(&r->ad); /* counts a pause down */
            r->after_open = false;
            msgs[i].r = r;
            msgs[i].accepted = v.accepted;
            msgs[i].next = v.next_token;
            msgs[i].block = r->ad.k_next;
            if (got[i]) {
                msgs[i].kind = 2; /* verdict on its block; block 0 pauses it */
            } else if (r->ad.k_next > 0) {
                msgs[i].kind = 1; /* (re)open: the drafter syncs to our tokens */
                r->opened = true;
                r->after_open = true;
            }
            if (msgs[i].kind) {
                r->round++;
                r->awaiting = r->ad.k_next > 0;
            }
        }
        pthread_mutex_unlock(&s->mu);
    }

    /* Retire finished requests. */
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_active;) {
        vreq *r = s->active[i];
        if (r->finished) {
            vlink *l = req_retire_locked(s, r);
            if (l)
                closes[n_closes++] = (pending_close){l, r->id, "finished"};
            s->active[i] = s->active[--s->n_active];
            for (int j = 0; j < live; j++)
                if (msgs[j].r == r)
                    msgs[j].kind = 0;
            continue;
        }
        i++;
    }
    if (live > 0)
        s->counters.rounds++;
    pthread_mutex_unlock(&s->mu);

    for (int i = 0; i < live; i++) {
        msg_out *m = &msgs[i];
        if (m->kind == 0 || !m->r->link)
            continue;
        m->r->t_asked = now_ms();
        /* The link cannot go away under us: r holds a reference until it is
         * retired, which only this thread does. */
        if (m->kind == 1)
            send_open(s, m->r, m->block);
        else
            send_verdict(s, m->r, m->accepted, m->next, m->block);
    }
    for (int i = 0; i < n_closes; i++) {
        send_close(s, closes[i].link, closes[i].id, closes[i].reason);
        pthread_mutex_lock(&s->mu);
        link_unref_locked(s, closes[i].link);
        pthread_mutex_unlock(&s->mu);
    }
    /* Requests that stopped speculating after a failure keep their link
     * reference until retired; drop it now that no message will be sent. */
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_active; i++) {
        vreq *r = s->active[i];
        if (!r->spec && r->link) {
            link_unref_locked(s, r->link);
            r->link = NULL;
        }
    }
    pthread_mutex_unlock(&s->mu);

    for (int i = 0; i < live; i++) {
        free(toks ? toks[i] : NULL);
        if (held[i])
            protobuf_c_message_free_unpacked(&held[i]->base, NULL);
    }
    free(toks);
    free(ntok);
    free(seqs);
    free(msgs);
    free(k);
    free(blk);
    free(held);
    free(got);
    free(batch);
    free(closes);
    return true;
}

static void *sched_main(void *arg)
{
    vsched *s = arg;
    while (sched_round(s))
        ;
    return NULL;
}

/* ---- life cycle ----------------------------------------------------------- */

tdm_status vsched_create(const vsched_params *p, vsched **out, tdm_error *err)
{
    *out = NULL;
    vsched *s = calloc(1, sizeof(*s));
    if (!s)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    s->p = *p;
    if (s->p.max_sequences < 1)
        s->p.max_sequences = 1;
    if (s->p.draft_timeout_ms <= 0)
        s->p.draft_timeout_ms = 2000;
    s->vocab = tdm_model_get_config(p->model)->vocab_size;
    s->active = calloc((size_t)s->p.max_sequences, sizeof(*s->active));
    s->vscratch = malloc(tdm_verify_scratch_bytes(s->vocab));
    if (!s->active || !s->vscratch) {
        free(s->active);
        free(s->vscratch);
        free(s);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        free(s->active);
        free(s->vscratch);
        free(s);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "cannot start the scheduler");
    }
    *out = s;
    return TDM_OK;
}

void vsched_destroy(vsched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);

    pthread_mutex_lock(&s->mu);
    /* Fail what is left (handlers normally finished before: the RPC server
     * shuts down first). */
    for (vreq *r = s->wait_head; r;) {
        vreq *next = r->next_waiting;
        req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED,
                          TDM_ERR_UNAVAILABLE, "the verifier shut down");
        vlink *l = req_retire_locked(s, r);
        if (l)
            link_unref_locked(s, l);
        r = next;
    }
    s->wait_head = s->wait_tail = NULL;
    for (int i = 0; i < s->n_active; i++) {
        vreq *r = s->active[i];
        req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED,
                          TDM_ERR_UNAVAILABLE, "the verifier shut down");
        vlink *l = req_retire_locked(s, r);
        if (l)
            link_unref_locked(s, l);
    }
    s->n_active = 0;
    while (s->links)
        link_break_locked(s, s->links, "the verifier shut down");
    while (s->readers > 0)
        pthread_cond_wait(&s->idle_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->idle_cv);
    free(s->active);
    free(s->vscratch);
    tdm_model_host_free(s->p.model, s->logits);
    free(s->argmax);
    free(s->want);
    free(s);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void vsched_get_counters(vsched *s, vsched_counters *c)
{
    pthread_mutex_lock(&s->mu);
    *c = s->counters;
    size_t n = s->n_overhead < TDM_ARRAY_LEN(s->overhead_us) ? (size_t)s->n_overhead
                                                             : TDM_ARRAY_LEN(s->overhead_us);
    c->overhead_p50_us = c->overhead_p99_us = 0;
    if (n > 0) {
        float *v = malloc(n * sizeof(float));
        if (v) {
            memcpy(v, s->overhead_us, n * sizeof(float));
            qsort(v, n, sizeof(float), cmp_float);
            c->overhead_p50_us = v[n / 2];
            c->overhead_p99_us = v[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1];
            free(v);
        }
    }
    c->active = (uint64_t)s->n_active;
    c->waiting = 0;
    for (vreq *r = s->wait_head; r; r = r->next_waiting)
        c->waiting++;
    pthread_mutex_unlock(&s->mu);
}
