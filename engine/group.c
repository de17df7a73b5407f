/*
 * group.c - a tensor-parallel model behind the whole model's API.
 *
 * tdm_model_load_group gives a model whose N ranks (shard.h) each hold a
 * slice of the weights on their own backend, joined by communicators
 * (comm.h). Each rank has a thread of its own, bound to its device once
 * (the caller's bind callback), and runs there every call that touches its
 * memory. A call on the group's model or on one of its sequences posts the
 * same call to every rank with that rank's sequences, and returns when all
 * have finished: the ranks make the same decisions from the same host
 * bookkeeping and meet in the same collectives. Rank 0's outputs (logits,
 * argmaxes, hidden states: whole rows on every rank) are the caller's; the
 * other ranks write theirs into scratch.
 *
 * A group's sequence (the caller's tdm_seq) holds the ranks' sequences and
 * nothing else; a group's model holds the ranks' models, its config is a
 * rank's (what one device holds), and its backend rank 0's.
 */
#include "engine_internal.h"
#include "alloc.h"
#include "capacity.h"
#include "snapshot.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef tdm_status (*group_fn)(tdm_group *g, int rank, void *arg, tdm_error *err);

struct tdm_group {
    int n;
    tdm_model **ranks;
    const char *dir;         /* while loading */
    tdm_backend *const *bes; /* while loading */
    tdm_comm *const *comms;  /* while loading */
    void (*bind)(int rank, void *ctx);
    void *bind_ctx;
    pthread_t *th;
    int started; /* threads running */
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    uint64_t gen; /* bumped for each posted call */
    int finished; /* ranks done with the current call */
    int stop;
    group_fn fn;
    void *arg;
    tdm_status *rc;  /* [n] */
    tdm_error *errs; /* [n] */
    /* scratch outputs of ranks > 0, [n] each, grown on demand */
    int32_t **argmax;
    float **hidden;
    size_t *rows;
};

typedef struct worker {
    tdm_group *g;
    int rank;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    tdm_group *g = w->g;
    const int r = w->rank;
    free(w);
    if (g->bind)
        g->bind(r, g->bind_ctx);
    uint64_t seen = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->stop && g->gen == seen)
            pthread_cond_wait(&g->work, &g->mu);
        if (g->stop)
            break;
        seen = g->gen;
        group_fn fn = g->fn;
        void *a = g->arg;
        pthread_mutex_unlock(&g->mu);
        tdm_error e = {0};
        const tdm_status rc = fn(g, r, a, &e);
        pthread_mutex_lock(&g->mu);
        g->rc[r] = rc;
        g->errs[r] = e;
        if (++g->finished == g->n)
            pthread_cond_signal(&g->done);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* fn on every rank, each on its thread; the first rank's error, if any. */
static tdm_status group_run(tdm_group *g, group_fn fn, void *arg, tdm_error *err)
{
    pthread_mutex_lock(&g->mu);
    g->fn = fn;
    g->arg = arg;
    g->finished = 0;
    g->gen++;
    pthread_cond_broadcast(&g->work);
    while (g->finished < g->n)
        pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    /* Rank 0's error as it is (every rank checks the same arguments);
     * another rank's alone names the rank. */
    for (int r = 0; r < g->n; r++)
        if (g->rc[r] != TDM_OK) {
            if (err)
                *err = g->errs[r];
            return r == 0 ? g->rc[r] : tdm_error_prefix(err, "tensor-parallel rank %d", r);
        }
    return TDM_OK;
}

static void group_free(tdm_group *g)
{
    if (g->started) {
        pthread_mutex_lock(&g->mu);
        g->stop = 1;
        pthread_cond_broadcast(&g->work);
        pthread_mutex_unlock(&g->mu);
        for (int r = 0; r < g->n; r++)
            pthread_join(g->th[r], NULL);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->work);
    pthread_cond_destroy(&g->done);
    for (int r = 0; r < g->n; r++) {
        free(g->argmax[r]);
        free(g->hidden[r]);
    }
    free(g->argmax);
    free(g->hidden);
    free(g->rows);
    free(g->ranks);
    free(g->th);
    free(g->rc);
    free(g->errs);
    free(g);
}

/* ---- the model ------------------------------------------------------------ */

static tdm_status load_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    (void)arg;
    return tdm_model_load_rank(g->dir, g->bes[r], g->comms[r], &g->ranks[r], err);
}

static tdm_status destroy_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    (void)arg;
    (void)err;
    tdm_model_destroy(g->ranks[r]);
    g->ranks[r] = NULL;
    return TDM_OK;
}

tdm_status tdm_model_load_group(const char *dir, int n, tdm_backend *const *bes,
                                tdm_comm *const *comms, void (*bind)(int rank, void *ctx),
                                void *bind_ctx, tdm_model **out, tdm_error *err)
{
    *out = NULL;
    TDM_ASSERT(n >= 1);
    tdm_group *g = tdm_xcalloc(1, sizeof(*g));
    g->n = n;
    g->ranks = tdm_xcalloc((size_t)n, sizeof(*g->ranks));
    g->th = tdm_xcalloc((size_t)n, sizeof(*g->th));
    g->rc = tdm_xcalloc((size_t)n, sizeof(*g->rc));
    g->errs = tdm_xcalloc((size_t)n, sizeof(*g->errs));
    g->argmax = tdm_xcalloc((size_t)n, sizeof(*g->argmax));
    g->hidden = tdm_xcalloc((size_t)n, sizeof(*g->hidden));
    g->rows = tdm_xcalloc((size_t)n, sizeof(*g->rows));
    g->bind = bind;
    g->bind_ctx = bind_ctx;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->work, NULL);
    pthread_cond_init(&g->done, NULL);
    for (int r = 0; r < n; r++) {
        worker *w = tdm_xmalloc(sizeof(*w));
        *w = (worker){g, r};
        if (pthread_create(&g->th[r], NULL, worker_main, w) != 0) {
            free(w);
            g->n = r; /* join those started */
            g->started = r > 0;
            group_free(g);
            return tdm_error_set(err, TDM_ERR_INTERNAL, "cannot start rank %d's thread", r);
        }
    }
    g->started = 1;
    g->dir = dir;
    g->bes = bes;
    g->comms = comms;
    tdm_status rc = group_run(g, load_rank, NULL, err);
    g->dir = NULL;
    g->bes = NULL;
    g->comms = NULL;
    if (rc != TDM_OK) {
        group_run(g, destroy_rank, NULL, NULL);
        group_free(g);
        return rc;
    }
    /* The caller's model: rank 0's config (what one device holds) and
     * backend, the group behind it. */
    tdm_model *m = tdm_xcalloc(1, sizeof(*m));
    const tdm_model *r0 = g->ranks[0];
    m->cfg = r0->cfg;
    m->full = r0->full;
    m->shard = r0->shard;
    m->be = r0->be;
    m->dir = tdm_xstrdup(dir);
    m->conv_dim = r0->conv_dim;
    m->graphs = r0->graphs;
    m->store.weight_bytes = r0->store.weight_bytes;
    m->group = g;
    *out = m;
    return TDM_OK;
}

void tdm_group_destroy(tdm_group *g)
{
    group_run(g, destroy_rank, NULL, NULL);
    group_free(g);
}

void tdm_group_set_graphs(tdm_group *g, int on)
{
    for (int r = 0; r < g->n; r++)
        tdm_model_set_graphs(g->ranks[r], on);
}

typedef struct ws_args {
    int rows;
} ws_args;

static tdm_status reserve_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    return tdm_model_reserve_workspace(g->ranks[r], ((ws_args *)arg)->rows, err);
}

tdm_status tdm_group_reserve_workspace(tdm_group *g, int rows, tdm_error *err)
{
    ws_args a = {rows};
    return group_run(g, reserve_rank, &a, err);
}

/* ---- sequences ------------------------------------------------------------ */

/* The ranks' sequences of the group's sequences seqs[0..n) on rank r. */
static tdm_seq **rank_seqs(tdm_seq *const *seqs, int n, int r)
{
    tdm_seq **rs = tdm_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(*rs));
    for (int i = 0; i < n; i++)
        rs[i] = seqs[i]->ranks[r];
    return rs;
}

/* What rank r brings back for the caller's `out` of `rows` rows: the
 * caller's own on rank 0; on the others scratch asking for the same step
 * (logits or argmax: the LM head and its gather; hidden alone: the final
 * norm), so that every rank meets the same collectives. */
static const tdm_step_out *rank_out(tdm_group *g, int r, const tdm_step_out *out, size_t rows,
                                    tdm_step_out *mine)
{
    if (r == 0 || !out)
        return out;
    memset(mine, 0, sizeof(*mine));
    if (rows > g->rows[r]) {
        free(g->argmax[r]);
        free(g->hidden[r]);
        g->argmax[r] = tdm_xmalloc(rows * sizeof(int32_t));
        g->hidden[r] = NULL;
        g->rows[r] = rows;
    }
    if (out->logits || out->argmax) {
        mine->argmax = g->argmax[r];
    } else if (out->hidden) {
        if (!g->hidden[r])
            g->hidden[r] =
                tdm_xmalloc(g->rows[r] * (size_t)g->ranks[r]->cfg.hidden_size * sizeof(float));
        mine->hidden = g->hidden[r];
    }
    return mine;
}

typedef struct create_args {
    const tdm_seq_params *p;
    tdm_seq *s;         /* create: the group's new sequence */
    const tdm_seq *src; /* fork */
} create_args;

static tdm_status create_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    create_args *a = arg;
    if (a->src)
        return tdm_seq_fork(a->src->ranks[r], &a->s->ranks[r], err);
    return tdm_seq_create(g->ranks[r], a->p, &a->s->ranks[r], err);
}

static tdm_status destroy_seq_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    (void)g;
    (void)err;
    tdm_seq *s = arg;
    tdm_seq_destroy(s->ranks[r]);
    s->ranks[r] = NULL;
    return TDM_OK;
}

static tdm_status group_seq_new(tdm_model *m, const tdm_seq_params *p, const tdm_seq *src,
                                tdm_seq **out, tdm_error *err)
{
    tdm_group *g = m->group;
    tdm_seq *s = tdm_xcalloc(1, sizeof(*s));
    s->m = m;
    s->p = *p;
    s->ranks = tdm_xcalloc((size_t)g->n, sizeof(*s->ranks));
    create_args a = {p, s, src};
    tdm_status rc = group_run(g, create_rank, &a, err);
    if (rc != TDM_OK) {
        tdm_group_seq_destroy(s);
        return rc;
    }
    *out = s;
    return TDM_OK;
}

tdm_status tdm_group_seq_create(tdm_model *m, const tdm_seq_params *p, tdm_seq **out,
                                tdm_error *err)
{
    return group_seq_new(m, p, NULL, out, err);
}

tdm_status tdm_group_seq_fork(const tdm_seq *src, tdm_seq **out, tdm_error *err)
{
    return group_seq_new(src->m, &src->p, src, out, err);
}

void tdm_group_seq_destroy(tdm_seq *s)
{
    group_run(s->m->group, destroy_seq_rank, s, NULL);
    free(s->ranks);
    free(s);
}

/* One call of the sequence API on every rank: which, and its arguments. */
typedef enum seq_call {
    CALL_PREFILL,
    CALL_STEP, /* step_out, verify_out */
    CALL_DECODE,
    CALL_DRAFT,
    CALL_COMMIT,
    CALL_RESERVE_KV,
} seq_call;

typedef struct call_args {
    seq_call call;
    tdm_seq *const *seqs;
    int nseq;
    int verify;                   /* CALL_STEP: tdm_seq_verify_out (1) or tdm_seq_step_out (0) */
    const int32_t *tokens;        /* prefill, decode */
    int n;                        /* prefill: tokens; commit: accepted; reserve_kv: positions */
    const int32_t *const *toks;   /* step, draft (lead) */
    const int *ntok;              /* step, draft (nlead) */
    const int *k;                 /* draft */
    const int32_t *const *forced; /* draft */
    int32_t *const *drafts;       /* draft (rank 0's) */
    const tdm_step_out *out;
    float *logits; /* decode */
    size_t rows;
} call_args;

static tdm_status call_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    call_args *a = arg;
    tdm_step_out mine;
    const tdm_step_out *out = rank_out(g, r, a->out, a->rows, &mine);
    tdm_seq **rs = rank_seqs(a->seqs, a->nseq, r);
    tdm_status rc = TDM_OK;
    switch (a->call) {
    case CALL_PREFILL:
        rc = tdm_seq_prefill_out(rs[0], a->tokens, a->n, out, err);
        break;
    case CALL_STEP:
        rc = a->verify ? tdm_seq_verify_out(rs, a->nseq, a->toks, a->ntok, out, err)
                       : tdm_seq_step_out(rs, a->nseq, a->toks, a->ntok, out, err);
        break;
    case CALL_DECODE: {
        /* logits on rank 0; an argmax elsewhere asks for the same step */
        if (r == 0) {
            rc = tdm_seq_decode(rs, a->nseq, a->tokens, a->logits, err);
        } else {
            const tdm_step_out o = {.logits = a->logits};
            const tdm_step_out *ro = rank_out(g, r, &o, a->rows, &mine);
            int32_t const **t = tdm_xmalloc((size_t)a->nseq * sizeof(*t));
            int *one = tdm_xmalloc((size_t)a->nseq * sizeof(int));
            for (int i = 0; i < a->nseq; i++) {
                t[i] = &a->tokens[i];
                one[i] = 1;
            }
            rc = tdm_seq_step_out(rs, a->nseq, (const int32_t *const *)t, one, ro, err);
            free(t);
            free(one);
        }
        break;
    }
    case CALL_DRAFT: {
        int32_t **d = (int32_t **)a->drafts;
        int32_t *scratch = NULL;
        if (r > 0) { /* the same drafts, into scratch */
            int total = 0;
            for (int i = 0; i < a->nseq; i++)
                total += a->k[i];
            scratch = tdm_xmalloc((size_t)total * sizeof(int32_t));
            d = tdm_xmalloc((size_t)a->nseq * sizeof(*d));
            for (int i = 0, at = 0; i < a->nseq; at += a->k[i], i++)
                d[i] = scratch + at;
        }
        rc = tdm_seq_draft(rs, a->nseq, a->toks, a->ntok, a->k, a->forced, d, err);
        if (r > 0) {
            free(scratch);
            free(d);
        }
        break;
    }
    case CALL_COMMIT:
        rc = tdm_seq_commit(rs[0], a->n, err);
        break;
    case CALL_RESERVE_KV:
        rc = tdm_seq_reserve_kv(rs[0], a->n, err);
        break;
    }
    free(rs);
    return rc;
}

tdm_status tdm_group_prefill(tdm_seq *s, const int32_t *tokens, int n, const tdm_step_out *out,
                             tdm_error *err)
{
    tdm_seq *const seqs[1] = {s};
    call_args a = {.call = CALL_PREFILL,
                   .seqs = seqs,
                   .nseq = 1,
                   .tokens = tokens,
                   .n = n,
                   .out = out,
                   .rows = (size_t)(n > 0 ? n : 0)};
    return group_run(s->m->group, call_rank, &a, err);
}

tdm_status tdm_group_step(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                          const int *ntokens, int verify, const tdm_step_out *out, tdm_error *err)
{
    size_t rows = 0;
    for (int i = 0; i < nseq; i++)
        rows += ntokens[i] > 0 ? (size_t)ntokens[i] : 0;
    call_args a = {.call = CALL_STEP,
                   .seqs = seqs,
                   .nseq = nseq,
                   .verify = verify,
                   .toks = tokens,
                   .ntok = ntokens,
                   .out = out,
                   .rows = rows};
    return group_run(seqs[0]->m->group, call_rank, &a, err);
}

tdm_status tdm_group_decode(tdm_seq *const *seqs, int nseq, const int32_t *tokens, float *logits,
                            tdm_error *err)
{
    call_args a = {.call = CALL_DECODE,
                   .seqs = seqs,
                   .nseq = nseq,
                   .tokens = tokens,
                   .logits = logits,
                   .rows = (size_t)nseq};
    return group_run(seqs[0]->m->group, call_rank, &a, err);
}

tdm_status tdm_group_draft(tdm_seq *const *seqs, int nseq, const int32_t *const *lead,
                           const int *nlead, const int *k, const int32_t *const *forced,
                           int32_t *const *drafts, tdm_error *err)
{
    call_args a = {.call = CALL_DRAFT,
                   .seqs = seqs,
                   .nseq = nseq,
                   .toks = lead,
                   .ntok = nlead,
                   .k = k,
                   .forced = forced,
                   .drafts = drafts};
    return group_run(seqs[0]->m->group, call_rank, &a, err);
}

tdm_status tdm_group_commit(tdm_seq *s, int n_accepted, tdm_error *err)
{
    tdm_seq *const seqs[1] = {s};
    call_args a = {.call = CALL_COMMIT, .seqs = seqs, .nseq = 1, .n = n_accepted};
    return group_run(s->m->group, call_rank, &a, err);
}

tdm_status tdm_group_reserve_kv(tdm_seq *s, int n, tdm_error *err)
{
    tdm_seq *const seqs[1] = {s};
    call_args a = {.call = CALL_RESERVE_KV, .seqs = seqs, .nseq = 1, .n = n};
    return group_run(s->m->group, call_rank, &a, err);
}

typedef struct fetch_args {
    float *logits;
    const int *rows;
    int n;
} fetch_args;

static tdm_status fetch_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    const fetch_args *a = arg;
    return r == 0 ? tdm_step_probs_fetch(g->ranks[0], a->logits, a->rows, a->n, err) : TDM_OK;
}

tdm_status tdm_group_probs_fetch(tdm_group *g, float *logits, const int *rows, int n,
                                 tdm_error *err)
{
    fetch_args a = {logits, rows, n};
    return group_run(g, fetch_rank, &a, err);
}

/* ---- state snapshots -------------------------------------------------------- */

/* A group's snapshot is in the whole model's layout (snapshot.h, from the
 * checkpoint's config), so that it moves between verifiers split any way:
 * each rank writes its slices of each tensor into their places (export), or
 * reads them from there (import). A KV head replicated over several ranks is
 * written by the first of them. */

typedef struct snap_args {
    tdm_seq *s;
    const tdm_snap_layout *l;
    uint8_t *out;      /* export */
    const uint8_t *in; /* import */
} snap_args;

/* Where rank r's slice of a state tensor lies in the whole one: `runs` runs
 * per row of `width` whole floats; run i takes n[i] floats of the rank's row
 * from its offset loc[i] to whole[i]. */
typedef struct slice_map {
    int rows;
    size_t local_width, width;
    int runs;
    size_t loc[3], whole[3], n[3];
} slice_map;

static slice_map map_of(const tdm_model *rm, const tdm_snap_tensor *t, bool *writes)
{
    const tdm_model_config *c = &rm->cfg, *f = &rm->full;
    const tdm_shard *sh = &rm->shard;
    const char *kind = strrchr(t->name, '.') + 1;
    slice_map m = {0};
    *writes = true;
    if (strcmp(kind, "conv") == 0) {
        const size_t Dk = (size_t)f->lin_k_dim, Dv = (size_t)f->lin_v_dim;
        const size_t Hk = (size_t)f->lin_k_heads, Hkl = (size_t)c->lin_k_heads;
        const size_t Hvl = (size_t)c->lin_v_heads;
        m.rows = f->conv_kernel - 1;
        m.width = tdm_capacity_conv_dim(f);
        m.local_width = tdm_capacity_conv_dim(c);
        m.runs = 3; /* q, k, v channels */
        m.loc[0] = 0, m.whole[0] = (size_t)sh->k_head0 * Dk, m.n[0] = Hkl * Dk;
        m.loc[1] = Hkl * Dk, m.whole[1] = Hk * Dk + (size_t)sh->k_head0 * Dk, m.n[1] = Hkl * Dk;
        m.loc[2] = 2 * Hkl * Dk, m.whole[2] = 2 * Hk * Dk + (size_t)sh->v_head0 * Dv;
        m.n[2] = Hvl * Dv;
    } else if (strcmp(kind, "recurrent") == 0) {
        const size_t head = (size_t)f->lin_k_dim * (size_t)f->lin_v_dim;
        m.rows = 1;
        m.width = (size_t)f->lin_v_heads * head;
        m.local_width = (size_t)c->lin_v_heads * head;
        m.runs = 1;
        m.whole[0] = (size_t)sh->v_head0 * head, m.n[0] = m.local_width;
    } else { /* key, value: [committed, nKV, D] */
        const size_t D = (size_t)f->head_dim;
        m.rows = (int)t->shape[0];
        m.width = (size_t)f->num_kv_heads * D;
        m.local_width = (size_t)c->num_kv_heads * D;
        m.runs = 1;
        m.whole[0] = (size_t)sh->kv_head0 * D, m.n[0] = m.local_width;
        /* replicated: size / num_kv_heads ranks in a row hold one head,
         * and the first of them writes it */
        const int nkv = f->num_kv_heads;
        *writes = nkv % sh->size == 0 || sh->rank % (sh->size / nkv) == 0;
    }
    return m;
}

/* A rank's slice between its own rows (local) and the whole tensor's. */
static void slice_copy(const slice_map *m, float *whole, float *local, bool to_local)
{
    for (int row = 0; row < m->rows; row++)
        for (int k = 0; k < m->runs; k++) {
            float *w = whole + (size_t)row * m->width + m->whole[k];
            float *l = local + (size_t)row * m->local_width + m->loc[k];
            if (to_local)
                memcpy(l, w, m->n[k] * sizeof(float));
            else
                memcpy(w, l, m->n[k] * sizeof(float));
        }
}

static tdm_status snap_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    snap_args *a = arg;
    tdm_model *rm = g->ranks[r];
    tdm_seq *rs = a->s->ranks[r];
    tdm_backend *be = rm->be;
    if (a->in) { /* KV for the committed positions, as a forward would grow it */
        tdm_status rc = tdm_seq_reserve_kv(rs, (int)a->l->committed, err);
        if (rc != TDM_OK)
            return rc;
    }
    float *tmp = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < a->l->n_tensors; i++) {
        const tdm_snap_tensor *t = &a->l->tensors[i];
        bool writes;
        const slice_map m = map_of(rm, t, &writes);
        const size_t n = (size_t)m.rows * m.local_width;
        if (n == 0 || (!a->in && !writes))
            continue;
        if (n > cap) {
            free(tmp);
            tmp = tdm_xmalloc(n * sizeof(float));
            cap = n;
        }
        float *whole =
            (float *)(void *)((a->in ? (uint8_t *)(uintptr_t)a->in : a->out) + t->offset);
        if (!a->in) {
            be->download(be->ctx, tmp, tdm_seq_state_buf(rs, t), n * sizeof(float));
            be->sync(be->ctx);
        }
        slice_copy(&m, whole, tmp, a->in != NULL);
        if (a->in)
            be->upload(be->ctx, tdm_seq_state_buf(rs, t), tmp, n * sizeof(float));
    }
    be->sync(be->ctx);
    free(tmp);
    if (a->in)
        rs->n_past = (int)a->l->committed;
    return TDM_OK;
}

tdm_status tdm_group_seq_export(const tdm_seq *s, const tdm_snap_layout *l, uint8_t *payload,
                                tdm_error *err)
{
    snap_args a = {.s = (tdm_seq *)(uintptr_t)s, .l = l, .out = payload};
    return group_run(s->m->group, snap_rank, &a, err);
}

tdm_status tdm_group_seq_import(tdm_seq *s, const tdm_snap_layout *l, const uint8_t *payload,
                                tdm_error *err)
{
    snap_args a = {.s = s, .l = l, .in = payload};
    return group_run(s->m->group, snap_rank, &a, err);
}

/* ---- prefix-cache blocks ----------------------------------------------------- */

/* A group's prefix-cache blocks are in the checkpoint's layout, like its
 * snapshots: a block's pieces in prefix_cache.c's order (per linear layer
 * its conv window, then its recurrent state; per attention layer K, then V
 * of the block's positions), each rank's slice of each piece in its place. */

typedef struct prefix_args {
    tdm_seq *s;
    int n, j, B;
    uint8_t *out;              /* take: one block */
    const void *const *blocks; /* give: the prefix's blocks */
    int nblocks;
} prefix_args;

static tdm_status prefix_rank(tdm_group *g, int r, void *arg, tdm_error *err)
{
    prefix_args *a = arg;
    tdm_model *rm = g->ranks[r];
    tdm_seq *rs = a->s->ranks[r];
    const size_t local_bytes = tdm_capacity_prefix_block_bytes(&rm->cfg, a->B);
    uint8_t *loc = malloc(local_bytes ? local_bytes : 1);
    if (!loc)
        return tdm_error_oom(err, local_bytes, "a rank's prefix-cache block");
    const int nb = a->out ? 1 : a->nblocks;
    tdm_status rc = TDM_OK;
    for (int i = 0; i < nb && rc == TDM_OK; i++) {
        if (a->out && (rc = tdm_prefix_block_take(rs, a->n, a->j, a->B, loc, err)) != TDM_OK)
            break;
        uint8_t *whole = a->out ? a->out : (uint8_t *)(uintptr_t)a->blocks[i];
        size_t at_local = 0, at_whole = 0;
        for (int L = 0; L < rm->full.num_layers; L++) {
            const bool linear = rm->full.layer_types[L] == TDM_LAYER_LINEAR_ATTENTION;
            for (int k = 0; k < 2; k++) {
                tdm_snap_tensor t = {.layer = (uint32_t)L, .shape = {(uint64_t)a->B}};
                snprintf(t.name, sizeof(t.name), "layers.%d.%s", L,
                         linear ? (k ? "recurrent" : "conv") : (k ? "value" : "key"));
                bool writes;
                const slice_map m = map_of(rm, &t, &writes);
                float *w = (float *)(void *)(whole + at_whole);
                float *l = (float *)(void *)(loc + at_local);
                if (!a->out)
                    slice_copy(&m, w, l, true);
                else if (writes)
                    slice_copy(&m, w, l, false);
                at_whole += (size_t)m.rows * m.width * sizeof(float);
                at_local += (size_t)m.rows * m.local_width * sizeof(float);
            }
        }
        TDM_ASSERT(at_local == local_bytes &&
                   at_whole == tdm_capacity_prefix_block_bytes(&rm->full, a->B));
        if (!a->out) {
            tdm_prefix_block_give(rs, i, i == nb - 1, a->B, loc);
            rm->be->sync(rm->be->ctx); /* loc is reused by the next block */
        }
    }
    if (rc == TDM_OK && !a->out)
        rs->n_past = a->nblocks * a->B;
    free(loc);
    return rc;
}

tdm_status tdm_group_prefix_take(const tdm_seq *s, int n, int j, int B, uint8_t *p, tdm_error *err)
{
    prefix_args a = {.s = (tdm_seq *)(uintptr_t)s, .n = n, .j = j, .B = B, .out = p};
    return group_run(s->m->group, prefix_rank, &a, err);
}

tdm_status tdm_group_prefix_give(tdm_seq *s, const void *const *blocks, int nblocks, int B,
                                 tdm_error *err)
{
    prefix_args a = {.s = s, .B = B, .blocks = blocks, .nblocks = nblocks};
    return group_run(s->m->group, prefix_rank, &a, err);
}
