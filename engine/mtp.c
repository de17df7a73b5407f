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
 * bracket). Every op computes a row the same way whatever the rows of the
 * call (backend.h), so a prime in one call or in several gives the same
 * bits. Sizes come from capacity.c (tdm_capacity_mtp_seq_bytes).
 */
#include "mtp.h"
#include "alloc.h"
#include "capacity.h"
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MTP_KV_INITIAL_CAP 64

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
    int rows;                /* rows hid and hn hold */
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
 * hidden-state buffers. */
static tdm_status rows_ensure(tdm_mtp *h, int rows, tdm_error *err)
{
    tdm_status rc = tdm_model_reserve_workspace(h->m, rows, err);
    if (rc != TDM_OK || rows <= h->rows)
        return rc;
    tdm_backend *be = h->m->be;
    const size_t nb = (size_t)rows * (size_t)h->m->cfg.hidden_size * sizeof(float);
    float *hid = be->alloc(be->ctx, nb), *hn = be->alloc(be->ctx, nb);
    if (!hid || !hn) {
        be->free(be->ctx, hid);
        be->free(be->ctx, hn);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "backend out of memory for MTP calls of %d rows", rows);
    }
    be->free(be->ctx, h->hid);
    be->free(be->ctx, h->hn);
    h->hid = hid;
    h->hn = hn;
    h->rows = rows;
    return TDM_OK;
}

/* R rows at positions n_past .. n_past+R-1: hid backend [R, H] the hidden
 * states, ids host [R] the tokens. Leaves y = norm(x) in ws.xn [R, H], and
 * the last row's y in s->last; advances n_past. The caller has made room
 * (rows_ensure, kv_ensure). */
static void mtp_rows(tdm_mtp_seq *s, const float *hid, const int32_t *ids, int R)
{
    tdm_mtp *h = s->h;
    tdm_model *m = h->m;
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    const int H = m->cfg.hidden_size;
    const float eps = (float)m->cfg.rms_norm_eps;
    tdm_workspace *w = &m->ws;
    int32_t *pos = tdm_xmalloc((size_t)R * sizeof(int32_t));
    for (int i = 0; i < R; i++)
        pos[i] = s->n_past + i;

    be->embed(bx, w->xn, m->embed, ids, R, H);              /* [R, H] */
    be->rmsnorm(bx, w->xn, w->xn, h->norm_e, R, H, eps, 1); /* e */
    be->rmsnorm(bx, h->hn, hid, h->norm_h, R, H, eps, 1);   /* g */
    be->matmul(bx, w->x, w->xn, h->fc_e, R, H, H, 0);       /* x = e·fc_eᵀ */
    be->matmul(bx, w->x, h->hn, h->fc_h, R, H, H, 1);       /* x += g·fc_hᵀ */
    tdm_attn_seg as = {.row0 = 0, .nrows = R, .n_past = s->n_past};
    tdm_fwd_attention(m, &h->layer, R, pos, &as, &s->k, &s->v, 1); /* x += attention */
    tdm_fwd_mlp(m, &h->layer, R);                                  /* x += MLP */
    be->rmsnorm(bx, w->xn, w->x, h->norm, R, H, eps, 1);           /* y */
    be->copy(bx, s->last, w->xn + (size_t)(R - 1) * (size_t)H, (size_t)H * sizeof(float));
    s->n_past += R;
    s->has_last = 1;
    free(pos);
}

tdm_status tdm_mtp_prime(tdm_mtp_seq *s, const float *hidden, const int32_t *next, int n,
                         float *logits, tdm_error *err)
{
    tdm_mtp *h = s->h;
    tdm_model *m = h->m;
    tdm_backend *be = m->be;
    if (n < 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "an MTP prime needs rows (got %d)", n);
    if (s->drafted)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "the MTP cache ends in %d draft rows: roll back to position %d "
                             "before priming",
                             s->drafted, s->n_past - s->drafted);
    tdm_status rc = tdm_model_check_tokens(m, next, n, err);
    if (rc != TDM_OK)
        return rc;
    const int chunk = n < TDM_PREFILL_ROWS ? n : TDM_PREFILL_ROWS;
    if ((rc = rows_ensure(h, chunk, err)) || (rc = kv_ensure(s, s->n_past + n, err)))
        return rc;
    const size_t H = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    for (int at = 0; at < n; at += chunk) {
        const int R = n - at < chunk ? n - at : chunk;
        be->upload(be->ctx, h->hid, hidden + (size_t)at * H, (size_t)R * H * sizeof(float));
        mtp_rows(s, h->hid, next + at, R);
        if (logits) {
            be->matmul(be->ctx, m->ws.logits, m->ws.xn, m->lm_head, R, (int)H, (int)V, 0);
            be->download(be->ctx, logits + (size_t)at * V, m->ws.logits,
                         (size_t)R * V * sizeof(float));
        }
    }
    be->sync(be->ctx);
    s->carry = -1;
    return TDM_OK;
}

tdm_status tdm_mtp_draft(tdm_mtp_seq *s, int k, int32_t *drafts, float *logits, tdm_error *err)
{
    tdm_mtp *h = s->h;
    tdm_model *m = h->m;
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    if (k < 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "a draft of %d tokens", k);
    if (!s->has_last)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "nothing to draft from: prime the MTP sequence first (it is at "
                             "position %d)",
                             s->n_past);
    const int rows = k - 1 + (s->carry >= 0);
    tdm_status rc;
    if ((rc = rows_ensure(h, 1, err)) || (rc = kv_ensure(s, s->n_past + rows, err)))
        return rc;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    for (int j = 0; j < k; j++) {
        const float *y = s->last;
        if (j > 0 || s->carry >= 0) {
            const int32_t t = j > 0 ? drafts[j - 1] : s->carry;
            mtp_rows(s, s->last, &t, 1); /* reads last, then writes it */
            s->drafted++;
            y = m->ws.xn;
        }
        be->matmul(bx, m->ws.logits, y, m->lm_head, 1, H, V, 0); /* [1, vocab] */
        be->argmax(bx, &drafts[j], m->ws.logits, 1, V);
        if (logits)
            be->download(bx, logits + (size_t)j * (size_t)V, m->ws.logits,
                         (size_t)V * sizeof(float));
    }
    be->sync(bx);
    s->carry = drafts[k - 1];
    return TDM_OK;
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
