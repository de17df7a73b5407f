/*
 * mtp.c - the MTP head (mtp.h): loading the mtp.* tensors and the rows of
 * its forward pass.
 *
 * A row follows mtp.h's recipe top to bottom in mtp_rows. The projection of
 * the concatenation [e, g] by mtp.fc [H, 2H] runs as two products on the
 * column halves of fc, loaded as matrices of their own (fc_e = fc[:, :H],
 * fc_h = fc[:, H:]): x = e·fc_eᵀ + g·fc_hᵀ, so no [R, 2H] buffer is built.
 * The decoder layer is the target's own gated-attention layer code
 * (tdm_fwd_attention, tdm_fwd_mlp), on the model's workspace, with this
 * head's weights and the sequence's KV cache. Ops run eagerly (no graph
 * bracket); a greedy draft queues its k steps without waiting for the
 * device in between (argmax_to, embed_dev) when the backend has them and
 * no logits are asked for. Every op computes a row the same way whatever the rows of the
 * call (backend.h), so a prime in one call or in several gives the same
 * bits. Sizes come from capacity.c (tdm_capacity_mtp_seq_bytes).
 */
#include "mtp.h"
#include "alloc.h"
#include "capacity.h"
#include "engine_internal.h"
#include "sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MTP_KV_INITIAL_CAP 64
#define MTP_GRAPH_ROWS 16 /* primes of at most this many rows run as a graph */

struct tdm_mtp {
    tdm_model *m;            /* the target (borrowed), or `own` */
    tdm_model *own;          /* the head-only model of tdm_mtp_open, or NULL */
    tdm_weight_store store;  /* what the head's tensors placed */
    tdm_weight fc_e, fc_h;   /* [H, H]: mtp.fc's columns for the embedding, the hidden state */
    const float *norm_e;     /* [H] zero-centred: pre_fc_norm_embedding */
    const float *norm_h;     /* [H] zero-centred: pre_fc_norm_hidden */
    const float *norm;       /* [H] zero-centred: the head's final norm */
    tdm_layer_weights layer; /* mtp.layers.0: a full-attention decoder layer */
    float *hid;              /* backend [rows, H]: a prime's hidden states, uploaded */
    float *hn;               /* backend [rows, H]: pre_fc_norm_hidden of a call's hidden states */
    float *y[2];             /* backend [rows, H]: a draft chain's y rows, step by step in turn */
    int rows;                /* rows hid, hn and y hold */
    int graphs;              /* draft chains through the backend's graph slots */
    int32_t *dids;           /* backend [dcap]: drafts on the device, [step, sequence] */
    int dcap;
    float *dprobs;      /* backend [dprobs_rows, draft vocabulary]: sampled drafts' */
    int dprobs_rows;    /* distributions on the device, [step, sequence] */
    tdm_draft_vocab dv; /* the draft vocabulary (tdm_mtp_set_vocab); n 0: the whole one */
    int fp8;            /* matrices rounded to FP8 (tdm_mtp_set_weights_fp8) */
};

struct tdm_mtp_seq {
    tdm_mtp *h;
    int n_past;        /* positions in the KV cache */
    int kv_cap;        /* positions k and v hold */
    int max_positions; /* tdm_mtp_seq_create's; 0: grow by doubling */
    float *k, *v;      /* backend [kv_cap, nKV*D] */
    float *last;       /* backend [H]: the head's output y at position n_past - 1 */
    int has_last;      /* `last` is valid: a prime or draft ran since the last rollback */
    int drafted;       /* draft rows at the end of the cache (positions n_past-drafted ..) */
    int32_t carry;     /* the last draft, not run through the head yet; -1: none */
};

/* ---- loading ----------------------------------------------------------- */

/* The head's tensors into h->store through m's loaders. */
static tdm_status mtp_load(tdm_mtp *h, tdm_model *m, tdm_error *err)
{
    const tdm_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size;
    if (c->mtp_layers > 1)
        return tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                             "%s/config.json: mtp_num_hidden_layers is %d; the engine runs a "
                             "head of one layer",
                             m->dir, c->mtp_layers);
    if (!tdm_st_find(m->st, "mtp.fc.weight"))
        return tdm_error_set(err, TDM_ERR_NOT_FOUND,
                             "%s: no MTP head: tensor 'mtp.fc.weight' is missing (config.json "
                             "declares %d MTP layer%s; a checkpoint for drafting needs the mtp.* "
                             "tensors of a Qwen3.5/3.6 release)",
                             m->dir, c->mtp_layers, c->mtp_layers == 1 ? "" : "s");
    tdm_weight_store *saved = m->into;
    m->into = &h->store;
    tdm_status rc;
    if ((rc = tdm_model_load_matrix_cols(m, "mtp.fc.weight", H, 2 * H, 0, H, &h->fc_e, err)) ||
        (rc = tdm_model_load_matrix_cols(m, "mtp.fc.weight", H, 2 * H, H, H, &h->fc_h, err)) ||
        (rc = tdm_model_load_vector(m, "mtp.pre_fc_norm_embedding.weight", H, &h->norm_e, err)) ||
        (rc = tdm_model_load_vector(m, "mtp.pre_fc_norm_hidden.weight", H, &h->norm_h, err)) ||
        (rc = tdm_model_load_vector(m, "mtp.norm.weight", H, &h->norm, err)) ||
        (rc =
             tdm_model_load_layer(m, "mtp.layers.0.", 0, TDM_LAYER_FULL_ATTENTION, &h->layer, err)))
        tdm_error_prefix(err, "MTP head");
    m->into = saved;
    return rc;
}

static tdm_status mtp_new(tdm_model *m, tdm_model *own, tdm_mtp **out, tdm_error *err)
{
    *out = NULL;
    tdm_mtp *h = tdm_xcalloc(1, sizeof(*h));
    h->m = m;
    h->own = own;
    tdm_status rc = mtp_load(h, m, err);
    if (rc != TDM_OK) {
        tdm_mtp_destroy(h);
        return rc;
    }
    *out = h;
    return TDM_OK;
}

tdm_status tdm_mtp_create(tdm_model *m, tdm_mtp **out, tdm_error *err)
{
    return mtp_new(m, NULL, out, err);
}

tdm_status tdm_mtp_open(const char *dir, tdm_backend *be, tdm_mtp **out, tdm_error *err)
{
    TDM_ASSERT(be);
    *out = NULL;
    tdm_model *m = NULL;
    tdm_status rc = tdm_model_load_head(dir, be, &m, err);
    return rc != TDM_OK ? rc : mtp_new(m, m, out, err);
}

tdm_status tdm_mtp_check(const char *dir, tdm_error *err)
{
    tdm_model *m = NULL;
    tdm_status rc = tdm_model_load_head(dir, NULL, &m, err);
    if (rc != TDM_OK)
        return rc;
    tdm_mtp h;
    memset(&h, 0, sizeof(h));
    rc = mtp_load(&h, m, err);
    tdm_weight_store_free(NULL, &h.store); /* nothing was placed: no backend */
    tdm_model_destroy(m);
    return rc;
}

void tdm_mtp_destroy(tdm_mtp *h)
{
    if (!h)
        return;
    tdm_backend *be = h->m->be;
    if (be) {
        tdm_weight_store_free(be, &h->store);
        be->free(be->ctx, h->hid);
        be->free(be->ctx, h->hn);
        be->free(be->ctx, h->y[0]);
        be->free(be->ctx, h->y[1]);
        be->free(be->ctx, h->dids);
        be->free(be->ctx, h->dprobs);
        tdm_draft_vocab_free(be, &h->dv);
    }
    tdm_model_destroy(h->own);
    free(h);
}

size_t tdm_mtp_weight_bytes(const tdm_mtp *h)
{
    return h->store.weight_bytes;
}

const tdm_model_config *tdm_mtp_get_config(const tdm_mtp *h)
{
    return &h->m->cfg;
}

/* mats[0..n), of the head's store, rounded to FP8. */
static tdm_status mtp_round(tdm_mtp *h, const tdm_fp8_mat *mats, int n, int *nc, int *nk,
                            tdm_error *err)
{
    tdm_model *m = h->m;
    tdm_weight_store *saved = m->into;
    m->into = &h->store;
    tdm_status rc = tdm_model_round_fp8(m, mats, n, nc, nk, err);
    m->into = saved;
    return rc;
}

tdm_status tdm_mtp_set_vocab(tdm_mtp *h, const int32_t *ids, int n, tdm_error *err)
{
    tdm_model *m = h->m;
    tdm_weight_store *saved = m->into;
    m->into = &h->store;
    tdm_status rc = tdm_draft_vocab_load(m, ids, n, &h->dv, err);
    m->into = saved;
    if (rc == TDM_OK && h->fp8) {
        const tdm_fp8_mat rows = {&h->dv.head, n, m->cfg.hidden_size, &m->lm_head,
                                  m->cfg.vocab_size};
        int nc = 0, nk = 0;
        if ((rc = mtp_round(h, &rows, 1, &nc, &nk, err)) != TDM_OK)
            return tdm_error_prefix(err, "draft vocabulary");
    }
    return rc;
}

tdm_status tdm_mtp_set_weights_fp8(tdm_mtp *h, tdm_mtp_fp8 *got, tdm_error *err)
{
    if (h->fp8)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "the weights are FP8 already");
    tdm_model *m = h->m;
    const int64_t H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    tdm_mtp_fp8 r = {.before = h->store.weight_bytes, .lm_head = TDM_MTP_FP8_HEAD_TARGETS};
    /* A head-only load's LM head (tied: the embedding's table, which then
     * reads the rounded values); the target's (tdm_mtp_create) is the
     * target's to round. */
    if (h->own) {
        tdm_model *own = h->own;
        r.tied = own->lm_head.data == own->embed.data;
        const tdm_fp8_mat head = {&own->lm_head, V, H, NULL, 0};
        tdm_status rc = tdm_model_round_fp8(own, &head, 1, &r.converted, &r.kept, err);
        if (rc != TDM_OK)
            return tdm_error_prefix(err, "LM head");
        r.lm_head = r.converted ? TDM_MTP_FP8_HEAD_ROUNDED : TDM_MTP_FP8_HEAD_KEPT;
    }
    /* fc's two halves, the decoder layer's projections, a draft
     * vocabulary's rows (the LM head's, under its scale) */
    tdm_fp8_mat mats[2 + TDM_LAYER_FP8_MATS + 1] = {{&h->fc_e, H, H, NULL, 0},
                                                    {&h->fc_h, H, H, NULL, 0}};
    int nm = 2 + tdm_layer_fp8_mats(&m->cfg, &h->layer, mats + 2);
    if (h->dv.n)
        mats[nm++] = (tdm_fp8_mat){&h->dv.head, h->dv.n, H, &m->lm_head, V};
    tdm_status rc = mtp_round(h, mats, nm, &r.converted, &r.kept, err);
    if (rc != TDM_OK)
        return rc;
    r.vocab_rows = h->dv.n && h->dv.head.dtype == TDM_DTYPE_FP8;
    h->fp8 = 1;
    r.after = h->store.weight_bytes;
    if (got)
        *got = r;
    return TDM_OK;
}

void tdm_mtp_set_graphs(tdm_mtp *h, int on)
{
    h->graphs = on != 0;
}

int tdm_mtp_vocab_size(const tdm_mtp *h)
{
    return h->dv.n ? h->dv.n : h->m->cfg.vocab_size;
}

int32_t tdm_mtp_vocab_id(const tdm_mtp *h, int t)
{
    return h->dv.n ? h->dv.ids[t] : t;
}

void *tdm_mtp_host_alloc(tdm_mtp *h, size_t nbytes)
{
    return tdm_model_host_alloc(h->m, nbytes);
}

void tdm_mtp_host_free(tdm_mtp *h, void *p)
{
    tdm_model_host_free(h->m, p);
}

/* ---- sequences --------------------------------------------------------- */

static size_t kv_row_bytes(const tdm_mtp *h)
{
    return tdm_capacity_kv_width(&h->m->cfg) * sizeof(float);
}

static tdm_status kv_ensure(tdm_mtp_seq *s, int need, tdm_error *err)
{
    if (need <= s->kv_cap)
        return TDM_OK;
    tdm_backend *be = s->h->m->be;
    int cap = s->kv_cap ? s->kv_cap : MTP_KV_INITIAL_CAP;
    while (cap < need)
        cap *= 2;
    if (s->max_positions > 0)
        cap = need; /* past what the caller reserved: only what is needed */
    const size_t row = kv_row_bytes(s->h);
    float *nk = be->alloc(be->ctx, (size_t)cap * row);
    float *nv = be->alloc(be->ctx, (size_t)cap * row);
    if (!nk || !nv) {
        be->free(be->ctx, nk);
        be->free(be->ctx, nv);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "out of memory growing the MTP head's KV cache to %d positions", cap);
    }
    if (s->n_past > 0) {
        be->copy(be->ctx, nk, s->k, (size_t)s->n_past * row);
        be->copy(be->ctx, nv, s->v, (size_t)s->n_past * row);
    }
    be->free(be->ctx, s->k);
    be->free(be->ctx, s->v);
    s->k = nk;
    s->v = nv;
    s->kv_cap = cap;
    return TDM_OK;
}

tdm_status tdm_mtp_seq_create(tdm_mtp *h, int max_positions, tdm_mtp_seq **out, tdm_error *err)
{
    *out = NULL;
    if (max_positions < 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "max_positions %d is negative",
                             max_positions);
    tdm_backend *be = h->m->be;
    tdm_mtp_seq *s = tdm_xcalloc(1, sizeof(*s));
    s->h = h;
    s->max_positions = max_positions;
    s->carry = -1;
    s->last = be->alloc(be->ctx, (size_t)h->m->cfg.hidden_size * sizeof(float));
    tdm_status rc = s->last ? kv_ensure(s, max_positions > 0 ? max_positions : 1, err)
                            : tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                                            "%s backend memory exhausted: no room for an MTP "
                                            "sequence",
                                            be->name);
    if (rc != TDM_OK) {
        tdm_mtp_seq_destroy(s);
        return rc;
    }
    *out = s;
    return TDM_OK;
}

void tdm_mtp_seq_destroy(tdm_mtp_seq *s)
{
    if (!s)
        return;
    tdm_backend *be = s->h->m->be;
    be->free(be->ctx, s->k);
    be->free(be->ctx, s->v);
    be->free(be->ctx, s->last);
    free(s);
}

int tdm_mtp_seq_length(const tdm_mtp_seq *s)
{
    return s->n_past;
}

size_t tdm_mtp_seq_bytes(const tdm_mtp_seq *s)
{
    return tdm_capacity_mtp_seq_bytes(&s->h->m->cfg, s->kv_cap);
}

/* ---- the forward pass -------------------------------------------------- */

/* Room for calls of `rows` rows: the model's workspace and the head's
 * row buffers. */
static tdm_status rows_ensure(tdm_mtp *h, int rows, tdm_error *err)
{
    tdm_status rc = tdm_model_reserve_workspace(h->m, rows, err);
    if (rc != TDM_OK || rows <= h->rows)
        return rc;
    tdm_backend *be = h->m->be;
    const size_t nb = (size_t)rows * (size_t)h->m->cfg.hidden_size * sizeof(float);
    float *b[4];
    int ok = 1;
    for (int i = 0; i < 4; i++)
        ok &= (b[i] = be->alloc(be->ctx, nb)) != NULL;
    if (!ok) {
        for (int i = 0; i < 4; i++)
            be->free(be->ctx, b[i]);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "backend out of memory for MTP calls of %d rows", rows);
    }
    float **mine[4] = {&h->hid, &h->hn, &h->y[0], &h->y[1]};
    for (int i = 0; i < 4; i++) {
        be->free(be->ctx, *mine[i]);
        *mine[i] = b[i];
    }
    h->rows = rows;
    return TDM_OK;
}

/* One forward of nseg segments: segment i is counts[i] rows of seqs[i] at
 * positions n_past .. n_past+counts[i]-1, rows in segment order; hid backend
 * [R, H] their hidden states, ids host [R] their tokens (or, when ids_dev is
 * not NULL, backend [R] written earlier in the queue: embed_dev). Leaves y =
 * norm(x) in ws.xn [R, H] and each segment's last y in its sequence's
 * `last` or, with yout, y in yout [R, H] alone (ops only: a graph bracket may
 * hold it; the caller brings `last` up to date). Advances every n_past. The
 * caller has made room (rows_ensure, kv_ensure). */
static void mtp_rows(tdm_mtp_seq *const *seqs, const int *counts, int nseg, const float *hid,
                     const int32_t *ids, const int32_t *ids_dev, float *yout, int R)
{
    tdm_mtp *h = seqs[0]->h;
    tdm_model *m = h->m;
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    const int H = m->cfg.hidden_size;
    const float eps = (float)m->cfg.rms_norm_eps;
    tdm_workspace *w = &m->ws;
    int32_t *pos = tdm_xmalloc((size_t)R * sizeof(int32_t));
    tdm_attn_seg *as = tdm_xcalloc((size_t)nseg, sizeof(*as));
    float **kc = tdm_xmalloc((size_t)nseg * sizeof(float *));
    float **vc = tdm_xmalloc((size_t)nseg * sizeof(float *));
    for (int i = 0, r = 0; i < nseg; i++) {
        as[i] = (tdm_attn_seg){.row0 = r, .nrows = counts[i], .n_past = seqs[i]->n_past};
        kc[i] = seqs[i]->k;
        vc[i] = seqs[i]->v;
        for (int j = 0; j < counts[i]; j++, r++)
            pos[r] = seqs[i]->n_past + j;
    }

    if (ids_dev)
        be->embed_dev(bx, w->xn, m->embed, ids_dev, R, H); /* [R, H] */
    else
        be->embed(bx, w->xn, m->embed, ids, R, H);
    be->rmsnorm(bx, w->xn, w->xn, h->norm_e, R, H, eps, 1);            /* e */
    be->rmsnorm(bx, h->hn, hid, h->norm_h, R, H, eps, 1);              /* g */
    be->matmul(bx, w->x, w->xn, h->fc_e, R, H, H, 0);                  /* x = e·fc_eᵀ */
    be->matmul(bx, w->x, h->hn, h->fc_h, R, H, H, 1);                  /* x += g·fc_hᵀ */
    tdm_fwd_attention(m, &h->layer, R, pos, as, kc, vc, nseg);         /* x += attention */
    tdm_fwd_mlp(m, &h->layer, R);                                      /* x += MLP */
    be->rmsnorm(bx, yout ? yout : w->xn, w->x, h->norm, R, H, eps, 1); /* y */
    for (int i = 0; i < nseg; i++) {
        const size_t last = (size_t)(as[i].row0 + counts[i] - 1);
        if (!yout)
            be->copy(bx, seqs[i]->last, w->xn + last * (size_t)H, (size_t)H * sizeof(float));
        seqs[i]->n_past += counts[i];
        seqs[i]->has_last = 1;
    }
    free(pos);
    free(as);
    free(kc);
    free(vc);
}

/* Sequences of one head, none twice. */
static tdm_status check_batch(tdm_mtp_seq *const *seqs, int nseq, tdm_error *err)
{
    if (nseq < 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "no MTP sequences given");
    for (int i = 0; i < nseq; i++) {
        if (seqs[i]->h != seqs[0]->h)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "MTP sequences of different heads in one batch");
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                     "MTP sequence %d appears twice in one batch", i);
    }
    return TDM_OK;
}

/* mtp_rows of a prime (hidden states in h->hid) through the backend's graph
 * slots: y rows into h->y[0], then each segment's last row into its
 * sequence's `last`, after the bracket. */
static void prime_graph(tdm_mtp_seq *const *seqs, const int *counts, int nseg, const int32_t *ids,
                        int R)
{
    tdm_mtp *h = seqs[0]->h;
    tdm_model *m = h->m;
    tdm_backend *be = m->be;
    const size_t H = (size_t)m->cfg.hidden_size;
    uint64_t key = tdm_key_mix(0xa4093822299f31d0ull, (uint64_t)(uintptr_t)h);
    key = tdm_key_mix(key, (uint64_t)(uintptr_t)m->ws.block);
    key = tdm_key_mix(key, (uint64_t)m->ws.rows);
    key = tdm_key_mix(key, (uint64_t)(uintptr_t)h->hid);
    key = tdm_key_mix(key, (uint64_t)(uintptr_t)h->y[0]);
    key = tdm_key_mix(key, (uint64_t)nseg);
    int saved[MTP_GRAPH_ROWS];
    for (int i = 0; i < nseg; i++) {
        key = tdm_key_mix(key, (uint64_t)counts[i]);
        saved[i] = seqs[i]->n_past;
    }
    be->graph_begin(be->ctx, key);
    mtp_rows(seqs, counts, nseg, h->hid, ids, NULL, h->y[0], R);
    if (be->graph_end(be->ctx) != 0) { /* refused: nothing ran; again, eagerly */
        for (int i = 0; i < nseg; i++)
            seqs[i]->n_past = saved[i];
        mtp_rows(seqs, counts, nseg, h->hid, ids, NULL, h->y[0], R);
    }
    for (int i = 0, r = 0; i < nseg; r += counts[i], i++)
        be->copy(be->ctx, seqs[i]->last, h->y[0] + (size_t)(r + counts[i] - 1) * H,
                 H * sizeof(float));
}

tdm_status tdm_mtp_prime_n(tdm_mtp_seq *const *seqs, int nseq, const float *const *hidden,
                           const int32_t *const *next, const int *n, float *logits, tdm_error *err)
{
    tdm_status rc = check_batch(seqs, nseq, err);
    if (rc != TDM_OK)
        return rc;
    tdm_mtp *h = seqs[0]->h;
    tdm_model *m = h->m;
    tdm_backend *be = m->be;
    long total = 0;
    for (int i = 0; i < nseq; i++) {
        const tdm_mtp_seq *s = seqs[i];
        if (n[i] < 1)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "MTP sequence %d: a prime needs rows (got %d)", i, n[i]);
        if (s->drafted)
            return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                                 "MTP sequence %d: the cache ends in %d draft rows: roll back to "
                                 "position %d before priming",
                                 i, s->drafted, s->n_past - s->drafted);
        if ((rc = tdm_model_check_tokens(m, next[i], n[i], err)) != TDM_OK)
            return tdm_error_prefix(err, "MTP sequence %d", i);
        total += n[i];
    }
    /* Forwards of at most TDM_PREFILL_ROWS rows: pieces of the sequences'
     * rows in order, so a forward's rows are consecutive rows of `logits`. */
    const int chunk = total < TDM_PREFILL_ROWS ? (int)total : TDM_PREFILL_ROWS;
    if ((rc = rows_ensure(h, chunk, err)) != TDM_OK)
        return rc;
    for (int i = 0; i < nseq; i++)
        if ((rc = kv_ensure(seqs[i], seqs[i]->n_past + n[i], err)) != TDM_OK)
            return rc;
    const size_t H = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    /* A verdict's few rows as one graph; a prompt's many, eagerly. */
    const bool graph = !logits && h->graphs && be->graph_begin && total <= MTP_GRAPH_ROWS;
    tdm_mtp_seq **pseq = tdm_xmalloc((size_t)chunk * sizeof(*pseq));
    int *pcount = tdm_xmalloc((size_t)chunk * sizeof(int));
    int32_t *ids = tdm_xmalloc((size_t)chunk * sizeof(int32_t));
    size_t g0 = 0; /* the forward's first row among all */
    for (int si = 0, at = 0; si < nseq;) {
        int R = 0, np = 0;
        while (si < nseq && R < chunk) {
            const int c = n[si] - at < chunk - R ? n[si] - at : chunk - R;
            be->upload(be->ctx, h->hid + (size_t)R * H, hidden[si] + (size_t)at * H,
                       (size_t)c * H * sizeof(float));
            memcpy(ids + R, next[si] + at, (size_t)c * sizeof(int32_t));
            pseq[np] = seqs[si];
            pcount[np++] = c;
            R += c;
            at += c;
            if (at == n[si]) {
                si++;
                at = 0;
            }
        }
        if (graph)
            prime_graph(pseq, pcount, np, ids, R);
        else
            mtp_rows(pseq, pcount, np, h->hid, ids, NULL, NULL, R);
        if (logits) {
            be->matmul(be->ctx, m->ws.logits, m->ws.xn, m->lm_head, R, (int)H, (int)V, 0);
            be->download(be->ctx, logits + g0 * V, m->ws.logits, (size_t)R * V * sizeof(float));
        }
        g0 += (size_t)R;
    }
    /* Without logits the rows stay queued: the next call (a draft) queues
     * behind them and waits once, at its end. */
    if (logits)
        be->sync(be->ctx);
    for (int i = 0; i < nseq; i++)
        seqs[i]->carry = -1;
    free(pseq);
    free(pcount);
    free(ids);
    return TDM_OK;
}

tdm_status tdm_mtp_prime(tdm_mtp_seq *s, const float *hidden, const int32_t *next, int n,
                         float *logits, tdm_error *err)
{
    return tdm_mtp_prime_n(&s, 1, &hidden, &next, &n, logits, err);
}

/* Room for the device's drafts of a call: [kmax, nseq] ids. */
static tdm_status dids_ensure(tdm_mtp *h, int n, tdm_error *err)
{
    if (n <= h->dcap)
        return TDM_OK;
    tdm_backend *be = h->m->be;
    int32_t *ids = be->alloc(be->ctx, (size_t)n * sizeof(int32_t));
    if (!ids)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "backend out of memory for %d MTP draft tokens", n);
    be->free(be->ctx, h->dids);
    h->dids = ids;
    h->dcap = n;
    return TDM_OK;
}

/* Room on the backend for n sampled drafts' distributions of vd floats. */
static tdm_status dprobs_ensure(tdm_mtp *h, int n, size_t vd, tdm_error *err)
{
    if (n <= h->dprobs_rows)
        return TDM_OK;
    tdm_backend *be = h->m->be;
    float *p = be->alloc(be->ctx, (size_t)n * vd * sizeof(float));
    if (!p)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "backend out of memory for %d MTP draft distributions of %zu", n, vd);
    be->free(be->ctx, h->dprobs);
    h->dprobs = p;
    h->dprobs_rows = n;
    return TDM_OK;
}

/* A sampled draft on the host: row x's logits (vd of them) turned into
 * ds's distribution of step j and drawn with its uniform; the token id. */
static int32_t mtp_draw_host(const tdm_mtp *h, const tdm_draft_sampling *ds, int j, int x,
                             size_t vd, float *row, int *order)
{
    tdm_backend *be = h->m->be;
    be->download(be->ctx, row, h->m->ws.logits + (size_t)x * vd, vd * sizeof(float));
    be->sync(be->ctx);
    const tdm_sampling sp = {ds->temperature, ds->top_p, ds->top_k};
    float *p = ds->probs + (size_t)j * vd;
    tdm_sampling_probs(&sp, row, (int)vd, p, order);
    return tdm_mtp_vocab_id(h, tdm_sampling_draw(p, (int)vd, ds->u[j]));
}

static tdm_status mtp_draft(tdm_mtp_seq *const *seqs, int nseq, const int *k,
                            const int32_t *const *forced, const tdm_draft_sampling *const *sampling,
                            int32_t *const *drafts, float *logits, tdm_error *err)
{
    tdm_status rc = check_batch(seqs, nseq, err);
    if (rc != TDM_OK)
        return rc;
    bool sampled = false;
    for (int i = 0; sampling && i < nseq; i++)
        sampled = sampled || sampling[i];
    if (sampled && forced)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "forced proposals and sampled drafts in one MTP call");
    tdm_mtp *h = seqs[0]->h;
    tdm_model *m = h->m;
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    int kmax = 0;
    for (int i = 0; i < nseq; i++) {
        if (k[i] < 1)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "MTP sequence %d: a draft of %d tokens", i, k[i]);
        if (!seqs[i]->has_last)
            return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                                 "MTP sequence %d: nothing to draft from: prime it first (it is "
                                 "at position %d)",
                                 i, seqs[i]->n_past);
        if (forced && (rc = tdm_model_check_tokens(m, forced[i], k[i], err)) != TDM_OK)
            return tdm_error_prefix(err, "MTP sequence %d", i);
        kmax = k[i] > kmax ? k[i] : kmax;
    }
    /* On the device: each step's argmax stays there and feeds the next
     * step's embedding; the drafts come back in one download at the end. */
    const bool device = !logits && be->argmax_to && be->embed_dev && (!sampled || be->sample_to);
    const size_t vd = (size_t)tdm_mtp_vocab_size(h);
    if ((rc = rows_ensure(h, nseq, err)) != TDM_OK ||
        (device && (rc = dids_ensure(h, kmax * nseq, err)) != TDM_OK) ||
        (device && sampled && (rc = dprobs_ensure(h, kmax * nseq, vd, err)) != TDM_OK))
        return rc;
    for (int i = 0; i < nseq; i++)
        if ((rc = kv_ensure(seqs[i], seqs[i]->n_past + k[i] - 1 + (seqs[i]->carry >= 0), err)) !=
            TDM_OK)
            return rc;
    const size_t H = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    /* The head's rows a draft step reads: Vd of them, token dv.ids[i] at i. */
    const size_t Vd = h->dv.n ? (size_t)h->dv.n : V;
    const tdm_weight head = h->dv.n ? h->dv.head : m->lm_head;
    /* Longest chains first: step j runs a prefix of them (x < na[j]), so
     * sequence ord[x]'s rows are row x of every step. */
    int *ord = tdm_xmalloc((size_t)nseq * sizeof(int));
    for (int i = 0; i < nseq; i++) {
        int x = i;
        while (x > 0 && k[ord[x - 1]] < k[i]) {
            ord[x] = ord[x - 1];
            x--;
        }
        ord[x] = i;
    }
    tdm_mtp_seq **run = tdm_xmalloc((size_t)nseq * sizeof(*run));
    int *ones = tdm_xmalloc((size_t)nseq * sizeof(int));
    int32_t *ids = tdm_xmalloc((size_t)nseq * sizeof(int32_t));
    int32_t *rows = tdm_xmalloc((size_t)nseq * sizeof(int32_t));
    int32_t *am = tdm_xmalloc((size_t)nseq * (size_t)kmax * sizeof(int32_t));
    size_t *out0 = tdm_xmalloc((size_t)nseq * sizeof(size_t)); /* each one's first logits row */
    int *na = tdm_xmalloc((size_t)kmax * sizeof(int));         /* sequences drafting at step j */
    int *saved = tdm_xmalloc(2 * (size_t)nseq * sizeof(int));
    tdm_sample_row *srows = sampled ? tdm_xcalloc((size_t)nseq, sizeof(*srows)) : NULL;
    float *hrow = sampled && !device ? tdm_xmalloc(vd * sizeof(float)) : NULL;
    int *horder = sampled && !device ? tdm_xmalloc(vd * sizeof(int)) : NULL;
    for (int i = 0, o = 0; i < nseq; o += k[i], i++) {
        ones[i] = 1;
        rows[i] = i;
        out0[i] = (size_t)o;
    }
    for (int j = 0; j < kmax; j++) {
        na[j] = 0;
        while (na[j] < nseq && k[ord[na[j]]] > j)
            na[j]++;
    }

    /* Step 0: the carried drafts run, one row each; then every sequence's
     * last y, gathered into y[0], gives its first draft. */
    int nr = 0;
    for (int x = 0; x < nseq; x++) {
        tdm_mtp_seq *q = seqs[ord[x]];
        if (q->carry < 0)
            continue;
        be->copy(bx, h->hid + (size_t)nr * H, q->last, H * sizeof(float));
        ids[nr] = q->carry;
        run[nr++] = q;
    }
    if (nr > 0)
        mtp_rows(run, ones, nr, h->hid, ids, NULL, NULL, nr);
    for (int x = 0; x < nr; x++)
        run[x]->drafted++;
    for (int x = 0; x < nseq; x++)
        be->copy(bx, h->y[0] + (size_t)x * H, seqs[ord[x]]->last, H * sizeof(float));
    for (int x = 0; x < nseq; x++)
        run[x] = seqs[ord[x]];

    /* Steps 1 .. kmax-1 read the previous step's y rows and drafts and
     * write their own y rows into the other buffer: only ops, so on the
     * device the chain is one graph (after the step-0 head below). */
    const bool graph = device && h->graphs && be->graph_begin && kmax > 1;
    uint64_t key = tdm_key_mix(0x13198a2e03707344ull, (uint64_t)(uintptr_t)h);
    key = tdm_key_mix(key, (uint64_t)(uintptr_t)m->ws.block);
    key = tdm_key_mix(key, (uint64_t)m->ws.rows);
    key = tdm_key_mix(key, (uint64_t)(uintptr_t)h->y[0]);
    key = tdm_key_mix(key, (uint64_t)(uintptr_t)h->dids);
    key = tdm_key_mix(key, ((uint64_t)nseq << 2) | ((uint64_t)sampled << 1) | (forced != NULL));
    if (sampled)
        key = tdm_key_mix(key, (uint64_t)(uintptr_t)h->dprobs);
    for (int x = 0; x < nseq; x++)
        key = tdm_key_mix(key, (uint64_t)k[ord[x]]);
    for (int x = 0; x < nseq; x++) {
        saved[2 * x] = run[x]->n_past;
        saved[2 * x + 1] = run[x]->drafted;
    }
    for (int pass = 0;; pass++) {
        for (int j = 0; j < kmax; j++) {
            float *y = h->y[j % 2];
            if (j == 1 && graph && pass == 0)
                be->graph_begin(bx, key);
            if (j > 0) {
                const int32_t *dev = device && !forced ? h->dids + (size_t)(j - 1) * nseq : NULL;
                for (int x = 0; x < na[j]; x++)
                    ids[x] = forced ? forced[ord[x]][j - 1] : dev ? 0 : drafts[ord[x]][j - 1];
                mtp_rows(run, ones, na[j], h->y[(j + 1) % 2], ids, dev, y, na[j]);
                for (int x = 0; x < na[j]; x++)
                    run[x]->drafted++;
            }
            /* The drafting sequences' y through the LM head (or its draft
             * vocabulary's rows). */
            be->matmul(bx, m->ws.logits, y, head, na[j], (int)H, (int)Vd, 0); /* [na, Vd] */
            if (device && sampled) {
                /* greedy rows (zeroed settings) take the argmax there too */
                for (int x = 0; x < na[j]; x++) {
                    const tdm_draft_sampling *ds = sampling[ord[x]];
                    srows[x] =
                        ds ? (tdm_sample_row){ds->temperature, ds->top_p, ds->top_k, 0, ds->u[j]}
                           : (tdm_sample_row){0};
                }
                be->sample_to(bx, h->dids + (size_t)j * nseq, h->dprobs + (size_t)j * nseq * Vd,
                              m->ws.logits, rows, na[j], (int)Vd, h->dv.n ? h->dv.map : NULL,
                              srows);
                continue;
            }
            if (device) {
                be->argmax_to(bx, h->dids + (size_t)j * nseq, m->ws.logits, rows, na[j], (int)Vd,
                              h->dv.n ? h->dv.map : NULL);
                continue;
            }
            be->argmax(bx, am, m->ws.logits, na[j], (int)Vd);
            for (int x = 0; x < na[j]; x++) {
                const int i = ord[x];
                const tdm_draft_sampling *ds = sampled ? sampling[i] : NULL;
                drafts[i][j] = forced    ? forced[i][j]
                               : ds      ? mtp_draw_host(h, ds, j, x, Vd, hrow, horder)
                               : h->dv.n ? h->dv.ids[am[x]]
                                         : am[x];
                if (logits) /* the row's first Vd values; spread out below */
                    be->download(bx, logits + (out0[i] + (size_t)j) * V,
                                 m->ws.logits + (size_t)x * Vd, Vd * sizeof(float));
            }
        }
        if (!graph || pass > 0 || be->graph_end(bx) == 0)
            break;
        /* The replay did not match its graph and nothing of steps 1.. ran:
         * again, eagerly (step 0's work is queued already; it runs again,
         * to the same bits). */
        for (int x = 0; x < nseq; x++) {
            run[x]->n_past = saved[2 * x];
            run[x]->drafted = saved[2 * x + 1];
        }
    }
    /* Each sequence's last y, from the buffer of its last step. */
    for (int x = 0; x < nseq; x++)
        if (k[ord[x]] > 1)
            be->copy(bx, run[x]->last, h->y[(k[ord[x]] - 1) % 2] + (size_t)x * H,
                     H * sizeof(float));
    if (device)
        be->download(bx, am, h->dids, (size_t)kmax * (size_t)nseq * sizeof(int32_t));
    for (int x = 0; device && sampled && x < nseq; x++) {
        const tdm_draft_sampling *ds = sampling[ord[x]];
        for (int j = 0; ds && j < k[ord[x]]; j++)
            be->download(bx, ds->probs + (size_t)j * Vd,
                         h->dprobs + ((size_t)j * (size_t)nseq + (size_t)x) * Vd,
                         Vd * sizeof(float));
    }
    be->sync(bx);
    for (int x = 0; device && x < nseq; x++)
        for (int j = 0; j < k[ord[x]]; j++)
            drafts[ord[x]][j] = forced ? forced[ord[x]][j] : am[(size_t)j * nseq + (size_t)x];
    if (logits && h->dv.n)
        for (size_t r = 0; r < (size_t)out0[nseq - 1] + (size_t)k[nseq - 1]; r++)
            tdm_draft_vocab_spread(&h->dv, logits + r * V, (int)V);
    for (int i = 0; i < nseq; i++)
        seqs[i]->carry = drafts[i][k[i] - 1];
    free(ord);
    free(run);
    free(ones);
    free(ids);
    free(rows);
    free(am);
    free(out0);
    free(na);
    free(saved);
    free(srows);
    free(hrow);
    free(horder);
    return TDM_OK;
}

tdm_status tdm_mtp_draft_n(tdm_mtp_seq *const *seqs, int nseq, const int *k,
                           const int32_t *const *forced, int32_t *const *drafts, float *logits,
                           tdm_error *err)
{
    return mtp_draft(seqs, nseq, k, forced, NULL, drafts, logits, err);
}

tdm_status tdm_mtp_draft_sampled(tdm_mtp_seq *const *seqs, int nseq, const int *k,
                                 const tdm_draft_sampling *const *sampling, int32_t *const *drafts,
                                 tdm_error *err)
{
    return mtp_draft(seqs, nseq, k, NULL, sampling, drafts, NULL, err);
}

tdm_status tdm_mtp_draft(tdm_mtp_seq *s, int k, int32_t *drafts, float *logits, tdm_error *err)
{
    return tdm_mtp_draft_n(&s, 1, &k, NULL, &drafts, logits, err);
}

tdm_status tdm_mtp_rollback(tdm_mtp_seq *s, int position, tdm_error *err)
{
    if (position < 0 || position > s->n_past)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "MTP rollback to position %d: the cache holds 0..%d", position,
                             s->n_past);
    if (position == s->n_past)
        return TDM_OK;
    const int primed = s->n_past - s->drafted;
    s->drafted = position > primed ? position - primed : 0;
    s->n_past = position; /* entries past it are overwritten by later rows */
    s->has_last = 0;
    s->carry = -1;
    return TDM_OK;
}
