/*
 * vsched.c - see vsched.h. A round is sched_round(): a short list of named
 * steps, each below it in the order it runs.
 *
 * Locks: s->mu guards the request lists, every request's life-cycle, output
 * and block fields, and the counters. The scheduler thread holds it only to
 * move data in and out: never while it runs the model, writes to a stream,
 * opens a channel or lets go of a Draft stream (vlink.h).
 */
#include "vsched.h"

#include "adaptive.h"
#include "spin.h"
#include "alloc.h"
#include "compat.h"
#include "defs.h"
#include "feature_stream.h"
#include "log.h"
#include "pool.h"
#include "timing_lock.h"
#include "prefix_cache.h"
#include "request_check.h"
#include "runtime.h"
#include "sampling.h"
#include "verify.h"
#include "vlink.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOG "verifier"

/* ---- types ------------------------------------------------------------------ */

typedef enum { REQ_WAITING, REQ_ACTIVE, REQ_DONE } req_state;

struct vreq {
    uint64_t id; /* sequence id on the Draft stream */
    char request_id[96];
    /* what to generate */
    int32_t *tokens; /* [cap] prompt, then every committed generated token */
    int n_tokens, cap, prompt_len, max_tokens;
    int n_given;      /* tokens handed in: the prompt, then any generated elsewhere (prefilled) */
    int kv_positions; /* the most positions it may reach: its KV, held from admission */
    size_t reserved;  /* bytes admission reserves for it */
    int32_t *stop_ids;
    int n_stop;
    tdm_sampling sampling;
    uint64_t seed; /* draws are keyed by it and the position (tdm_rng_seed_at) */
    bool seeded;   /* the client chose the seed */
    /* model state (scheduler thread only) */
    tdm_seq *seq;
    int32_t last;    /* newest token, not yet run through the model */
    bool fresh;      /* admitted; its first token not yet generated */
    bool prefilling; /* its prompt (but the last token) is not yet all in the model */
    bool imported;   /* continues an imported snapshot: its state came with it */
    bool continued;  /* continues a run begun elsewhere (imported, or recomputed) */
    bool open_first; /* its prefill's end is yet to come: then its drafter opens
                        (open_first_blocks) and its first step verifies a block */
    int prefilled;   /* prompt tokens in the model */
    int cached;      /* prompt tokens restored from the prefix cache */
    /* speculation (scheduler thread, except the block fields: under mu) */
    vlink *link; /* a reference while the request holds it */
    char drafter_id[128];
    /* What its drafter reported a draft costs it (draft_pass_costs): ms a
     * drafted token in passes of dcost_n[i] sequences, beside what a pass
     * costs whatever its length (dpass_ms; 0 where not reported); n_dcost
     * 0: nothing. */
    int n_dcost;
    int dcost_n[TDM_REQ_MAX_DRAFT_COSTS];
    double dcost_ms[TDM_REQ_MAX_DRAFT_COSTS];
    double dpass_ms;
    bool spec;             /* speculating with link */
    bool run_ahead;        /* its drafter may draft ahead of verdicts (not on this GPU) */
    bool opened;           /* the drafter knows this sequence */
    bool scores;           /* its drafter answers scoring opens (DrafterAssignment.scores) */
    bool scoring;          /* a scoring open awaits its DraftScore (under mu) */
    int score_from, score_end; /* ... for positions [score_from, score_end) */
    bool awaiting;         /* a block was asked for and has not arrived */
    bool after_open;       /* the awaited block follows an open: its wait includes a prefill */
    double t_asked, t_got; /* when the awaited block was asked for and arrived */
    uint32_t round;        /* the round number the awaited block must carry */
    tdm_adaptive ad;
    Tandem__V1__DraftResponse *block; /* delivered by the reader, under mu */
    /* Run-ahead (drafter.proto), under mu: a block for the round after the
     * one being verified, held until the verdict says whether it stands; and
     * what the last verdict was, for ahead blocks that come after it. */
    Tandem__V1__DraftResponse *ahead_block;
    bool last_all;     /* the last verdict accepted its whole block and asked for another */
    int32_t last_next; /* ... and its next token */
    bool block_ahead;  /* r->block was drafted ahead (no exchange to measure) */
    uint32_t ahead_used;
    uint32_t reached_at[TDM_MAX_DRAFT_BLOCK], accepted_at[TDM_MAX_DRAFT_BLOCK];
    int positions; /* draft positions reached so far */
    char spec_note[320];
    char ahead_off[240]; /* " (no run-ahead: why)" where it is not asked for; "" */
    /* What the adaptive rule did, for the stats while it speculates with
     * pauses (fill_stats), and the pauses, probes and rounds it says. */
    char ad_note[560];
    int noted[4];
    /* Feature stream (drafter.proto), scheduler thread: what its drafter
     * takes, and the rows of committed positions not yet sent to it. Only
     * a sequence with feat set has hidden states brought back by its steps. */
    bool feat;
    tdm_feat_request feat_req;
    tdm_feat_out fout;
    double feat_encode_us; /* encoding the rows held, us (put out with them) */
    tdm_feat_out fsent;    /* the rows sent already: a re-open sends them again */
    /* Re-opening on the drafter's address after it failed
     * (drafter_reopen_tries), scheduler thread and on_link_broken under mu:
     * whether a try is due, where, when, and the tries made. */
    bool reopen;
    char reopen_addr[256];
    double reopen_at;
    int reopen_tries;
    /* life cycle (under mu) */
    req_state state;
    bool cancelled;
    bool released;      /* the scheduler will not touch it again */
    bool drain_noticed; /* its Run was told the verifier is draining */
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
    double t_admit; /* when it got a place in the batch */
    uint32_t rounds, spec_rounds, drafted, accepted;
    struct vreq *next_waiting;
};

/* What a round sends a sequence's drafter after its step. */
typedef enum { MSG_NONE, MSG_OPEN, MSG_VERDICT, MSG_SCORE } msg_kind;

/* One live sequence of a round. */
typedef struct vround_seq {
    vreq *r;
    int k;                            /* drafts it verifies; 0: one plain row */
    Tandem__V1__DraftResponse *block; /* its block, freed when the round ends */
    bool got;                         /* a valid block (maybe empty) came */
    int row;                          /* its first row in the step */
    msg_kind msg;
    int accepted;
    int32_t next;
    int next_block; /* block length asked for next; 0 pauses drafting */
    tdm_verdict v;  /* the verdict on its rows (verdicts) */
    bool unverified; /* its block came and went unverified (plain_measure) */
    int commit;     /* drafts its verdict keeps, committed once the messages are out;
                       -1: nothing to commit (no drafts, or the request failed) */
} vround_seq;

/* A Close to send, with the link reference it holds until sent. */
typedef struct pending_close {
    vlink *link;
    uint64_t id;
    const char *reason;
} pending_close;

/* The round's scratch, sized once for max_sequences (vsched_create). */
typedef struct vround {
    vround_seq *seqs; /* [max_sequences]: the live sequences, in row order */
    int n;
    int32_t *rows;        /* [max_sequences * (1 + TDM_MAX_DRAFT_BLOCK)]: the step's tokens */
    const int32_t **toks; /* [max_sequences]: each sequence's first row in rows */
    int *ntok;            /* [max_sequences] */
    tdm_seq **eseqs;      /* [max_sequences] */
    int n_rows, drafted;
    pending_close *closes; /* [2 * max_sequences + 1] */
    int n_closes;
    vlink **drop; /* [2 * max_sequences + 1]: references to let go after the lock */
    int n_drop;
    tdm_step_buf out;     /* logits and argmaxes (grown on demand) */
    uint8_t *want_hidden; /* [max_sequences]: the sequence's drafter takes hidden states */
    int *sampled;         /* [max_sequences]: the sequences with a rejection (verdicts) */
    int *fetch;           /* [max_sequences]: their rejected rows */
    tdm_sample_row *probs_of; /* [max_sequences]: each sequence's settings (run_step) */
    float *hidden;        /* [hidden_rows, H]: the step's (or a prefill's) hidden states */
    size_t hidden_rows;
    float *feat_row; /* [TDM_FEAT_MAX_SPECS * H]: one row of several specs */
    tdm_status rc;   /* the step's status; != OK fails every sequence in it */
    tdm_error err;
    double t_wait, t_step;
    double t_verdicts;     /* ms verdicts() took this round */
    double cost, fixed;    /* per drafted token and per speculating sequence (adaptive.h) */
    /* The step, or a drafter for a block of it, ran a shape for the first
     * time (a CUDA graph captured, steps run eagerly): the round's time says
     * nothing of what such rounds cost, so no timing model learns from it. */
    bool first_sight;
    int n_stepped, n_spec; /* sequences of the step, and those with drafts */
    double t_idle_end;     /* when admit_and_retire found work */
    /* Drafters at work while the step runs: blocks still awaited after the
     * round took its own (a sequence sat out for its open's prefill, a
     * prompt's catch-up); a plain step beside them is not a plain step. */
    bool drafting;
    /* The round runs plainly to measure a plain round (plain_round_due):
     * its blocks are not verified, each drafter hears "none accepted". */
    bool plain_measure;
} vround;

_Static_assert(TDM_MAX_DRAFT_BLOCK + 1 <= 1 << 16, "rows of one sequence fit an int");

/* A snapshot export or import for the scheduler thread to carry out
 * between rounds; the RPC handler that queued it waits for `done`. */
typedef struct snap_job {
    bool import;
    /* export */
    char request_id[96], snapshot_id[128];
    bool detach;
    vsched_snapshot *out;
    /* import */
    tdm_snap_layout layout;
    uint8_t *payload;
    vsched_continuation cont;
    /* outcome (under mu) */
    bool done;
    tdm_status rc;
    tdm_error err;
    struct snap_job *next;
} snap_job;

/* An imported snapshot's sequence waiting for its Run (under mu). */
typedef struct staged_snap {
    char id[128];
    tdm_seq *seq;
    tdm_snap_layout layout; /* its tokens */
    vsched_continuation cont;
    double expires; /* ms */
    struct staged_snap *next;
} staged_snap;

/* A drafter's acceptance over its recent speculative rounds, by replica id
 * (adaptive.h: tdm_accept_memory). */
#define DACC_MAX 64
#define WARM_MAX 5   /* batch sizes warm_steps times: 1, 2, 4, 8, 16 */
#define WARM_SEQS 16 /* the largest */
typedef struct dacc {
    char id[128];
    tdm_accept_memory m;
} dacc;

struct vsched {
    vsched_params p;
    int vocab;
    int hidden_size; /* H: a feature spec's values per position */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* new work, blocks, cancellations */
    _Atomic uint64_t wakes; /* bumped with every signal of cv, for pollers (spin.h) */
    vreq *wait_head, *wait_tail;
    vreq **active; /* [max_sequences] */
    int n_active;
    size_t reserved; /* bytes the active requests reserved (under mu) */
    char limits[1400];
    bool stop;
    bool draining; /* takes no new request; running ones are told (under mu) */
    pthread_t thread;
    uint64_t next_id;
    vlinks *links;
    vsched_counters counters;
    tdm_steptime st; /* how a step's time grows with its rows (scheduler thread) */
    /* What speculation costs on this verifier, in ms (the adaptive rule's
     * priors, converted to plain steps of the batch a request joins): per
     * drafted token, and the exchange per speculating sequence; 0 = none. */
    _Atomic double cost_ms_ema, fixed_ms_ema;
    /* What steps cost on this verifier, timed before it served (warm_steps;
     * read-only after): plain steps of warm_n[i] sequences, and what a
     * verify step adds a drafted token. A fresh verifier's first requests
     * start from it (warm_cost) until rounds measure what a draft costs. */
    int n_warm;
    int warm_n[WARM_MAX];
    double warm_plain_ms[WARM_MAX], warm_draft_ms[WARM_MAX];
    /* The share of recent rounds that ran a shape for the first time
     * (moving average, scheduler thread): below FIRST_SIGHT_ONE_OFF such
     * rounds are one-offs the timing models leave out; above it, new shapes
     * are what rounds here are (a batch whose mix of block lengths keeps
     * changing), and their time is learnt like any other. */
    double first_share;
    /* What each drafter's drafts were accepted at (dacc_*): the starting
     * acceptance of its next requests. */
    pthread_mutex_t dacc_mu;
    dacc dacc[DACC_MAX];
    int n_dacc;
    _Atomic double plain_seq_ms;   /* a plain step's time per sequence at the current batch */
    _Atomic double plain_round_ms; /* and the whole step's */
    double exchange_ms;            /* moving average of the exchange (scheduler thread, under mu) */
    /* How long a sequence waits for its first block after an open (the
     * drafter catching up on its tokens): the last opens' waits
     * (tdm_open_cost, scheduler thread), and what they say in ms (<= 0:
     * not known yet). */
    tdm_open_cost opens;
    _Atomic double open_ms;
    /* What a round costs after its step (commits, verdicts, tokens out, the
     * drafters' messages), scheduler thread: moving averages of a plain
     * round's per sequence, and of what a speculating sequence adds to it
     * (a verify block's commit and its verdict); ms, 0 = not seen yet. */
    _Atomic double post_plain_ms, post_spec_ms;
    /* Exchange overhead per block (wait minus the drafter's own time), us. */
    float overhead_us[4096];
    uint64_t n_overhead;
    double exchange_us_total, draft_us_total; /* and their sums since the start */
    double open_wait_us_total;                /* first blocks' waits beyond the prefill */
    uint64_t open_waits;
    double send_us_total;                     /* send_messages: building and queueing them */
    uint64_t sends;
    uint64_t draft_tokens_total;
    /* The drafter's own time per draft token, per block, us. */
    float draft_token_us[4096];
    uint64_t n_draft_token;
    /* The round's timeline: each phase's time in the last 4096 rounds, us
     * (under mu). Idle is the wait for work before a round. */
    float phase_us[4096][VSCHED_PHASES];
    uint64_t n_phase;
    double t_started;       /* when the scheduler thread started, ms */
    double idle_since;      /* when the scheduler began to wait for work; 0: busy */
    snap_job *jobs;         /* snapshot work queued for the scheduler thread */
    staged_snap *staged;    /* imported snapshots waiting for their Run */
    pthread_cond_t jobs_cv; /* a job is done */
    vround rd;              /* scheduler thread */
    /* Feature rows and bytes sent (vsched_counters): the scheduler thread
     * adds, Describe reads. */
    _Atomic uint64_t feature_rows, feature_bytes;
    _Atomic uint64_t feature_rows_shm, feature_bytes_shm, feature_ring_full;
    _Atomic uint64_t feature_puts_shm, feature_puts_grpc;
    _Atomic double feature_put_us_shm, feature_put_us_grpc;
    /* A round's sampled verdicts, judged across cores: one scratch for
     * rejection sampling per chunk of the pool's jobs. */
    tdm_pool *vpool;
    void **vscratch;
    int n_vscratch;
    /* NULL: prefix_cache off. Used by the scheduler thread and, for
     * FetchPrefix and a fetched prefix's import, by RPC handler threads:
     * every use holds pmu, the innermost lock (taken under mu, never the
     * other way round), held for host copies and the uploads of a hit. */
    tdm_prefix_cache *prefix;
    pthread_mutex_t pmu;
    /* Prefill throughput, prompt tokens per ms: a moving average over the
     * prefill calls (scheduler thread writes; 0: none measured yet). */
    _Atomic double prefill_tok_per_ms;
};

/* A moving average of what speculation costs, in ms. */
static void ema_ms(_Atomic double *e, double v)
{
    const double prev = atomic_load(e);
    atomic_store(e, prev > 0 ? 0.9 * prev + 0.1 * v : v);
}

/* An adaptive prior from a cost in ms: in plain steps per sequence at the
 * current batch (what the request's rounds will be measured against);
 * -1 (the rule's own prior) while nothing is measured. */
static double prior(vsched *s, _Atomic double *cost_ms)
{
    const double ms = atomic_load(cost_ms), seq = atomic_load(&s->plain_seq_ms);
    return ms > 0 && seq > 0 ? ms / seq : -1.0;
}

/* The same at a batch of n sequences (tdm_steptime_cost_at), where that
 * batch's plain round is known, else at the current batch's: a request of a
 * burst is admitted to a batch the last round did not have (the demo pair on
 * one H100: a burst of 32 judged at one sequence opened on the drafter,
 * 0.88x plain). Scheduler thread. */
static double prior_at(vsched *s, _Atomic double *cost_ms, int n)
{
    const double c = tdm_steptime_cost_at(&s->st, atomic_load(cost_ms), n);
    return c > 0 ? c : prior(s, cost_ms);
}

/* y at x from the points (xs[i], ys[i]), xs ascending: linear between them;
 * outside them, the nearest point's y, or where extend is set, the line
 * through the last two. */
static double interp(const int *xs, const double *ys, int m, int x, bool extend)
{
    if (m == 1 || x <= xs[0])
        return ys[0];
    if (x >= xs[m - 1] && !extend)
        return ys[m - 1];
    int i = 0;
    while (i + 2 < m && xs[i + 1] < x)
        i++;
    const double w = (double)(x - xs[i]) / (xs[i + 1] - xs[i]);
    return ys[i] + w * (ys[i + 1] - ys[i]);
}

/* r's drafter's draft_pass_costs (checked: tdm_req_check_run): its passes of
 * its block (the first entry's), ascending by sequences, and a pass of one
 * token for one sequence. What a pass costs whatever its length (dpass_ms)
 * is the line through the two passes of one sequence; each drafted token
 * costs the rest. */
static void draft_costs_of(vreq *r, const Tandem__V1__DrafterAssignment *da)
{
    const uint32_t block = da->n_draft_pass_costs ? da->draft_pass_costs[0]->block : 0;
    double one_block = -1, one_token = -1;
    for (size_t i = 0; i < da->n_draft_pass_costs; i++) {
        const Tandem__V1__DraftPassCost *c = da->draft_pass_costs[i];
        if (c->sequences == 1 && c->block == 1)
            one_token = c->millis;
        if (c->block != block ||
            (r->n_dcost > 0 && (int)c->sequences <= r->dcost_n[r->n_dcost - 1]))
            continue;
        if (c->sequences == 1)
            one_block = c->millis;
        r->dcost_n[r->n_dcost] = (int)c->sequences;
        r->dcost_ms[r->n_dcost++] = c->millis;
    }
    r->dpass_ms = 0;
    if (block > 1 && one_block > 0 && one_token > 0) {
        const double pass = one_token - (one_block - one_token) / (block - 1);
        r->dpass_ms = pass < 0 ? 0 : pass > one_token ? one_token : pass;
    }
    for (int i = 0; i < r->n_dcost; i++) {
        const double rest = r->dcost_ms[i] - r->dpass_ms;
        r->dcost_ms[i] = (rest > 0 ? rest : 0) / ((double)r->dcost_n[i] * block);
    }
}

/* What speculation costs a sequence of r's at a batch of n, in plain steps
 * of it, from what was timed before serving (tdm_adaptive_timed): `drafted`
 * of the batch speculating and sharing the drafter's passes, and the exchange
 * at exchange_ms; -1 in both where the verifier's steps or the drafter's
 * passes were not timed. */
static void timed_costs(const vsched *s, const vreq *r, int n, int drafted, double exchange_ms,
                        double *cost, double *fixed)
{
    *cost = *fixed = -1.0;
    if (s->n_warm == 0 || r->n_dcost == 0)
        return;
    tdm_adaptive_timed(interp(s->warm_n, s->warm_plain_ms, s->n_warm, n, true), n, drafted,
                       interp(s->warm_n, s->warm_draft_ms, s->n_warm, n, false),
                       interp(r->dcost_n, r->dcost_ms, r->n_dcost, drafted, false), r->dpass_ms,
                       exchange_ms, cost, fixed);
}

/* The starting guess of what a drafted token costs a sequence of r's in a
 * batch of n, in plain steps of it, from what was timed before serving
 * (timed_costs, the whole batch drafted): the
 * verifier's own steps (warm_steps: a plain step, and what a verify adds a
 * draft) and the drafter's passes (its Descriptor's draft_pass_costs); -1
 * where either is missing (an n-gram or MTP drafter reports none: without
 * its part the guess would say only what verifying costs, and the rule keeps
 * its own). The exchange is not in it; what the drafter's pass costs
 * whatever its length is *pass (where not NULL), in the same unit (a round's share of each
 * sequence: the pass drafts them all). On two CPU cores a verified row and a draft cost
 * more than a plain step per sequence of eight, so speculation that cannot
 * pay starts paused instead of opening every first request on the drafter
 * to find out; on a GPU both are cheap, and the guess is about the rule's
 * own. */
static double warm_cost(const vsched *s, const vreq *r, int n, double *pass)
{
    double cost, fixed;
    timed_costs(s, r, n, n, 0, &cost, &fixed);
    if (pass)
        *pass = cost > 0 ? fixed : 0;
    return cost;
}

/* The entry of drafter `id` (under dacc_mu); a new one (the oldest's slot
 * when the table is full) when add is set, else NULL. */
static dacc *dacc_find_locked(vsched *s, const char *id, bool add)
{
    for (int i = 0; i < s->n_dacc; i++)
        if (strcmp(s->dacc[i].id, id) == 0)
            return &s->dacc[i];
    if (!add)
        return NULL;
    if (s->n_dacc == DACC_MAX) /* the oldest goes */
        memmove(&s->dacc[0], &s->dacc[1], (size_t)--s->n_dacc * sizeof(dacc));
    dacc *d = &s->dacc[s->n_dacc++];
    *d = (dacc){0};
    snprintf(d->id, sizeof(d->id), "%s", id);
    return d;
}

/* A speculative round of drafter id: k drafts, n accepted. */
static void dacc_note(vsched *s, const char *id, int k, int n)
{
    if (k <= 0)
        return;
    pthread_mutex_lock(&s->dacc_mu);
    tdm_accept_memory_note(&dacc_find_locked(s, id, true)->m, k, n);
    pthread_mutex_unlock(&s->dacc_mu);
}

/* Drafter id's acceptance on earlier requests (tdm_accept_memory_prior;
 * nudge: a request starts paused); -1 where not known. pos (where not
 * NULL): its acceptance by position (zero where not known). */
static double dacc_prior(vsched *s, const char *id, bool nudge, tdm_accept_positions *pos)
{
    pthread_mutex_lock(&s->dacc_mu);
    dacc *d = dacc_find_locked(s, id, false);
    const double a = d ? tdm_accept_memory_prior(&d->m, nudge) : -1.0;
    if (pos && d)
        *pos = d->m.pos;
    pthread_mutex_unlock(&s->dacc_mu);
    return a;
}

/* Drafter id's acceptance per draft on earlier requests, as measured
 * (tdm_accept_memory_rate); -1 where not known. */
static double dacc_rate(vsched *s, const char *id)
{
    pthread_mutex_lock(&s->dacc_mu);
    dacc *d = dacc_find_locked(s, id, false);
    const double a = d ? tdm_accept_memory_rate(&d->m) : -1.0;
    pthread_mutex_unlock(&s->dacc_mu);
    return a;
}

/* Whether r's drafter, computing apart from this verifier, should draft
 * ahead of verdicts with blocks of k (tdm_run_ahead_gain): at the batch r
 * joins, from this verifier's steps timed before serving, the passes its
 * drafter reported and the drafter's acceptance on earlier requests (the
 * rule's prior, 0.7, where none). Where a time is not known the gain cannot
 * be judged, and it is asked to. Where not, why says so with the numbers. */
static bool ahead_pays(vsched *s, const vreq *r, int k, char *why, size_t len)
{
    if (s->n_warm == 0 || r->n_dcost == 0 || k <= 0)
        return true;
    pthread_mutex_lock(&s->mu);
    const int n = s->n_active + 1;
    pthread_mutex_unlock(&s->mu);
    const double verify = interp(s->warm_n, s->warm_plain_ms, s->n_warm, n, true) +
                          n * k * interp(s->warm_n, s->warm_draft_ms, s->n_warm, n, false);
    const double chain =
        r->dpass_ms + n * k * interp(r->dcost_n, r->dcost_ms, r->n_dcost, n, false);
    double a = dacc_rate(s, r->drafter_id);
    if (a < 0)
        a = 0.7;
    if (tdm_run_ahead_gain(a, k, chain, verify) > 0)
        return true;
    snprintf(why, len,
             "it would not pay: %d drafts ahead take %.2f ms against a %.2f ms verify step, "
             "and stand in %.0f %% of rounds at acceptance %.2f",
             k + 1, chain * (k + 1) / k, verify, 100 * pow(a, k + 1), a);
    return false;
}

/* Tokens a sequence loses while its drafter opens it: the open's wait in
 * rounds of the batch it joins (a plain round: one token of each sequence);
 * -1 when not measured yet. */
static double open_cost(vsched *s)
{
    const double ms = atomic_load(&s->open_ms), round = atomic_load(&s->plain_round_ms);
    return ms > 0 && round > 0 ? ms / round : -1.0;
}

/* The same at a batch of n sequences, where that batch's plain round is
 * known, else at the current batch's, as prior_at (a round of n sequences
 * is n plain steps of one). Scheduler thread. */
static double open_cost_at(vsched *s, int n)
{
    const double c = tdm_steptime_cost_at(&s->st, atomic_load(&s->open_ms), n);
    return c > 0 ? c / n : open_cost(s);
}

/* The share of rounds with a first sight up to which they are one-offs
 * (vsched.first_share). */
#define FIRST_SIGHT_ONE_OFF 0.5

/* Signals cv (under mu) and tells pollers (await_blocks). */
static void sched_wake(vsched *s)
{
    tdm_spin_bump(&s->wakes);
    pthread_cond_broadcast(&s->cv);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- requests ---------------------------------------------------------------- */

static void req_free(vreq *r)
{
    if (!r)
        return;
    if (r->block)
        protobuf_c_message_free_unpacked(&r->block->base, NULL);
    if (r->ahead_block)
        protobuf_c_message_free_unpacked(&r->ahead_block->base, NULL);
    free(r->tokens);
    free(r->stop_ids);
    free(r->out);
    tdm_feat_out_free(&r->fout);
    tdm_feat_out_free(&r->fsent);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static void req_drop_spec_locked(vreq *r, const char *fmt, const char *detail)
{
    if (!r->spec)
        return;
    r->spec = false;
    r->awaiting = false;
    snprintf(r->spec_note, sizeof(r->spec_note), fmt, detail);
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

static void req_fail(vsched *s, vreq *r, tdm_status code, const char *msg)
{
    pthread_mutex_lock(&s->mu);
    req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED, code, msg);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Ends a request (under mu): frees its model state and hands its link
 * reference to the round, as a Close to send when the drafter knows the
 * sequence, else as a reference to drop; the Run handler is woken. */
static void req_retire_locked(vround *rd, vreq *r, const char *why)
{
    if (r->link) {
        if (r->opened && why)
            rd->closes[rd->n_closes++] = (pending_close){r->link, r->id, why};
        else
            rd->drop[rd->n_drop++] = r->link;
        r->link = NULL;
    }
    tdm_seq_destroy(r->seq);
    r->seq = NULL;
    r->state = REQ_DONE;
    r->released = true;
    if (!r->t_end)
        r->t_end = now_ms();
    pthread_cond_broadcast(&r->cv);
}

static vreq *find_active_locked(vsched *s, vlink *l, uint64_t id)
{
    for (int i = 0; i < s->n_active; i++)
        if (s->active[i]->id == id && s->active[i]->link == l)
            return s->active[i];
    return NULL;
}

/* ---- what the Draft streams deliver (reader threads) --------------------------- */

/* Whether an ahead block stands after the verdict that came before it. */
static bool ahead_stands(const vreq *r, const Tandem__V1__DraftBlock *b)
{
    return r->last_all && (int32_t)b->assumed_token == r->last_next;
}

/* Takes a block the drafter sent (under mu). */
static void take_delivered_locked(vsched *s, vreq *r, Tandem__V1__DraftResponse *resp, bool ahead)
{
    if (r->block)
        protobuf_c_message_free_unpacked(&r->block->base, NULL);
    r->block = resp;
    r->t_got = now_ms();
    r->block_ahead = ahead;
    if (ahead) {
        r->ahead_used++;
        s->counters.ahead_used++;
    }
}

/* A scoring open's answer (under mu): positions from where the drafter's
 * model stood to the sequence's last token when it was sent, weighed by the
 * adaptive rule as the rounds they replay (tdm_adaptive_on_scored); the
 * drafter's memory takes them too. A restart opens the sequence with its
 * next round (plan_message_locked). Positions outside what was sent, or
 * before what was asked, are a faulty drafter's: dropped. */
static void take_score_locked(vsched *s, vreq *r, const Tandem__V1__DraftScore *sc)
{
    r->scoring = false;
    if ((int64_t)sc->position < r->score_from ||
        (int64_t)sc->position + (int64_t)sc->hits.len > r->score_end) {
        tdm_log_warn(LOG,
                     "request %s: drafter %s scored positions %u..%zu where %d..%d were asked "
                     "for; dropped",
                     r->request_id, r->drafter_id, sc->position, sc->position + sc->hits.len,
                     r->score_from, r->score_end);
        return;
    }
    if (r->ad.k_next > 0)
        return; /* a probe reopened it meanwhile: its rounds measure */
    pthread_mutex_lock(&s->dacc_mu);
    tdm_adaptive_on_scored(&r->ad, sc->hits.data, (int)sc->hits.len,
                           &dacc_find_locked(s, r->drafter_id, true)->m);
    pthread_mutex_unlock(&s->dacc_mu);
    s->counters.scores++;
    s->counters.scored_positions += sc->hits.len;
    if (r->ad.k_next > 0)
        s->counters.score_restarts++;
    tdm_log_debug(LOG,
                  "request %s: %zu positions scored from %u: acceptance %.2f; speculation %s "
                  "(block %d)",
                  r->request_id, sc->hits.len, sc->position, r->ad.accept_rate,
                  r->ad.k_next > 0 ? "restarts" : "stays paused", r->ad.k_next);
}

static void on_draft_message(void *user, vlink *l, Tandem__V1__DraftResponse *resp)
{
    vsched *s = user;
    uint64_t id =
        resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_BLOCK   ? resp->block->sequence_id
        : resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_ERROR ? resp->error->sequence_id
        : resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_SCORE ? resp->score->sequence_id
                                                                    : 0;
    bool keep = false;
    pthread_mutex_lock(&s->mu);
    vreq *r = find_active_locked(s, l, id);
    if (r && r->spec && resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_BLOCK) {
        const Tandem__V1__DraftBlock *b = resp->block;
        if (!b->ahead && r->awaiting && b->round == r->round) {
            take_delivered_locked(s, r, resp, false);
            keep = true;
        } else if (b->ahead && r->awaiting && b->round == r->round) {
            /* Drafted ahead of a verdict already given: it stands or not. */
            if (ahead_stands(r, b)) {
                take_delivered_locked(s, r, resp, true);
                keep = true;
            } else {
                s->counters.ahead_dropped++;
            }
        } else if (b->ahead && b->round == r->round + 1) {
            /* Drafted ahead of the verdict on the block in hand (being
             * verified, or arrived and not yet taken): held for it. */
            if (r->ahead_block)
                protobuf_c_message_free_unpacked(&r->ahead_block->base, NULL);
            r->ahead_block = resp;
            keep = true;
        }
        sched_wake(s);
    } else if (r && r->spec && r->scoring &&
               resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_SCORE) {
        take_score_locked(s, r, resp->score);
    } else if (r && r->spec && (r->awaiting || r->scoring) &&
               resp->kind_case == TANDEM__V1__DRAFT_RESPONSE__KIND_ERROR) {
        req_drop_spec_locked(r, "off: drafter reported: %s", resp->error->message);
        sched_wake(s);
    }
    pthread_mutex_unlock(&s->mu);
    if (!keep)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
}

/* The wait before re-open try n (n >= 1): 250 ms, doubling. */
static double reopen_backoff_ms(int n)
{
    return 250.0 * (double)(1 << (n < 8 ? n - 1 : 7));
}

/* An active request's drafter failed (under mu). */
static void req_link_failed_locked(vsched *s, vreq *r, const char *why)
{
    if (r->spec && r->reopen_tries < s->p.drafter_reopen_tries) {
        /* A drafter restarted on its address takes the sequence again. */
        r->reopen = true;
        r->reopen_at = now_ms() + reopen_backoff_ms(r->reopen_tries + 1);
        snprintf(r->reopen_addr, sizeof(r->reopen_addr), "%s", vlink_address(r->link));
    }
    req_drop_spec_locked(r, "off: drafter failed (%s)", why);
}

static void on_link_broken(void *user, vlink *l, const char *why)
{
    vsched *s = user;
    pthread_mutex_lock(&s->mu);
    s->counters.drafter_failures++;
    for (int i = 0; i < s->n_active; i++)
        if (s->active[i]->link == l)
            req_link_failed_locked(s, s->active[i], why);
    for (vreq *r = s->wait_head; r; r = r->next_waiting)
        if (r->link == l)
            req_drop_spec_locked(r, "off: drafter failed (%s)", why);
    sched_wake(s);
    pthread_mutex_unlock(&s->mu);
}

/* ---- messages to drafters (scheduler thread, without mu) ------------------------ */

/* Sends m on r's Draft stream. A stream that broke is a drafter failure
 * for r here too: a request that took the link before it broke, and was
 * listed only after on_link_broken looked, would otherwise wait its whole
 * draft_timeout for a block. */
static void send_msg(vsched *s, vreq *r, const Tandem__V1__DraftRequest *m)
{
    if (vlink_send(r->link, m))
        return;
    char why[300] = "";
    vlink_is_broken(r->link, why, sizeof(why));
    pthread_mutex_lock(&s->mu);
    req_link_failed_locked(s, r, why[0] ? why : "its Draft stream ended");
    sched_wake(s);
    pthread_mutex_unlock(&s->mu);
}

/* Room for the rows of a long prompt: messages of at most half the message
 * size of feature data (the rest is the open's tokens and framing). */
static size_t feat_message_bytes(const vsched *s)
{
    return s->p.max_message_bytes > 0 ? (size_t)s->p.max_message_bytes / 2 : (size_t)32 << 20;
}

/* Where a message's rows went, and since when they are being put out. */
typedef struct feat_put {
    Tandem__V1__Features last; /* the rows the open or verdict carries */
    Tandem__V1__FeatureShmRef ref;
    bool shm;  /* by reference into the ring */
    double t0; /* ms */
} feat_put;

/* Puts the feature rows r holds out: into its link's shared-memory ring
 * when the link has one with room (then *p's `last` references them), else
 * all but the last message's worth as FeatureChunks and the last
 * message's into p->last. NULL when r holds none. The data stays r's until
 * tdm_feat_out_sent. */
static Tandem__V1__Features *feat_send_chunks(vsched *s, vreq *r, feat_put *p)
{
    if (!r->feat || r->fout.rows == 0)
        return NULL;
    p->t0 = now_ms();
    const uint64_t bytes =
        (uint64_t)r->fout.rows * (uint64_t)r->fout.width * tdm_feat_dtype_bytes(r->fout.dtype);
    atomic_fetch_add(&s->feature_rows, (uint64_t)r->fout.rows);
    atomic_fetch_add(&s->feature_bytes, bytes);
    tdm_feat_ring *ring = vlink_feat_ring(r->link);
    p->shm = ring && tdm_feat_out_ring(&r->fout, ring, &p->last, &p->ref);
    if (p->shm) {
        atomic_fetch_add(&s->feature_rows_shm, (uint64_t)r->fout.rows);
        atomic_fetch_add(&s->feature_bytes_shm, bytes);
        return &p->last;
    }
    if (ring)
        atomic_fetch_add(&s->feature_ring_full, 1);
    const size_t max = feat_message_bytes(s);
    Tandem__V1__Features few[8];
    size_t n = tdm_feat_out_messages(&r->fout, max, few, TDM_ARRAY_LEN(few));
    Tandem__V1__Features *m = few;
    if (n > TDM_ARRAY_LEN(few)) {
        m = tdm_xmalloc(n * sizeof(*m));
        tdm_feat_out_messages(&r->fout, max, m, n);
    }
    for (size_t i = 0; i + 1 < n; i++) {
        Tandem__V1__FeatureChunk c = TANDEM__V1__FEATURE_CHUNK__INIT;
        c.sequence_id = r->id;
        c.hidden = &m[i];
        Tandem__V1__DraftRequest dr = TANDEM__V1__DRAFT_REQUEST__INIT;
        dr.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_FEATURES;
        dr.features = &c;
        send_msg(s, r, &dr);
    }
    p->last = m[n - 1];
    if (m != few)
        free(m);
    return &p->last;
}

/* The rows of r's last message (p; had: it carried rows) went out: counts
 * the time spent putting them out, their encoding included; the rows are
 * kept while a drafter that fails may be re-opened (drafter_reopen_tries),
 * else dropped. */
static void feat_sent(vsched *s, vreq *r, const feat_put *p, bool had)
{
    if (!r->feat)
        return;
    if (had) {
        const double us = r->feat_encode_us + (now_ms() - p->t0) * 1e3;
        /* One writer (this thread): a load and a store add. */
        _Atomic double *total = p->shm ? &s->feature_put_us_shm : &s->feature_put_us_grpc;
        atomic_store(total, atomic_load(total) + us);
        atomic_fetch_add(p->shm ? &s->feature_puts_shm : &s->feature_puts_grpc, 1);
        r->feat_encode_us = 0;
    }
    if (s->p.drafter_reopen_tries > 0)
        tdm_feat_out_take(&r->fsent, &r->fout);
    else
        tdm_feat_out_sent(&r->fout);
}

/* An open of r's first n tokens (send_open: every committed token and
 * `last`; before a fresh request's prefill: its prompt). */
static void send_open_n(vsched *s, vreq *r, int block, int n)
{
    Tandem__V1__SequenceOpen open = TANDEM__V1__SEQUENCE_OPEN__INIT;
    Tandem__V1__SamplingParams sp = TANDEM__V1__SAMPLING_PARAMS__INIT;
    open.sequence_id = r->id;
    open.n_tokens = (size_t)n;
    open.tokens = (uint32_t *)r->tokens; /* ids are non-negative: same bits */
    open.block_size = (uint32_t)block;
    sp.temperature = r->sampling.temperature;
    sp.top_p = r->sampling.top_p;
    sp.top_k = r->sampling.top_k;
    sp.seed_choice_case = TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED;
    sp.seed = r->seed ^ 0x5eedd4a7f7e5ull; /* the drafter's own stream of randomness */
    open.sampling = &sp;
    open.round = r->round;
    open.run_ahead = r->run_ahead; /* this verifier takes blocks drafted ahead of its verdict */
    Tandem__V1__FeatureRequest freq;
    Tandem__V1__FeatureSpec specs[TDM_FEAT_MAX_SPECS], *sp_ptrs[TDM_FEAT_MAX_SPECS];
    feat_put fp;
    if (r->feat) {
        tdm_feat_request_to_proto(&r->feat_req, &freq, specs, sp_ptrs);
        open.features = &freq;
        open.hidden = feat_send_chunks(s, r, &fp);
    }
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_OPEN;
    m.open = &open;
    send_msg(s, r, &m);
    feat_sent(s, r, &fp, open.hidden != NULL);
}

static void send_open(vsched *s, vreq *r, int block)
{
    /* Every committed token, `last` included (it sits right after them). */
    r->tokens[r->n_tokens] = r->last;
    send_open_n(s, r, block, r->n_tokens + 1);
}

/* A scoring open (drafter.proto): block 0, the positions planned
 * (plan_message_locked). */
static void send_score(vsched *s, vreq *r)
{
    r->tokens[r->n_tokens] = r->last;
    Tandem__V1__SequenceOpen open = TANDEM__V1__SEQUENCE_OPEN__INIT;
    open.sequence_id = r->id;
    open.n_tokens = (size_t)r->n_tokens + 1;
    open.tokens = (uint32_t *)r->tokens;
    open.round = r->round;
    open.score = true;
    open.score_from = (uint32_t)r->score_from;
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_OPEN;
    m.open = &open;
    send_msg(s, r, &m);
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
    feat_put fp;
    v.hidden = feat_send_chunks(s, r, &fp);
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_VERDICT;
    m.verdict = &v;
    send_msg(s, r, &m);
    feat_sent(s, r, &fp, v.hidden != NULL);
}

/* Keeps n rows of hidden states (host [n, H]) for r's drafter, one value
 * block per spec of its request (every spec available is the same state
 * today: the last layer's output after the final norm). */
static void feat_keep(vsched *s, vreq *r, const float *hidden, int n)
{
    const int H = s->hidden_size, ns = r->feat_req.n;
    const double t0 = now_ms();
    if (ns == 1) {
        tdm_feat_out_append(&r->fout, hidden, n);
    } else {
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < ns; j++)
                memcpy(s->rd.feat_row + (size_t)j * H, hidden + (size_t)i * H,
                       (size_t)H * sizeof(float));
            tdm_feat_out_append(&r->fout, s->rd.feat_row, 1);
        }
    }
    r->feat_encode_us += (now_ms() - t0) * 1e3;
}

/* Room in the round's hidden buffer for `rows` rows. */
static void hidden_reserve(vsched *s, size_t rows)
{
    vround *rd = &s->rd;
    if (rows <= rd->hidden_rows)
        return;
    free(rd->hidden);
    rd->hidden = tdm_xmalloc(rows * (size_t)s->hidden_size * sizeof(float));
    rd->hidden_rows = rows;
}

/* Sends the round's Closes and lets go of the references it collected. */
static void flush_links(vround *rd)
{
    for (int i = 0; i < rd->n_closes; i++) {
        vlink_send_close(rd->closes[i].link, rd->closes[i].id, rd->closes[i].reason);
        vlink_unref(rd->closes[i].link);
    }
    rd->n_closes = 0;
    for (int i = 0; i < rd->n_drop; i++)
        vlink_unref(rd->drop[i]);
    rd->n_drop = 0;
}

/* ---- state snapshots: queued work and imported sequences ----------------------- */

static void staged_free(staged_snap *st)
{
    if (!st)
        return;
    tdm_seq_destroy(st->seq);
    tdm_snap_layout_free(&st->layout);
    free(st);
}

void vsched_snapshot_free(vsched_snapshot *x)
{
    tdm_snap_layout_free(&x->layout);
    free(x->payload);
    x->payload = NULL;
}

/* Queues a job for the scheduler thread and waits until it is done. Under
 * mu (the wait lets go of it). */
static tdm_status job_run_locked(vsched *s, snap_job *j, tdm_error *err)
{
    if (s->stop)
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE, "the verifier is shutting down");
    snap_job **pp = &s->jobs;
    while (*pp)
        pp = &(*pp)->next;
    *pp = j;
    sched_wake(s);
    while (!j->done)
        pthread_cond_wait(&s->jobs_cv, &s->mu);
    if (j->rc != TDM_OK && err)
        *err = j->err;
    return j->rc;
}

tdm_status vsched_export(vsched *s, const char *request_id, bool detach, const char *snapshot_id,
                         vsched_snapshot *out, tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    snap_job j = {.detach = detach, .out = out};
    snprintf(j.request_id, sizeof(j.request_id), "%s", request_id);
    snprintf(j.snapshot_id, sizeof(j.snapshot_id), "%s", snapshot_id);
    pthread_mutex_lock(&s->mu);
    tdm_status rc = job_run_locked(s, &j, err);
    pthread_mutex_unlock(&s->mu);
    if (rc == TDM_OK)
        tdm_snap_seal(&out->layout, out->payload); /* here, not on the scheduler's thread */
    return rc;
}

/* Whether a continuation fits its layout and this verifier. */
static tdm_status check_continuation(const vsched *s, const tdm_snap_layout *l,
                                     const vsched_continuation *c, tdm_error *err)
{
    const uint32_t n = l->committed;
    if (c->prompt_tokens < 1 || c->prompt_tokens > n)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "continuation.prompt_tokens: %u, the layout's %u committed tokens "
                             "hold a prompt of 1..%u",
                             c->prompt_tokens, n, n);
    if (c->generated != n - c->prompt_tokens + 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "continuation.generated: %u, the layout's tokens after the prompt "
                             "and next_token make %u",
                             c->generated, n - c->prompt_tokens + 1);
    if (c->max_tokens <= c->generated)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "continuation.max_tokens: %u, but %u tokens were generated already: "
                             "nothing is left to continue",
                             c->max_tokens, c->generated);
    if (c->next_token < 0 || c->next_token >= s->vocab)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "continuation.next_token: %d is outside the vocabulary (0..%d)",
                             (int)c->next_token, s->vocab - 1);
    if ((int64_t)n + 1 >= (int64_t)s->p.max_context)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.committed_position: %u positions and the next token leave "
                             "no room in this verifier's max_context %d",
                             n, s->p.max_context);
    for (int i = 0; i < c->n_stop; i++)
        if (c->stop_ids[i] < 0 || c->stop_ids[i] >= s->vocab)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "continuation.stop_token_ids[%d]: %d is outside the vocabulary "
                                 "(0..%d)",
                                 i, (int)c->stop_ids[i], s->vocab - 1);
    return TDM_OK;
}

tdm_status vsched_import(vsched *s, const char *snapshot_id, tdm_snap_layout *layout,
                         uint8_t *payload, const vsched_continuation *c, tdm_error *err)
{
    snap_job j = {.import = true, .layout = *layout, .payload = payload, .cont = *c};
    memset(layout, 0, sizeof(*layout));
    snprintf(j.snapshot_id, sizeof(j.snapshot_id), "%s", snapshot_id);
    tdm_status rc = check_continuation(s, &j.layout, c, err);
    if (rc != TDM_OK) {
        tdm_snap_layout_free(&j.layout);
        free(j.payload);
        return rc;
    }
    /* The bounds, counting what is queued as well as what waits, checked
     * and the job queued under one lock. */
    pthread_mutex_lock(&s->mu);
    if (s->draining) {
        pthread_mutex_unlock(&s->mu);
        tdm_snap_layout_free(&j.layout);
        free(j.payload);
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                             "the verifier is draining: it takes no snapshot to continue");
    }
    const double now = now_ms();
    int n = 1;
    uint64_t bytes = j.layout.total_bytes;
    bool taken = false;
    for (const staged_snap *st = s->staged; st; st = st->next) {
        taken = taken || strcmp(st->id, snapshot_id) == 0;
        if (st->expires > now) {
            n++;
            bytes += st->layout.total_bytes;
        }
    }
    for (const snap_job *q = s->jobs; q; q = q->next) {
        taken = taken || (q->import && strcmp(q->snapshot_id, snapshot_id) == 0);
        n += q->import;
        bytes += q->import ? q->layout.total_bytes : 0;
    }
    if (taken)
        rc = tdm_error_set(err, TDM_ERR_ALREADY_EXISTS,
                           "snapshot_id %s: a snapshot of that id was imported already",
                           snapshot_id);
    else if (n > s->p.max_snapshots)
        rc = tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                           "max_snapshots: %d imported snapshots would wait for their Run, this "
                           "verifier holds at most %d",
                           n, s->p.max_snapshots);
    else if ((int64_t)bytes > s->p.max_snapshot_bytes)
        rc = tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                           "max_snapshot_bytes: imported snapshots waiting for their Run would "
                           "hold %llu bytes, this verifier holds at most %lld",
                           (unsigned long long)bytes, (long long)s->p.max_snapshot_bytes);
    else
        rc = job_run_locked(s, &j, err);
    pthread_mutex_unlock(&s->mu);
    tdm_snap_layout_free(&j.layout);
    free(j.payload);
    return rc;
}

/* An export, on the scheduler thread. */
static void job_export(vsched *s, snap_job *j)
{
    vreq *r = NULL;
    for (int i = 0; i < s->n_active; i++)
        if (strcmp(s->active[i]->request_id, j->request_id) == 0 && !s->active[i]->cancelled &&
            !s->active[i]->finished)
            r = s->active[i];
    if (!r) {
        j->rc =
            tdm_error_set(&j->err, TDM_ERR_NOT_FOUND,
                          "request_id %s: no such request runs on this verifier", j->request_id);
        return;
    }
    if (r->fresh || r->prefilling || !r->seq) {
        j->rc = tdm_error_set(&j->err, TDM_ERR_FAILED_PRECONDITION,
                              "request_id %s has not generated its first token yet (its prompt "
                              "is being prefilled); a snapshot is taken after it",
                              j->request_id);
        return;
    }
    if (r->n_stop > (int)TDM_ARRAY_LEN(j->out->cont.stop_ids)) {
        j->rc = tdm_error_set(&j->err, TDM_ERR_FAILED_PRECONDITION,
                              "request_id %s has %d stop_token_ids; a snapshot carries at most "
                              "%zu",
                              j->request_id, r->n_stop, TDM_ARRAY_LEN(j->out->cont.stop_ids));
        return;
    }
    vsched_snapshot *x = j->out;
    /* The digest is the caller's (vsched_export), off this thread. */
    j->rc = tdm_seq_snapshot_take(r->seq, s->p.fingerprint, r->tokens, r->n_tokens, &x->layout,
                                  &x->payload, &j->err);
    if (j->rc != TDM_OK)
        return;
    vsched_continuation *c = &x->cont;
    pthread_mutex_lock(&s->mu);
    s->counters.snapshots_exported++;
    pthread_mutex_unlock(&s->mu);
    snprintf(c->request_id, sizeof(c->request_id), "%s", r->request_id);
    c->prompt_tokens = (uint32_t)r->prompt_len;
    c->max_tokens = (uint32_t)r->max_tokens;
    c->generated = (uint32_t)r->n_out;
    c->next_token = r->last;
    c->sampling = r->sampling;
    c->seed = r->seed;
    c->n_stop = r->n_stop;
    memcpy(c->stop_ids, r->stop_ids, (size_t)c->n_stop * sizeof(int32_t));
    if (j->detach) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "moved: the request's state was exported as snapshot %s at %u "
                 "generated tokens",
                 j->snapshot_id, c->generated);
        pthread_mutex_lock(&s->mu);
        req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED, TDM_ERR_ABORTED,
                          msg);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

/* An import, on the scheduler thread: the sequence, kept for its Run. */
static void job_import(vsched *s, snap_job *j)
{
    tdm_seq_params sp = {.strategy = s->p.strategy, .max_draft = s->p.max_draft};
    tdm_seq *seq = NULL;
    j->rc = tdm_seq_from_snapshot(s->p.model, &sp, s->p.fingerprint, &j->layout, j->payload, &seq,
                                  &j->err);
    if (j->rc != TDM_OK)
        return;
    staged_snap *st = tdm_xcalloc(1, sizeof(*st));
    snprintf(st->id, sizeof(st->id), "%s", j->snapshot_id);
    st->seq = seq;
    st->layout = j->layout;
    memset(&j->layout, 0, sizeof(j->layout));
    st->cont = j->cont;
    st->expires = now_ms() + (double)s->p.snapshot_ttl_ms;
    pthread_mutex_lock(&s->mu);
    st->next = s->staged;
    s->staged = st;
    s->counters.snapshots_imported++;
    pthread_mutex_unlock(&s->mu);
}

/* ---- submit, next, cancel, release (RPC handler threads) ---------------------- */

/* Whether r's reservation fits beside the running requests' (under mu). */
static bool fits_locked(const vsched *s, const vreq *r)
{
    return s->p.seq_budget_bytes == 0 || s->reserved + r->reserved <= s->p.seq_budget_bytes;
}

tdm_status vsched_submit(vsched *s, const Tandem__V1__RunRequest *req, vreq **out, tdm_error *err)
{
    *out = NULL;
    tdm_status crc = tdm_req_check_run(req, s->vocab, s->p.max_context, s->p.max_draft, err);
    if (crc != TDM_OK)
        return crc;
    const Tandem__V1__SamplingParams *sp = req->sampling;
    const Tandem__V1__DrafterAssignment *da = req->drafter;
    if (da && !da->address[0])
        da = NULL;

    staged_snap *st = NULL;
    if (req->snapshot_id && req->snapshot_id[0]) {
        pthread_mutex_lock(&s->mu);
        for (staged_snap **pp = &s->staged; *pp; pp = &(*pp)->next)
            if (strcmp((*pp)->id, req->snapshot_id) == 0 && (*pp)->expires > now_ms()) {
                st = *pp;
                *pp = st->next;
                break;
            }
        pthread_mutex_unlock(&s->mu);
        if (!st)
            return tdm_error_set(err, TDM_ERR_NOT_FOUND,
                                 "snapshot_id %s: no imported snapshot of that id waits on this "
                                 "verifier (never imported, continued already, or dropped after "
                                 "snapshot_ttl %lld ms)",
                                 req->snapshot_id, (long long)s->p.snapshot_ttl_ms);
    }
    const int committed = st ? (int)st->layout.committed : 0;
    vreq *r = tdm_xcalloc(1, sizeof(*r));
    r->n_given = st ? 0 : (int)req->n_prompt_ids;
    r->prompt_len = st ? (int)st->cont.prompt_tokens : (int)(req->n_prompt_ids - req->generated);
    r->max_tokens = st ? (int)st->cont.max_tokens : (int)req->max_tokens;
    r->cap = (st ? committed + 1 : r->prompt_len) + r->max_tokens + s->p.max_draft + 2;
    r->kv_positions = r->cap < s->p.max_context ? r->cap : s->p.max_context;
    r->reserved = s->p.seq_fixed_bytes + (size_t)r->kv_positions * s->p.kv_bytes_per_position;
    r->out_cap = r->max_tokens + s->p.max_draft + 2;
    if (s->p.seq_budget_bytes > 0 && r->reserved > s->p.seq_budget_bytes) {
        tdm_status rc =
            tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                          "a request of %d positions needs %zu bytes of state, more "
                          "than the %zu the verifier holds for sequences (%s)",
                          r->kv_positions, r->reserved, s->p.seq_budget_bytes, s->limits);
        free(r);
        staged_free(st);
        return rc;
    }
    r->tokens = malloc((size_t)r->cap * sizeof(int32_t));
    r->out = malloc((size_t)r->out_cap * sizeof(int32_t));
    if (!r->tokens || !r->out) {
        const size_t bytes = ((size_t)r->cap + (size_t)r->out_cap) * sizeof(int32_t);
        const int prompt_len = r->prompt_len, max_tokens = r->max_tokens;
        req_free(r);
        staged_free(st);
        return tdm_error_oom(err, bytes, "the tokens of a request (%d prompt, %d to generate)",
                             prompt_len, max_tokens);
    }
    r->n_stop = st ? st->cont.n_stop : (int)req->n_stop_token_ids;
    r->stop_ids = tdm_xmalloc(((size_t)r->n_stop + 1) * sizeof(int32_t));
    pthread_cond_init(&r->cv, NULL);
    snprintf(r->request_id, sizeof(r->request_id), "%s",
             req->request_id && req->request_id[0] ? req->request_id
             : st                                  ? st->cont.request_id
                                                   : "");
    if (st) {
        /* The state covers the committed tokens; the newest generated one
         * runs in the next step, as after any round. */
        const vsched_continuation *c = &st->cont;
        memcpy(r->tokens, st->layout.tokens, (size_t)committed * sizeof(int32_t));
        r->n_tokens = committed;
        r->last = c->next_token;
        for (int i = r->prompt_len; i < committed; i++)
            r->out[r->n_out++] = r->tokens[i];
        r->out[r->n_out++] = c->next_token;
        r->out_taken = r->n_out; /* streamed by the Run it was taken from */
        memcpy(r->stop_ids, c->stop_ids, (size_t)r->n_stop * sizeof(int32_t));
        r->sampling = c->sampling;
        r->seed = c->seed;
        r->seeded = true;
        r->seq = st->seq;
        st->seq = NULL;
        r->imported = true;
        r->continued = true;
        r->prefilled = r->prompt_len - 1;
        staged_free(st);
    } else {
        for (int i = 0; i < r->n_given; i++)
            r->tokens[i] = (int32_t)req->prompt_ids[i];
        r->n_tokens = r->n_given;
        /* Tokens generated elsewhere: streamed there already. */
        for (int i = r->prompt_len; i < r->n_given; i++)
            r->out[r->n_out++] = r->tokens[i];
        r->out_taken = r->n_out;
        r->continued = r->n_out > 0;
        for (int i = 0; i < r->n_stop; i++)
            r->stop_ids[i] = (int32_t)req->stop_token_ids[i];
        r->sampling = tdm_req_sampling(sp);
    }
    if (r->imported) {
        /* the seed came with the snapshot */
    } else if (sp && sp->seed_choice_case == TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED) {
        r->seed = sp->seed;
        r->seeded = true;
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->seed = (uint64_t)ts.tv_nsec * 6364136223846793005ull ^ (uint64_t)ts.tv_sec ^
                  (uint64_t)(uintptr_t)r;
    }
    if (da) {
        snprintf(r->drafter_id, sizeof(r->drafter_id), "%s", da->replica_id);
        draft_costs_of(r, da);
        /* The drafter's acceptance on earlier requests, and by position;
         * seeded requests keep the rule's prior. */
        tdm_accept_positions positions = {{0}, {0}};
        const double accept_prior =
            r->seeded ? -1.0 : dacc_prior(s, da->replica_id, false, &positions);
        tdm_adaptive_params ap = {.k_max = (int)da->block_size, /* the drafter's limit too */
                                  .k_initial = (int)da->block_size,
                                  .min_gain = 0.05,
                                  .pause_tokens = 32,
                                  .min_rounds = 4,
                                  /* What speculation costs here is known from earlier
                                   * requests; seeded ones keep the fixed prior. */
                                  .cost_prior = r->seeded ? -1.0 : prior(s, &s->cost_ms_ema),
                                  .accept_prior = accept_prior,
                                  .accept_positions = positions,
                                  .fixed_prior = r->seeded ? -1.0 : prior(s, &s->fixed_ms_ema),
                                  .fixed = da->fixed_block_size,
                                  .open_cost = r->seeded ? -1.0 : open_cost(s),
                                  .tokens_left = r->max_tokens - r->n_out};
        tdm_adaptive_init(&r->ad, &ap);
        if (tdm_log_get_level() <= TDM_LOG_DEBUG)
            tdm_log_debug(LOG,
                          "request %s: speculation starts %s, block %d; priors: acceptance %.2f, "
                          "cost %.2f + %.2f a draft, open %.1f tokens, %d tokens left",
                          r->request_id, r->ad.k_next > 0 ? "on" : "paused", r->ad.k_next,
                          r->ad.accept_rate, r->ad.fixed, r->ad.cost, ap.open_cost,
                          ap.tokens_left);
        if (!r->seeded && r->ad.k_next == 0)
            dacc_prior(s, da->replica_id, true, NULL); /* one more without speculation */
        /* The Draft stream is opened here, before the lock: it may connect. */
        tdm_error lerr = {0};
        r->link = vlinks_get(s->links, da->address, &lerr);
        if (r->link && da->features && da->features->n_specs > 0) {
            /* A hidden-state drafter: the states of every committed
             * position go to it (the gateway's rule drafter-features
             * checked them; a direct caller is checked here). */
            tdm_error ferr = {0};
            char want[96];
            int miss = -1;
            if (tdm_feat_request_from_proto(da->features, "drafter.features", &r->feat_req,
                                            &ferr) != TDM_OK) {
                snprintf(r->spec_note, sizeof(r->spec_note), "off: %s", ferr.msg);
            } else if ((miss = tdm_feat_request_missing(&r->feat_req)) >= 0) {
                snprintf(r->spec_note, sizeof(r->spec_note),
                         "off: drafter %s needs the hidden states of the %s, which this verifier "
                         "cannot stream (it streams the final layer after the norm)",
                         da->replica_id,
                         tdm_feat_spec_name(&r->feat_req.specs[miss], want, sizeof(want)));
            } else if (st) {
                snprintf(r->spec_note, sizeof(r->spec_note),
                         "off: drafter %s needs the hidden states of every position, which an "
                         "imported snapshot does not carry",
                         da->replica_id);
            } else {
                r->feat = true;
                tdm_feat_out_init(&r->fout, r->feat_req.n * s->hidden_size, r->feat_req.dtype, 0);
                tdm_feat_out_init(&r->fsent, r->feat_req.n * s->hidden_size, r->feat_req.dtype, 0);
            }
            if (!r->feat) {
                vlink_unref(r->link);
                r->link = NULL;
            }
        }
        if (r->link) {
            r->spec = true;
            /* A drafter on this verifier's own GPU would draft ahead in the
             * verifier's time (through MPS too: the two then share its
             * bandwidth, bench/RESULTS.md); so would one on its CPU cores. */
            const tdm_gpu_share share =
                tdm_gpu_sharing(s->p.device_uuid, s->p.device_mps, da->device_uuid, da->device_mps);
            const bool cores = (!s->p.device_uuid || !s->p.device_uuid[0]) && !da->device_uuid[0] &&
                               tdm_cores_shared(s->p.host_id, s->p.cpus, da->host_id, da->cpus);
            /* Scores (drafter.proto) judge a greedy sequence's model drafter
             * while it is paused, in time the sequence does not wait for:
             * not where the drafter computes on this verifier's CPU cores,
             * whose plain steps its catch-ups would slow (two cores, the
             * demo pair at one stream: 0.88 of plain, against 0.98
             * unscored). */
            r->scores = da->scores && !r->feat && !da->fixed_block_size && !cores &&
                        tdm_sampling_is_greedy(&r->sampling);
            char loss[160] = "";
            r->run_ahead = share == TDM_GPU_APART && !cores &&
                           ahead_pays(s, r, (int)da->block_size, loss, sizeof(loss));
            snprintf(r->ahead_off, sizeof(r->ahead_off), "%s",
                     r->run_ahead ? ""
                     : share == TDM_GPU_SHARED_MPS
                         ? " (no run-ahead: the drafter shares this verifier's GPU, through MPS)"
                     : share == TDM_GPU_SHARED_TURNS
                         ? " (no run-ahead: the drafter shares this verifier's GPU as a context "
                           "of its own, and the two take turns on it)"
                     : cores ? " (no run-ahead: the drafter may run on this verifier's CPU cores)"
                             : "");
            if (!r->ahead_off[0] && !r->run_ahead)
                snprintf(r->ahead_off, sizeof(r->ahead_off), " (no run-ahead: %s)", loss);
            snprintf(r->spec_note, sizeof(r->spec_note), "on%s", r->ahead_off);
            if (share == TDM_GPU_SHARED_TURNS && vlink_note_once(r->link))
                tdm_log_warn(LOG,
                             "drafter %s (%s) shares this verifier's GPU %s, and %s runs "
                             "through an MPS server: their contexts take turns on the GPU, so "
                             "each waits for the other's kernels; %s",
                             da->replica_id, da->address, s->p.device_uuid,
                             tdm_gpu_turns_without(s->p.device_mps, da->device_mps),
                             TDM_GPU_TURNS_FIX);
        } else if (!r->spec_note[0]) {
            snprintf(r->spec_note, sizeof(r->spec_note), "off: cannot reach drafter %s (%s)",
                     da->address, lerr.msg);
        }
    } else {
        snprintf(r->spec_note, sizeof(r->spec_note), "off: no drafter assigned");
    }
    r->t_submit = now_ms();
    r->open_first = true;

    pthread_mutex_lock(&s->mu);
    if (s->stop || s->draining) {
        const bool draining = s->draining;
        pthread_mutex_unlock(&s->mu);
        vlink_unref(r->link);
        req_free(r);
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE, "the verifier is %s",
                             draining ? "draining: it takes no new requests" : "shutting down");
    }
    /* The line holds max_waiting requests beyond those the next round
     * admits to the free places. */
    int waiting = 0;
    for (vreq *w = s->wait_head; w; w = w->next_waiting)
        waiting += !w->cancelled;
    const int free_places = s->p.max_sequences - s->n_active;
    if (waiting - free_places >= s->p.max_waiting) {
        s->counters.refused++;
        const int active = s->n_active;
        const size_t held = s->reserved;
        pthread_mutex_unlock(&s->mu);
        vlink_unref(r->link);
        req_free(r);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "the verifier is full: %d requests running (%zu of %zu bytes of "
                             "state reserved) and %d waiting, the most it takes (%s)",
                             active, held, s->p.seq_budget_bytes, waiting, s->limits);
    }
    r->id = ++s->next_id;
    r->state = REQ_WAITING;
    if (s->wait_tail)
        s->wait_tail->next_waiting = r;
    else
        s->wait_head = r;
    s->wait_tail = r;
    s->counters.requests++;
    sched_wake(s);
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
    /* Written when its numbers change, not at every token's stats: a Run
     * takes them under mu, which the round's emit takes per sequence. */
    const int noted[4] = {r->ad.pauses, r->ad.probes, r->ad.rounds, r->ad.scores};
    const bool ad = r->spec && r->ad.pauses > 0;
    if (ad && (!r->ad_note[0] || memcmp(noted, r->noted, sizeof(noted)) != 0)) {
        memcpy(r->noted, noted, sizeof(noted));
        snprintf(r->ad_note, sizeof(r->ad_note),
                 "on%s, switched off %d time(s) by the adaptive rule (%d probe(s), %d score(s) "
                 "of which %d restarted it, %d speculative rounds; last: %s, at acceptance %.2f, "
                 "%.2f + %.2f a draft)",
                 r->ahead_off, r->ad.pauses, r->ad.probes, r->ad.scores, r->ad.score_starts,
                 r->ad.rounds, r->ad.pause_why, r->ad.pause_at[0], r->ad.pause_at[2],
                 r->ad.pause_at[1]);
    }
    st->speculation = ad ? r->ad_note : r->spec_note;
    st->seed = r->seed;
    st->ahead_blocks = r->ahead_used;
    st->cached_prompt_tokens = (uint32_t)r->cached;
    st->n_reached_at_position = st->n_accepted_at_position = (size_t)r->positions;
    st->reached_at_position = r->reached_at;
    st->accepted_at_position = r->accepted_at;
}

/* Whether r's Run should now hear that the verifier drains: once, after its
 * first token (a snapshot is taken only after it), while it runs (under mu). */
static bool drain_due_locked(const vsched *s, const vreq *r)
{
    return s->draining && !r->drain_noticed && r->n_out > 0 && r->out_taken == r->n_out &&
           !r->finished && !r->released;
}

void vsched_drain(vsched *s)
{
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    for (int i = 0; i < s->n_active; i++)
        pthread_cond_broadcast(&s->active[i]->cv);
    pthread_mutex_unlock(&s->mu);
}

int vsched_in_flight(vsched *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_active;
    for (vreq *w = s->wait_head; w; w = w->next_waiting)
        n += !w->cancelled;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void vsched_next(vsched *s, vreq *r, vsched_output *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_lock(&s->mu);
    while (r->out_taken == r->n_out && !r->finished && !r->released && !drain_due_locked(s, r))
        pthread_cond_wait(&r->cv, &s->mu);
    int n = r->n_out - r->out_taken;
    if (drain_due_locked(s, r)) {
        /* Told once, before any more tokens: its caller may move it now. */
        r->drain_noticed = true;
        o->draining = true;
    } else if (n > 0) {
        o->ids = tdm_xmalloc((size_t)n * sizeof(int32_t));
        memcpy(o->ids, r->out + r->out_taken, (size_t)n * sizeof(int32_t));
        o->n_ids = n;
        o->index = r->out_taken;
        r->out_taken = r->n_out;
    } else if (r->finished || r->released) {
        o->done = true;
        o->finish_reason = r->reason;
        o->status = r->finished ? r->fail : TDM_ERR_CANCELLED;
        snprintf(o->msg, sizeof(o->msg), "%s", r->finished ? r->fail_msg : "cancelled");
        o->queue_ms = r->t_admit > 0 ? r->t_admit - r->t_submit : 0;
    }
    if (!r->t_end && !o->done) {
        /* Progress: stats as if the request ended now. */
        double end = r->t_end;
        r->t_end = now_ms();
        fill_stats(r, o);
        r->t_end = end;
    } else {
        fill_stats(r, o);
    }
    pthread_mutex_unlock(&s->mu);
}

void vsched_cancel(vsched *s, vreq *r)
{
    pthread_mutex_lock(&s->mu);
    if (!r->released) {
        r->cancelled = true;
        sched_wake(s);
    }
    pthread_mutex_unlock(&s->mu);
}

void vsched_release(vsched *s, vreq *r)
{
    vlink *drop = NULL;
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
            drop = r->link;
            r->link = NULL;
        }
    }
    r->cancelled = true;
    sched_wake(s);
    while (!r->released)
        pthread_cond_wait(&r->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    vlink_unref(drop);
    req_free(r);
}

/* ---- the round ------------------------------------------------------------------ */

/* 1. Waits for work, retires cancelled sequences, admits waiting requests up
 * to max_sequences, and takes the round's sequences. False: stop. */
static bool admit_and_retire(vsched *s, vround *rd)
{
    pthread_mutex_lock(&s->mu);
    s->idle_since = now_ms();
    while (!s->stop && !s->wait_head && s->n_active == 0 && !s->jobs) {
        if (!s->staged) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        /* Imported snapshots expire while nothing runs: look once a second. */
        struct timespec soon;
        clock_gettime(CLOCK_REALTIME, &soon);
        soon.tv_sec += 1;
        if (pthread_cond_timedwait(&s->cv, &s->mu, &soon) == ETIMEDOUT)
            break;
    }
    rd->t_idle_end = now_ms();
    s->counters.phase_total_us[VSCHED_IDLE] += (rd->t_idle_end - s->idle_since) * 1e3;
    s->idle_since = 0;
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    for (int i = 0; i < s->n_active;) {
        vreq *r = s->active[i];
        if (r->cancelled) {
            req_retire_locked(rd, r, "cancelled");
            s->counters.cancelled++;
            s->reserved -= r->reserved;
            s->active[i] = s->active[--s->n_active];
            continue;
        }
        i++;
    }
    /* Cancelled waiting requests hand their link to the round: at most
     * max_sequences of them a round, so the round's arrays never overflow. */
    int retired_waiting = 0;
    while (s->wait_head && s->n_active < s->p.max_sequences &&
           retired_waiting < s->p.max_sequences) {
        vreq *r = s->wait_head;
        if (!r->cancelled && !fits_locked(s, r))
            break; /* first come, first served: it waits for memory */
        s->wait_head = r->next_waiting;
        if (!s->wait_head)
            s->wait_tail = NULL;
        r->next_waiting = NULL;
        if (r->cancelled) {
            req_retire_locked(rd, r, NULL);
            retired_waiting++;
            continue;
        }
        r->state = REQ_ACTIVE;
        s->reserved += r->reserved;
        r->t_admit = now_ms();
        r->fresh = !r->imported;
        r->prefilling = !r->imported; /* an imported state is past its prompt */
        s->active[s->n_active++] = r;
    }
    rd->n = s->n_active;
    for (int i = 0; i < rd->n; i++)
        rd->seqs[i] = (vround_seq){.r = s->active[i]};
    pthread_mutex_unlock(&s->mu);
    flush_links(rd);
    return true;
}

/* 1a. Snapshot work between rounds: exports of running requests (their
 * committed state, consistent with what was streamed), imports of received
 * snapshots, and imported snapshots whose time to wait for a Run is up. */
static void snapshot_jobs(vsched *s)
{
    pthread_mutex_lock(&s->mu);
    snap_job *jobs = s->jobs;
    s->jobs = NULL;
    staged_snap *expired = NULL;
    const double now = now_ms();
    for (staged_snap **pp = &s->staged; *pp;) {
        staged_snap *st = *pp;
        if (st->expires <= now) {
            *pp = st->next;
            st->next = expired;
            expired = st;
            s->counters.snapshots_expired++;
            continue;
        }
        pp = &st->next;
    }
    pthread_mutex_unlock(&s->mu);
    while (expired) {
        staged_snap *next = expired->next;
        tdm_log_info(LOG, "imported snapshot %s dropped: no Run continued it within %lld ms",
                     expired->id, (long long)s->p.snapshot_ttl_ms);
        staged_free(expired);
        expired = next;
    }
    while (jobs) {
        snap_job *j = jobs, *next = j->next;
        if (j->import)
            job_import(s, j);
        else
            job_export(s, j);
        pthread_mutex_lock(&s->mu);
        j->done = true; /* j belongs to its handler from here on */
        pthread_cond_broadcast(&s->jobs_cv);
        pthread_mutex_unlock(&s->mu);
        jobs = next;
    }
}

/* The cache's own counters into the scheduler's (under mu). */
static void prefix_counters_locked(vsched *s)
{
    tdm_prefix_stats ps;
    pthread_mutex_lock(&s->pmu);
    tdm_prefix_cache_stats(s->prefix, &ps);
    pthread_mutex_unlock(&s->pmu);
    s->counters.prefix_stored = ps.inserted;
    s->counters.prefix_evictions = ps.evictions;
    s->counters.prefix_blocks = ps.entries;
    s->counters.prefix_bytes = ps.bytes;
}

/* A new request's sequence: from the longest cached prefix of its prompt
 * (at most all of it but the last token, which runs in the step), else
 * empty. */
static tdm_status prefill_start(vsched *s, vreq *r, tdm_error *err)
{
    tdm_seq_params sp = {
        .strategy = s->p.strategy, .max_draft = s->p.max_draft, .max_positions = r->kv_positions};
    const int most = r->n_given - 1;
    /* A drafter fed hidden states needs the prompt's, which a cached state
     * does not carry: such a request prefills its whole prompt. */
    if (s->prefix && !r->feat && most >= tdm_prefix_cache_block(s->prefix)) {
        int covered = 0;
        pthread_mutex_lock(&s->pmu);
        tdm_status rc = tdm_prefix_cache_get_seq(s->prefix, s->p.model, &sp, r->tokens, most,
                                                 &r->seq, &covered, err);
        pthread_mutex_unlock(&s->pmu);
        if (rc != TDM_OK)
            return rc;
        pthread_mutex_lock(&s->mu);
        if (covered > 0) {
            s->counters.prefix_hits++;
            s->counters.prefix_tokens_saved += (uint64_t)covered;
        } else {
            s->counters.prefix_misses++;
        }
        pthread_mutex_unlock(&s->mu);
        r->prefilled = r->cached = covered;
        if (r->seq)
            return TDM_OK;
    }
    return tdm_seq_create(s->p.model, &sp, &r->seq, err);
}

/* Stores r's state when its prefill stopped at a block boundary. A failure
 * (the host has no room for the copy) costs only the entry. */
static void prefill_store(vsched *s, vreq *r)
{
    const int B = tdm_prefix_cache_block(s->prefix);
    if (r->prefilled == 0 || r->prefilled % B != 0)
        return;
    tdm_prefix_put res;
    tdm_error err = {0};
    pthread_mutex_lock(&s->pmu);
    const tdm_status rc = tdm_prefix_cache_put_seq(s->prefix, r->seq, r->tokens, &res, &err);
    pthread_mutex_unlock(&s->pmu);
    if (rc != TDM_OK)
        tdm_log_warn(LOG, "request %s: prefix cache: the block ending at %d not kept: %s",
                     r->request_id, r->prefilled, err.msg);
    pthread_mutex_lock(&s->mu);
    prefix_counters_locked(s);
    pthread_mutex_unlock(&s->mu);
}

static void open_first(vsched *s, vreq *r, bool at_start);

/* 2. Prefills prompts, prefill_chunk tokens a round over all of them in the
 * order they were admitted: every prompt token but the last, which runs in
 * the batched step and yields the first generated token. A sequence joins
 * the step in the round its prefill completes; until then it sits rounds
 * out (and is cancelled between chunks like any other). A request whose
 * prefill fails ends here; it is retired with the finished ones. With the
 * prefix cache, a prompt starts from its longest cached prefix, and a chunk
 * stops at each block boundary, where the state is stored. */
static void prefill_chunks(vsched *s, vround *rd)
{
    int budget = s->p.prefill_chunk;
    for (;;) {
        /* The earliest admitted sequence still prefilling. */
        vreq *r = NULL;
        for (int i = 0; i < rd->n; i++) {
            vreq *c = rd->seqs[i].r;
            if (c->prefilling && !c->finished && (!r || c->id < r->id))
                r = c;
        }
        if (!r || budget <= 0)
            break;
        tdm_error err = {0};
        tdm_status rc = TDM_OK;
        /* A fresh request of a model drafter opens its sequence on the
         * drafter as its prefill starts: the drafter prefills the prompt
         * beside this one, in its idle moments, and drafts the first block,
         * which the request's first step verifies (open_first_blocks). */
        if (!r->seq && !r->feat && !r->continued)
            open_first(s, r, true);
        if (!r->seq)
            rc = prefill_start(s, r, &err);
        /* A call covers one segment of a fixed grid, whole: multiples of
         * prefill_chunk and, with the prefix cache, its block boundaries.
         * On CUDA a prompt chunk's rounding depends on its length (its
         * matmuls from 16 rows and its delta rule from 64 take faster
         * forms: backend.h), so a prompt is prefilled in the same calls
         * whatever else the round prefills, and gets the same tokens at any
         * load; a prefix-cache hit runs the very calls a miss ran from its
         * boundary on. A segment the round's budget cannot hold waits for
         * the next round (a fresh round's budget holds any segment). */
        const int want = r->n_given - 1 - r->prefilled;
        const int C = s->p.prefill_chunk, to_chunk = C - r->prefilled % C;
        int n = want < to_chunk ? want : to_chunk;
        if (s->prefix) {
            const int B = tdm_prefix_cache_block(s->prefix), to_block = B - r->prefilled % B;
            n = n < to_block ? n : to_block;
        }
        if (rc == TDM_OK && n > budget)
            break;
        if (rc == TDM_OK && n > 0) {
            const double t0 = now_ms();
            if (r->feat) {
                /* Its drafter takes the prompt's hidden states at its open. */
                hidden_reserve(s, (size_t)n);
                const tdm_step_out o = {.hidden = rd->hidden};
                rc = tdm_seq_prefill_out(r->seq, r->tokens + r->prefilled, n, &o, &err);
                if (rc == TDM_OK)
                    feat_keep(s, r, rd->hidden, n);
            } else {
                rc = tdm_seq_prefill(r->seq, r->tokens + r->prefilled, n, NULL, &err);
            }
            const double ms = now_ms() - t0;
            if (rc == TDM_OK && ms > 0) {
                const double rate = n / ms, prev = atomic_load(&s->prefill_tok_per_ms);
                atomic_store(&s->prefill_tok_per_ms, prev > 0 ? 0.8 * prev + 0.2 * rate : rate);
            }
            if (rc == TDM_OK)
                tdm_log_debug(LOG, "request %s: prompt rows %d..%d of %d prefilled in %.2f ms",
                              r->request_id, r->prefilled, r->prefilled + n, r->n_given - 1, ms);
        }
        if (rc != TDM_OK) {
            tdm_log_error(LOG, "request %s: %s", r->request_id, err.msg);
            req_fail(s, r, rc, err.msg);
            r->prefilling = false;
            continue;
        }
        r->prefilled += n;
        budget -= n;
        if (s->prefix && n > 0)
            prefill_store(s, r);
        if (r->prefilled == r->n_given - 1) {
            r->prefilling = false;
            r->last = r->tokens[r->n_given - 1];
            r->n_tokens = r->n_given - 1; /* `last` is committed after the step */
            /* Opened as its prefill started: the block it waits for is due
             * from now (draft_timeout_ms), and the open costs what it makes
             * the request wait beyond its prefill. */
            pthread_mutex_lock(&s->mu);
            if (r->after_open && r->awaiting)
                r->t_asked = r->block ? r->t_got : now_ms();
            pthread_mutex_unlock(&s->mu);
        }
    }
    /* Only the sequences done prefilling (and not failed) take part in the step. */
    int live = 0;
    for (int i = 0; i < rd->n; i++) {
        vreq *r = rd->seqs[i].r;
        if (!r->prefilling && !r->finished)
            rd->seqs[live++] = rd->seqs[i];
    }
    rd->n = live;
}

/* Whether a sequence waits on a block it was promised. Under mu. */
static bool awaits_block(const vreq *r)
{
    return r->spec && r->awaiting && !r->block && !r->cancelled && !r->finished;
}

/* 3. Waits for the blocks asked for in the previous round, each at most
 * draft_timeout after it was asked for. A block that follows an open costs
 * the drafter a prefill of the sequence so far: its sequence sits the round
 * out instead of holding the batch (within its own timeout). */
static void await_blocks(vsched *s, vround *rd)
{
    const double timeout = s->p.draft_timeout_ms;
    double t0 = now_ms();
    pthread_mutex_lock(&s->mu);
    int held_out = 0;
    for (int i = 0; i < rd->n;) {
        vreq *r = rd->seqs[i].r;
        if (awaits_block(r) && r->after_open && t0 - r->t_asked < timeout) {
            rd->seqs[i] = rd->seqs[--rd->n];
            held_out++;
            continue;
        }
        i++;
    }
    if (rd->n == 0 && held_out > 0) {
        /* Nothing else to run: wait a little for one of those blocks. */
        struct timespec soon;
        clock_gettime(CLOCK_REALTIME, &soon);
        soon.tv_nsec += 2000000L;
        if (soon.tv_nsec >= 1000000000L) {
            soon.tv_sec++;
            soon.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &soon);
    }
    while (!s->stop) {
        /* The earliest deadline of the blocks still missing. */
        double first = 0;
        bool missing = false;
        for (int i = 0; i < rd->n; i++) {
            vreq *r = rd->seqs[i].r;
            if (!awaits_block(r))
                continue;
            double due = r->t_asked + timeout;
            if (due <= now_ms()) {
                char d[64];
                snprintf(d, sizeof(d), "%d ms", s->p.draft_timeout_ms);
                req_drop_spec_locked(r, "off: drafter sent no block within %s", d);
                s->counters.drafter_failures++;
                if (r->opened) {
                    vlink_ref(r->link);
                    rd->closes[rd->n_closes++] = (pending_close){r->link, r->id, "timeout"};
                }
                continue;
            }
            if (!missing || due < first)
                first = due;
            missing = true;
        }
        if (!missing)
            break;
        /* Polled first (spin.h), so a block is seen the moment it lands;
         * one that lands while mu is free is seen before sleeping, not at
         * the deadline (sched_wake bumps wakes under mu). */
        const uint64_t seen = atomic_load(&s->wakes);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double wait_ms = first - now_ms();
        if (wait_ms < 0)
            wait_ms = 0;
        long long ns = (long long)until.tv_nsec + (long long)(wait_ms * 1e6);
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        tdm_spin_wait(&s->mu, &s->cv, &s->wakes, seen, &until);
    }
    pthread_mutex_unlock(&s->mu);
    rd->t_wait = now_ms() - t0;
}

/* The drafts r's next round can use: no more than the positions left in the
 * context, nor than the tokens the request still emits (a round emits its
 * accepted drafts and one token more; with one token left, none). So its
 * last token is never run through the model, as in a plain request, and no
 * row is drafted or verified for a token it cannot emit. Under mu. */
static int draft_room(const vsched *s, const vreq *r)
{
    const int context = s->p.max_context - (r->n_tokens + 1) - 1;
    const int emits = r->max_tokens - r->n_out - 1;
    const int room = context < emits ? context : emits;
    return room > 0 ? room : 0;
}

/* Why a block cannot be verified as it is (a drafter is input like any
 * other), or NULL when it can. */
static const char *block_fault(const vsched *s, const vreq *r, const Tandem__V1__DraftBlock *b,
                               char *buf, size_t len)
{
    size_t max = (size_t)(s->p.max_draft < r->ad.p.k_max ? s->p.max_draft : r->ad.p.k_max);
    tdm_error e;
    if (tdm_req_check_draft_block(b, (uint32_t)(r->n_tokens + 1), max, s->vocab, &e) == TDM_OK)
        return NULL;
    snprintf(buf, len, "%s", e.msg);
    return buf;
}

/* 4. Takes the blocks that came and checks them against what is committed:
 * a malformed block turns speculation off for its sequence only. */
static void take_blocks(vsched *s, vround *rd)
{
    rd->first_sight = false;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < rd->n; i++) {
        vround_seq *q = &rd->seqs[i];
        vreq *r = q->r;
        if (r->block) {
            q->block = r->block;
            r->block = NULL;
            const Tandem__V1__DraftBlock *b = q->block->block;
            char buf[200];
            const char *fault = r->spec ? block_fault(s, r, b, buf, sizeof(buf)) : "";
            if (fault) {
                if (r->spec) {
                    tdm_log_warn(LOG,
                                 "request %s: drafter %s sent a malformed %s; speculation "
                                 "off for this sequence",
                                 r->request_id, r->drafter_id, fault);
                    s->counters.malformed_blocks++;
                    req_drop_spec_locked(r, "off: drafter sent a malformed %s", fault);
                    if (r->opened) {
                        vlink_ref(r->link);
                        rd->closes[rd->n_closes++] =
                            (pending_close){r->link, r->id, "malformed block"};
                    }
                }
            } else {
                /* A block drafted ahead, or a first one, may bring more
                 * than the request can use: the rest is not verified. */
                const int room = draft_room(s, r);
                q->k = (int)b->n_tokens < room ? (int)b->n_tokens : room;
                q->got = true;
                rd->first_sight |= b->first_sight;
                /* After an open the wait includes the drafter's prefill:
                 * the open's cost, for the adaptive rule of requests to come. */
                if (r->after_open && r->t_asked > 0 && r->t_got >= r->t_asked) {
                    s->open_wait_us_total += (r->t_got - r->t_asked) * 1e3;
                    s->open_waits++;
                    if (!(b->first_sight && s->first_share < FIRST_SIGHT_ONE_OFF)) {
                        tdm_open_cost_note(&s->opens, r->t_got - r->t_asked);
                        atomic_store(&s->open_ms, tdm_open_cost_ms(&s->opens));
                    }
                }
                if (!r->after_open && !r->block_ahead && r->t_asked > 0 && r->t_got >= r->t_asked) {
                    double us = (r->t_got - r->t_asked) * 1e3 - (double)b->draft_micros;
                    s->overhead_us[s->n_overhead++ % TDM_ARRAY_LEN(s->overhead_us)] =
                        (float)(us > 0 ? us : 0);
                    s->exchange_us_total += us > 0 ? us : 0;
                    const double ms = us > 0 ? us * 1e-3 : 0;
                    s->exchange_ms = s->exchange_ms > 0 ? 0.9 * s->exchange_ms + 0.1 * ms : ms;
                }
                if (b->n_tokens > 0) {
                    s->draft_token_us[s->n_draft_token++ % TDM_ARRAY_LEN(s->draft_token_us)] =
                        (float)((double)b->draft_micros / (double)b->n_tokens);
                    s->draft_us_total += (double)b->draft_micros;
                    s->draft_tokens_total += b->n_tokens;
                }
            }
        }
        r->awaiting = false;
    }
    rd->drafting = false;
    for (int i = 0; i < s->n_active; i++)
        rd->drafting |= awaits_block(s->active[i]);
    pthread_mutex_unlock(&s->mu);
}

/* 4b. Whether this round runs plainly to measure what a plain round of its
 * sequences takes (tdm_steptime_wants_plain: none within the last
 * TDM_STEPTIME_PLAIN_FRESH rounds), the baseline every speculative round's
 * cost is judged against (adaptive.h). Only where every block it would set
 * aside is an adaptive request's own, after its first block, without a
 * seed (whose output must not depend on timing), and no drafter computes
 * beside the step. It costs one round's accepted drafts. */
static void plain_round_due(vsched *s, vround *rd)
{
    rd->plain_measure = false;
    if (rd->drafting || !tdm_steptime_wants_plain(&s->st, rd->n))
        return;
    bool any = false;
    for (int i = 0; i < rd->n; i++) {
        const vround_seq *q = &rd->seqs[i];
        if (q->k == 0)
            continue;
        if (q->r->ad.p.fixed || q->r->seeded || q->r->after_open)
            return;
        any = true;
    }
    if (!any)
        return; /* plain already */
    rd->plain_measure = true;
    for (int i = 0; i < rd->n; i++) {
        vround_seq *q = &rd->seqs[i];
        q->unverified = q->k > 0;
        q->k = 0;
    }
}

/* Longest blocks first, then by arrival: the step's shape (rows per
 * sequence, in order) is the key of its CUDA graph, so a batch where a few
 * sequences verify blocks gives a handful of shapes rather than one per
 * arrangement (each new shape runs eagerly, the second sight is captured). */
static int by_rows_desc(const void *a, const void *b)
{
    const vround_seq *x = a, *y = b;
    if (x->k != y->k)
        return x->k > y->k ? -1 : 1;
    return x->r->id < y->r->id ? -1 : x->r->id > y->r->id;
}

/* The position of the sequence that its first row in the round decides
 * (row i decides the one after i drafts). */
static uint32_t round_position(const vround_seq *q)
{
    return (uint32_t)(q->r->prompt_len + q->r->n_out);
}

/* 5. One batched forward pass over every live sequence: its last token, then
 * its drafts. Greedy sequences bring back only each row's argmax. */
static void run_step(vsched *s, vround *rd)
{
    double t0 = now_ms();
    rd->rc = TDM_OK;
    rd->t_step = 0;
    rd->cost = rd->fixed = -1.0;
    rd->n_rows = 0;
    rd->n_stepped = rd->n;
    rd->n_spec = 0;
    rd->drafted = 0;
    qsort(rd->seqs, (size_t)rd->n, sizeof(rd->seqs[0]), by_rows_desc);
    for (int i = 0; i < rd->n; i++) {
        vround_seq *q = &rd->seqs[i];
        int32_t *row = rd->rows + rd->n_rows;
        row[0] = q->r->last;
        for (int j = 0; j < q->k; j++)
            row[1 + j] = (int32_t)q->block->block->tokens[j];
        q->row = rd->n_rows;
        rd->toks[i] = row;
        rd->ntok[i] = 1 + q->k;
        rd->eseqs[i] = q->r->seq;
        rd->n_rows += 1 + q->k;
        rd->drafted += q->k;
    }
    if (rd->n == 0)
        return;
    /* Logits come back for sampled sequences alone: rows up to the last of theirs. */
    int logit_rows = 0;
    for (int i = 0; i < rd->n; i++)
        if (!tdm_sampling_is_greedy(&rd->seqs[i].r->sampling))
            logit_rows = rd->seqs[i].row + 1 + rd->seqs[i].k;
    rd->rc = tdm_step_buf_reserve(&rd->out, s->p.model, (size_t)rd->n_rows, (size_t)logit_rows,
                                  &rd->err);
    if (rd->rc != TDM_OK)
        return;
    bool any_feat = false;
    for (int i = 0; i < rd->n; i++) {
        const tdm_sampling *sp = &rd->seqs[i].r->sampling;
        rd->out.want[i] = !tdm_sampling_is_greedy(sp);
        /* a sampled one's last row's draw: plain decoding's, or the bonus
         * token's */
        const vround_seq *q = &rd->seqs[i];
        rd->probs_of[i] = (tdm_sample_row){
            sp->temperature, sp->top_p, sp->top_k, 0,
            rd->out.want[i]
                ? tdm_verify_bonus_uniform(q->r->seed, round_position(q) + (uint32_t)q->k)
                : 0.0};
        rd->want_hidden[i] = rd->seqs[i].r->feat;
        any_feat |= rd->seqs[i].r->feat;
    }
    tdm_step_out o = tdm_step_buf_out(&rd->out);
    /* A sampled sequence's rows stay where the logits are, as its
     * distributions (on the device for CUDA): its draw and its drafts'
     * probabilities come back, and verdicts fetches a row a rejection needs. */
    o.probs_of = rd->probs_of;
    if (any_feat) {
        /* Only sequences whose drafter takes hidden states bring theirs back. */
        hidden_reserve(s, (size_t)rd->n_rows);
        o.hidden = rd->hidden;
        o.want_hidden = rd->want_hidden;
    }
    const uint64_t fs = tdm_runtime_graph_first_sights(s->p.runtime);
    rd->rc = tdm_seq_step_out(rd->eseqs, rd->n, rd->toks, rd->ntok, &o, &rd->err);
    rd->t_step = now_ms() - t0;
    if (rd->rc != TDM_OK)
        return;
    const bool step_first = tdm_runtime_graph_first_sights(s->p.runtime) != fs;
    rd->first_sight |= step_first;
    s->first_share = 0.95 * s->first_share + 0.05 * (rd->first_sight ? 1.0 : 0.0);
    rd->first_sight = rd->first_sight && s->first_share < FIRST_SIGHT_ONE_OFF;
    tdm_steptime_tick(&s->st);
    if (!(step_first && rd->first_sight)) {
        tdm_steptime_add(&s->st, rd->n_rows, rd->t_step);
        if (rd->n_rows == rd->n && !rd->drafting)
            tdm_steptime_add_plain(&s->st, rd->n, rd->t_step);
    }
    tdm_log_debug(LOG, "step: %d sequences, %d rows, %.3f ms", rd->n, rd->n_rows, rd->t_step);
    /* What speculating and each drafted token cost, against the plain round
     * the model predicts; the exchange and the drafter's pass whatever its
     * length (its draft_pass_costs) are the part that does not grow with the
     * drafts. */
    int spec = 0;
    double pass_ms = 0; /* the longest of the drafters' passes whatever their length */
    for (int i = 0; i < rd->n; i++)
        if (rd->seqs[i].k > 0) {
            spec++;
            pass_ms = rd->seqs[i].r->dpass_ms > pass_ms ? rd->seqs[i].r->dpass_ms : pass_ms;
        }
    rd->n_spec = spec;
    double plain_round;
    if (tdm_steptime_plain(&s->st, rd->n, &plain_round)) {
        atomic_store(&s->plain_seq_ms, plain_round / rd->n);
        atomic_store(&s->plain_round_ms, plain_round);
    }
    if (!rd->first_sight &&
        tdm_steptime_round_cost(&s->st, rd->n, spec, rd->drafted, rd->t_wait + rd->t_step,
                                s->exchange_ms + pass_ms, &rd->fixed, &rd->cost)) {
        const double seq_ms = plain_round / rd->n;
        /* and what speculating adds after the step, as measured on the
         * rounds before (post_cost) */
        rd->fixed += atomic_load(&s->post_spec_ms) / seq_ms;
        ema_ms(&s->cost_ms_ema, rd->cost * seq_ms);
        ema_ms(&s->fixed_ms_ema, rd->fixed * seq_ms);
    }
}

/* Appends a round's new tokens to r, applying the stop ids and max_tokens.
 * Returns true when the request finished. Under mu. */
static bool emit_tokens_locked(vreq *r, const int32_t *toks, int n, int max_context)
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
        if (r->n_tokens >= max_context) {
            req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_CONTEXT, TDM_OK, NULL);
            return true;
        }
    }
    return false;
}

/* A sequence's drafts' distributions, as its block sent them. */
static void block_dists(const Tandem__V1__DraftBlock *b, int k, tdm_draft_dist *dd)
{
    for (int j = 0; j < k; j++) {
        dd[j].n = 0;
        if (b->n_dists) {
            dd[j].n = (int)b->dists[j]->n_ids;
            dd[j].ids = b->dists[j]->ids;
            dd[j].probs = b->dists[j]->probs;
        }
    }
}

/* The verdict on one sequence's rows, as far as the step's outputs decide
 * it: how many drafts it keeps, and the token that follows them unless a
 * draft was rejected under sampling (next_token -1: the rejected row's
 * distribution decides it, verdict_residual). Greedy: its argmaxes.
 * Sampled: its drafts' probabilities and its last row's draw (run_step's
 * probs_of). take_blocks checked the ids. */
static tdm_verdict verdict_of(const vsched *s, const vround *rd, int i)
{
    const vround_seq *q = &rd->seqs[i];
    const vreq *r = q->r;
    const int32_t *am = rd->out.argmax + q->row;
    const bool greedy = tdm_sampling_is_greedy(&r->sampling); /* as want[] in run_step */
    tdm_verdict v = {0, greedy ? am[0] : rd->out.drawn[i]};
    if (q->k == 0)
        return v;
    const Tandem__V1__DraftBlock *b = q->block->block;
    tdm_draft_dist dd[TDM_MAX_DRAFT_BLOCK];
    block_dists(b, q->k, dd);
    if (greedy) {
        tdm_verify_block_argmax(am, s->vocab, b->tokens, q->k, dd, &v);
        return v;
    }
    v.accepted = tdm_verify_accepted(r->seed, round_position(q), rd->out.picked + q->row, b->tokens,
                                     q->k, dd);
    if (v.accepted < q->k)
        v.next_token = -1;
    return v;
}

static void verdict_log(const vround *rd, const vround_seq *q)
{
    if (q->k == 0 || tdm_log_get_level() > TDM_LOG_DEBUG)
        return;
    const Tandem__V1__DraftBlock *b = q->block->block;
    tdm_log_debug(LOG,
                  "request %s round %u: %d drafts from position %u, accepted %d; wait %.2f "
                  "ms, step %.2f ms, cost %.2f + %.2f a draft, acceptance estimate %.2f",
                  q->r->request_id, b->round, q->k, b->position, q->v.accepted, rd->t_wait,
                  rd->t_step, rd->fixed, rd->cost, q->r->ad.accept_rate);
}

/* A sampled sequence's token after its first rejected draft: from that
 * row's distribution, fetched into the step's logits (verdicts). Reads only
 * the round and the request, so sequences may be judged on several threads
 * at once, each with a scratch of its own. */
static void verdict_residual(const vsched *s, const vround *rd, vround_seq *q, void *scratch)
{
    const int i = q->v.accepted;
    const Tandem__V1__DraftBlock *b = q->block->block;
    tdm_draft_dist dd[TDM_MAX_DRAFT_BLOCK];
    block_dists(b, q->k, dd);
    const float *p = rd->out.logits + (size_t)(q->row + i) * (size_t)s->vocab;
    q->v.next_token = tdm_verify_residual(q->r->seed, round_position(q) + (uint32_t)i, p, s->vocab,
                                          b->tokens[i], &dd[i], scratch);
}

/* The rejections of a round, judged on the verdict pool: each chunk claims
 * sequences until none is left. */
typedef struct verdict_job {
    const vsched *s;
    vround *rd;
    const int *idx; /* the sequences' indices in rd->seqs */
    int n;
    atomic_int next;
} verdict_job;

static void verdict_chunk(void *arg, int chunk)
{
    verdict_job *j = arg;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;)
        verdict_residual(j->s, j->rd, &j->rd->seqs[j->idx[i]], j->s->vscratch[chunk]);
}

/* Every sequence's verdict on a stepped round. A greedy one reads its
 * argmaxes; a sampled one its drafts' probabilities and its draw. Where a
 * sampled draft was rejected, that row's distribution is fetched (all of a
 * round's in one call) and the token drawn from the residual over the
 * vocabulary (a pass over 248k floats): two or more such go to the pool,
 * where the result does not depend on which thread judges which. */
static void verdicts(vsched *s, vround *rd)
{
    int *idx = rd->sampled, *rows = rd->fetch;
    int n = 0;
    for (int i = 0; i < rd->n; i++) {
        vround_seq *q = &rd->seqs[i];
        q->v = verdict_of(s, rd, i);
        if (q->v.next_token >= 0)
            continue;
        rows[n] = q->row + q->v.accepted;
        idx[n++] = i;
    }
    if (n > 0) {
        tdm_error err = {0};
        rd->rc = tdm_step_probs_fetch(s->p.model, rd->out.logits, rows, n, &err);
        if (rd->rc != TDM_OK) {
            rd->err = err;
            return;
        }
    }
    verdict_job j = {.s = s, .rd = rd, .idx = idx, .n = n};
    atomic_init(&j.next, 0);
    const int chunks = n < s->n_vscratch ? n : s->n_vscratch; /* one: on this thread */
    if (s->vpool)
        tdm_pool_run(s->vpool, verdict_chunk, &j, chunks);
    else if (chunks > 0)
        verdict_chunk(&j, 0);
    for (int i = 0; i < rd->n; i++)
        verdict_log(rd, &rd->seqs[i]);
}

/* What the sequence's drafter hears next (under mu): a verdict on its block,
 * or an open after a pause; its adaptive state moves on first. */
static void plan_message_locked(vsched *s, vround *rd, vround_seq *q, const tdm_verdict *v)
{
    vreq *r = q->r;
    /* A request with an explicit seed must give the same output every time:
     * its block lengths follow acceptance only (the cost stays at its prior),
     * so wall-clock timing never shifts its random stream. */
    const int pauses = r->ad.pauses;
    if (q->unverified) {
        /* Its block said nothing: the rule goes on as it was. */
    } else if (q->got) {
        dacc_note(s, r->drafter_id, q->k, v->accepted);
        tdm_adaptive_on_round(&r->ad, q->k, v->accepted,
                              r->after_open || r->seeded ? -1.0 : rd->cost,
                              r->after_open || r->seeded ? -1.0 : rd->fixed);
    } else {
        /* Whether a pause ends in a probe is judged on what speculating
         * costs at the verifier's current batch, as other requests
         * measure it. */
        if (!r->seeded)
            tdm_adaptive_set_costs(&r->ad, prior(s, &s->cost_ms_ema), prior(s, &s->fixed_ms_ema));
        tdm_adaptive_on_plain_token(&r->ad); /* counts a pause down */
    }
    s->counters.adaptive_switch_offs += (uint64_t)(r->ad.pauses - pauses);
    r->after_open = false;
    q->accepted = v->accepted;
    q->next = v->next_token;
    const int room = draft_room(s, r);
    q->next_block = r->ad.k_next < room ? r->ad.k_next : room;
    if (q->got && !q->unverified && tdm_log_get_level() <= TDM_LOG_DEBUG)
        tdm_log_debug(LOG,
                      "request %s: next block %d (expected speed-up %.2f at block %d), "
                      "paused for %d tokens, %d pause(s), %d probe(s)",
                      r->request_id, r->ad.k_next,
                      tdm_adaptive_speedup(&r->ad, r->ad.k_next > 0 ? r->ad.k_next : 1),
                      r->ad.k_next > 0 ? r->ad.k_next : 1, r->ad.paused_left, r->ad.pauses,
                      r->ad.probes);
    if (q->got) {
        q->msg = MSG_VERDICT; /* on its block; block 0 pauses it */
    } else if (q->next_block > 0) {
        q->msg = MSG_OPEN; /* (re)open: the drafter syncs to our tokens */
        r->opened = true;
        r->after_open = true;
    } else if (r->scores && !r->scoring && tdm_adaptive_score_due(&r->ad)) {
        /* Paused: the drafter scores the tokens decoded without it (its
         * answer comes when it comes: take_score_locked). */
        q->msg = MSG_SCORE;
        r->opened = true;
        r->scoring = true;
        r->score_from = r->prompt_len;
        r->score_end = r->n_tokens + 1; /* every committed token and `last` (send_open) */
    }
    if (q->msg == MSG_OPEN || q->msg == MSG_VERDICT) {
        r->round++;
        r->awaiting = q->next_block > 0;
    }
    /* What an ahead block of the next round must have assumed to stand. */
    r->last_all = q->msg == MSG_VERDICT && q->k > 0 && v->accepted == q->k &&
                  q->k == (int)q->block->block->n_tokens && r->awaiting;
    r->last_next = v->next_token;
    if (r->ahead_block) {
        Tandem__V1__DraftResponse *ab = r->ahead_block;
        r->ahead_block = NULL;
        if (r->awaiting && ab->block->round == r->round && ahead_stands(r, ab->block)) {
            take_delivered_locked(s, r, ab, true);
        } else {
            s->counters.ahead_dropped++;
            protobuf_c_message_free_unpacked(&ab->base, NULL);
        }
    }
}

/* The prefix cache keeps the states at the block boundaries a round's
 * committed rows reach (the last token and the accepted drafts), so that a
 * later prompt holding this request's text (a conversation's next turn)
 * starts after it: after a plain step from the committed state, inside a
 * verified block from the verify's own state there, before the commit (the
 * strategies that have one: extra_buffer, replay; prefix-cache-state keeps
 * no_buffer off). A failure costs only the entry. */
static void round_store(vsched *s, vreq *r, const vround_seq *q, int accepted)
{
    const int B = tdm_prefix_cache_block(s->prefix), base = r->n_tokens;
    const int keep = q->k > 0 ? accepted + 1 : 1;
    const int first = (base / B + 1) * B;
    if (first > base + keep || (q->k > 0 && s->p.strategy == TDM_STATE_NO_BUFFER))
        return;
    /* The tokens the rows ran, after the committed ones (the emit below
     * writes the same there). */
    r->tokens[base] = r->last;
    for (int j = 0; j < accepted; j++)
        r->tokens[base + 1 + j] = (int32_t)q->block->block->tokens[j];
    for (int end = first; end <= base + keep; end += B) {
        tdm_prefix_put res;
        tdm_error err = {0};
        pthread_mutex_lock(&s->pmu);
        tdm_status rc = q->k > 0
                            ? tdm_prefix_cache_put_pending(s->prefix, r->seq, r->tokens,
                                                           end - base - 1, &res, &err)
                            : tdm_prefix_cache_put_seq(s->prefix, r->seq, r->tokens, &res, &err);
        pthread_mutex_unlock(&s->pmu);
        if (rc != TDM_OK)
            tdm_log_warn(LOG, "request %s: prefix cache: the block ending at %d not kept: %s",
                         r->request_id, end, err.msg);
    }
    pthread_mutex_lock(&s->mu);
    prefix_counters_locked(s);
    pthread_mutex_unlock(&s->mu);
}

/* 6. Verifies each sequence's block, notes the accepted prefix for
 * commit_round, streams the new tokens and plans what its drafter hears. */
static void verify_emit(vsched *s, vround *rd)
{
    bool any_spec = false;
    const double t0 = now_ms();
    if (rd->rc == TDM_OK)
        verdicts(s, rd);
    rd->t_verdicts = now_ms() - t0;
    for (int i = 0; i < rd->n; i++) {
        vround_seq *q = &rd->seqs[i];
        vreq *r = q->r;
        q->commit = -1;
        if (rd->rc != TDM_OK) {
            req_fail(s, r, rd->rc, rd->err.msg);
            continue;
        }
        const tdm_verdict v = q->v;
        if (s->prefix)
            round_store(s, r, q, v.accepted);
        q->commit = q->k > 0 ? v.accepted : -1;
        /* The committed positions' states: the row of the token it ran and
         * of each accepted draft (the last one gave the next token). */
        if (r->feat)
            feat_keep(s, r, rd->hidden + (size_t)q->row * (size_t)s->hidden_size, v.accepted + 1);
        int32_t newt[TDM_MAX_DRAFT_BLOCK + 1];
        int nn = 0;
        for (int j = 0; j < v.accepted; j++)
            newt[nn++] = (int32_t)q->block->block->tokens[j];
        newt[nn++] = v.next_token;

        pthread_mutex_lock(&s->mu);
        r->tokens[r->n_tokens++] = r->last; /* the token the step ran */
        if (r->fresh)
            r->t_first = now_ms();
        r->fresh = false;
        r->rounds++;
        if (q->k > 0) {
            r->spec_rounds++;
            r->drafted += (uint32_t)q->k;
            r->accepted += (uint32_t)v.accepted;
            for (int j = 0; j < q->k && j <= v.accepted; j++) {
                r->reached_at[j]++;
                r->accepted_at[j] += j < v.accepted;
            }
            const int reached = q->k < v.accepted + 1 ? q->k : v.accepted + 1;
            if (reached > r->positions)
                r->positions = reached;
            s->counters.spec_rounds++;
            s->counters.drafted += (uint64_t)q->k;
            s->counters.accepted += (uint64_t)v.accepted;
            for (int j = 0; j < v.accepted; j++)
                s->counters.accepted_at[j]++;
            if (!any_spec)
                s->counters.speculative_steps++;
            any_spec = true;
        } else if (r->spec && r->link && r->ad.k_next == 0) {
            s->counters.adaptive_off_rounds++; /* paused by the adaptive rule */
        }
        int before = r->n_out;
        bool done = emit_tokens_locked(r, newt, nn, s->p.max_context);
        s->counters.tokens += (uint64_t)(r->n_out - before);
        /* The last emitted token is the next input; it is not yet in the
         * model, so it is not yet committed in r->tokens. */
        if (!done) {
            r->n_tokens--;
            r->last = r->tokens[r->n_tokens];
        }
        if (!done && r->spec && r->link)
            plan_message_locked(s, rd, q, &v);
        pthread_mutex_unlock(&s->mu);
    }
    /* The Runs hear of their tokens once every sequence's are out: a Run
     * woken while this loop still takes mu a sequence at a time would take
     * it in turn with the loop, and each handoff is a sleep and a wake
     * (5 us a sequence at 32 sequences on the H100). The requests stay
     * valid: only this thread retires them, after this. */
    for (int i = 0; rd->rc == TDM_OK && i < rd->n; i++)
        pthread_cond_broadcast(&rd->seqs[i].r->cv);
}

/* 9. Commits each sequence's accepted drafts, after its verdict went out:
 * the drafter drafts while the commit's work is queued and runs. A commit
 * that fails ends its request (its tokens are out; the verdict's block is
 * dropped with the Close). Retired requests are not touched (commit -1:
 * their handler may have let go of them). */
static void commit_round(vsched *s, vround *rd)
{
    for (int i = 0; i < rd->n; i++) {
        vround_seq *q = &rd->seqs[i];
        vreq *r = q->r;
        if (q->commit < 0)
            continue;
        tdm_error cerr = {0};
        if (tdm_seq_commit(r->seq, q->commit, &cerr) != TDM_OK)
            req_fail(s, r, cerr.code, cerr.msg);
    }
}

/* 7. Retires the sequences that finished (or failed) this round. */
static void retire_finished(vsched *s, vround *rd)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_active;) {
        vreq *r = s->active[i];
        if (r->finished) {
            req_retire_locked(rd, r, "finished");
            s->reserved -= r->reserved;
            s->active[i] = s->active[--s->n_active];
            for (int j = 0; j < rd->n; j++)
                if (rd->seqs[j].r == r) {
                    rd->seqs[j].msg = MSG_NONE;
                    rd->seqs[j].commit = -1;
                }
            continue;
        }
        i++;
    }
    if (rd->n > 0)
        s->counters.rounds++;
    s->counters.plain_measure_rounds += rd->plain_measure;
    /* What the batch holds now (metrics). */
    uint64_t mem[4] = {0};
    for (int i = 0; i < s->n_active; i++)
        if (s->active[i]->seq) {
            tdm_seq_memory m;
            tdm_seq_memory_usage(s->active[i]->seq, &m);
            mem[0] += m.kv_bytes;
            mem[1] += m.recurrent_bytes;
            mem[2] += m.conv_bytes;
            mem[3] += m.strategy_bytes;
        }
    s->counters.kv_bytes = mem[0];
    s->counters.recurrent_bytes = mem[1];
    s->counters.conv_bytes = mem[2];
    s->counters.strategy_bytes = mem[3];
    pthread_mutex_unlock(&s->mu);
}

/* 8. Sends the drafters their verdicts and opens, then the Closes; lets go
 * of the links of sequences that stopped speculating. */
static void send_messages(vsched *s, vround *rd)
{
    double send_us = 0;
    uint64_t sends = 0;
    for (int i = 0; i < rd->n; i++) {
        vround_seq *q = &rd->seqs[i];
        /* The link cannot go away under us: r holds a reference until it is
         * retired, which only this thread does. */
        if (q->msg == MSG_NONE || !q->r->link)
            continue;
        if (q->msg == MSG_SCORE) {
            send_score(s, q->r);
            continue;
        }
        q->r->t_asked = now_ms();
        if (q->msg == MSG_OPEN)
            send_open(s, q->r, q->next_block);
        else
            send_verdict(s, q->r, q->accepted, q->next, q->next_block);
        send_us += (now_ms() - q->r->t_asked) * 1e3;
        sends++;
    }
    pthread_mutex_lock(&s->mu);
    s->send_us_total += send_us;
    s->sends += sends;
    for (int i = 0; i < s->n_active; i++) {
        vreq *r = s->active[i];
        if (!r->spec && r->link) {
            rd->drop[rd->n_drop++] = r->link;
            r->link = NULL;
        }
        if (!r->link && r->feat && !r->reopen) {
            r->feat = false; /* no drafter takes its states any more */
            tdm_feat_out_free(&r->fout);
            tdm_feat_out_free(&r->fsent);
        }
    }
    pthread_mutex_unlock(&s->mu);
    flush_links(rd);
    for (int i = 0; i < rd->n; i++)
        if (rd->seqs[i].block) {
            protobuf_c_message_free_unpacked(&rd->seqs[i].block->base, NULL);
            rd->seqs[i].block = NULL;
        }
}

/* After a round: what its work after the step took (post_ms), as a plain
 * round's per sequence or, with drafts, as the part a speculating sequence
 * adds, for the adaptive rule's fixed cost (run_step). */
static void post_cost(vsched *s, const vround *rd, double post_ms)
{
    const int n = rd->n_stepped;
    if (n <= 0 || rd->rc != TDM_OK || rd->first_sight || rd->plain_measure)
        return;
    const double plain = atomic_load(&s->post_plain_ms);
    if (rd->n_spec == 0) {
        ema_ms(&s->post_plain_ms, post_ms / n);
    } else if (plain > 0) {
        const double extra = (post_ms - n * plain) / rd->n_spec;
        ema_ms(&s->post_spec_ms, extra > 0 ? extra : 0);
    }
}

/* Adds one round's timeline (t[0] its start, t[i + 1] the end of phase i)
 * to the counters. */
static void record_timeline(vsched *s, const double *t, const double *commit_parts)
{
    pthread_mutex_lock(&s->mu);
    float *row = s->phase_us[s->n_phase++ % TDM_ARRAY_LEN(s->phase_us)];
    for (int i = 0; i < VSCHED_PHASES; i++) {
        double us = (t[i + 1] - t[i]) * 1e3;
        row[i] = (float)us;
        if (i != VSCHED_IDLE) /* counted as it passes (admit_and_retire) */
            s->counters.phase_total_us[i] += us;
    }
    for (int i = 0; i < VSCHED_COMMIT_PARTS; i++)
        s->counters.commit_part_us[i] += commit_parts[i] * 1e3;
    pthread_mutex_unlock(&s->mu);
}

/* Where the measured costs alone keep r paused (tdm_adaptive_ceiling: no
 * score or probe due), they move back towards what was timed before serving
 * (tdm_adaptive_relax_costs), priced as r would speculate if it restarted:
 * alone in its batch (timed_costs with one sequence drafted; adaptive.h's
 * tdm_adaptive_timed says why not the whole batch), with the exchange last
 * measured. A tenth of
 * the way over a batch's worth of starts (0.1 / n each, at a batch of n): a
 * burst of 32 requests moves them as far as one request does at one stream,
 * not 97 % of the way. cost and fixed are the measured costs at a batch of n
 * (plain steps). Measured on one H100, a few dear first rounds (1.0-1.1
 * plain steps a draft on the demo pair, against 0.55 timed) held every later
 * request paused for the rest of a load. Scheduler thread, under mu. */
static void relax_costs_locked(vsched *s, vreq *r, int n, double cost, double fixed)
{
    const double cost_ms = atomic_load(&s->cost_ms_ema), fixed_ms = atomic_load(&s->fixed_ms_ema);
    if (!(cost > 0) || !(cost_ms > 0))
        return;
    double timed, timed_fixed;
    timed_costs(s, r, n, 1, s->exchange_ms, &timed, &timed_fixed);
    if (!(timed > 0))
        return;
    double c = cost, f = fixed;
    if (!tdm_adaptive_relax_costs(&r->ad, &c, &f, timed, timed_fixed, 0.1 / (n > 1 ? n : 1)))
        return;
    const double step_ms = cost_ms / cost; /* a plain step's share of a sequence at n */
    atomic_store(&s->cost_ms_ema, c * step_ms);
    if (f != fixed)
        atomic_store(&s->fixed_ms_ema, fixed_ms * f / fixed);
    s->counters.cost_relaxes++;
    tdm_log_debug(LOG,
                  "request %s: the measured costs (%.2f + %.2f a draft) lose even with every "
                  "draft accepted; relaxed to %.2f + %.2f towards the timed %.2f a draft",
                  r->request_id, fixed, cost, f, c, timed);
}

/* A fresh adaptive request decides its start again at the batch it runs in
 * (the one it was queued to may have been another's): as its prefill starts,
 * or, where it was queued on a guess of what a draft costs (none measured
 * then), as its prefill ends (its open waits for that: open_first), from
 * what earlier requests have measured since. Costs as measured (prior_at),
 * or else from the steps timed before serving (warm_cost). Scheduler thread,
 * under mu. */
static void judge_start_locked(vsched *s, vreq *r)
{
    const int n = s->n_active;
    double c = prior_at(s, &s->cost_ms_ema, n), pass = 0;
    const bool guessed = !(c > 0);
    if (guessed)
        c = warm_cost(s, r, n, &pass);
    if (!(c > 0))
        return;
    tdm_adaptive_params p = r->ad.p;
    p.cost_prior = c;
    p.cost_guessed = guessed;
    p.fixed_prior = prior_at(s, &s->fixed_ms_ema, n);
    if (guessed) /* the drafter's pass, which measured rounds put in f */
        p.fixed_prior = (p.fixed_prior > 0 ? p.fixed_prior : 0) + pass;
    p.open_cost = open_cost_at(s, n);
    tdm_adaptive_init(&r->ad, &p);
    if (!guessed)
        relax_costs_locked(s, r, n, p.cost_prior, p.fixed_prior);
    tdm_log_debug(LOG,
                  "request %s: speculation starts %s at a batch of %d, block %d; cost %.2f + "
                  "%.2f a draft (%s)",
                  r->request_id, r->ad.k_next > 0 ? "on" : "paused", s->n_active, r->ad.k_next,
                  r->ad.fixed, r->ad.cost, guessed ? "timed before serving" : "measured");
}

/* 1b. A sequence that speculates from its start opens its drafter before its
 * first step, which then verifies the drafter's first block: its first round
 * speculates, and a sequence that continues (an imported snapshot, or a run
 * recomputed from its tokens) decides its first position as it would have
 * been decided where it came from (a round with drafts, not a plain step), so
 * that a seeded request draws the same tokens after a move. A fresh request
 * of a model drafter opens as its prefill starts (prefill_chunks: the drafter
 * catches up on the prompt beside the prefill), the others as it ends (an
 * MTP drafter needs the prompt's hidden states). Decided once; later opens
 * are the rounds' (plan_message_locked). */
static void open_first(vsched *s, vreq *r, bool at_start)
{
    /* Set before the request was queued, cleared only by this thread: once
     * decided, no lock a round. */
    if (!r->open_first)
        return;
    pthread_mutex_lock(&s->mu);
    const bool fresh =
        r->spec && !r->seeded && !r->continued && r->ad.rounds == 0 && !r->ad.p.fixed;
    const bool guess = fresh && r->ad.cost_win.guess;
    /* A start on a guess of the costs (a fresh verifier) waits for the
     * prompt's prefill to end: a burst of requests is admitted by then, and
     * each judges its start at the batch it runs in, not at the batch of one
     * that the first of them was admitted to. */
    const bool now =
        r->open_first && (at_start ? !(guess && warm_cost(s, r, 1, NULL) > 0) : !r->prefilling);
    if (now && fresh)
        judge_start_locked(s, r);
    const bool open =
        now && r->spec && r->link && r->ad.k_next > 0 && !r->cancelled && !r->finished;
    if (now)
        r->open_first = false;
    if (open) {
        r->opened = true;
        r->after_open = true;
        r->round++;
        r->awaiting = true;
        r->t_asked = now_ms();
    }
    pthread_mutex_unlock(&s->mu);
    if (!open)
        return;
    if (at_start)
        send_open_n(s, r, r->ad.k_next, r->n_given); /* the prompt */
    else
        send_open(s, r, r->ad.k_next);
}

static void open_first_blocks(vsched *s, vround *rd)
{
    for (int i = 0; i < rd->n; i++)
        open_first(s, rd->seqs[i].r, false);
}

/* 1c. A sequence whose drafter failed opens again on the drafter's address
 * when its try is due (drafter_reopen_tries): with every committed token and,
 * for a hidden-state drafter, the states of every position, so that a
 * drafter restarted there starts the sequence afresh. A try that finds no
 * drafter breaks at once and schedules the next, 250 ms doubling. */
static void reopen_drafters(vsched *s, vround *rd)
{
    for (int i = 0; i < rd->n; i++) {
        vreq *r = rd->seqs[i].r;
        pthread_mutex_lock(&s->mu);
        const bool due = r->reopen && now_ms() >= r->reopen_at && !r->link && !r->prefilling &&
                         !r->cancelled && !r->finished;
        if (due) {
            r->reopen = false;
            r->reopen_tries++;
        }
        pthread_mutex_unlock(&s->mu);
        if (!due)
            continue;
        tdm_error lerr = {0};
        vlink *l = vlinks_get(s->links, r->reopen_addr, &lerr); /* may connect: no lock */
        pthread_mutex_lock(&s->mu);
        if (!l) {
            if (r->reopen_tries < s->p.drafter_reopen_tries) {
                r->reopen = true;
                r->reopen_at = now_ms() + reopen_backoff_ms(r->reopen_tries + 1);
            }
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        r->link = l;
        r->spec = true;
        r->scoring = false; /* a score asked of the drafter that failed never comes */
        tdm_adaptive_params ap = r->ad.p;
        ap.tokens_left = r->max_tokens - r->n_out;
        ap.accept_prior = -1.0; /* a new drafter: its acceptance is not known */
        ap.accept_positions = (tdm_accept_positions){{0}, {0}};
        tdm_adaptive_init(&r->ad, &ap);
        r->opened = true;
        r->after_open = true;
        r->round++;
        r->awaiting = r->ad.k_next > 0;
        r->t_asked = now_ms();
        snprintf(r->spec_note, sizeof(r->spec_note),
                 "on: re-opened on drafter %s after it failed (try %d)", r->reopen_addr,
                 r->reopen_tries);
        s->counters.drafter_reopens++;
        pthread_mutex_unlock(&s->mu);
        if (r->feat) {
            /* Every row again, from position 0: the sent ones, then the new. */
            tdm_feat_out_take(&r->fsent, &r->fout);
            tdm_feat_out t = r->fout;
            r->fout = r->fsent;
            r->fsent = t;
        }
        tdm_log_info(LOG, "request %s: re-opened on drafter %s at %d tokens (try %d)",
                     r->request_id, r->reopen_addr, r->n_tokens + 1, r->reopen_tries);
        send_open(s, r, r->ad.k_next);
    }
}

/* One round. Returns false when the scheduler should stop. Every moment of
 * the scheduler thread falls in one phase of one round (vsched_phase). */
static bool sched_round(vsched *s)
{
    vround *rd = &s->rd;
    double t[VSCHED_PHASES + 1];
    t[0] = now_ms();
    if (!admit_and_retire(s, rd))
        return false;
    t[VSCHED_IDLE + 1] = rd->t_idle_end;
    snapshot_jobs(s);
    t[VSCHED_ADMIT + 1] = now_ms();
    prefill_chunks(s, rd);
    open_first_blocks(s, rd);
    reopen_drafters(s, rd);
    t[VSCHED_PREFILL + 1] = now_ms();
    await_blocks(s, rd);
    take_blocks(s, rd);
    plain_round_due(s, rd);
    t[VSCHED_WAIT + 1] = now_ms();
    run_step(s, rd);
    t[VSCHED_STEP + 1] = now_ms();
    /* The verdicts go out before the commits (the drafters draft while this
     * thread queues them); the commit phase counts both sides of the send. */
    verify_emit(s, rd);
    const double t_emitted = now_ms();
    retire_finished(s, rd);
    const double t_sending = now_ms();
    send_messages(s, rd);
    const double t_sent = now_ms();
    commit_round(s, rd);
    const double t_committed = now_ms();
    t[VSCHED_COMMIT + 1] = t_sending + (t_committed - t_sent);
    t[VSCHED_SEND + 1] = t[VSCHED_COMMIT + 1] + (t_sent - t_sending);
    const double parts[VSCHED_COMMIT_PARTS] = {
        [VSCHED_COMMIT_VERDICTS] = rd->t_verdicts,
        [VSCHED_COMMIT_EMIT] = t_emitted - t[VSCHED_STEP + 1] - rd->t_verdicts,
        [VSCHED_COMMIT_RETIRE] = t_sending - t_emitted,
        [VSCHED_COMMIT_STATES] = t_committed - t_sent,
    };
    record_timeline(s, t, parts);
    post_cost(s, rd, t[VSCHED_SEND + 1] - t[VSCHED_STEP + 1]);
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

static void round_init(vround *rd, int cap)
{
    rd->seqs = tdm_xcalloc((size_t)cap, sizeof(*rd->seqs));
    rd->rows = tdm_xcalloc((size_t)cap * (1 + TDM_MAX_DRAFT_BLOCK), sizeof(*rd->rows));
    rd->toks = tdm_xcalloc((size_t)cap, sizeof(*rd->toks));
    rd->ntok = tdm_xcalloc((size_t)cap, sizeof(*rd->ntok));
    rd->eseqs = tdm_xcalloc((size_t)cap, sizeof(*rd->eseqs));
    rd->want_hidden = tdm_xcalloc((size_t)cap, sizeof(*rd->want_hidden));
    rd->sampled = tdm_xcalloc((size_t)cap, sizeof(*rd->sampled));
    rd->fetch = tdm_xcalloc((size_t)cap, sizeof(*rd->fetch));
    rd->probs_of = tdm_xcalloc((size_t)cap, sizeof(*rd->probs_of));
    /* A sequence sends at most one Close a round, plus the waiting ones
     * retired at admission (at most cap: they are admitted as they retire). */
    rd->closes = tdm_xcalloc((size_t)cap * 2 + 1, sizeof(*rd->closes));
    rd->drop = tdm_xcalloc((size_t)cap * 2 + 1, sizeof(*rd->drop));
}

static void round_free(vround *rd)
{
    free(rd->seqs);
    free(rd->rows);
    free(rd->toks);
    free(rd->ntok);
    free(rd->eseqs);
    free(rd->want_hidden);
    free(rd->sampled);
    free(rd->fetch);
    free(rd->probs_of);
    free(rd->hidden);
    free(rd->feat_row);
    free(rd->closes);
    free(rd->drop);
    tdm_step_buf_free(&rd->out);
}

/* The sampled verdicts' pool: a thread a core up to 8 (a round of 32
 * sampled sequences has 32 draws over the vocabulary, and a residual for
 * each rejection), each with its scratch; its idle workers sleep, leaving
 * the cores to the backend and the exchange between rounds. */
#define VERDICT_THREADS_MAX 8

static void verdict_pool_init(vsched *s)
{
    int n = tdm_cpu_count();
    if (n > VERDICT_THREADS_MAX)
        n = VERDICT_THREADS_MAX;
    if (n > s->p.max_sequences)
        n = s->p.max_sequences;
    s->vpool = n > 1 ? tdm_pool_create(n, false) : NULL;
    if (!s->vpool)
        n = 1;
    s->n_vscratch = n;
    s->vscratch = tdm_xcalloc((size_t)n, sizeof(*s->vscratch));
    for (int i = 0; i < n; i++)
        s->vscratch[i] = tdm_xmalloc(tdm_verify_scratch_bytes(s->vocab));
}

static void verdict_pool_free(vsched *s)
{
    tdm_pool_destroy(s->vpool);
    for (int i = 0; i < s->n_vscratch; i++)
        free(s->vscratch[i]);
    free(s->vscratch);
}

/* Prefills a prompt on a throwaway sequence (tdm_model_warm_prompt), then
 * times steps on throwaway sequences before the verifier serves: for n = 1,
 * 2, 4, 8, 16 sequences (at most max_sequences; larger batches are
 * extrapolated), a plain step (one row each) and a verify step (1 + 4 rows
 * each, or 1 + max_draft, then committed with nothing accepted). Each pair
 * runs until it runs without a first sight (on CUDA graphs a shape runs
 * eagerly, then is captured), then the median of three is kept. A failure
 * leaves the table empty: the rule starts from its own guess, as before any
 * request measured a cost. */
static void warm_steps(vsched *s)
{
    const int k = s->p.max_draft < 4 ? s->p.max_draft : 4;
    const int lock = tdm_timing_lock_acquire(s->p.runtime ? s->p.runtime->device_uuid : "",
                                             TDM_TIMING_LOCK_WAIT_MS, LOG);
    const double t_start = now_ms();
    int32_t toks[TDM_MAX_DRAFT_BLOCK + 1] = {0};
    const int32_t *rows[WARM_SEQS];
    int plain_n[WARM_SEQS], verify_n[WARM_SEQS];
    tdm_seq *seqs[WARM_SEQS] = {0};
    tdm_step_buf out = {0};
    tdm_error err = {0};
    tdm_status rc = TDM_OK;
    int made = 0;
    for (int i = 0; i < WARM_SEQS; i++) {
        rows[i] = toks;
        plain_n[i] = 1;
        verify_n[i] = k + 1;
    }
    /* The first prompt's set-up, before the timings and the first request. */
    rc = tdm_model_warm_prompt(s->p.model, s->p.strategy, TDM_WARM_PROMPT_TOKENS, &err);
    for (int n = 1; n <= WARM_SEQS && n <= s->p.max_sequences && rc == TDM_OK; n *= 2) {
        for (; made < n && rc == TDM_OK; made++) {
            tdm_seq_params sp = {.strategy = s->p.strategy, .max_draft = k};
            rc = tdm_seq_create(s->p.model, &sp, &seqs[made], &err);
            if (rc == TDM_OK)
                rc = tdm_seq_prefill(seqs[made], toks, 1, NULL, &err);
        }
        if (rc == TDM_OK)
            rc = tdm_step_buf_reserve(&out, s->p.model, (size_t)(n * (k + 1)), 0, &err);
        const tdm_step_out o = tdm_step_buf_out(&out);
        double plain[3], verify[3];
        for (int j = 0, timed = 0, warm = 0; timed < 3 && rc == TDM_OK; j++) {
            const uint64_t fs = tdm_runtime_graph_first_sights(s->p.runtime);
            double t0 = now_ms();
            rc = tdm_seq_step_out(seqs, n, rows, plain_n, &o, &err);
            const double tp = now_ms() - t0;
            t0 = now_ms();
            if (rc == TDM_OK)
                rc = tdm_seq_step_out(seqs, n, rows, verify_n, &o, &err);
            for (int i = 0; i < n && rc == TDM_OK; i++)
                rc = tdm_seq_commit(seqs[i], 0, &err);
            const double tv = now_ms() - t0;
            if (!warm && tdm_runtime_graph_first_sights(s->p.runtime) != fs && j < 3)
                continue;
            warm = 1;
            plain[timed] = tp;
            verify[timed++] = tv;
        }
        if (rc != TDM_OK)
            break;
        const double p3 = tdm_median3(plain), extra = tdm_median3(verify) - p3;
        s->warm_n[s->n_warm] = n;
        s->warm_plain_ms[s->n_warm] = p3;
        s->warm_draft_ms[s->n_warm] = extra > 0 ? extra / (n * k) : 0.0;
        s->n_warm++;
    }
    for (int i = 0; i < made; i++)
        tdm_seq_destroy(seqs[i]);
    tdm_step_buf_free(&out);
    tdm_timing_lock_release(lock);
    if (rc != TDM_OK) {
        s->n_warm = 0;
        tdm_log_warn(LOG,
                     "steps could not be timed before serving (%s); the adaptive rule starts "
                     "from its own guess of a draft's cost",
                     err.msg);
        return;
    }
    char line[512];
    size_t used = 0;
    for (int i = 0; i < s->n_warm && used < sizeof(line); i++)
        used +=
            (size_t)snprintf(line + used, sizeof(line) - used, "%s%d: %.3f ms + %.3f a draft",
                             i ? ", " : "", s->warm_n[i], s->warm_plain_ms[i], s->warm_draft_ms[i]);
    tdm_log_info(LOG,
                 "steps timed in %.0f ms (sequences: plain step + what a verify adds a draft): %s",
                 now_ms() - t_start, line);
}

tdm_status vsched_create(const vsched_params *p, vsched **out, tdm_error *err)
{
    *out = NULL;
    if (p->max_draft < 1 || p->max_draft > TDM_MAX_DRAFT_BLOCK)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "max_draft_tokens %d is outside 1..%d",
                             p->max_draft, TDM_MAX_DRAFT_BLOCK);
    vsched *s = tdm_xcalloc(1, sizeof(*s));
    s->p = *p;
    if (s->p.max_sequences < 1)
        s->p.max_sequences = 1;
    if (s->p.draft_timeout_ms <= 0)
        s->p.draft_timeout_ms = 2000;
    if (s->p.max_context <= 1)
        s->p.max_context = tdm_model_get_config(p->model)->max_position_embeddings;
    if (s->p.prefill_chunk <= 0)
        s->p.prefill_chunk = 256;
    s->vocab = tdm_model_get_config(p->model)->vocab_size;
    s->hidden_size = tdm_model_get_config(p->model)->hidden_size;
    s->rd.feat_row =
        tdm_xmalloc((size_t)TDM_FEAT_MAX_SPECS * (size_t)s->hidden_size * sizeof(float));
    snprintf(s->limits, sizeof(s->limits), "%s", p->limits ? p->limits : "max_sequences");
    s->p.limits = s->limits;
    s->active = tdm_xcalloc((size_t)s->p.max_sequences, sizeof(*s->active));
    verdict_pool_init(s);
    round_init(&s->rd, s->p.max_sequences);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->dacc_mu, NULL);
    pthread_mutex_init(&s->pmu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->jobs_cv, NULL);
    if (s->p.snapshot_ttl_ms <= 0)
        s->p.snapshot_ttl_ms = 60000;
    if (s->p.max_snapshots <= 0)
        s->p.max_snapshots = 16;
    if (s->p.max_snapshot_bytes <= 0)
        s->p.max_snapshot_bytes = (int64_t)4 << 30;
    if (!s->p.fingerprint)
        s->p.fingerprint = "";
    if (s->p.prefix_cache) {
        tdm_prefix_params pp = {.block =
                                    s->p.prefix_cache_block > 0 ? s->p.prefix_cache_block : 256,
                                .budget = s->p.prefix_cache_memory};
        s->prefix = tdm_prefix_cache_create(&pp);
    }
    vlinks_callbacks cb = {.deliver = on_draft_message, .broken = on_link_broken, .user = s};
    const vlinks_feat vf = {.transport = p->feature_transport,
                            .shm_bytes = p->feature_shm_bytes,
                            .setting = p->feature_setting};
    const vlinks_lane vl = {.transport = p->exchange_transport, .setting = p->exchange_setting};
    s->links = vlinks_create(p->tls, p->trust, p->max_message_bytes, &vf, &vl, &cb);
    warm_steps(s);
    s->t_started = now_ms();
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        tdm_prefix_cache_destroy(s->prefix);
        vlinks_destroy(s->links);
        round_free(&s->rd);
        free(s->active);
        verdict_pool_free(s);
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
    sched_wake(s);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);

    /* Fail what is left (handlers normally finished before: the RPC server
     * shuts down first), max_sequences at a time: the round's arrays hold
     * their links until they are let go of. */
    vround *rd = &s->rd;
    for (bool more = true; more;) {
        pthread_mutex_lock(&s->mu);
        for (int n = 0; n < s->p.max_sequences && (s->n_active > 0 || s->wait_head); n++) {
            vreq *r;
            if (s->n_active > 0) {
                r = s->active[--s->n_active];
            } else {
                r = s->wait_head;
                s->wait_head = r->next_waiting;
                if (!s->wait_head)
                    s->wait_tail = NULL;
            }
            req_finish_locked(r, TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED,
                              TDM_ERR_UNAVAILABLE, "the verifier shut down");
            req_retire_locked(rd, r, NULL);
        }
        more = s->n_active > 0 || s->wait_head;
        pthread_mutex_unlock(&s->mu);
        flush_links(rd);
    }
    /* Snapshot work still queued fails; imported snapshots are dropped. */
    pthread_mutex_lock(&s->mu);
    for (snap_job *j = s->jobs, *next; j; j = next) {
        next = j->next;
        j->rc = tdm_error_set(&j->err, TDM_ERR_UNAVAILABLE, "the verifier shut down");
        j->done = true;
    }
    s->jobs = NULL;
    pthread_cond_broadcast(&s->jobs_cv);
    staged_snap *staged = s->staged;
    s->staged = NULL;
    pthread_mutex_unlock(&s->mu);
    while (staged) {
        staged_snap *next = staged->next;
        staged_free(staged);
        staged = next;
    }
    vlinks_destroy(s->links);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->dacc_mu);
    pthread_mutex_destroy(&s->pmu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->jobs_cv);
    round_free(rd);
    tdm_prefix_cache_destroy(s->prefix);
    free(s->active);
    verdict_pool_free(s);
    free(s);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median and 99th percentile of v[0..n) (sorts v). */
static void percentiles(float *v, size_t n, double *p50, double *p99)
{
    *p50 = *p99 = 0;
    if (n == 0)
        return;
    qsort(v, n, sizeof(float), cmp_float);
    *p50 = v[n / 2];
    *p99 = v[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1];
}

/* How many of a ring's entries hold values. */
static size_t ring_len(uint64_t n, size_t cap)
{
    return n < cap ? (size_t)n : cap;
}

void vsched_get_counters(vsched *s, vsched_counters *c)
{
    enum { RING = TDM_ARRAY_LEN(s->overhead_us) };
    float *v = tdm_xmalloc(RING * sizeof(float) * (2 + VSCHED_PHASES));
    float *dt = v + RING, *ph = dt + RING;
    pthread_mutex_lock(&s->mu);
    *c = s->counters;
    c->reserved_bytes = s->reserved;
    c->feature_rows = atomic_load(&s->feature_rows);
    c->feature_bytes = atomic_load(&s->feature_bytes);
    c->feature_rows_shm = atomic_load(&s->feature_rows_shm);
    c->feature_bytes_shm = atomic_load(&s->feature_bytes_shm);
    c->feature_rows_grpc = c->feature_rows - c->feature_rows_shm;
    c->feature_bytes_grpc = c->feature_bytes - c->feature_bytes_shm;
    c->feature_ring_full = atomic_load(&s->feature_ring_full);
    c->feature_puts_shm = atomic_load(&s->feature_puts_shm);
    c->feature_puts_grpc = atomic_load(&s->feature_puts_grpc);
    c->feature_put_us_shm = atomic_load(&s->feature_put_us_shm);
    c->feature_put_us_grpc = atomic_load(&s->feature_put_us_grpc);
    vlinks_feat_counts(s->links, &c->feature_streams_shm, &c->feature_streams_grpc);
    vlinks_lane_counts(s->links, &c->exchange_streams_shm, &c->exchange_streams_grpc);
    size_t n = ring_len(s->n_overhead, RING);
    memcpy(v, s->overhead_us, n * sizeof(float));
    size_t nd = ring_len(s->n_draft_token, RING);
    memcpy(dt, s->draft_token_us, nd * sizeof(float));
    size_t np = ring_len(s->n_phase, TDM_ARRAY_LEN(s->phase_us));
    for (size_t i = 0; i < np; i++)
        for (int p = 0; p < VSCHED_PHASES; p++)
            ph[(size_t)p * RING + i] = s->phase_us[i][p];
    c->active = (uint64_t)s->n_active;
    c->send_us_total = s->send_us_total;
    c->sends = s->sends;
    c->waiting = 0;
    for (vreq *r = s->wait_head; r; r = r->next_waiting)
        c->waiting++;
    c->snapshots_waiting = 0;
    for (const staged_snap *st = s->staged; st; st = st->next)
        c->snapshots_waiting++;
    double now = now_ms();
    c->uptime_us = s->t_started > 0 ? (now - s->t_started) * 1e3 : 0;
    if (s->idle_since > 0)
        c->phase_total_us[VSCHED_IDLE] += (now - s->idle_since) * 1e3;
    c->open_wait_us_total = s->open_wait_us_total;
    c->open_waits = s->open_waits;
    pthread_mutex_unlock(&s->mu);
    percentiles(v, n, &c->overhead_p50_us, &c->overhead_p99_us);
    percentiles(dt, nd, &c->draft_token_p50_us, &c->draft_token_p99_us);
    c->exchange_us_total = s->exchange_us_total;
    c->exchange_blocks = s->n_overhead;
    vlinks_parts parts;
    vlinks_exchange_parts(s->links, &parts);
    c->queue_us_total = parts.queue_us;
    c->write_us_total = parts.write_us;
    c->deliver_us_total = parts.deliver_us;
    c->writes = parts.writes;
    c->delivers = parts.delivers;
    c->draft_us_total = s->draft_us_total;
    c->draft_tokens_total = s->draft_tokens_total;
    for (int p = 0; p < VSCHED_PHASES; p++)
        percentiles(ph + (size_t)p * RING, np, &c->phase_p50_us[p], &c->phase_p99_us[p]);
    free(v);
    c->draft_streams = (uint64_t)vlinks_count(s->links);
}

/* ---- the prefix cache from RPC handler threads ----------------------------- */

int vsched_prefix_block(const vsched *s)
{
    return s->prefix ? tdm_prefix_cache_block(s->prefix) : 0;
}

int vsched_prefix_cached(vsched *s, const int32_t *tokens, int max_tokens)
{
    if (!s->prefix)
        return 0;
    pthread_mutex_lock(&s->pmu);
    const int n = tdm_prefix_cache_match(s->prefix, tokens, max_tokens, NULL);
    pthread_mutex_unlock(&s->pmu);
    return n;
}

tdm_status vsched_prefix_export(vsched *s, const int32_t *tokens, int max_tokens,
                                tdm_snap_layout *layout, uint8_t **payload, tdm_error *err)
{
    if (!s->prefix) {
        memset(layout, 0, sizeof(*layout));
        *payload = NULL;
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "this verifier runs with prefix_cache off");
    }
    pthread_mutex_lock(&s->pmu);
    const tdm_status rc =
        tdm_prefix_cache_export(s->prefix, tdm_model_checkpoint_config(s->p.model),
                                s->p.fingerprint, tokens, max_tokens, layout, payload, err);
    pthread_mutex_unlock(&s->pmu);
    return rc;
}

tdm_status vsched_prefix_import(vsched *s, const tdm_snap_layout *layout, const uint8_t *payload,
                                int *covered, tdm_error *err)
{
    *covered = 0;
    if (!s->prefix)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "this verifier runs with prefix_cache off");
    int stored = 0;
    pthread_mutex_lock(&s->pmu);
    const tdm_status rc = tdm_prefix_cache_import(
        s->prefix, tdm_model_checkpoint_config(s->p.model), layout, payload, &stored, covered, err);
    pthread_mutex_unlock(&s->pmu);
    pthread_mutex_lock(&s->mu);
    prefix_counters_locked(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

double vsched_prefill_rate(vsched *s)
{
    return atomic_load(&s->prefill_tok_per_ms);
}
