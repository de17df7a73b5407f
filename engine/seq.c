/*
 * seq.c - sequences and the forward pass.
 *
 * One forward call runs R rows that may come from several sequences (a
 * prefill chunk of one, a decode row of each, or verify blocks). Follow a
 * row top to bottom in fwd_run: embedding, then per layer a zero-centred
 * RMSNorm, the mixer (Gated DeltaNet or gated attention) added to the
 * residual, a zero-centred RMSNorm and the SwiGLU MLP added to the residual;
 * at the end the final norm and the LM head for the rows that want logits.
 *
 * Decode rows and verify blocks run the delta rule in its recurrent form
 * (exact math, one position after another), and every op computes a row the
 * same way whatever the batch or block it is in, so a verified position has
 * the same bits as the same position decoded alone: that is what makes the
 * commit strategies bit-identical to sequential decoding. A prompt chunk
 * lets the backend run its matmuls on faster paths equal to rounding
 * (backend.h: bulk): the CUDA backend takes them from 16 rows, the CPU
 * backend never. Its delta rule is the recurrent form too (a chunked form,
 * 64 positions a sequential step, was slower on the H100 at every length:
 * kernels/cuda/NOTES.md).
 */
#include "engine_internal.h"
#include "alloc.h"
#include "capacity.h"
#include "sampling.h"

#include <stdlib.h>
#include <string.h>

#define PREFILL_CHUNK TDM_PREFILL_ROWS
#define KV_INITIAL_CAP 64

/* ---- sizes ------------------------------------------------------------- */
/* Every size comes from capacity.c, so that its estimates are what is
 * allocated here. */

static size_t conv_floats(const tdm_model *m)
{
    tdm_state_floats f;
    tdm_capacity_state_floats(&m->cfg, TDM_STATE_NO_BUFFER, 0, &f);
    return f.conv;
}

static size_t rec_floats(const tdm_model *m)
{
    tdm_state_floats f;
    tdm_capacity_state_floats(&m->cfg, TDM_STATE_NO_BUFFER, 0, &f);
    return f.rec;
}

static size_t kv_width(const tdm_model *m)
{
    return tdm_capacity_kv_width(&m->cfg);
}

/* Floats of a layer's rec_x: states per position (extra_buffer), one
 * checkpoint (no_buffer) or a record of the positions' recurrence inputs
 * (replay). */
static size_t rec_x_floats(const tdm_seq *s)
{
    tdm_state_floats f;
    tdm_capacity_state_floats(&s->m->cfg, s->p.strategy, s->p.max_draft, &f);
    return f.rec_x;
}

/* Conv windows of a layer's conv_x: per position but under no_buffer. */
static size_t conv_x_floats(const tdm_seq *s)
{
    tdm_state_floats f;
    tdm_capacity_state_floats(&s->m->cfg, s->p.strategy, s->p.max_draft, &f);
    return f.conv_x;
}

/* ---- workspace ----------------------------------------------------------- */

static tdm_status ws_ensure(tdm_model *m, int rows, tdm_error *err)
{
    tdm_workspace *w = &m->ws;
    if (rows <= w->rows)
        return TDM_OK;
    if (rows < 2 * w->rows)
        rows = 2 * w->rows;
    size_t sizes[TDM_WORKSPACE_PIECES];
    const size_t total = tdm_capacity_workspace_bytes(&m->cfg, rows, sizes) / sizeof(float);
    float **dst[] = {&w->x, &w->xn, &w->qkv, &w->qkvc, &w->z,      &w->a,
                     &w->b, &w->o,  &w->o2,  &w->qg,   &w->q,      &w->gate,
                     &w->k, &w->v,  &w->h1,  &w->h2,   &w->logits, &w->gathered};
    _Static_assert(sizeof(dst) / sizeof(dst[0]) == TDM_WORKSPACE_PIECES,
                   "capacity.c sizes every workspace piece");
    void *block = m->be->alloc(m->be->ctx, total * sizeof(float));
    if (!block)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "backend out of memory for a workspace of %d rows", rows);
    if (w->block)
        m->be->free(m->be->ctx, w->block);
    w->block = block;
    w->rows = rows;
    float *p = block;
    for (size_t i = 0; i < TDM_ARRAY_LEN(sizes); i++) {
        *dst[i] = p;
        p += sizes[i];
    }
    return TDM_OK;
}

tdm_status tdm_model_reserve_workspace(tdm_model *m, int rows, tdm_error *err)
{
    if (m->group)
        return tdm_group_reserve_workspace(m->group, rows, err);
    return ws_ensure(m, rows, err);
}

tdm_status tdm_model_warm_prompt(tdm_model *m, tdm_state_strategy strategy, int tokens,
                                 tdm_error *err)
{
    if (tokens < 1)
        return TDM_OK;
    int32_t *ids = tdm_xcalloc((size_t)tokens, sizeof(int32_t));
    tdm_seq_params p = {.strategy = strategy};
    tdm_seq *s = NULL;
    tdm_status rc = tdm_seq_create(m, &p, &s, err);
    if (rc == TDM_OK)
        rc = tdm_seq_prefill(s, ids, tokens, NULL, err);
    tdm_seq_destroy(s);
    free(ids);
    return rc;
}

/* ---- KV capacity --------------------------------------------------------- */

static tdm_status kv_ensure(tdm_seq *s, int need, tdm_error *err)
{
    if (need <= s->kv_cap)
        return TDM_OK;
    tdm_model *m = s->m;
    int cap = s->kv_cap ? s->kv_cap : KV_INITIAL_CAP;
    while (cap < need)
        cap *= 2;
    /* A sequence created for max_positions holds them from the start; past
     * them (a caller's miscount) it grows only to what is needed. */
    if (s->p.max_positions > 0)
        cap = need;
    size_t row = kv_width(m) * sizeof(float);
    for (int L = 0; L < m->cfg.num_layers; L++) {
        if (!s->k[L])
            continue;
        float *nk = m->be->alloc(m->be->ctx, (size_t)cap * row);
        float *nv = m->be->alloc(m->be->ctx, (size_t)cap * row);
        if (!nk || !nv) {
            m->be->free(m->be->ctx, nk);
            m->be->free(m->be->ctx, nv);
            return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                                 "out of memory growing the KV cache to %d positions", cap);
        }
        m->be->copy(m->be->ctx, nk, s->k[L], (size_t)s->n_past * row);
        m->be->copy(m->be->ctx, nv, s->v[L], (size_t)s->n_past * row);
        m->be->free(m->be->ctx, s->k[L]);
        m->be->free(m->be->ctx, s->v[L]);
        s->k[L] = nk;
        s->v[L] = nv;
    }
    s->kv_cap = cap;
    return TDM_OK;
}

tdm_status tdm_seq_reserve_kv(tdm_seq *s, int n, tdm_error *err)
{
    if (s->ranks)
        return tdm_group_reserve_kv(s, n, err);
    return kv_ensure(s, n, err);
}

/* ---- the forward pass ------------------------------------------------------ */

/* One forward call's rows, as fwd_ops issues them. */
typedef struct fwd_step {
    tdm_seq *const *seqs;
    const int *counts; /* [nseq] rows of each sequence */
    int nseq, R;
    int prefill; /* a prompt chunk: the matmuls may take the backend's bulk paths */
    /* 0: no output; 1: final norm (ws.xn) and LM head (ws.logits); 2: the
     * final norm alone (hidden states wanted, no logits or argmax) */
    int logits;
    int *row0;          /* [nseq] first row of each sequence */
    int *extra;         /* [nseq] a verify's rows keep per-position conv windows and
                           recurrent states (1: extra_buffer) or recurrence inputs (2: replay) */
    int32_t *ids, *pos; /* [R] host */
    int32_t *ids_local; /* [R] host, tensor parallel: ids in the rank's vocabulary slice, or -1 */
    void **cdst;        /* [size * R] host, tensor parallel: gather_logits's copies */
    const void **csrc;
    size_t *cbytes;
    const int32_t *ids_dev; /* NULL, or the ids in backend memory (embed_dev; ids unused) */
    tdm_conv_seg *cs;       /* [nseq] host scratch */
    tdm_gdn_seg *gs;        /* [nseq] host scratch */
    tdm_attn_seg *as;       /* [nseq] host scratch */
    float **kc, **vc;       /* [nseq] host scratch: one layer's KV caches per sequence */
} fwd_step;

/* Host scratch of a step for up to nseq sequences and R rows; tp: the
 * ranks of a tensor-parallel model, 0 for a whole one. */
static void step_scratch(fwd_step *st, int nseq, int R, int tp)
{
    if (tp > 0) {
        st->ids_local = tdm_xmalloc((size_t)R * sizeof(int32_t));
        st->cdst = tdm_xmalloc((size_t)tp * (size_t)R * sizeof(void *));
        st->csrc = tdm_xmalloc((size_t)tp * (size_t)R * sizeof(void *));
        st->cbytes = tdm_xmalloc((size_t)tp * (size_t)R * sizeof(size_t));
    }
    st->row0 = tdm_xmalloc((size_t)nseq * sizeof(int));
    st->extra = tdm_xmalloc((size_t)nseq * sizeof(int));
    st->ids = tdm_xmalloc((size_t)R * sizeof(int32_t));
    st->pos = tdm_xmalloc((size_t)R * sizeof(int32_t));
    st->cs = tdm_xcalloc((size_t)nseq, sizeof(tdm_conv_seg));
    st->gs = tdm_xcalloc((size_t)nseq, sizeof(tdm_gdn_seg));
    st->as = tdm_xcalloc((size_t)nseq, sizeof(tdm_attn_seg));
    st->kc = tdm_xcalloc((size_t)nseq, sizeof(float *));
    st->vc = tdm_xcalloc((size_t)nseq, sizeof(float *));
}

static void step_scratch_free(fwd_step *st)
{
    free(st->ids_local);
    free(st->cdst);
    free((void *)st->csrc);
    free(st->cbytes);
    free(st->row0);
    free(st->extra);
    free(st->ids);
    free(st->pos);
    free(st->cs);
    free(st->gs);
    free(st->as);
    free(st->kc);
    free(st->vc);
}

/* The graph key of a step (backend.h: it must determine everything the ops
 * receive by value). The model fixes weights and sizes; the workspace block
 * and its row capacity fix every activation pointer; the rows per sequence,
 * the per-position-state kind of each and whether logits and a prompt's
 * faster matmuls (bulk) run fix the op sequence and every size. What changes
 * from step to step (token ids, positions, KV lengths, cache and state
 * pointers) reaches the ops through host arrays they stage, and stays out of
 * the key, so decode steps of one batch shape share one graph however long
 * the sequences are and whichever sequences fill the rows. */
static uint64_t fwd_key(const tdm_model *m, const fwd_step *st)
{
    uint64_t h = tdm_key_mix(0x243f6a8885a308d3ull, (uint64_t)(uintptr_t)m);
    h = tdm_key_mix(h, (uint64_t)(uintptr_t)m->ws.block);
    h = tdm_key_mix(h, (uint64_t)m->ws.rows);
    h = tdm_key_mix(h, (uint64_t)m->dv.n);
    h = tdm_key_mix(h, ((uint64_t)st->nseq << 3) | ((uint64_t)st->prefill << 2) |
                           (uint64_t)st->logits);
    for (int i = 0; i < st->nseq; i++)
        h = tdm_key_mix(h, ((uint64_t)st->counts[i] << 2) | (uint64_t)st->extra[i]);
    return h;
}

/* ys[i] = x · ws[i]ᵀ: projections that share their input, in one backend
 * call where the backend has one. */
static void project(tdm_backend *be, const float *x, int R, int in, int n, float *const *ys,
                    const tdm_weight *ws, const int *outs)
{
    if (be->matmul_n) {
        be->matmul_n(be->ctx, x, R, in, n, ys, ws, outs);
        return;
    }
    for (int i = 0; i < n; i++)
        be->matmul(be->ctx, ys[i], x, ws[i], R, in, outs[i], 0);
}

/* w->xn = rmsnorm(w->x) (weights norm, zero-centred), then the projections
 * that read it: ys[i] = xn · ws[i]ᵀ, or with up (n == 1) ys[0] =
 * silu(xn · ws[0]ᵀ) ⊙ (xn · upᵀ); in one backend call where the backend has
 * one. */
static void norm_project(tdm_model *m, const float *norm, int R, int n, float *const *ys,
                         const tdm_weight *ws, const tdm_weight *up, const int *outs)
{
    tdm_backend *be = m->be;
    tdm_workspace *w = &m->ws;
    const int H = m->cfg.hidden_size;
    const float eps = (float)m->cfg.rms_norm_eps;
    if (be->norm_matmul) {
        be->norm_matmul(be->ctx, w->xn, w->x, norm, eps, 1, R, H, n, ys, ws, up, outs);
        return;
    }
    be->rmsnorm(be->ctx, w->xn, w->x, norm, R, H, eps, 1);
    if (!up) {
        project(be, w->xn, R, H, n, ys, ws, outs);
    } else if (be->matmul_silu) {
        be->matmul_silu(be->ctx, ys[0], w->xn, ws[0], *up, R, H, outs[0]);
    } else {
        float *const yg[] = {ys[0], w->h2}; /* gate, up */
        const tdm_weight wg[] = {ws[0], *up};
        const int og[] = {outs[0], outs[0]};
        project(be, w->xn, R, H, 2, yg, wg, og);
        be->silu_mul(be->ctx, ys[0], ys[0], w->h2, (size_t)R * (size_t)outs[0]);
    }
}

/* Whether the LM head's rows come from several ranks' slices (a rank of one
 * computes whole rows in place). */
static int gathers(const tdm_model *m)
{
    return m->comm && m->comm->size > 1;
}

/* x += y · wᵀ for an output projection (o_proj, out_proj, down). On a
 * tensor-parallel rank y · wᵀ is the rank's part of the update: rank 0 adds
 * its part to x, the others put theirs in x's place, and the all-reduce
 * leaves x + the sum of the parts on every rank. */
static void residual_add(tdm_model *m, const float *y, tdm_weight w, int R, int in)
{
    tdm_backend *be = m->be;
    const int H = m->cfg.hidden_size;
    float *x = m->ws.x;
    be->matmul(be->ctx, x, y, w, R, in, H, !m->comm || m->comm->rank == 0);
    if (m->comm)
        m->comm->all_reduce_sum(m->comm->ctx, x, (size_t)R * (size_t)H);
}

/* See engine_internal.h. */
void tdm_fwd_attention(tdm_model *m, const tdm_layer_weights *lw, int R, const int32_t *pos,
                       tdm_attn_seg *as, float *const *k_cache, float *const *v_cache, int nseg)
{
    const tdm_model_config *c = &m->cfg;
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    const int nH = c->num_heads, nKV = c->num_kv_heads, D = c->head_dim;
    const int QD = nH * D, KD = nKV * D;
    const float eps = (float)c->rms_norm_eps;
    tdm_workspace *w = &m->ws;
    /* qg [R, nH, 2D], k and v [R, nKV, D] */
    float *const ys[] = {w->qg, w->k, w->v};
    const tdm_weight ws[] = {lw->q_proj, lw->k_proj, lw->v_proj};
    const int outs[] = {2 * QD, KD, KD};
    norm_project(m, lw->input_norm, R, 3, ys, ws, NULL, outs);
    for (int i = 0; i < nseg; i++) {
        as[i].k_cache = k_cache[i];
        as[i].v_cache = v_cache[i];
    }
    /* q, gate [R, nH, D]; the rows' k and v into the caches */
    be->attn_prep(bx, w->q, w->gate, w->qg, w->k, w->v, lw->q_norm, lw->k_norm, eps, pos,
                  m->inv_freq, c->rot_dim, as, nseg, nH, nKV, D);
    be->attention(bx, w->o, w->q, w->gate, as, nseg, nH, nKV, D); /* [R, nH, D] */
    residual_add(m, w->o, lw->o_proj, R, QD); /* x += */
}

void tdm_fwd_mlp(tdm_model *m, const tdm_layer_weights *lw, int R)
{
    const int I = m->cfg.intermediate_size;
    tdm_workspace *w = &m->ws;
    float *const ys[] = {w->h1}; /* silu(gate) ⊙ up [R, I] */
    const int outs[] = {I};
    norm_project(m, lw->post_norm, R, 1, ys, &lw->gate, &lw->up, outs);
    residual_add(m, w->h1, lw->down, R, I); /* x += */
}

/* The ops of one step, in order; logits (when asked) end in ws.logits. Op
 * slots only: nothing here allocates, crosses to the host or waits, so a
 * backend may record the step as a graph (backend.h). */
static void fwd_ops(tdm_model *m, const fwd_step *st)
{
    const tdm_model_config *c = &m->cfg;
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    const int R = st->R, nseq = st->nseq;
    const int H = c->hidden_size, C = m->conv_dim, K = c->conv_kernel;
    const int Hk = c->lin_k_heads, Hv = c->lin_v_heads, Dk = c->lin_k_dim, Dv = c->lin_v_dim;
    const int VD = Hv * Dv;
    const float eps = (float)c->rms_norm_eps;
    tdm_workspace *w = &m->ws;

    if (st->ids_dev) {
        be->embed_dev(bx, w->x, m->embed, st->ids_dev, R, H); /* x [R, H] */
    } else if (m->comm) {
        /* the rank's tokens; zeros for the others' (shard.h), summed */
        be->embed(bx, w->x, m->embed, st->ids_local, R, H);
        m->comm->all_reduce_sum(m->comm->ctx, w->x, (size_t)R * (size_t)H);
    } else {
        be->embed(bx, w->x, m->embed, st->ids, R, H);
    }
    for (int L = 0; L < c->num_layers; L++) {
        const tdm_layer_weights *lw = &m->layers[L];
        if (lw->kind == TDM_LAYER_LINEAR_ATTENTION) {
            /* qkv [R, C], z [R, Hv*Dv], b and a [R, Hv] */
            float *const ys[] = {w->qkv, w->z, w->b, w->a};
            const tdm_weight ws[] = {lw->in_qkv, lw->in_z, lw->in_b, lw->in_a};
            const int outs[] = {C, VD, Hv, Hv};
            norm_project(m, lw->input_norm, R, 4, ys, ws, NULL, outs);
            for (int i = 0; i < nseq; i++) {
                tdm_seq *s = st->seqs[i];
                float *cst = s->conv[L], *rst = s->rec[L], *cout = NULL, *rout = NULL;
                float *rin = NULL;
                const size_t off = (size_t)s->pending;
                if (st->extra[i]) {
                    /* Rows appended to a pending verify continue from the
                     * state after its last row; committed states stay put. */
                    if (off > 0)
                        cst = s->conv_x[L] + (off - 1) * conv_floats(m);
                    cout = s->conv_x[L] + off * conv_floats(m);
                }
                if (st->extra[i] == 1) {
                    if (off > 0)
                        rst = s->rec_x[L] + (off - 1) * rec_floats(m);
                    rout = s->rec_x[L] + off * rec_floats(m);
                } else if (st->extra[i] == 2) {
                    rin = s->rec_x[L]; /* from the committed state, after the pending rows */
                }
                st->cs[i] = (tdm_conv_seg){st->row0[i], st->counts[i], cst, cout};
                st->gs[i] = (tdm_gdn_seg){.row0 = st->row0[i],
                                          .nrows = st->counts[i],
                                          .state = rst,
                                          .states_out = rout,
                                          .inputs = rin,
                                          .replayed = rin ? (int)off : 0};
            }
            be->conv_silu(bx, w->qkvc, w->qkv, lw->conv_w, st->cs, nseq, C, K); /* [R, C] */
            const tdm_gdn_gates gt = {w->a, w->b, lw->A_log, lw->dt_bias};
            be->gdn_recurrent(bx, w->o, w->qkvc, C, gt, st->gs, nseq, Hk, Hv, Dk,
                              Dv); /* o [R, Hv, Dv] */
            be->rmsnorm_gated(bx, w->o2, w->o, w->z, lw->gnorm, R * Hv, Dv, eps);
            residual_add(m, w->o2, lw->out_proj, R, VD); /* x += */
        } else {
            for (int i = 0; i < nseq; i++) {
                tdm_seq *s = st->seqs[i];
                st->as[i] = (tdm_attn_seg){
                    .row0 = st->row0[i], .nrows = st->counts[i], .n_past = s->n_past};
                st->kc[i] = s->k[L];
                st->vc[i] = s->v[L];
            }
            tdm_fwd_attention(m, lw, R, st->pos, st->as, st->kc, st->vc, nseq);
        }
        tdm_fwd_mlp(m, lw, R);
    }
    if (st->logits == 1) {
        /* [R, vocab]; [R, draft vocabulary]; or the rank's slice, in its
         * place among the ranks' */
        float *y = w->logits;
        tdm_weight head = m->lm_head;
        int out = c->vocab_size;
        if (gathers(m)) {
            y = w->gathered + (size_t)m->comm->rank * (size_t)R * (size_t)m->shard.vocab_n;
            out = m->shard.vocab_n;
        } else if (m->dv.n) {
            head = m->dv.head;
            out = m->dv.n;
        }
        norm_project(m, m->final_norm, R, 1, &y, &head, NULL, &out);
    } else if (st->logits) {
        be->rmsnorm(bx, w->xn, w->x, m->final_norm, R, H, eps, 1);
    }
}

/* A tensor-parallel rank's logits after fwd_ops: the ranks' slices of every
 * row ([size, R, vocab / size] in ws.gathered, each rank's own in place)
 * gathered, then put together into whole rows in ws.logits. Copies, so not in
 * a graph bracket. */
static void gather_logits(tdm_model *m, int R, fwd_step *st)
{
    tdm_backend *be = m->be;
    const int N = m->comm->size;
    const size_t Vl = (size_t)m->shard.vocab_n, part = (size_t)R * Vl;
    float *g = m->ws.gathered;
    m->comm->all_gather(m->comm->ctx, g + (size_t)m->comm->rank * part, g, part);
    for (int j = 0, i = 0; j < N; j++)
        for (int r = 0; r < R; r++, i++) {
            st->cdst[i] = m->ws.logits + (size_t)r * (size_t)N * Vl + (size_t)j * Vl;
            st->csrc[i] = g + (size_t)j * part + (size_t)r * Vl;
            st->cbytes[i] = Vl * sizeof(float);
        }
    if (be->copy_n) {
        be->copy_n(be->ctx, N * R, st->cdst, st->csrc, st->cbytes);
        return;
    }
    for (int i = 0; i < N * R; i++)
        be->copy(be->ctx, st->cdst[i], st->csrc[i], st->cbytes[i]);
}

/* Runs counts[i] tokens of seqs[i] for all i as one batch of rows. verify:
 * extra_buffer sequences keep per-position states in conv_x/rec_x (their
 * committed states stay untouched). prefill: a prompt, whose matmuls the
 * backend may run on its faster paths (bulk). out (NULL: nothing back) says which
 * logits rows and argmaxes the host gets (tdm_step_out). Advances every
 * n_past. On a backend with graphs the ops are one bracketed step (fwd_key);
 * argmax and logits come back after it. */
/* Downloads the rows of the sequences `want` flags (NULL: all) from src
 * (src_width values a row) to dst (width a row): runs of consecutive wanted
 * sequences, one copy each where the widths agree, else one a row. */
static void download_rows(tdm_backend *be, void *bx, float *dst, const float *src, size_t width,
                          size_t src_width, const uint8_t *want, const int *row0, const int *counts,
                          int nseq)
{
    for (int i = 0; i < nseq;) {
        if (want && !want[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j < nseq && (!want || want[j]))
            j++;
        const size_t r0 = (size_t)row0[i], nr = (size_t)(row0[j - 1] + counts[j - 1]) - r0;
        if (src_width == width)
            be->download(bx, dst + r0 * width, src + r0 * width, nr * width * sizeof(float));
        else
            for (size_t r = r0; r < r0 + nr; r++)
                be->download(bx, dst + r * width, src + r * src_width, src_width * sizeof(float));
        i = j;
    }
}

/* Host logits rows of a model with a draft vocabulary, downloaded at its
 * width: spread out to the whole vocabulary (after the sync). */
static void spread_rows(const tdm_model *m, float *logits, const uint8_t *want, const int *row0,
                        const int *counts, int nseq)
{
    for (int i = 0; i < nseq; i++)
        for (int r = row0[i]; (!want || want[i]) && r < row0[i] + counts[i]; r++)
            tdm_draft_vocab_spread(&m->dv, logits + (size_t)r * (size_t)m->cfg.vocab_size,
                                   m->cfg.vocab_size);
}

static bool samples(const tdm_sample_row *r)
{
    const tdm_sampling s = {r->temperature, r->top_p, r->top_k};
    return !tdm_sampling_is_greedy(&s);
}

/* Room on the backend for R rows of probabilities, their draws and their
 * picks (keep_rows); the picks' ids into the rows stay below 2^31. */
static bool step_probs_fit(tdm_model *m, int R)
{
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    if (m->step_probs_rows >= (size_t)R)
        return true;
    if ((size_t)R * (size_t)m->cfg.vocab_size > (size_t)INT32_MAX)
        return false;
    float *p = be->alloc(bx, (size_t)R * (size_t)m->cfg.vocab_size * sizeof(float));
    int32_t *ids = be->alloc(bx, (size_t)R * sizeof(int32_t));
    float *pick = be->alloc(bx, (size_t)R * sizeof(float));
    if (!p || !ids || !pick) {
        be->free(bx, p);
        be->free(bx, ids);
        be->free(bx, pick);
        return false;
    }
    be->free(bx, m->step_probs);
    be->free(bx, m->step_probs_ids);
    be->free(bx, m->step_probs_pick);
    m->step_probs = p;
    m->step_probs_ids = ids;
    m->step_probs_pick = pick;
    m->step_probs_rows = (size_t)R;
    return true;
}

/* A step's kept rows while it runs (keep_rows, keep_finish). */
typedef struct keep_list {
    int n;
    int32_t *rows;      /* [R]: the step's rows kept, in order */
    tdm_sample_row *of; /* [R]: each one's settings, with its sequence's uniform */
    int32_t *ids;       /* [R]: the backend's draws (a host copy) */
    int32_t *pick_at;   /* [R]: the picks' ids into step_probs (j * vocab + token) */
    float *picks;       /* [R]: a host copy of the picks, in row order */
    uint8_t *kept;      /* [nseq]: the sequence's rows are kept */
    uint8_t *want;      /* [nseq]: its logits come back as they are */
    bool dev;           /* turned on the backend */
} keep_list;

/* A step's wanted logits to the host, except the rows of sequences that
 * out->probs_of samples: turned into their distributions and kept
 * (tdm_step_out). On the backend: sample_to into the model's scratch, each
 * row's pick (its probability of the next row's token) gathered from there
 * by embed as from a table of one column, the draws and picks downloaded.
 * Without sample_to or room for it: the rows downloaded as logits, for
 * keep_finish to turn on the host after the sync. The model has no draft
 * vocabulary (fwd_run). */
static void keep_rows(tdm_model *m, const tdm_step_out *out, const fwd_step *st, const int *counts,
                      int nseq, keep_list *k)
{
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    const size_t V = (size_t)m->cfg.vocab_size;
    const int R = st->R;
    *k = (keep_list){
        .rows = tdm_xmalloc((size_t)R * sizeof(int32_t)),
        .of = tdm_xmalloc((size_t)R * sizeof(tdm_sample_row)),
        .ids = tdm_xmalloc((size_t)R * sizeof(int32_t)),
        .pick_at = tdm_xmalloc((size_t)R * sizeof(int32_t)),
        .picks = tdm_xmalloc((size_t)R * sizeof(float)),
        .kept = tdm_xmalloc((size_t)nseq),
        .want = tdm_xmalloc((size_t)nseq),
    };
    for (int i = 0; i < nseq; i++) {
        const bool wanted = !out->want_logits || out->want_logits[i];
        k->kept[i] = wanted && samples(&out->probs_of[i]);
        k->want[i] = wanted && !k->kept[i];
        for (int r = st->row0[i]; k->kept[i] && r < st->row0[i] + counts[i]; r++) {
            k->rows[k->n] = r;
            k->of[k->n++] = out->probs_of[i];
        }
    }
    download_rows(be, bx, out->logits, m->ws.logits, V, V, k->want, st->row0, counts, nseq);
    k->dev = k->n > 0 && be->sample_to && step_probs_fit(m, R);
    if (!k->dev) {
        for (int j = 0; j < k->n; j++)
            be->download(bx, out->logits + (size_t)k->rows[j] * V,
                         m->ws.logits + (size_t)k->rows[j] * V, V * sizeof(float));
        return;
    }
    be->sample_to(bx, m->step_probs_ids, m->step_probs, m->ws.logits, k->rows, k->n, (int)V, NULL,
                  k->of);
    int np = 0;
    for (int i = 0, j = 0; i < nseq; i++)
        for (int c = 0; k->kept[i] && c < counts[i]; c++, j++)
            if (c + 1 < counts[i])
                k->pick_at[np++] = (int32_t)((size_t)j * V) + st->ids[k->rows[j] + 1];
    if (np > 0) {
        const tdm_weight table = {m->step_probs, TDM_DTYPE_F32, 0};
        be->embed(bx, m->step_probs_pick, table, k->pick_at, np, 1);
        be->download(bx, k->picks, m->step_probs_pick, (size_t)np * sizeof(float));
    }
    be->download(bx, k->ids, m->step_probs_ids, (size_t)k->n * sizeof(int32_t));
}

/* After the step's sync: the kept rows turned on the host where keep_rows
 * left them as logits, each kept sequence's draw and picks into out, and
 * the model's record of the rows for tdm_step_probs_fetch. */
static void keep_finish(tdm_model *m, const tdm_step_out *out, const fwd_step *st,
                        const int *counts, int nseq, keep_list *k)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    if (!k->dev && k->n > 0) {
        float *p = tdm_xmalloc(V * sizeof(float));
        int *order = tdm_xmalloc(V * sizeof(int));
        for (int j = 0; j < k->n; j++) {
            const tdm_sampling sp = {k->of[j].temperature, k->of[j].top_p, k->of[j].top_k};
            float *row = out->logits + (size_t)k->rows[j] * V;
            tdm_sampling_probs(&sp, row, (int)V, p, order);
            memcpy(row, p, V * sizeof(float));
        }
        free(p);
        free(order);
    }
    for (int i = 0, j = 0, np = 0; i < nseq; i++)
        for (int c = 0; k->kept[i] && c < counts[i]; c++, j++) {
            const int r = st->row0[i] + c;
            const float *row = out->logits + (size_t)r * V;
            if (c + 1 < counts[i]) {
                const float p = k->dev ? k->picks[np++] : row[st->ids[r + 1]];
                if (out->picked)
                    out->picked[r] = p;
            } else if (out->drawn) {
                out->drawn[i] = k->dev ? k->ids[j] : tdm_sampling_draw(row, (int)V, k->of[j].u);
            }
        }
    if (k->n > m->kept_cap) {
        free(m->kept_rows);
        m->kept_rows = tdm_xmalloc((size_t)k->n * sizeof(int32_t));
        m->kept_cap = k->n;
    }
    memcpy(m->kept_rows, k->rows, (size_t)k->n * sizeof(int32_t));
    m->kept_n = k->n;
    m->kept_dev = k->dev;
    m->kept_host = out->logits;
    free(k->rows);
    free(k->of);
    free(k->ids);
    free(k->pick_at);
    free(k->picks);
    free(k->kept);
    free(k->want);
}

tdm_status tdm_step_probs_fetch(tdm_model *m, float *logits, const int *rows, int n, tdm_error *err)
{
    if (m->group)
        return tdm_group_probs_fetch(m->group, logits, rows, n, err);
    tdm_backend *be = m->be;
    const size_t V = (size_t)m->cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < m->kept_n && m->kept_rows[j] != rows[i])
            j++;
        if (j == m->kept_n)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "step row %d was not kept by the model's last call", rows[i]);
        float *dst = logits + (size_t)rows[i] * V;
        if (m->kept_dev)
            be->download(be->ctx, dst, m->step_probs + (size_t)j * V, V * sizeof(float));
        else if (dst != m->kept_host + (size_t)rows[i] * V)
            memcpy(dst, m->kept_host + (size_t)rows[i] * V, V * sizeof(float));
    }
    if (m->kept_dev && n > 0)
        be->sync(be->ctx);
    return TDM_OK;
}

static tdm_status fwd_run(tdm_model *m, tdm_seq *const *seqs, int nseq, const int32_t *const *toks,
                          const int *counts, int verify, int prefill, const tdm_step_out *out,
                          tdm_error *err)
{
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    int R = 0;
    for (int i = 0; i < nseq; i++)
        R += counts[i];
    if (R == 0)
        return TDM_OK;
    m->kept_n = 0;
    if (out && out->probs_of && m->dv.n)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "a step's probabilities are not taken on a model with a draft "
                             "vocabulary");
    tdm_status rc = ws_ensure(m, R, err);
    for (int i = 0; rc == TDM_OK && i < nseq; i++)
        rc = kv_ensure(seqs[i], seqs[i]->n_past + counts[i], err);
    if (rc != TDM_OK)
        return rc;

    fwd_step st = {
        .seqs = seqs,
        .counts = counts,
        .nseq = nseq,
        .R = R,
        .prefill = prefill,
        .logits = !out                         ? 0
                  : out->logits || out->argmax ? 1
                  : out->hidden                ? 2
                                               : 0,
    };
    step_scratch(&st, nseq, R, m->comm ? m->comm->size : 0);
    for (int i = 0, r = 0; i < nseq; i++) {
        tdm_seq *s = seqs[i];
        st.row0[i] = r;
        st.extra[i] = !verify || !s->verifying                  ? 0
                      : s->p.strategy == TDM_STATE_EXTRA_BUFFER ? 1
                      : s->p.strategy == TDM_STATE_REPLAY       ? 2
                                                                : 0;
        for (int j = 0; j < counts[i]; j++, r++) {
            st.ids[r] = toks[i][j];
            st.pos[r] = s->n_past + j;
        }
    }
    for (int r = 0; m->comm && r < R; r++) {
        const int32_t t = st.ids[r] - m->shard.vocab0;
        st.ids_local[r] = t >= 0 && t < m->shard.vocab_n ? t : -1;
    }

    /* A prompt's prefill may take the backend's faster matmuls (backend.h:
     * bulk; the key's row counts say whether it does). A tensor-parallel
     * rank's collectives go into a graph only where the communicator records
     * them with the backend's step (comm.h). */
    const int bulk = prefill && be->bulk && be->bulk(bx, R);
    if (m->graphs && be->graph_begin && (!m->comm || m->comm->in_graphs)) {
        /* Recorded, replayed or eager: graph_end queues or has done the work. */
        be->graph_begin(bx, fwd_key(m, &st));
        fwd_ops(m, &st);
        if (be->graph_end(bx) != 0)
            fwd_ops(m, &st); /* the replay did not match its graph: nothing ran */
    } else {
        fwd_ops(m, &st);
    }
    if (bulk)
        be->bulk(bx, 0);
    const size_t V = (size_t)m->cfg.vocab_size, H = (size_t)m->cfg.hidden_size;
    const size_t Vl = (size_t)tdm_model_draft_vocab_size(m); /* a logits row's width */
    if (gathers(m) && st.logits == 1)
        gather_logits(m, R, &st);
    if (out && out->argmax)
        be->argmax(bx, out->argmax, m->ws.logits, R, (int)Vl);
    keep_list kl = {0};
    const bool keep = out && out->logits && out->probs_of;
    if (keep) {
        keep_rows(m, out, &st, counts, nseq, &kl);
    } else if (out && out->logits) {
        download_rows(be, bx, out->logits, m->ws.logits, V, Vl, out->want_logits, st.row0, counts,
                      nseq);
    }
    if (out && out->hidden) /* ws.xn holds the final norm's output (fwd_ops) */
        download_rows(be, bx, out->hidden, m->ws.xn, H, H,
                      out->want_hidden ? out->want_hidden : out->want_logits, st.row0, counts,
                      nseq);
    be->sync(bx);
    if (m->dv.n && out && out->argmax)
        for (int r = 0; r < R; r++)
            out->argmax[r] = m->dv.ids[out->argmax[r]];
    if (m->dv.n && out && out->logits)
        spread_rows(m, out->logits, out->want_logits, st.row0, counts, nseq);
    if (keep)
        keep_finish(m, out, &st, counts, nseq, &kl);
    for (int i = 0; i < nseq; i++)
        seqs[i]->n_past += counts[i];
    step_scratch_free(&st);
    return rc;
}

/* ---- sequences ---------------------------------------------------------- */

static float **layer_array(int n)
{
    return tdm_xcalloc((size_t)n, sizeof(float *));
}

tdm_status tdm_seq_create(tdm_model *m, const tdm_seq_params *p, tdm_seq **out, tdm_error *err)
{
    *out = NULL;
    if (p->max_draft < 0 || p->max_draft > TDM_MAX_DRAFT_BLOCK)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "max_draft %d is outside 0..%d",
                             p->max_draft, TDM_MAX_DRAFT_BLOCK);
    if (p->strategy != TDM_STATE_EXTRA_BUFFER && p->strategy != TDM_STATE_NO_BUFFER &&
        p->strategy != TDM_STATE_REPLAY)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "unknown state strategy %d",
                             (int)p->strategy);
    if (p->max_positions < 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "max_positions %d is negative",
                             p->max_positions);
    if (p->strategy == TDM_STATE_REPLAY && !m->be->gdn_replay)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "state strategy replay: the %s backend cannot replay a delta rule",
                             m->be->name);
    if (m->group)
        return tdm_group_seq_create(m, p, out, err);
    const int NL = m->cfg.num_layers;
    tdm_seq *s = tdm_xcalloc(1, sizeof(*s));
    s->m = m;
    s->p = *p;
    s->k = layer_array(NL);
    s->v = layer_array(NL);
    s->conv = layer_array(NL);
    s->rec = layer_array(NL);
    s->conv_x = layer_array(NL);
    s->rec_x = layer_array(NL);
    s->pend_tokens = tdm_xmalloc((size_t)(p->max_draft + 1) * sizeof(int32_t));
    int ok = 1;
    void *bx = m->be->ctx;
    for (int L = 0; ok && L < NL; L++) {
        if (m->cfg.layer_types[L] != TDM_LAYER_LINEAR_ATTENTION)
            continue; /* KV caches come with the first forward (kv_ensure) */
        s->conv[L] = m->be->alloc(bx, conv_floats(m) * sizeof(float));
        s->rec[L] = m->be->alloc(bx, rec_floats(m) * sizeof(float));
        s->conv_x[L] = m->be->alloc(bx, conv_x_floats(s) * sizeof(float));
        s->rec_x[L] = m->be->alloc(bx, rec_x_floats(s) * sizeof(float));
        ok = s->conv[L] && s->rec[L] && s->conv_x[L] && s->rec_x[L];
    }
    /* KV caches for max_positions, or a first KV_INITIAL_CAP that grows;
     * their being non-NULL tells kv_ensure which layers own KV caches. */
    const int kv_cap = p->max_positions > 0 ? p->max_positions : KV_INITIAL_CAP;
    for (int L = 0; ok && L < NL; L++) {
        if (m->cfg.layer_types[L] != TDM_LAYER_FULL_ATTENTION)
            continue;
        s->k[L] = m->be->alloc(bx, (size_t)kv_cap * kv_width(m) * sizeof(float));
        s->v[L] = m->be->alloc(bx, (size_t)kv_cap * kv_width(m) * sizeof(float));
        ok = s->k[L] && s->v[L];
    }
    if (!ok) {
        tdm_seq_destroy(s);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "%s backend memory exhausted: no room for the state of a new "
                             "sequence",
                             m->be->name);
    }
    s->kv_cap = kv_cap;
    *out = s;
    return TDM_OK;
}

void tdm_seq_destroy(tdm_seq *s)
{
    if (!s)
        return;
    if (s->ranks) {
        tdm_group_seq_destroy(s);
        return;
    }
    tdm_backend *be = s->m->be;
    float **arrs[] = {s->k, s->v, s->conv, s->rec, s->conv_x, s->rec_x};
    for (size_t a = 0; a < TDM_ARRAY_LEN(arrs); a++) {
        if (!arrs[a])
            continue;
        for (int L = 0; L < s->m->cfg.num_layers; L++)
            if (arrs[a][L])
                be->free(be->ctx, arrs[a][L]);
        free(arrs[a]);
    }
    free(s->pend_tokens);
    free(s);
}

int tdm_seq_length(const tdm_seq *s)
{
    if (s->ranks)
        return tdm_seq_length(s->ranks[0]);
    return s->n_past - s->pending;
}

tdm_status tdm_seq_fork(const tdm_seq *src, tdm_seq **out, tdm_error *err)
{
    *out = NULL;
    if (src->ranks)
        return tdm_group_seq_fork(src, out, err);
    if (src->pending)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "cannot fork a sequence with an uncommitted verify");
    tdm_seq *s;
    tdm_status rc = tdm_seq_create(src->m, &src->p, &s, err);
    if (rc != TDM_OK)
        return rc;
    if ((rc = kv_ensure(s, src->n_past, err)) != TDM_OK) {
        tdm_seq_destroy(s);
        return rc;
    }
    tdm_model *m = src->m;
    void *bx = m->be->ctx;
    for (int L = 0; L < m->cfg.num_layers; L++) {
        if (src->k[L]) {
            size_t n = (size_t)src->n_past * kv_width(m) * sizeof(float);
            m->be->copy(bx, s->k[L], src->k[L], n);
            m->be->copy(bx, s->v[L], src->v[L], n);
        }
        if (src->conv[L]) {
            m->be->copy(bx, s->conv[L], src->conv[L], conv_floats(m) * sizeof(float));
            m->be->copy(bx, s->rec[L], src->rec[L], rec_floats(m) * sizeof(float));
        }
    }
    s->n_past = src->n_past;
    *out = s;
    return TDM_OK;
}

tdm_status tdm_model_check_tokens(const tdm_model *m, const int32_t *t, int n, tdm_error *err)
{
    for (int i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= m->cfg.vocab_size)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "token id %d is outside the vocabulary (0..%d)", (int)t[i],
                                 m->cfg.vocab_size - 1);
    return TDM_OK;
}

static tdm_status check_idle(const tdm_seq *s, tdm_error *err)
{
    if (s->pending)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "the sequence has an uncommitted verify; commit it first");
    return TDM_OK;
}

/* no_buffer: the checkpoint lives in slot 0 of conv_x/rec_x. to_checkpoint
 * saves the committed states there; otherwise they are restored from it. */
static void states_checkpoint(tdm_seq *s, int to_checkpoint)
{
    tdm_model *m = s->m;
    for (int L = 0; L < m->cfg.num_layers; L++) {
        if (!s->conv[L])
            continue;
        float *cd = to_checkpoint ? s->conv_x[L] : s->conv[L];
        float *cs = to_checkpoint ? s->conv[L] : s->conv_x[L];
        float *rd = to_checkpoint ? s->rec_x[L] : s->rec[L];
        float *rs = to_checkpoint ? s->rec[L] : s->rec_x[L];
        m->be->copy(m->be->ctx, cd, cs, conv_floats(m) * sizeof(float));
        m->be->copy(m->be->ctx, rd, rs, rec_floats(m) * sizeof(float));
    }
}

tdm_status tdm_seq_prefill(tdm_seq *s, const int32_t *tokens, int n, float *logits, tdm_error *err)
{
    const tdm_step_out o = {.logits = logits};
    return tdm_seq_prefill_out(s, tokens, n, &o, err);
}

tdm_status tdm_seq_prefill_out(tdm_seq *s, const int32_t *tokens, int n, const tdm_step_out *out,
                               tdm_error *err)
{
    if (s->ranks)
        return tdm_group_prefill(s, tokens, n, out, err);
    tdm_status rc;
    if ((rc = check_idle(s, err)) || (rc = tdm_model_check_tokens(s->m, tokens, n, err)))
        return rc;
    const size_t V = (size_t)s->m->cfg.vocab_size, H = (size_t)s->m->cfg.hidden_size;
    for (int at = 0; at < n; at += PREFILL_CHUNK) {
        int cnt = n - at < PREFILL_CHUNK ? n - at : PREFILL_CHUNK;
        const int32_t *t = tokens + at;
        const size_t a = (size_t)at;
        const tdm_step_out o = {
            .logits = out && out->logits ? out->logits + a * V : NULL,
            .argmax = out && out->argmax ? out->argmax + a : NULL,
            .hidden = out && out->hidden ? out->hidden + a * H : NULL,
        };
        rc = fwd_run(s->m, &s, 1, &t, &cnt, 0, 1, &o, err);
        if (rc != TDM_OK)
            return rc;
    }
    return TDM_OK;
}

static tdm_status check_batch(tdm_seq *const *seqs, int nseq, int allow_pending, tdm_error *err)
{
    if (nseq < 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "no sequences given");
    for (int i = 0; i < nseq; i++) {
        if (seqs[i]->m != seqs[0]->m)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "sequences of different models in one batch");
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                     "sequence %d appears twice in one batch", i);
        if (!allow_pending) {
            tdm_status rc = check_idle(seqs[i], err);
            if (rc != TDM_OK)
                return rc;
        }
    }
    return TDM_OK;
}

tdm_status tdm_seq_decode(tdm_seq *const *seqs, int nseq, const int32_t *tokens, float *logits,
                          tdm_error *err)
{
    tdm_status rc;
    if ((rc = check_batch(seqs, nseq, 0, err)) ||
        (rc = tdm_model_check_tokens(seqs[0]->m, tokens, nseq, err)))
        return rc;
    if (seqs[0]->ranks)
        return tdm_group_decode(seqs, nseq, tokens, logits, err);
    const int32_t **t = tdm_xmalloc((size_t)nseq * sizeof(*t));
    int *cnt = tdm_xmalloc((size_t)nseq * sizeof(int));
    for (int i = 0; i < nseq; i++) {
        t[i] = &tokens[i];
        cnt[i] = 1;
    }
    const tdm_step_out o = {.logits = logits};
    rc = fwd_run(seqs[0]->m, seqs, nseq, t, cnt, 0, 0, &o, err);
    free(t);
    free(cnt);
    return rc;
}

/* Checkpoint (no_buffer) and bookkeeping for a sequence whose rows start
 * or extend a pending verify. */
static void pending_begin(tdm_seq *s, const int32_t *tokens, int n)
{
    if (s->pending == 0) {
        if (s->p.strategy == TDM_STATE_NO_BUFFER)
            states_checkpoint(s, 1);
        s->base = s->n_past;
    }
    memcpy(s->pend_tokens + s->pending, tokens, (size_t)n * sizeof(int32_t));
    s->verifying = 1;
}

/* After a failed forward: back to the committed position, pending dropped. */
static void pending_abort(tdm_seq *s)
{
    if (s->p.strategy == TDM_STATE_NO_BUFFER && (s->pending > 0 || s->verifying))
        states_checkpoint(s, 0);
    if (s->pending > 0 || s->verifying)
        s->n_past = s->base;
    s->pending = 0;
    s->verifying = 0;
}

/* The shared body of verify and step: sequences with verify_rows[i] set get
 * pending rows, the others are decoded and committed at once. */
static tdm_status run_rows(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                           const int *ntokens, const int *verify_rows, const tdm_step_out *out,
                           tdm_error *err)
{
    tdm_model *m = seqs[0]->m;
    tdm_status rc;
    for (int i = 0; i < nseq; i++) {
        tdm_seq *s = seqs[i];
        if (ntokens[i] < 1)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "sequence %d: no tokens to run", i);
        if (verify_rows[i] && s->pending + ntokens[i] > s->p.max_draft + 1)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "sequence %d: a verify block carries 1 + k tokens with k <= %d "
                                 "(max_draft); got %d tokens",
                                 i, s->p.max_draft, s->pending + ntokens[i]);
        if (!verify_rows[i] && (ntokens[i] != 1 || s->pending))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "sequence %d: a decode row is one token on a committed "
                                 "sequence",
                                 i);
        if ((rc = tdm_model_check_tokens(m, tokens[i], ntokens[i], err)) != TDM_OK)
            return rc;
    }
    for (int i = 0; i < nseq; i++)
        if (verify_rows[i])
            pending_begin(seqs[i], tokens[i], ntokens[i]);
    rc = fwd_run(m, seqs, nseq, tokens, ntokens, 1, 0, out, err);
    for (int i = 0; i < nseq; i++) {
        tdm_seq *s = seqs[i];
        if (!verify_rows[i])
            continue;
        if (rc != TDM_OK) {
            pending_abort(s); /* nothing was committed */
            continue;
        }
        s->pending += ntokens[i];
        s->verifying = 0;
    }
    return rc;
}

tdm_status tdm_seq_verify(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                          const int *ntokens, float *logits, tdm_error *err)
{
    const tdm_step_out o = {.logits = logits};
    return tdm_seq_verify_out(seqs, nseq, tokens, ntokens, &o, err);
}

tdm_status tdm_seq_verify_out(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                              const int *ntokens, const tdm_step_out *out, tdm_error *err)
{
    tdm_status rc = check_batch(seqs, nseq, 1, err);
    if (rc != TDM_OK)
        return rc;
    if (seqs[0]->ranks)
        return tdm_group_step(seqs, nseq, tokens, ntokens, 1, out, err);
    int *vr = tdm_xmalloc((size_t)nseq * sizeof(int));
    for (int i = 0; i < nseq; i++)
        vr[i] = 1;
    rc = run_rows(seqs, nseq, tokens, ntokens, vr, out, err);
    free(vr);
    return rc;
}

/* ---- drafting ------------------------------------------------------------ */

/* Draft j of a sampled sequence from its row of logits over the whole
 * vocabulary: the distribution (entry t for the model's draft vocabulary
 * id t) into probs, the token drawn with u. scratch: [V] floats + [V] ints. */
static int32_t draw_host(const tdm_model *m, const tdm_draft_sampling *ds, double u,
                         const float *logits, float *probs, void *scratch)
{
    const int V = m->cfg.vocab_size, Vl = tdm_model_draft_vocab_size(m);
    const tdm_sampling sp = {ds->temperature, ds->top_p, ds->top_k};
    float *p = scratch;
    tdm_sampling_probs(&sp, logits, V, p, (int *)(p + V));
    for (int t = 0; t < Vl; t++)
        probs[t] = p[tdm_model_draft_vocab_id(m, t)];
    return tdm_sampling_draw(p, V, u);
}

/* tdm_seq_draft as separate verify calls, the argmaxes (or a sampled
 * sequence's logits) read on the host. */
static tdm_status draft_calls(tdm_seq *const *seqs, int nseq, const int32_t *const *lead,
                              const int *nlead, const int *k, const int32_t *const *forced,
                              const tdm_draft_sampling *const *sampling, int32_t *const *drafts,
                              tdm_error *err)
{
    const tdm_model *m = seqs[0]->m;
    const size_t V = (size_t)m->cfg.vocab_size, Vl = (size_t)tdm_model_draft_vocab_size(m);
    int kmax = 0, R0 = 0;
    bool sampled = false;
    for (int i = 0; i < nseq; i++) {
        kmax = k[i] > kmax ? k[i] : kmax;
        R0 += nlead[i];
        sampled = sampled || (sampling && sampling[i]);
    }
    const size_t Rmax = (size_t)(R0 > nseq ? R0 : nseq);
    tdm_seq **sq = tdm_xmalloc((size_t)nseq * sizeof(*sq));
    const int32_t **tp = tdm_xmalloc((size_t)nseq * sizeof(*tp));
    int *nt = tdm_xmalloc((size_t)nseq * sizeof(int)),
        *idx = tdm_xmalloc((size_t)nseq * sizeof(int));
    int32_t *am = tdm_xmalloc(Rmax * sizeof(int32_t));
    uint8_t *want = sampled ? tdm_xmalloc((size_t)nseq) : NULL;
    float *logits = sampled ? tdm_xmalloc(Rmax * V * sizeof(float)) : NULL;
    void *scratch = sampled ? tdm_xmalloc(V * (sizeof(float) + sizeof(int))) : NULL;
    tdm_status rc = TDM_OK;
    for (int s = 0; s < kmax && rc == TDM_OK; s++) {
        int n = 0;
        for (int i = 0; i < nseq; i++) {
            if (k[i] <= s)
                continue;
            idx[n] = i;
            sq[n] = seqs[i];
            tp[n] = s == 0 ? lead[i] : &drafts[i][s - 1];
            nt[n] = s == 0 ? nlead[i] : 1;
            if (want)
                want[n] = sampling[i] != NULL;
            n++;
        }
        const tdm_step_out o = {.argmax = am, .logits = logits, .want_logits = want};
        rc = tdm_seq_verify_out(sq, n, tp, nt, &o, err);
        for (int x = 0, row = 0; rc == TDM_OK && x < n; x++) {
            row += nt[x];
            const int i = idx[x];
            const tdm_draft_sampling *ds = sampling ? sampling[i] : NULL;
            int32_t t = am[row - 1];
            if (ds)
                t = draw_host(m, ds, ds->u[s], logits + (size_t)(row - 1) * V,
                              ds->probs + (size_t)s * Vl, scratch);
            drafts[i][s] = forced ? forced[i][s] : t;
        }
    }
    if (rc != TDM_OK)
        for (int i = 0; i < nseq; i++)
            pending_abort(seqs[i]);
    free(sq);
    free(tp);
    free(nt);
    free(idx);
    free(am);
    free(want);
    free(logits);
    free(scratch);
    return rc;
}

/* A sequence's counters that a draft chain moves, kept to start it over. */
typedef struct draft_saved {
    int n_past, pending, base, verifying;
} draft_saved;

/* Grows the model's draft-chain outputs (backend memory) to nseq chains of
 * kmax tokens, and with `sampled` a distribution row per token. */
static tdm_status draft_bufs(tdm_model *m, int kmax, int nseq, bool sampled, tdm_error *err)
{
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    if (m->draft_cap < kmax * nseq) {
        int32_t *ids = be->alloc(bx, (size_t)kmax * (size_t)nseq * sizeof(int32_t));
        if (!ids)
            return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                                 "backend out of memory for %d draft tokens", kmax * nseq);
        if (m->draft_ids)
            be->free(bx, m->draft_ids);
        m->draft_ids = ids;
        m->draft_cap = kmax * nseq;
    }
    const size_t rows = (size_t)kmax * (size_t)nseq, Vl = (size_t)tdm_model_draft_vocab_size(m);
    if (sampled && m->draft_probs_rows < rows) {
        float *p = be->alloc(bx, rows * Vl * sizeof(float));
        if (!p)
            return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                                 "backend out of memory for %zu draft distributions of %zu",
                                 rows, Vl);
        if (m->draft_probs)
            be->free(bx, m->draft_probs);
        m->draft_probs = p;
        m->draft_probs_rows = rows;
    }
    return TDM_OK;
}

static tdm_status draft(tdm_seq *const *seqs, int nseq, const int32_t *const *lead,
                        const int *nlead, const int *k, const int32_t *const *forced,
                        const tdm_draft_sampling *const *sampling, int32_t *const *drafts,
                        tdm_error *err)
{
    if (nseq <= 0)
        return TDM_OK;
    tdm_status rc = check_batch(seqs, nseq, 1, err);
    if (rc != TDM_OK)
        return rc;
    bool sampled = false;
    for (int i = 0; sampling && i < nseq; i++)
        sampled = sampled || sampling[i];
    if (seqs[0]->ranks && !sampled)
        return tdm_group_draft(seqs, nseq, lead, nlead, k, forced, drafts, err);
    tdm_model *m = seqs[0]->m;
    tdm_backend *be = m->be;
    void *bx = be->ctx;
    /* A tensor-parallel rank gathers its logits between steps (copies):
     * separate verify calls (a group's sampled chains too). */
    bool device = be->argmax_to && be->embed_dev && !m->comm && !seqs[0]->ranks &&
                  (!sampled || be->sample_to);
    int kmax = 0, R0 = 0;
    for (int i = 0; i < nseq; i++) {
        const tdm_seq *s = seqs[i];
        if (k[i] < 1 || nlead[i] < 1)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "sequence %d: a draft needs lead tokens and k >= 1 (got %d, %d)",
                                 i, nlead[i], k[i]);
        if (s->pending + nlead[i] + k[i] - 1 > s->p.max_draft + 1)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "sequence %d: %d pending rows, %d lead tokens and %d drafts "
                                 "exceed 1 + max_draft (%d)",
                                 i, s->pending, nlead[i], k[i], s->p.max_draft);
        if ((rc = tdm_model_check_tokens(m, lead[i], nlead[i], err)) != TDM_OK ||
            (forced && (rc = tdm_model_check_tokens(m, forced[i], k[i], err)) != TDM_OK))
            return rc;
        device = device && s->p.strategy != TDM_STATE_NO_BUFFER;
        kmax = k[i] > kmax ? k[i] : kmax;
        R0 += nlead[i];
    }
    if (!device)
        return draft_calls(seqs, nseq, lead, nlead, k, forced, sampling, drafts, err);

    /* Longest chains first (step s runs a prefix of them), then most lead
     * rows: fewer shapes, so fewer graphs. */
    int *ord = tdm_xmalloc((size_t)nseq * sizeof(int));
    for (int i = 0; i < nseq; i++) {
        int j = i;
        while (j > 0 &&
               (k[ord[j - 1]] < k[i] || (k[ord[j - 1]] == k[i] && nlead[ord[j - 1]] < nlead[i]))) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
    const int Rmax = R0 > nseq ? R0 : nseq;
    rc = ws_ensure(m, Rmax, err);
    for (int i = 0; rc == TDM_OK && i < nseq; i++)
        rc = kv_ensure(seqs[i], seqs[i]->n_past + nlead[i] + k[i] - 1, err);
    if (rc == TDM_OK)
        rc = draft_bufs(m, kmax, nseq, sampled, err);
    if (rc != TDM_OK) {
        free(ord);
        return rc;
    }
    tdm_seq **sq = tdm_xmalloc((size_t)nseq * sizeof(*sq));
    int *counts = tdm_xmalloc((size_t)nseq * sizeof(int));
    int32_t *rows = tdm_xmalloc((size_t)nseq * sizeof(int32_t));
    int32_t *host = tdm_xmalloc((size_t)kmax * (size_t)nseq * sizeof(int32_t));
    tdm_sample_row *srows = sampled ? tdm_xcalloc((size_t)nseq, sizeof(*srows)) : NULL;
    const size_t Vl = (size_t)tdm_model_draft_vocab_size(m);
    draft_saved *saved = tdm_xmalloc((size_t)nseq * sizeof(*saved));
    for (int x = 0; x < nseq; x++) {
        sq[x] = seqs[ord[x]];
        saved[x] = (draft_saved){sq[x]->n_past, sq[x]->pending, sq[x]->base, sq[x]->verifying};
    }
    fwd_step st = {
        .seqs = sq,
        .counts = counts,
        .logits = 1,
    };
    step_scratch(&st, nseq, Rmax, 0);
    /* The key: the model, the workspace, where the tokens go, and per
     * chain its length, lead rows and strategy (backend.h). */
    uint64_t key = tdm_key_mix(0x452821e638d01377ull, (uint64_t)(uintptr_t)m);
    key = tdm_key_mix(key, (uint64_t)(uintptr_t)m->ws.block);
    key = tdm_key_mix(key, (uint64_t)m->ws.rows);
    key = tdm_key_mix(key, (uint64_t)(uintptr_t)m->draft_ids);
    key = tdm_key_mix(key, (uint64_t)m->dv.n);
    key = tdm_key_mix(key, ((uint64_t)nseq << 2) | ((uint64_t)sampled << 1) | (forced != NULL));
    if (sampled)
        key = tdm_key_mix(key, (uint64_t)(uintptr_t)m->draft_probs);
    for (int x = 0; x < nseq; x++)
        key = tdm_key_mix(key, ((uint64_t)k[ord[x]] << 40) | ((uint64_t)nlead[ord[x]] << 8) |
                                   (uint64_t)sq[x]->p.strategy);
    for (int pass = 0;; pass++) {
        const bool graph = m->graphs && be->graph_begin && pass == 0;
        if (graph)
            be->graph_begin(bx, key);
        for (int s = 0; s < kmax; s++) {
            int n = 0, R = 0;
            while (n < nseq && k[ord[n]] > s)
                n++;
            st.nseq = n;
            st.ids_dev = s > 0 && !forced ? m->draft_ids + (size_t)(s - 1) * (size_t)nseq : NULL;
            for (int x = 0; x < n; x++) {
                const int i = ord[x];
                tdm_seq *q = sq[x];
                counts[x] = s == 0 ? nlead[i] : 1;
                st.row0[x] = R;
                for (int j = 0; j < counts[x]; j++, R++) {
                    st.ids[R] = s == 0 ? lead[i][j] : forced ? forced[i][s - 1] : 0;
                    st.pos[R] = q->n_past + j;
                }
                pending_begin(q, st.ids + st.row0[x], counts[x]); /* host only: no no_buffer */
                st.extra[x] = q->p.strategy == TDM_STATE_EXTRA_BUFFER ? 1 : 2;
                rows[x] = R - 1;
            }
            st.R = R;
            fwd_ops(m, &st);
            int32_t *out = m->draft_ids + (size_t)s * (size_t)nseq;
            const int32_t *map = m->dv.n ? m->dv.map : NULL;
            if (sampled) {
                /* greedy rows (zeroed settings) take the argmax there too */
                for (int x = 0; x < n; x++) {
                    const tdm_draft_sampling *ds = sampling[ord[x]];
                    srows[x] = ds ? (tdm_sample_row){ds->temperature, ds->top_p, ds->top_k, 0,
                                                     ds->u[s]}
                                  : (tdm_sample_row){0};
                }
                be->sample_to(bx, out, m->draft_probs + (size_t)s * (size_t)nseq * Vl,
                              m->ws.logits, rows, n, (int)Vl, map, srows);
            } else {
                be->argmax_to(bx, out, m->ws.logits, rows, n, (int)Vl, map);
            }
            for (int x = 0; x < n; x++) {
                sq[x]->n_past += counts[x];
                sq[x]->pending += counts[x];
                sq[x]->verifying = 0;
            }
        }
        if (!graph || be->graph_end(bx) == 0)
            break;
        /* The replay did not match its graph and nothing ran: again, eagerly. */
        for (int x = 0; x < nseq; x++) {
            sq[x]->n_past = saved[x].n_past;
            sq[x]->pending = saved[x].pending;
            sq[x]->base = saved[x].base;
            sq[x]->verifying = saved[x].verifying;
        }
    }
    be->download(bx, host, m->draft_ids, (size_t)kmax * (size_t)nseq * sizeof(int32_t));
    for (int x = 0; sampled && x < nseq; x++) {
        const tdm_draft_sampling *ds = sampling[ord[x]];
        for (int s = 0; ds && s < k[ord[x]]; s++)
            be->download(bx, ds->probs + (size_t)s * Vl,
                         m->draft_probs + ((size_t)s * (size_t)nseq + (size_t)x) * Vl,
                         Vl * sizeof(float));
    }
    be->sync(bx);
    for (int x = 0; x < nseq; x++) {
        const int i = ord[x];
        tdm_seq *q = sq[x];
        for (int s = 0; s < k[i]; s++)
            drafts[i][s] = forced ? forced[i][s] : host[(size_t)s * (size_t)nseq + (size_t)x];
        /* The rows' tokens as the host knows them now (pending_begin saw placeholders). */
        for (int s = 1; s < k[i]; s++)
            q->pend_tokens[saved[x].pending + nlead[i] + s - 1] = drafts[i][s - 1];
    }
    step_scratch_free(&st);
    free(ord);
    free(sq);
    free(counts);
    free(rows);
    free(host);
    free(srows);
    free(saved);
    return TDM_OK;
}

tdm_status tdm_seq_draft(tdm_seq *const *seqs, int nseq, const int32_t *const *lead,
                         const int *nlead, const int *k, const int32_t *const *forced,
                         int32_t *const *drafts, tdm_error *err)
{
    return draft(seqs, nseq, lead, nlead, k, forced, NULL, drafts, err);
}

tdm_status tdm_seq_draft_sampled(tdm_seq *const *seqs, int nseq, const int32_t *const *lead,
                                 const int *nlead, const int *k,
                                 const tdm_draft_sampling *const *sampling,
                                 int32_t *const *drafts, tdm_error *err)
{
    return draft(seqs, nseq, lead, nlead, k, NULL, sampling, drafts, err);
}

tdm_status tdm_seq_step(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                        const int *ntokens, float *logits, tdm_error *err)
{
    const tdm_step_out o = {.logits = logits};
    return tdm_seq_step_out(seqs, nseq, tokens, ntokens, &o, err);
}

tdm_status tdm_seq_step_out(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                            const int *ntokens, const tdm_step_out *out, tdm_error *err)
{
    tdm_status rc = check_batch(seqs, nseq, 0, err);
    if (rc != TDM_OK)
        return rc;
    if (seqs[0]->ranks)
        return tdm_group_step(seqs, nseq, tokens, ntokens, 0, out, err);
    int *vr = tdm_xmalloc((size_t)nseq * sizeof(int));
    for (int i = 0; i < nseq; i++)
        vr[i] = ntokens[i] > 1;
    rc = run_rows(seqs, nseq, tokens, ntokens, vr, out, err);
    free(vr);
    return rc;
}

/* dst[i] = src[i] for i < n, in one backend call where it has one. */
static void copy_n(tdm_backend *be, int n, void *const *dst, const void *const *src,
                   const size_t *nbytes)
{
    if (be->copy_n) {
        if (n > 0)
            be->copy_n(be->ctx, n, dst, src, nbytes);
        return;
    }
    for (int i = 0; i < n; i++)
        be->copy(be->ctx, dst[i], src[i], nbytes[i]);
}

tdm_status tdm_seq_commit(tdm_seq *s, int n_accepted, tdm_error *err)
{
    if (s->ranks)
        return tdm_group_commit(s, n_accepted, err);
    if (!s->pending)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "commit without a pending verify");
    if (n_accepted < -1 || n_accepted >= s->pending)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "n_accepted %d is outside -1..%d (the verify carried %d drafts)",
                             n_accepted, s->pending - 1, s->pending - 1);
    tdm_model *m = s->m;
    int keep = n_accepted + 1, ran = s->pending;
    if (keep == 0) {
        /* Every pending row dropped: the committed states stayed put
         * (extra_buffer, replay) or come back from the checkpoint. */
        pending_abort(s);
        return TDM_OK;
    }
    s->pending = 0;
    if (s->p.strategy != TDM_STATE_NO_BUFFER) {
        /* Every linear layer's conv window after the last accepted row, and
         * its recurrent state: picked (extra_buffer) or replayed from the
         * record, all layers in one call (replay). */
        const int replay = s->p.strategy == TDM_STATE_REPLAY;
        const tdm_model_config *c = &m->cfg;
        enum { BATCH = 64 };
        void *dst[BATCH];
        const void *src[BATCH];
        size_t nb[BATCH];
        tdm_gdn_seg gs[BATCH];
        int n = 0, ng = 0;
        for (int L = 0; L < c->num_layers; L++) {
            if (!s->conv[L])
                continue;
            dst[n] = s->conv[L];
            src[n] = s->conv_x[L] + (size_t)n_accepted * conv_floats(m);
            nb[n++] = conv_floats(m) * sizeof(float);
            if (replay) {
                gs[ng++] = (tdm_gdn_seg){.nrows = keep, .state = s->rec[L], .inputs = s->rec_x[L]};
            } else {
                dst[n] = s->rec[L];
                src[n] = s->rec_x[L] + (size_t)n_accepted * rec_floats(m);
                nb[n++] = rec_floats(m) * sizeof(float);
            }
            if (n + 2 > BATCH) {
                copy_n(m->be, n, dst, src, nb);
                n = 0;
            }
            if (ng == BATCH) {
                m->be->gdn_replay(m->be->ctx, gs, ng, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                                  c->lin_v_dim);
                ng = 0;
            }
        }
        copy_n(m->be, n, dst, src, nb);
        if (ng > 0)
            m->be->gdn_replay(m->be->ctx, gs, ng, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                              c->lin_v_dim);
        s->n_past = s->base + keep; /* KV entries past it are simply overwritten later */
        return TDM_OK;
    }
    if (keep == ran) /* everything accepted: the in-place states are final */
        return TDM_OK;
    states_checkpoint(s, 0);
    s->n_past = s->base;
    const int32_t *t = s->pend_tokens;
    tdm_status rc = fwd_run(m, &s, 1, &t, &keep, 0, 0, NULL, err);
    if (rc != TDM_OK) {
        /* Leave a consistent sequence: the checkpoint. */
        states_checkpoint(s, 0);
        s->n_past = s->base;
        return tdm_error_prefix(err, "commit (state restored to before the verify)");
    }
    return TDM_OK;
}

void tdm_seq_memory_usage(const tdm_seq *s, tdm_seq_memory *mem)
{
    if (s->ranks) { /* one rank's: what one device holds */
        tdm_seq_memory_usage(s->ranks[0], mem);
        return;
    }
    const tdm_model *m = s->m;
    memset(mem, 0, sizeof(*mem));
    for (int L = 0; L < m->cfg.num_layers; L++) {
        if (s->k[L])
            mem->kv_bytes += 2 * (size_t)s->kv_cap * kv_width(m) * sizeof(float);
        if (s->conv[L]) {
            mem->conv_bytes += conv_floats(m) * sizeof(float);
            mem->recurrent_bytes += rec_floats(m) * sizeof(float);
            mem->strategy_bytes += (conv_x_floats(s) + rec_x_floats(s)) * sizeof(float);
        }
    }
}

/* ---- step buffers ------------------------------------------------------ */

tdm_status tdm_step_buf_reserve(tdm_step_buf *b, tdm_model *m, size_t rows, size_t logit_rows,
                                tdm_error *err)
{
    TDM_ASSERT(logit_rows <= rows);
    if (b->m && b->m != m)
        tdm_step_buf_free(b);
    if (logit_rows > b->logits_cap) {
        const size_t V = (size_t)m->cfg.vocab_size;
        float *p = tdm_model_host_alloc(m, logit_rows * V * sizeof(float));
        if (!p)
            return tdm_error_oom(err, logit_rows * V * sizeof(float), "the logits of %zu rows",
                                 logit_rows);
        if (b->logits)
            tdm_model_host_free(m, b->logits);
        b->logits = p;
        b->logits_cap = logit_rows;
    }
    if (rows > b->rows) {
        free(b->argmax);
        free(b->want);
        free(b->drawn);
        free(b->picked);
        b->argmax = tdm_xmalloc(rows * sizeof(int32_t));
        b->want = tdm_xmalloc(rows);
        b->drawn = tdm_xmalloc(rows * sizeof(int32_t));
        b->picked = tdm_xmalloc(rows * sizeof(float));
        b->rows = rows;
    }
    b->m = m;
    b->logit_rows = logit_rows;
    return TDM_OK;
}

void tdm_step_buf_free(tdm_step_buf *b)
{
    if (b->m && b->logits)
        tdm_model_host_free(b->m, b->logits);
    free(b->argmax);
    free(b->want);
    free(b->drawn);
    free(b->picked);
    *b = (tdm_step_buf){0};
}

tdm_step_out tdm_step_buf_out(const tdm_step_buf *b)
{
    return (tdm_step_out){.logits = b->logit_rows ? b->logits : NULL,
                          .want_logits = b->want,
                          .argmax = b->argmax,
                          .drawn = b->drawn,
                          .picked = b->picked};
}
