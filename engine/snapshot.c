/*
 * snapshot.c - see snapshot.h: layouts, export and import of a sequence's
 * committed state, checksums and the assembler of received chunks.
 */
#include "snapshot.h"

#include "alloc.h"
#include "engine_internal.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- layouts ------------------------------------------------------------ */

void tdm_snap_layout_free(tdm_snap_layout *l)
{
    free(l->tokens);
    free(l->tensors);
    memset(l, 0, sizeof(*l));
}

static void add_tensor(tdm_snap_layout *l, const char *prefix, const char *kind, int layer,
                       int ndim, uint64_t d0, uint64_t d1, uint64_t d2)
{
    tdm_snap_tensor *t = &l->tensors[l->n_tensors++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%slayers.%d.%s", prefix, layer, kind);
    t->layer = (uint32_t)layer;
    t->dtype = TANDEM__V1__SNAPSHOT_DTYPE__SNAPSHOT_DTYPE_F32;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->nbytes = d0 * d1 * d2 * sizeof(float);
    t->offset = l->total_bytes;
    l->total_bytes += t->nbytes;
}

/* Appends one state's tensors (a sequence's, or a prefix block's with
 * kv_rows = block) to out, whose tensors has room. */
static void add_state(tdm_snap_layout *out, const tdm_model_config *c, const char *prefix,
                      uint64_t kv_rows)
{
    const uint64_t conv_dim = 2 * (uint64_t)c->lin_k_heads * (uint64_t)c->lin_k_dim +
                              (uint64_t)c->lin_v_heads * (uint64_t)c->lin_v_dim;
    for (int L = 0; L < c->num_layers; L++) {
        if (c->layer_types[L] == TDM_LAYER_LINEAR_ATTENTION) {
            add_tensor(out, prefix, "conv", L, 2, (uint64_t)(c->conv_kernel - 1), conv_dim, 1);
            add_tensor(out, prefix, "recurrent", L, 3, (uint64_t)c->lin_v_heads,
                       (uint64_t)c->lin_k_dim, (uint64_t)c->lin_v_dim);
        } else {
            add_tensor(out, prefix, "key", L, 3, kv_rows, (uint64_t)c->num_kv_heads,
                       (uint64_t)c->head_dim);
            add_tensor(out, prefix, "value", L, 3, kv_rows, (uint64_t)c->num_kv_heads,
                       (uint64_t)c->head_dim);
        }
    }
}

void tdm_snap_layout_expected(const tdm_model_config *c, const char *fingerprint,
                              uint32_t committed, tdm_snap_layout *out)
{
    memset(out, 0, sizeof(*out));
    out->version = TDM_SNAPSHOT_LAYOUT_VERSION;
    snprintf(out->fingerprint, sizeof(out->fingerprint), "%s", fingerprint ? fingerprint : "");
    out->committed = committed;
    out->tensors = tdm_xcalloc((size_t)c->num_layers * 2 + 1, sizeof(tdm_snap_tensor));
    add_state(out, c, "", committed);
}

void tdm_snap_layout_expected_prefix(const tdm_model_config *c, const char *fingerprint,
                                     uint32_t committed, uint32_t block, tdm_snap_layout *out)
{
    TDM_ASSERT(block > 0 && committed % block == 0);
    memset(out, 0, sizeof(*out));
    out->version = TDM_SNAPSHOT_LAYOUT_VERSION;
    snprintf(out->fingerprint, sizeof(out->fingerprint), "%s", fingerprint ? fingerprint : "");
    out->committed = committed;
    out->prefix_block = block;
    const uint32_t nblocks = committed / block;
    out->tensors = tdm_xcalloc((size_t)c->num_layers * 2 * nblocks + 1, sizeof(tdm_snap_tensor));
    for (uint32_t i = 0; i < nblocks; i++) {
        char prefix[24];
        snprintf(prefix, sizeof(prefix), "blocks.%u.", i);
        add_state(out, c, prefix, block);
    }
}

static void shape_str(const tdm_snap_tensor *t, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

tdm_status tdm_snap_layout_check(const tdm_snap_layout *l, const tdm_model_config *cfg,
                                 const char *fingerprint, uint32_t max_committed, tdm_error *err)
{
    if (l->version != TDM_SNAPSHOT_LAYOUT_VERSION)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "layout.layout_version: the snapshot has version %u, this replica "
                             "reads version %u",
                             l->version, TDM_SNAPSHOT_LAYOUT_VERSION);
    if (strcmp(l->fingerprint, fingerprint) != 0)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "layout.model_fingerprint: the snapshot is of model %s, this replica "
                             "serves model %s",
                             l->fingerprint[0] ? l->fingerprint : "(none)", fingerprint);
    if (l->committed > max_committed)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.committed_position: %u positions, this replica holds at most "
                             "%u",
                             l->committed, max_committed);
    for (uint32_t i = 0; i < l->committed; i++)
        if (l->tokens[i] < 0 || l->tokens[i] >= cfg->vocab_size)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "layout.tokens[%u]: %d is outside the vocabulary (0..%d)", i,
                                 (int)l->tokens[i], cfg->vocab_size - 1);
    if (l->prefix_block && (l->committed == 0 || l->committed % l->prefix_block != 0))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.committed_position: %u positions is not a whole number of "
                             "prefix blocks of %u",
                             l->committed, l->prefix_block);
    tdm_snap_layout e;
    if (l->prefix_block)
        tdm_snap_layout_expected_prefix(cfg, fingerprint, l->committed, l->prefix_block, &e);
    else
        tdm_snap_layout_expected(cfg, fingerprint, l->committed, &e);
    tdm_status rc = TDM_OK;
    if (l->n_tensors != e.n_tensors) {
        rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                           "layout.tensors: the snapshot has %zu tensors, this model has %zu",
                           l->n_tensors, e.n_tensors);
        goto out;
    }
    for (size_t i = 0; i < e.n_tensors && rc == TDM_OK; i++) {
        const tdm_snap_tensor *g = &l->tensors[i], *x = &e.tensors[i];
        char gs[96], xs[96];
        shape_str(g, gs, sizeof(gs));
        shape_str(x, xs, sizeof(xs));
        if (strcmp(g->name, x->name) != 0)
            rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                               "layout.tensors[%zu].name: the snapshot has %s, this model has %s",
                               i, g->name, x->name);
        else if (g->layer != x->layer)
            rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                               "layout.tensors[%zu].layer (%s): the snapshot has %u, this model "
                               "has %u",
                               i, x->name, g->layer, x->layer);
        else if (g->dtype != x->dtype)
            rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                               "layout.tensors[%zu].dtype (%s): the snapshot has %d, this model "
                               "has %d (F32)",
                               i, x->name, g->dtype, x->dtype);
        else if (strcmp(gs, xs) != 0)
            rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                               "layout.tensors[%zu].shape (%s): the snapshot has %s, this model "
                               "has %s",
                               i, x->name, gs, xs);
        else if (g->offset != x->offset)
            rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                               "layout.tensors[%zu].offset (%s): the snapshot has %" PRIu64
                               ", the tensors before it add up to %" PRIu64,
                               i, x->name, g->offset, x->offset);
        else if (g->nbytes != x->nbytes)
            rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                               "layout.tensors[%zu].nbytes (%s): the snapshot has %" PRIu64
                               ", its shape and dtype make %" PRIu64,
                               i, x->name, g->nbytes, x->nbytes);
    }
    if (rc == TDM_OK && l->total_bytes != e.total_bytes)
        rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                           "layout.total_bytes: the snapshot declares %" PRIu64
                           ", its tensors add up to %" PRIu64,
                           l->total_bytes, e.total_bytes);
out:
    tdm_snap_layout_free(&e);
    return rc;
}

/* ---- sequences ------------------------------------------------------------ */

/* See engine_internal.h. */
float *tdm_seq_state_buf(const tdm_seq *s, const tdm_snap_tensor *t)
{
    const char *kind = strrchr(t->name, '.') + 1;
    const int L = (int)t->layer;
    if (strcmp(kind, "conv") == 0)
        return s->conv[L];
    if (strcmp(kind, "recurrent") == 0)
        return s->rec[L];
    if (strcmp(kind, "key") == 0)
        return s->k[L];
    return s->v[L];
}

tdm_status tdm_seq_snapshot(const tdm_seq *s, const char *fingerprint, const int32_t *tokens,
                            int n_tokens, tdm_snap_layout *layout, uint8_t **payload,
                            tdm_error *err)
{
    tdm_status rc = tdm_seq_snapshot_take(s, fingerprint, tokens, n_tokens, layout, payload, err);
    if (rc == TDM_OK)
        tdm_snap_seal(layout, *payload);
    return rc;
}

void tdm_snap_seal(tdm_snap_layout *layout, const uint8_t *payload)
{
    tdm_sha256(payload, (size_t)layout->total_bytes, layout->sha256);
}

tdm_status tdm_seq_snapshot_take(const tdm_seq *s, const char *fingerprint, const int32_t *tokens,
                                 int n_tokens, tdm_snap_layout *layout, uint8_t **payload,
                                 tdm_error *err)
{
    memset(layout, 0, sizeof(*layout));
    *payload = NULL;
    if (!s->ranks && s->m->comm)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "a snapshot is of a whole model or a group of ranks, not of one rank");
    const int pending = s->ranks ? s->ranks[0]->pending : s->pending;
    if (pending)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "a snapshot is taken at the committed position: the sequence has "
                             "an uncommitted verify of %d rows",
                             pending);
    const int n = tdm_seq_length(s);
    if (n_tokens != n)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "a snapshot needs the %d committed tokens of the sequence, got %d", n,
                             n_tokens);
    /* The whole model's layout, however the model is split (group.c). */
    tdm_snap_layout l;
    tdm_snap_layout_expected(&s->m->full, fingerprint, (uint32_t)n, &l);
    uint8_t *p = malloc(l.total_bytes ? l.total_bytes : 1);
    if (!p) {
        uint64_t total = l.total_bytes;
        tdm_snap_layout_free(&l);
        return tdm_error_oom(err, (size_t)total, "a snapshot of %d positions", n);
    }
    l.tokens = tdm_xmalloc(((size_t)n + 1) * sizeof(int32_t));
    if (n > 0)
        memcpy(l.tokens, tokens, (size_t)n * sizeof(int32_t));
    if (s->ranks) {
        tdm_status rc = tdm_group_seq_export(s, &l, p, err);
        if (rc != TDM_OK) {
            free(p);
            tdm_snap_layout_free(&l);
            return rc;
        }
        *layout = l;
        *payload = p;
        return TDM_OK;
    }
    tdm_backend *be = s->m->be;
    for (size_t i = 0; i < l.n_tensors; i++)
        be->download(be->ctx, p + l.tensors[i].offset, tdm_seq_state_buf(s, &l.tensors[i]),
                     (size_t)l.tensors[i].nbytes);
    be->sync(be->ctx);
    *layout = l;
    *payload = p;
    return TDM_OK;
}

tdm_status tdm_seq_from_snapshot(tdm_model *m, const tdm_seq_params *p, const char *fingerprint,
                                 const tdm_snap_layout *l, const uint8_t *payload, tdm_seq **out,
                                 tdm_error *err)
{
    *out = NULL;
    if (!m->group && m->comm)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "a snapshot goes into a whole model or a group of ranks, not into "
                             "one rank");
    if (l->prefix_block)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "layout.prefix_block: %u; a prefix's cached blocks go into a prefix "
                             "cache, not a sequence",
                             l->prefix_block);
    tdm_status rc = tdm_snap_layout_check(l, &m->full, fingerprint,
                                          (uint32_t)m->cfg.max_position_embeddings, err);
    if (rc != TDM_OK)
        return rc;
    uint8_t digest[32];
    if (!l->verified)
        tdm_sha256(payload, (size_t)l->total_bytes, digest);
    if (!l->verified && memcmp(digest, l->sha256, sizeof(digest)) != 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.sha256: the payload's SHA-256 differs from the one declared");
    tdm_seq *s;
    if ((rc = tdm_seq_create(m, p, &s, err)) != TDM_OK)
        return rc;
    if (m->group) {
        if ((rc = tdm_group_seq_import(s, l, payload, err)) != TDM_OK) {
            tdm_seq_destroy(s);
            return rc;
        }
        *out = s;
        return TDM_OK;
    }
    /* A forward of the committed length sizes the KV caches (kv_ensure)
     * without running: grow them the way the first forward would. */
    if ((rc = tdm_seq_reserve_kv(s, (int)l->committed, err)) != TDM_OK) {
        tdm_seq_destroy(s);
        return rc;
    }
    for (size_t i = 0; i < l->n_tensors; i++)
        m->be->upload(m->be->ctx, tdm_seq_state_buf(s, &l->tensors[i]),
                      payload + l->tensors[i].offset, (size_t)l->tensors[i].nbytes);
    m->be->sync(m->be->ctx);
    s->n_past = (int)l->committed;
    *out = s;
    return TDM_OK;
}

/* ---- checksums -------------------------------------------------------------- */

static uint32_t crc_table[8][256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1; /* Castagnoli, reflected */
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* The table-driven CRC: eight bytes a step (slicing-by-8), then the tail a
 * byte at a time. crc is already inverted. */
static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
              crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
/* SSE4.2's crc32 instruction computes this very polynomial, about five times
 * faster than the tables (a snapshot of a 4B-shaped sequence is 100+ MB). */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--)
        crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}
#endif

uint32_t tdm_crc32c(uint32_t crc, const void *data, size_t n)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        return ~crc_hw(~crc, data, n);
#endif
    return ~crc_sw(~crc, data, n);
}

void tdm_sha256(const void *data, size_t n, uint8_t out[32])
{
    unsigned int len = 32;
    TDM_ASSERT(EVP_Digest(data, n, out, &len, EVP_sha256(), NULL) == 1 && len == 32);
}

/* ---- wire ------------------------------------------------------------------ */

void tdm_snap_layout_to_proto(const tdm_snap_layout *l, Tandem__V1__SnapshotLayout *out,
                              Tandem__V1__SnapshotTensor *tensors,
                              Tandem__V1__SnapshotTensor **ptrs, uint64_t (*shapes)[3])
{
    tandem__v1__snapshot_layout__init(out);
    out->layout_version = l->version;
    out->model_fingerprint = (char *)l->fingerprint;
    out->committed_position = l->committed;
    out->n_tokens = l->committed;
    out->tokens = (uint32_t *)l->tokens; /* ids are non-negative: same bits */
    out->n_tensors = l->n_tensors;
    out->tensors = ptrs;
    out->total_bytes = l->total_bytes;
    out->prefix_block = l->prefix_block;
    out->sha256.data = (uint8_t *)l->sha256;
    out->sha256.len = sizeof(l->sha256);
    for (size_t i = 0; i < l->n_tensors; i++) {
        const tdm_snap_tensor *t = &l->tensors[i];
        Tandem__V1__SnapshotTensor *o = &tensors[i];
        tandem__v1__snapshot_tensor__init(o);
        o->name = (char *)t->name;
        o->layer = t->layer;
        o->dtype = (Tandem__V1__SnapshotDtype)t->dtype;
        memcpy(shapes[i], t->shape, sizeof(shapes[i]));
        o->n_shape = (size_t)t->ndim;
        o->shape = shapes[i];
        o->offset = t->offset;
        o->nbytes = t->nbytes;
        ptrs[i] = o;
    }
}

tdm_status tdm_snap_layout_from_proto(const Tandem__V1__SnapshotLayout *in, size_t max_tokens,
                                      size_t max_tensors, tdm_snap_layout *out, tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    if (strlen(in->model_fingerprint) >= sizeof(out->fingerprint))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.model_fingerprint: %zu bytes, at most %zu",
                             strlen(in->model_fingerprint), sizeof(out->fingerprint) - 1);
    if (in->n_tokens != in->committed_position)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.tokens: %zu tokens for committed_position %u", in->n_tokens,
                             in->committed_position);
    if (in->n_tokens > max_tokens)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.committed_position: %u positions, this replica holds at most "
                             "%zu",
                             in->committed_position, max_tokens);
    if (in->n_tensors > max_tensors)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.tensors: %zu tensors, this model has at most %zu",
                             in->n_tensors, max_tensors);
    if (in->sha256.len != 32)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.sha256: %zu bytes, a SHA-256 has 32", in->sha256.len);
    for (size_t i = 0; i < in->n_tensors; i++) {
        const Tandem__V1__SnapshotTensor *t = in->tensors[i];
        if (strlen(t->name) >= sizeof(out->tensors[0].name))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "layout.tensors[%zu].name: %zu bytes, at most %zu", i,
                                 strlen(t->name), sizeof(out->tensors[0].name) - 1);
        if (t->n_shape > 3)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "layout.tensors[%zu].shape (%s): %zu dimensions, at most 3", i,
                                 t->name, t->n_shape);
    }
    for (size_t i = 0; i < in->n_tokens; i++)
        if (in->tokens[i] > INT32_MAX)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "layout.tokens[%zu]: %u is not a token id", i, in->tokens[i]);
    out->version = in->layout_version;
    out->prefix_block = in->prefix_block;
    snprintf(out->fingerprint, sizeof(out->fingerprint), "%s", in->model_fingerprint);
    out->committed = in->committed_position;
    out->tokens = tdm_xmalloc((in->n_tokens + 1) * sizeof(int32_t));
    for (size_t i = 0; i < in->n_tokens; i++)
        out->tokens[i] = (int32_t)in->tokens[i];
    out->tensors = tdm_xcalloc(in->n_tensors + 1, sizeof(tdm_snap_tensor));
    out->n_tensors = in->n_tensors;
    for (size_t i = 0; i < in->n_tensors; i++) {
        const Tandem__V1__SnapshotTensor *t = in->tensors[i];
        tdm_snap_tensor *o = &out->tensors[i];
        snprintf(o->name, sizeof(o->name), "%s", t->name);
        o->layer = t->layer;
        o->dtype = (int)t->dtype;
        o->ndim = (int)t->n_shape;
        for (size_t d = 0; d < t->n_shape; d++)
            o->shape[d] = t->shape[d];
        o->offset = t->offset;
        o->nbytes = t->nbytes;
    }
    out->total_bytes = in->total_bytes;
    memcpy(out->sha256, in->sha256.data, 32);
    return TDM_OK;
}

uint32_t tdm_snap_chunk_count(uint64_t total, uint32_t chunk_bytes)
{
    return 1 + (uint32_t)((total + chunk_bytes - 1) / chunk_bytes);
}

/* ---- the assembler ----------------------------------------------------------- */

struct tdm_snap_asm {
    const tdm_model_config *cfg;
    char fingerprint[80];
    uint32_t max_committed;
    uint32_t prefix_block; /* the kind of layout expected: 0 a sequence's, else a prefix's */
    char id[128];
    uint32_t next;    /* index expected next */
    bool have_layout; /* chunk 0 came */
    bool last;        /* the last chunk came */
    bool failed;      /* a chunk was refused: everything after is too */
    tdm_snap_layout layout;
    uint8_t *payload; /* [layout.total_bytes] */
    uint64_t got;     /* bytes received, all in order */
};

tdm_snap_asm *tdm_snap_asm_create(const tdm_model_config *cfg, const char *fingerprint,
                                  uint32_t max_committed)
{
    tdm_snap_asm *a = tdm_xcalloc(1, sizeof(*a));
    a->cfg = cfg;
    snprintf(a->fingerprint, sizeof(a->fingerprint), "%s", fingerprint);
    a->max_committed = max_committed;
    return a;
}

tdm_snap_asm *tdm_snap_asm_create_prefix(const tdm_model_config *cfg, const char *fingerprint,
                                         uint32_t max_committed, uint32_t block)
{
    TDM_ASSERT(block > 0);
    tdm_snap_asm *a = tdm_snap_asm_create(cfg, fingerprint, max_committed);
    a->prefix_block = block;
    return a;
}

void tdm_snap_asm_destroy(tdm_snap_asm *a)
{
    if (!a)
        return;
    tdm_snap_layout_free(&a->layout);
    free(a->payload);
    free(a);
}

const char *tdm_snap_asm_id(const tdm_snap_asm *a)
{
    return a->id;
}

static tdm_status asm_take(tdm_snap_asm *a, const Tandem__V1__SnapshotChunk *c, tdm_error *err)
{
    if (a->last)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "chunk %u: the chunk marked last was chunk %u; no chunk may follow",
                             c->index, a->next - 1);
    if (c->index != a->next)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "chunk.index: expected chunk %u, got %u (%s)", a->next, c->index,
                             c->index < a->next ? "repeated" : "out of order or missing");
    const char *id = c->snapshot_id ? c->snapshot_id : "";
    if (c->index == 0) {
        if (!c->layout)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk 0: the layout is missing (chunk 0 carries it)");
        if (strlen(id) >= sizeof(a->id))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk 0: snapshot_id has %zu bytes, at most %zu", strlen(id),
                                 sizeof(a->id) - 1);
        if (c->data.len != 0 || c->offset != 0)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk 0: offset %" PRIu64 " and %zu data bytes; chunk 0 carries "
                                 "only the layout (offset 0, no data)",
                                 c->offset, c->data.len);
        if (c->layout->prefix_block != a->prefix_block)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "layout.prefix_block: the stream has %u, this replica expects %u "
                                 "(0: a sequence's state; else a prefix's blocks of that many "
                                 "tokens)",
                                 c->layout->prefix_block, a->prefix_block);
        const size_t max_tensors =
            (size_t)a->cfg->num_layers * 2 *
            (a->prefix_block ? (size_t)(a->max_committed / a->prefix_block) : 1);
        tdm_status rc =
            tdm_snap_layout_from_proto(c->layout, a->max_committed, max_tensors, &a->layout, err);
        if (rc == TDM_OK)
            rc = tdm_snap_layout_check(&a->layout, a->cfg, a->fingerprint, a->max_committed, err);
        if (rc != TDM_OK)
            return rc;
        /* Checked against the model: total_bytes is what its state takes. */
        a->payload = malloc(a->layout.total_bytes ? (size_t)a->layout.total_bytes : 1);
        if (!a->payload)
            return tdm_error_oom(err, (size_t)a->layout.total_bytes, "a snapshot's payload");
        snprintf(a->id, sizeof(a->id), "%s", id);
        a->have_layout = true;
    } else {
        if (c->layout)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk %u: carries a layout; only chunk 0 does", c->index);
        if (id[0] && strcmp(id, a->id) != 0)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk %u: snapshot_id %s, chunk 0 had %s", c->index, id,
                                 a->id[0] ? a->id : "(none)");
        if (c->data.len == 0) /* else a stream of empty chunks would never end */
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk %u: no data; every chunk after chunk 0 carries payload "
                                 "bytes",
                                 c->index);
        if (c->offset != a->got)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk %u: offset %" PRIu64
                                 ", the chunks before it carried %" PRIu64 " bytes",
                                 c->index, c->offset, a->got);
        if (c->data.len > a->layout.total_bytes - a->got)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk %u: %zu bytes at offset %" PRIu64
                                 " run past total_bytes %" PRIu64,
                                 c->index, c->data.len, c->offset, a->layout.total_bytes);
        const uint32_t crc = tdm_crc32c(0, c->data.data, c->data.len);
        if (crc != c->crc32c)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "chunk %u: crc32c 0x%08x declared, the data has 0x%08x", c->index,
                                 c->crc32c, crc);
        if (c->data.len > 0)
            memcpy(a->payload + a->got, c->data.data, c->data.len);
        a->got += c->data.len;
    }
    a->next++;
    a->last = c->last;
    return TDM_OK;
}

tdm_status tdm_snap_asm_add(tdm_snap_asm *a, const Tandem__V1__SnapshotChunk *c, tdm_error *err)
{
    if (a->failed)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "chunk %u: an earlier chunk was refused", c->index);
    tdm_status rc = asm_take(a, c, err);
    a->failed = rc != TDM_OK;
    return rc;
}

tdm_status tdm_snap_asm_finish(tdm_snap_asm *a, tdm_snap_layout *layout, uint8_t **payload,
                               tdm_error *err)
{
    memset(layout, 0, sizeof(*layout));
    *payload = NULL;
    if (a->failed)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "a chunk was refused");
    if (!a->have_layout)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "the stream ended before chunk 0 (the layout)");
    if (!a->last)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "the stream ended after chunk %u without a chunk marked last "
                             "(truncated: %" PRIu64 " of %" PRIu64 " bytes)",
                             a->next - 1, a->got, a->layout.total_bytes);
    if (a->got != a->layout.total_bytes)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.total_bytes: %" PRIu64
                             " declared, the chunks carried %" PRIu64,
                             a->layout.total_bytes, a->got);
    uint8_t digest[32];
    tdm_sha256(a->payload, (size_t)a->got, digest);
    if (memcmp(digest, a->layout.sha256, sizeof(digest)) != 0) {
        char want[17], got[17];
        for (int i = 0; i < 8; i++) {
            snprintf(want + 2 * i, 3, "%02x", a->layout.sha256[i]);
            snprintf(got + 2 * i, 3, "%02x", digest[i]);
        }
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.sha256: %s... declared, the payload has %s...", want, got);
    }
    a->layout.verified = true;
    *layout = a->layout;
    *payload = a->payload;
    memset(&a->layout, 0, sizeof(a->layout));
    a->payload = NULL;
    a->failed = true; /* handed over: nothing more to assemble */
    return TDM_OK;
}
