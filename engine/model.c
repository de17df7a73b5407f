/*
 * model.c - loading a Qwen3.5 checkpoint: every tensor the config implies is
 * looked up (prefix model.language_model. or model.), checked for shape and
 * dtype, and placed on the backend. Matrices stay in their storage dtype when
 * the backend's matmul takes it (bf16, f32) and are mapped without a copy on
 * the CPU; fp16 matrices and all vectors become f32.
 */
#include "engine_internal.h"
#include "alloc.h"
#include "capacity.h"
#include "pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const prefixes[] = {"model.language_model.", "model."};

static void track(void ***arr, size_t *n, size_t *cap, void *p)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        *arr = tdm_xrealloc(*arr, nc * sizeof(void *));
        *cap = nc;
    }
    (*arr)[(*n)++] = p;
}

void tdm_weight_store_free(tdm_backend *be, tdm_weight_store *s)
{
    for (size_t i = 0; i < s->nowned; i++)
        be->free(be->ctx, s->owned[i]);
    free(s->owned);
    for (size_t i = 0; i < s->nhost; i++)
        free(s->host[i]);
    free(s->host);
    memset(s, 0, sizeof(*s));
}

static float bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static float half_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void to_f32(float *dst, const tdm_st_tensor *t)
{
    const unsigned char *p = t->data;
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == TDM_ST_DTYPE_F32) {
            memcpy(&dst[i], p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            if (t->dtype == TDM_ST_DTYPE_BF16) {
                uint32_t u = (uint32_t)h << 16;
                memcpy(&dst[i], &u, 4);
            } else {
                dst[i] = half_to_f32(h);
            }
        }
    }
}

/* Finds `name` under the known prefixes (or as is, for lm_head) and checks
 * its shape and dtype. */
static tdm_status find(tdm_model *m, const char *dir, const char *name, int with_prefix, int ndim,
                       const int64_t *shape, const tdm_st_tensor **out, tdm_error *err)
{
    const tdm_st_tensor *t = NULL;
    char full[512];
    if (with_prefix) {
        for (size_t i = 0; i < TDM_ARRAY_LEN(prefixes) && !t; i++) {
            snprintf(full, sizeof(full), "%s%s", prefixes[i], name);
            t = tdm_st_find(m->st, full);
        }
    } else {
        snprintf(full, sizeof(full), "%s", name);
        t = tdm_st_find(m->st, full);
    }
    if (!t) {
        if (with_prefix)
            return tdm_error_set(err, TDM_ERR_NOT_FOUND,
                                 "%s: missing tensor '%s' (looked for model.language_model.%s and "
                                 "model.%s)",
                                 dir, name, name, name);
        return tdm_error_set(err, TDM_ERR_NOT_FOUND, "%s: missing tensor '%s'", dir, name);
    }
    const char *file = tdm_st_file_path(m->st, t->file_index);
    if (t->dtype != TDM_ST_DTYPE_F32 && t->dtype != TDM_ST_DTYPE_BF16 &&
        t->dtype != TDM_ST_DTYPE_F16)
        return tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                             "%s: tensor '%s' has dtype %s; supported are F32, BF16 and F16", file,
                             t->name, tdm_st_dtype_name(t->dtype));
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[128], want[128];
        tdm_st_tensor w;
        memset(&w, 0, sizeof(w));
        w.ndim = ndim;
        for (int i = 0; i < ndim; i++)
            w.shape[i] = shape[i];
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: tensor '%s' has shape %s, but config.json implies %s", file,
                             t->name, tdm_st_shape_str(t, got, sizeof(got)),
                             tdm_st_shape_str(&w, want, sizeof(want)));
    }
    *out = t;
    return TDM_OK;
}

static tdm_status load_matrix(tdm_model *m, const char *dir, const char *name, int with_prefix,
                              int64_t rows, int64_t cols, tdm_weight *w, tdm_error *err)
{
    const tdm_st_tensor *t = NULL;
    int64_t shape[2] = {rows, cols};
    tdm_status rc = find(m, dir, name, with_prefix, 2, shape, &t, err);
    if (rc != TDM_OK)
        return rc;
    tdm_weight_store *ws = m->into;
    ws->weight_bytes += t->nbytes;
    if (!m->be) /* tdm_model_check: found, with the right shape and dtype */
        return TDM_OK;
    const void *host = t->data;
    tdm_dtype dt = t->dtype == TDM_ST_DTYPE_BF16 ? TDM_DTYPE_BF16 : TDM_DTYPE_F32;
    size_t esize = dt == TDM_DTYPE_BF16 ? 2 : 4;
    /* fp16, or data misaligned for its element type: convert to an f32 copy. */
    if (t->dtype == TDM_ST_DTYPE_F16 || ((uintptr_t)t->data % esize) != 0) {
        float *conv = malloc((size_t)t->numel * sizeof(float));
        if (!conv)
            return tdm_error_oom(err, (size_t)t->numel * sizeof(float), "an f32 copy of %s",
                                 t->name);
        track(&ws->host, &ws->nhost, &ws->caphost, conv);
        to_f32(conv, t);
        host = conv;
        dt = TDM_DTYPE_F32;
        esize = 4;
    }
    int owned = 0;
    const void *dev = m->be->weight_map(m->be->ctx, host, (size_t)t->numel * esize, &owned);
    if (!dev)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "backend out of memory for %s",
                             t->name);
    if (owned)
        track(&ws->owned, &ws->nowned, &ws->capowned, (void *)dev);
    w->data = dev;
    w->dtype = dt;
    return TDM_OK;
}

/* A span of rows (engine/shard.h: a rank's slice), for the loaders below. */
typedef struct span {
    int64_t start, n;
} span;

/* The rows sp[0..ns) (width values each) of a vector tensor of `shape` on a
 * tensor-parallel rank, as f32 in backend memory; the whole vector on a
 * whole model (m->comm NULL) or where sp is NULL. */
static tdm_status load_vector_rows(tdm_model *m, const char *name, int with_prefix, int ndim,
                                   const int64_t *shape, int64_t width, const span *sp, int ns,
                                   const float **out, tdm_error *err)
{
    if (!m->comm)
        sp = NULL;
    const tdm_st_tensor *t = NULL;
    tdm_status rc = find(m, m->dir, name, with_prefix, ndim, shape, &t, err);
    if (rc != TDM_OK)
        return rc;
    int64_t n = sp ? 0 : t->numel;
    for (int i = 0; sp && i < ns; i++)
        n += sp[i].n * width;
    m->into->weight_bytes += (size_t)n * (t->dtype == TDM_ST_DTYPE_F32 ? 4 : 2);
    if (!m->be) /* tdm_model_check */
        return TDM_OK;
    float *vals = tdm_xmalloc((size_t)t->numel * sizeof(float)); /* a norm's or gate's vector */
    to_f32(vals, t);
    if (sp) { /* the slice, in place at the front */
        for (int i = 0, k = 0; i < ns; k += (int)(sp[i].n * width), i++)
            memmove(vals + k, vals + sp[i].start * width,
                    (size_t)(sp[i].n * width) * sizeof(float));
    }
    float *dev = m->be->alloc(m->be->ctx, (size_t)n * sizeof(float));
    if (!dev) {
        free(vals);
        return tdm_error_oom(err, (size_t)n * sizeof(float), "%s on the %s backend", t->name,
                             m->be->name);
    }
    track(&m->into->owned, &m->into->nowned, &m->into->capowned, dev);
    m->be->upload(m->be->ctx, dev, vals, (size_t)n * sizeof(float));
    free(vals);
    *out = dev;
    return TDM_OK;
}

static tdm_status load_vector(tdm_model *m, const char *name, int with_prefix, int ndim,
                              const int64_t *shape, const float **out, tdm_error *err)
{
    return load_vector_rows(m, name, with_prefix, ndim, shape, 0, NULL, 0, out, err);
}

tdm_status tdm_model_load_vector(tdm_model *m, const char *name, int64_t n, const float **out,
                                 tdm_error *err)
{
    const int64_t shape[1] = {n};
    return load_vector(m, name, 0, 1, shape, out, err);
}

/* n consecutive values of tensor t from src into dst: bf16 and f32 as they
 * are, f16 as f32 (the dtypes load_matrix places). */
static void copy_span(unsigned char *dst, const tdm_st_tensor *t, const unsigned char *src,
                      int64_t n)
{
    if (t->dtype == TDM_ST_DTYPE_F16) {
        tdm_st_tensor part = *t; /* the span, through to_f32 */
        part.data = src;
        part.numel = n;
        to_f32((float *)(void *)dst, &part);
    } else {
        memcpy(dst, src, (size_t)n * (t->dtype == TDM_ST_DTYPE_F32 ? 4 : 2));
    }
}

/* A host block (malloc'ed, [rows, cols] of dt) made a backend weight; the
 * block is freed or kept as the weight's alias, whatever happens. */
static tdm_status place_block(tdm_model *m, const tdm_st_tensor *t, unsigned char *block, size_t nb,
                              tdm_dtype dt, tdm_weight *w, tdm_error *err)
{
    int owned = 0;
    const void *dev = m->be->weight_map(m->be->ctx, block, nb, &owned);
    if (!dev) {
        free(block);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "backend out of memory for %s",
                             t->name);
    }
    if (owned) { /* the backend holds its own copy */
        track(&m->into->owned, &m->into->nowned, &m->into->capowned, (void *)dev);
        free(block);
    } else { /* the backend's weight aliases the block */
        track(&m->into->host, &m->into->nhost, &m->into->caphost, block);
    }
    w->data = dev;
    w->dtype = dt;
    return TDM_OK;
}

/* Rows ids[0..n) (NULL: 0..n-1) and columns col0 .. col0+ncols-1 of the
 * [rows, cols] matrix `name`, as their own [n, ncols] matrix: a copy in the
 * storage dtype (bf16) or f32, as load_matrix places them. */
static tdm_status load_gathered(tdm_model *m, const char *name, int with_prefix, int64_t rows,
                                int64_t cols, const int32_t *ids, int64_t n, int64_t col0,
                                int64_t ncols, tdm_weight *w, tdm_error *err)
{
    TDM_ASSERT(n > 0 && col0 >= 0 && ncols > 0 && col0 + ncols <= cols);
    const tdm_st_tensor *t = NULL;
    const int64_t shape[2] = {rows, cols};
    tdm_status rc = find(m, m->dir, name, with_prefix, 2, shape, &t, err);
    if (rc != TDM_OK)
        return rc;
    for (int64_t i = 0; ids && i < n; i++)
        if (ids[i] < 0 || ids[i] >= rows)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "row %d of %s: the tensor has rows 0..%lld", (int)ids[i], t->name,
                                 (long long)(rows - 1));
    const size_t src_es = t->dtype == TDM_ST_DTYPE_F32 ? 4 : 2;
    m->into->weight_bytes += (size_t)n * (size_t)ncols * src_es;
    if (!m->be)
        return TDM_OK;
    const tdm_dtype dt = t->dtype == TDM_ST_DTYPE_BF16 ? TDM_DTYPE_BF16 : TDM_DTYPE_F32;
    const size_t es = dt == TDM_DTYPE_BF16 ? 2 : 4;
    const size_t nb = (size_t)n * (size_t)ncols * es;
    unsigned char *block = malloc(nb);
    if (!block)
        return tdm_error_oom(err, nb, "%lld rows, columns %lld..%lld of %s", (long long)n,
                             (long long)col0, (long long)(col0 + ncols - 1), t->name);
    const unsigned char *src = t->data;
    for (int64_t i = 0; i < n; i++) {
        const size_t r = ids ? (size_t)ids[i] : (size_t)i;
        copy_span(block + (size_t)i * (size_t)ncols * es, t,
                  src + (r * (size_t)cols + (size_t)col0) * src_es, ncols);
    }
    return place_block(m, t, block, nb, dt, w, err);
}

tdm_status tdm_model_load_matrix_cols(tdm_model *m, const char *name, int64_t rows, int64_t cols,
                                      int64_t col0, int64_t ncols, tdm_weight *w, tdm_error *err)
{
    return load_gathered(m, name, 0, rows, cols, NULL, rows, col0, ncols, w, err);
}

tdm_status tdm_model_load_matrix_rows(tdm_model *m, const char *name, int with_prefix, int64_t rows,
                                      int64_t cols, const int32_t *ids, int n, tdm_weight *w,
                                      tdm_error *err)
{
    return load_gathered(m, name, with_prefix, rows, cols, ids, n, 0, cols, w, err);
}

/* The rows sp[0..ns) of the [rows, cols] matrix `name`, in that order: on a
 * tensor-parallel rank its slice (a copy); on a whole model (m->comm NULL)
 * the whole matrix, as load_matrix places it. */
static tdm_status load_rows(tdm_model *m, const char *name, int with_prefix, int64_t rows,
                            int64_t cols, const span *sp, int ns, tdm_weight *w, tdm_error *err)
{
    if (!m->comm)
        return load_matrix(m, m->dir, name, with_prefix, rows, cols, w, err);
    int64_t n = 0;
    for (int i = 0; i < ns; i++)
        n += sp[i].n;
    int32_t *ids = tdm_xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0, k = 0; i < ns; i++)
        for (int64_t j = 0; j < sp[i].n; j++)
            ids[k++] = (int32_t)(sp[i].start + j);
    tdm_status rc = load_gathered(m, name, with_prefix, rows, cols, ids, n, 0, cols, w, err);
    free(ids);
    return rc;
}

/* Columns col0 .. col0+ncols-1 of the [rows, cols] matrix `name` on a
 * tensor-parallel rank; the whole matrix on a whole model. */
static tdm_status load_cols(tdm_model *m, const char *name, int with_prefix, int64_t rows,
                            int64_t cols, int64_t col0, int64_t ncols, tdm_weight *w,
                            tdm_error *err)
{
    if (!m->comm)
        return load_matrix(m, m->dir, name, with_prefix, rows, cols, w, err);
    return load_gathered(m, name, with_prefix, rows, cols, NULL, rows, col0, ncols, w, err);
}

tdm_status tdm_model_load_layer(tdm_model *m, const char *pre, int with_prefix, tdm_layer_kind kind,
                                tdm_layer_weights *w, tdm_error *err)
{
    /* Shapes are the checkpoint's (m->full); a tensor-parallel rank takes
     * its slices of them (shard.h), a whole model all of each. */
    const tdm_model_config *c = &m->full, *lc = &m->cfg;
    const tdm_shard *sh = &m->shard;
    const int64_t H = c->hidden_size, I = c->intermediate_size, Il = lc->intermediate_size;
    char n[256];
    tdm_status rc;
    int64_t vh[1] = {H};
    const int P = with_prefix;
    w->kind = kind;
    const span mlp[1] = {{sh->mlp0, Il}};
#define NAME(suffix) (snprintf(n, sizeof(n), "%s%s", pre, suffix), n)
    if ((rc = load_vector(m, NAME("input_layernorm.weight"), P, 1, vh, &w->input_norm, err)) ||
        (rc = load_vector(m, NAME("post_attention_layernorm.weight"), P, 1, vh, &w->post_norm,
                          err)) ||
        (rc = load_rows(m, NAME("mlp.gate_proj.weight"), P, I, H, mlp, 1, &w->gate, err)) ||
        (rc = load_rows(m, NAME("mlp.up_proj.weight"), P, I, H, mlp, 1, &w->up, err)) ||
        (rc = load_cols(m, NAME("mlp.down_proj.weight"), P, H, I, sh->mlp0, Il, &w->down, err)))
        return rc;
    if (w->kind == TDM_LAYER_LINEAR_ATTENTION) {
        const int64_t Hk = c->lin_k_heads, Hv = c->lin_v_heads, Dk = c->lin_k_dim,
                      Dv = c->lin_v_dim, VD = Hv * Dv;
        const int64_t Hkl = lc->lin_k_heads, Hvl = lc->lin_v_heads;
        const int64_t C = tdm_capacity_conv_dim(c), K = c->conv_kernel;
        int64_t s_hv[1] = {Hv}, s_dv[1] = {c->lin_v_dim}, s_conv[3] = {C, 1, K};
        /* the conv's channels and in_proj_qkv's rows: q, k (key heads), v */
        const span qkv[3] = {{sh->k_head0 * Dk, Hkl * Dk},
                             {Hk * Dk + sh->k_head0 * Dk, Hkl * Dk},
                             {2 * Hk * Dk + sh->v_head0 * Dv, Hvl * Dv}};
        const span vrows[1] = {{sh->v_head0 * Dv, Hvl * Dv}}, heads[1] = {{sh->v_head0, Hvl}};
        if ((rc = load_rows(m, NAME("linear_attn.in_proj_qkv.weight"), P, C, H, qkv, 3, &w->in_qkv,
                            err)) ||
            (rc = load_rows(m, NAME("linear_attn.in_proj_z.weight"), P, VD, H, vrows, 1, &w->in_z,
                            err)) ||
            (rc = load_rows(m, NAME("linear_attn.in_proj_b.weight"), P, Hv, H, heads, 1, &w->in_b,
                            err)) ||
            (rc = load_rows(m, NAME("linear_attn.in_proj_a.weight"), P, Hv, H, heads, 1, &w->in_a,
                            err)) ||
            (rc = load_cols(m, NAME("linear_attn.out_proj.weight"), P, H, VD, sh->v_head0 * Dv,
                            Hvl * Dv, &w->out_proj, err)) ||
            (rc = load_vector_rows(m, NAME("linear_attn.conv1d.weight"), P, 3, s_conv, K, qkv, 3,
                                   &w->conv_w, err)) ||
            (rc = load_vector_rows(m, NAME("linear_attn.A_log"), P, 1, s_hv, 1, heads, 1, &w->A_log,
                                   err)) ||
            (rc = load_vector_rows(m, NAME("linear_attn.dt_bias"), P, 1, s_hv, 1, heads, 1,
                                   &w->dt_bias, err)) ||
            (rc = load_vector(m, NAME("linear_attn.norm.weight"), P, 1, s_dv, &w->gnorm, err)))
            return rc;
    } else {
        const int64_t D = c->head_dim, QD = (int64_t)c->num_heads * D,
                      KD = (int64_t)c->num_kv_heads * D;
        int64_t s_d[1] = {D};
        /* q_proj: per head D query rows then D gate rows */
        const span q[1] = {{sh->q_head0 * 2 * D, (int64_t)lc->num_heads * 2 * D}};
        const span kv[1] = {{sh->kv_head0 * D, (int64_t)lc->num_kv_heads * D}};
        if ((rc = load_rows(m, NAME("self_attn.q_proj.weight"), P, 2 * QD, H, q, 1, &w->q_proj,
                            err)) ||
            (rc =
                 load_rows(m, NAME("self_attn.k_proj.weight"), P, KD, H, kv, 1, &w->k_proj, err)) ||
            (rc =
                 load_rows(m, NAME("self_attn.v_proj.weight"), P, KD, H, kv, 1, &w->v_proj, err)) ||
            (rc = load_cols(m, NAME("self_attn.o_proj.weight"), P, H, QD, sh->q_head0 * D,
                            (int64_t)lc->num_heads * D, &w->o_proj, err)) ||
            (rc = load_vector(m, NAME("self_attn.q_norm.weight"), P, 1, s_d, &w->q_norm, err)) ||
            (rc = load_vector(m, NAME("self_attn.k_norm.weight"), P, 1, s_d, &w->k_norm, err)))
            return rc;
    }
#undef NAME
    return TDM_OK;
}

/* The walk of tdm_model_load; with be NULL it only finds and checks every
 * tensor (tdm_model_check). layers 0: the embedding, final norm and LM head
 * only (tdm_model_load_head). */
static tdm_status model_walk(const char *dir, tdm_backend *be, int layers, tdm_comm *comm,
                             tdm_model **out, tdm_error *err)
{
    *out = NULL;
    tdm_model *m = tdm_xcalloc(1, sizeof(*m));
    m->be = be;
    m->graphs = 1;
    m->into = &m->store;
    m->dir = tdm_xstrdup(dir);
    tdm_status rc = tdm_model_config_load(dir, &m->full, err);
    if (rc == TDM_OK)
        rc = tdm_shard_config(&m->full, comm ? comm->rank : 0, comm ? comm->size : 1, &m->cfg,
                              &m->shard, err);
    if (rc == TDM_OK)
        rc = tdm_st_open(dir, &m->st, err);
    if (rc != TDM_OK) {
        tdm_model_destroy(m);
        return rc;
    }
    m->comm = comm;
    const tdm_model_config *c = &m->cfg;
    m->conv_dim = (int)tdm_capacity_conv_dim(c);
    m->layers = tdm_xcalloc((size_t)c->num_layers, sizeof(tdm_layer_weights));
    m->inv_freq = tdm_xmalloc((size_t)(c->rot_dim / 2) * sizeof(float));
    /* As transformers computes it in fp32: 1 / theta^(2i / rot_dim). */
    for (int i = 0; i < c->rot_dim / 2; i++) {
        float e = (float)(2 * i) / (float)c->rot_dim;
        m->inv_freq[i] = 1.0f / powf((float)c->rope_theta, e);
    }
    int64_t hv[1] = {c->hidden_size};
    const span vocab[1] = {{m->shard.vocab0, m->shard.vocab_n}};
    rc = load_rows(m, "embed_tokens.weight", 1, c->vocab_size, c->hidden_size, vocab, 1, &m->embed,
                   err);
    /* Decoding reads one embedding row, so an untied table is not streamed. */
    size_t embed_bytes = m->store.weight_bytes;
    if (rc == TDM_OK)
        rc = load_vector(m, "norm.weight", 1, 1, hv, &m->final_norm, err);
    if (rc == TDM_OK) {
        if (c->tie_word_embeddings)
            m->lm_head = m->embed;
        else
            rc = load_rows(m, "lm_head.weight", 0, c->vocab_size, c->hidden_size, vocab, 1,
                           &m->lm_head, err);
    }
    for (int L = 0; rc == TDM_OK && layers && L < c->num_layers; L++) {
        char pre[64];
        snprintf(pre, sizeof(pre), "layers.%d.", L);
        rc = tdm_model_load_layer(m, pre, 1, c->layer_types[L], &m->layers[L], err);
    }
    if (rc == TDM_OK && !c->tie_word_embeddings)
        m->store.weight_bytes -= embed_bytes;
    if (rc != TDM_OK) {
        tdm_model_destroy(m);
        return rc;
    }
    *out = m;
    return TDM_OK;
}

tdm_status tdm_model_load(const char *dir, tdm_backend *be, tdm_model **out, tdm_error *err)
{
    TDM_ASSERT(be);
    return model_walk(dir, be, 1, NULL, out, err);
}

tdm_status tdm_model_load_rank(const char *dir, tdm_backend *be, tdm_comm *comm, tdm_model **out,
                               tdm_error *err)
{
    TDM_ASSERT(be && comm);
    return model_walk(dir, be, 1, comm, out, err);
}

tdm_status tdm_model_load_head(const char *dir, tdm_backend *be, tdm_model **out, tdm_error *err)
{
    return model_walk(dir, be, 0, NULL, out, err);
}

tdm_status tdm_model_check(const char *dir, size_t *weight_bytes, tdm_error *err)
{
    tdm_model *m = NULL;
    tdm_status rc = model_walk(dir, NULL, 1, NULL, &m, err);
    if (rc == TDM_OK && weight_bytes)
        *weight_bytes = m->store.weight_bytes;
    tdm_model_destroy(m);
    return rc;
}

void tdm_model_destroy(tdm_model *m)
{
    if (!m)
        return;
    if (m->group) { /* the ranks' models, on their threads */
        tdm_group_destroy(m->group);
        free(m->dir);
        free(m);
        return;
    }
    tdm_draft_vocab_free(m->be, &m->dv);
    tdm_weight_store_free(m->be, &m->store);
    if (m->ws.block)
        m->be->free(m->be->ctx, m->ws.block);
    if (m->draft_ids)
        m->be->free(m->be->ctx, m->draft_ids);
    if (m->draft_probs)
        m->be->free(m->be->ctx, m->draft_probs);
    if (m->step_probs)
        m->be->free(m->be->ctx, m->step_probs);
    if (m->step_probs_ids)
        m->be->free(m->be->ctx, m->step_probs_ids);
    if (m->step_probs_pick)
        m->be->free(m->be->ctx, m->step_probs_pick);
    free(m->kept_rows);
    free(m->layers);
    free(m->dir);
    free(m->inv_freq);
    tdm_st_close(m->st);
    free(m);
}

/* ---- FP8 weights (tdm_model_set_weights_fp8) ------------------------------ */

/* Forgets backend memory p of m->into's store: freed, with the host block
 * it aliases; nothing where the store does not hold it (a mapped
 * checkpoint). */
static void store_release(tdm_model *m, const void *p)
{
    tdm_weight_store *s = m->into;
    for (size_t i = 0; i < s->nowned; i++)
        if (s->owned[i] == p) {
            m->be->free(m->be->ctx, s->owned[i]);
            s->owned[i] = s->owned[--s->nowned];
            return;
        }
    for (size_t i = 0; i < s->nhost; i++)
        if (s->host[i] == p) {
            free(s->host[i]);
            s->host[i] = s->host[--s->nhost];
            return;
        }
}

/* A matrix's rounding over the host's cores: pass 0 finds each chunk's
 * largest magnitude, pass 1 writes the codes. */
#define FP8_CHUNK ((size_t)1 << 20)
typedef struct fp8_job {
    const void *src;
    tdm_dtype dt;
    size_t n;
    int pass, e;
    float *amax; /* [chunks] */
    uint8_t *codes;
} fp8_job;

static void fp8_task(void *arg, int chunk)
{
    fp8_job *j = arg;
    const size_t i0 = (size_t)chunk * FP8_CHUNK, i1 = i0 + FP8_CHUNK < j->n ? i0 + FP8_CHUNK : j->n;
    const uint16_t *hb = j->src;
    const float *hf = j->src;
#define FP8_AT(i) (j->dt == TDM_DTYPE_BF16 ? bf16_to_f32(hb[i]) : hf[i])
    if (j->pass == 0) {
        float amax = 0.0f;
        for (size_t i = i0; i < i1; i++) {
            const float a = fabsf(FP8_AT(i));
            amax = a > amax || a != a ? a : amax;
        }
        j->amax[chunk] = amax;
    } else {
        for (size_t i = i0; i < i1; i++)
            j->codes[i] = tdm_fp8_encode(FP8_AT(i), j->e);
    }
#undef FP8_AT
}

/* n values of w (dtype bf16 or f32) brought to the host: malloc'd, NULL
 * where the host has no room. */
static void *fp8_download(tdm_model *m, const tdm_weight *w, size_t n)
{
    void *h = malloc(n * tdm_dtype_size(w->dtype));
    if (h) {
        m->be->download(m->be->ctx, h, w->data, n * tdm_dtype_size(w->dtype));
        m->be->sync(m->be->ctx);
    }
    return h;
}

/* The largest magnitude of n values at src (NaN where one is). */
static float fp8_amax(tdm_pool *pool, const void *src, tdm_dtype dt, size_t n)
{
    const int nch = (int)((n + FP8_CHUNK - 1) / FP8_CHUNK);
    float *amaxs = tdm_xmalloc((size_t)nch * sizeof(float));
    fp8_job job = {src, dt, n, 0, 0, amaxs, NULL};
    tdm_pool_run(pool, fp8_task, &job, nch);
    float amax = 0.0f;
    for (int i = 0; i < nch; i++)
        amax = amaxs[i] > amax || amaxs[i] != amaxs[i] ? amaxs[i] : amax;
    free(amaxs);
    return amax;
}

/* The scale mat's values are rounded under (tdm_fp8_mat); *covered false
 * where none covers them, or their matrix's. src: mat's values on the host. */
static tdm_status fp8_scale(tdm_model *m, tdm_pool *pool, const tdm_fp8_mat *mat, const void *src,
                            size_t n, int *e, bool *covered, tdm_error *err)
{
    const tdm_weight *of = mat->scale_of;
    *covered = false;
    if (of && of->dtype == TDM_DTYPE_FP8) {
        *e = of->scale_exp;
        *covered = true;
        return TDM_OK;
    }
    float amax;
    if (of) {
        if (of->dtype != TDM_DTYPE_BF16 && of->dtype != TDM_DTYPE_F32)
            return TDM_OK;
        const size_t no = (size_t)mat->scale_rows * (size_t)mat->cols;
        void *h = fp8_download(m, of, no);
        if (!h)
            return tdm_error_oom(err, no * tdm_dtype_size(of->dtype), "a matrix's FP8 scale");
        amax = fp8_amax(pool, h, of->dtype, no);
        free(h);
    } else {
        amax = fp8_amax(pool, src, mat->w->dtype, n);
    }
    *covered = tdm_fp8_scale_exp(amax, e) == 0;
    return TDM_OK;
}

/* mat's matrix, of m->into's store, replaced by its FP8 codes
 * (tdm_model_set_weights_fp8), rounded on pool's threads; m's embedding
 * follows where it is that matrix (a tied LM head). *done false where it
 * stays as it is (cols not a multiple of 64, no scale covering its range,
 * already FP8, f16). */
static tdm_status fp8_round(tdm_model *m, tdm_pool *pool, const tdm_fp8_mat *mat, bool *done,
                            tdm_error *err)
{
    *done = false;
    tdm_weight *w = mat->w;
    if (!w->data || mat->cols % 64 || (w->dtype != TDM_DTYPE_BF16 && w->dtype != TDM_DTYPE_F32))
        return TDM_OK;
    tdm_backend *be = m->be;
    const size_t n = (size_t)mat->rows * (size_t)mat->cols, es = tdm_dtype_size(w->dtype);
    void *src = fp8_download(m, w, n);
    uint8_t *codes = malloc(n);
    if (!src || !codes) {
        free(src);
        free(codes);
        return tdm_error_oom(err, n * (es + 1), "a matrix's FP8 rounding");
    }
    int e = 0;
    bool covered = false;
    tdm_status rc = fp8_scale(m, pool, mat, src, n, &e, &covered, err);
    if (rc != TDM_OK || !covered) {
        free(src);
        free(codes);
        return rc;
    }
    const int nch = (int)((n + FP8_CHUNK - 1) / FP8_CHUNK);
    fp8_job job = {src, w->dtype, n, 1, e, NULL, codes};
    tdm_pool_run(pool, fp8_task, &job, nch);
    free(src);
    int owned = 0;
    const void *dev = be->weight_map(be->ctx, codes, n, &owned);
    if (!dev) {
        free(codes);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "backend out of memory for a matrix's FP8 codes (%zu bytes)", n);
    }
    tdm_weight_store *st = m->into;
    if (owned) {
        track(&st->owned, &st->nowned, &st->capowned, (void *)dev);
        free(codes);
    } else {
        track(&st->host, &st->nhost, &st->caphost, codes);
    }
    const void *old = w->data;
    store_release(m, old);
    st->weight_bytes = st->weight_bytes - n * es + n;
    *w = (tdm_weight){dev, TDM_DTYPE_FP8, e};
    if (m->embed.data == old)
        m->embed = *w;
    *done = true;
    return TDM_OK;
}

tdm_status tdm_model_round_fp8(tdm_model *m, const tdm_fp8_mat *mats, int n, int *nc, int *nk,
                               tdm_error *err)
{
    tdm_pool *pool = tdm_pool_create((int)sysconf(_SC_NPROCESSORS_ONLN), false);
    if (!pool)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "cannot start threads to round matrices to FP8");
    tdm_status rc = TDM_OK;
    for (int i = 0; i < n && rc == TDM_OK; i++) {
        bool done = false;
        rc = fp8_round(m, pool, &mats[i], &done, err);
        if (done)
            (*nc)++;
        else
            (*nk)++;
    }
    tdm_pool_destroy(pool);
    return rc;
}

int tdm_layer_fp8_mats(const tdm_model_config *c, tdm_layer_weights *lw, tdm_fp8_mat *out)
{
    const int64_t H = c->hidden_size, I = c->intermediate_size;
    const int64_t VD = (int64_t)c->lin_v_heads * c->lin_v_dim;
    const int64_t QD = (int64_t)c->num_heads * c->head_dim;
    const int64_t KD = (int64_t)c->num_kv_heads * c->head_dim;
    int n = 0;
    if (lw->kind == TDM_LAYER_LINEAR_ATTENTION) {
        out[n++] = (tdm_fp8_mat){.w = &lw->in_qkv, .rows = tdm_capacity_conv_dim(c), .cols = H};
        out[n++] = (tdm_fp8_mat){.w = &lw->in_z, .rows = VD, .cols = H};
        out[n++] = (tdm_fp8_mat){.w = &lw->in_b, .rows = c->lin_v_heads, .cols = H};
        out[n++] = (tdm_fp8_mat){.w = &lw->in_a, .rows = c->lin_v_heads, .cols = H};
        out[n++] = (tdm_fp8_mat){.w = &lw->out_proj, .rows = H, .cols = VD};
    } else {
        out[n++] = (tdm_fp8_mat){.w = &lw->q_proj, .rows = 2 * QD, .cols = H};
        out[n++] = (tdm_fp8_mat){.w = &lw->k_proj, .rows = KD, .cols = H};
        out[n++] = (tdm_fp8_mat){.w = &lw->v_proj, .rows = KD, .cols = H};
        out[n++] = (tdm_fp8_mat){.w = &lw->o_proj, .rows = H, .cols = QD};
    }
    out[n++] = (tdm_fp8_mat){.w = &lw->gate, .rows = I, .cols = H};
    out[n++] = (tdm_fp8_mat){.w = &lw->up, .rows = I, .cols = H};
    out[n++] = (tdm_fp8_mat){.w = &lw->down, .rows = H, .cols = I};
    return n;
}

tdm_status tdm_model_set_weights_fp8(tdm_model *m, int *converted, int *kept, tdm_error *err)
{
    if (m->group || m->comm)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "FP8 weights on a tensor-parallel model");
    if (m->fp8)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "the weights are FP8 already");
    const tdm_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    const size_t head_es = tdm_dtype_size(m->lm_head.dtype);
    /* every layer's projections, the LM head (tied: the embedding's table,
     * which then reads the rounded values), and a draft vocabulary's rows:
     * the rounded head's */
    tdm_fp8_mat *mats =
        tdm_xmalloc(((size_t)c->num_layers * TDM_LAYER_FP8_MATS + 2) * sizeof(tdm_fp8_mat));
    int nm = 0;
    for (int l = 0; l < c->num_layers; l++)
        nm += tdm_layer_fp8_mats(c, &m->layers[l], mats + nm);
    mats[nm++] = (tdm_fp8_mat){&m->lm_head, V, H, NULL, 0};
    if (m->dv.n)
        mats[nm++] = (tdm_fp8_mat){&m->dv.head, m->dv.n, H, &m->lm_head, V};
    int nc = 0, nk = 0;
    tdm_status rc = tdm_model_round_fp8(m, mats, nm, &nc, &nk, err);
    free(mats);
    if (rc != TDM_OK)
        return rc;
    /* With a draft vocabulary a step streams its rows, not the head's. */
    if (m->dv.n && m->lm_head.dtype == TDM_DTYPE_FP8)
        m->into->weight_bytes += (size_t)V * (size_t)H * (head_es - 1);
    m->fp8 = 1;
    if (converted)
        *converted = nc;
    if (kept)
        *kept = nk;
    return TDM_OK;
}

tdm_status tdm_model_set_draft_vocab(tdm_model *m, const int32_t *ids, int n, tdm_error *err)
{
    if (m->group || m->comm)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "a draft vocabulary on a tensor-parallel model: its LM head is "
                             "split over ranks");
    const size_t before = m->store.weight_bytes;
    tdm_status rc = tdm_draft_vocab_load(m, ids, n, &m->dv, err);
    if (rc != TDM_OK)
        return rc;
    /* A step streams the vocabulary's rows instead of the whole LM head
     * (the embedding, when tied, is then only indexed). */
    const size_t rows = m->store.weight_bytes - before;
    m->store.weight_bytes =
        before -
        (size_t)m->cfg.vocab_size * (size_t)m->cfg.hidden_size * tdm_dtype_size(m->lm_head.dtype) +
        rows;
    if (m->fp8) {
        const tdm_fp8_mat dvm = {&m->dv.head, n, m->cfg.hidden_size, &m->lm_head,
                                 m->cfg.vocab_size};
        int nc = 0, nk = 0;
        if ((rc = tdm_model_round_fp8(m, &dvm, 1, &nc, &nk, err)) != TDM_OK)
            return tdm_error_prefix(err, "draft vocabulary");
    }
    return TDM_OK;
}

int tdm_model_draft_vocab_size(const tdm_model *m)
{
    return m->dv.n ? m->dv.n : m->cfg.vocab_size;
}

int32_t tdm_model_draft_vocab_id(const tdm_model *m, int t)
{
    return m->dv.n ? m->dv.ids[t] : t;
}

const tdm_model_config *tdm_model_get_config(const tdm_model *m)
{
    return &m->cfg;
}

const tdm_model_config *tdm_model_checkpoint_config(const tdm_model *m)
{
    return &m->full;
}

tdm_backend *tdm_model_backend(const tdm_model *m)
{
    return m->be;
}

size_t tdm_model_weight_bytes(const tdm_model *m)
{
    return m->store.weight_bytes;
}

int tdm_model_graphs(const tdm_model *m)
{
    return m->graphs;
}

void tdm_model_set_graphs(tdm_model *m, int on)
{
    m->graphs = on != 0;
    if (m->group)
        tdm_group_set_graphs(m->group, on);
}

void *tdm_model_host_alloc(tdm_model *m, size_t nbytes)
{
    return m->be->host_alloc(m->be->ctx, nbytes);
}

void tdm_model_host_free(tdm_model *m, void *p)
{
    m->be->host_free(m->be->ctx, p);
}
