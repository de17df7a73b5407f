/*
 * cpu_backend.c - the CPU implementation of backend.h: fp32 arithmetic over
 * host memory, heavy ops (matmul, attention, gated delta rule) spread over a
 * persistent pool. Row results never depend on how rows are batched.
 */
#include "cpu_internal.h"
#include "alloc.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef CPU_ASAN
#include <sanitizer/asan_interface.h>
#include <stdio.h>

void cpu_check_range(const void *p, size_t bytes, const char *what)
{
    void *bad = __asan_region_is_poisoned((void *)(uintptr_t)p, bytes);
    if (!bad)
        return;
    fprintf(stderr, "cpu backend: %s: %zu bytes from %p reach poisoned memory at %p\n", what, bytes,
            p, bad);
    __asan_describe_address(bad);
    abort();
}
#endif

/* --- memory ------------------------------------------------------------- */

#ifdef CPU_ASAN
static void cpu_poison(void *p, size_t n, int poison)
{
    if (poison)
        __asan_poison_memory_region(p, n);
    else
        __asan_unpoison_memory_region(p, n);
}
#else
static void cpu_poison(void *p, size_t n, int poison)
{
    (void)p;
    (void)n;
    (void)poison;
}
#endif

/* Every block carries a 64-byte header holding the length of its mapping,
 * or 0 for a heap block. Blocks of a MiB and more are mapped: the kernel
 * hands out their zero pages as they are first touched, so state reserved
 * for positions a sequence has not reached yet (capacity.h) or a workspace
 * sized for the largest step costs no memory until it is used. */
#define CPU_BLOCK_HEADER 64
#define CPU_MAP_MIN ((size_t)1 << 20)

/* A mapping's length to its last page's end. */
static size_t cpu_map_span(size_t len)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (len + page - 1) / page * page;
}

static void *cpu_alloc(void *ctx, size_t nbytes)
{
    (void)ctx;
    /* 64-byte alignment for SIMD loads and to keep rows off shared lines. */
    size_t n = (nbytes + 63) & ~(size_t)63;
    if (!n)
        n = 64;
    const size_t len = n + CPU_BLOCK_HEADER;
    char *base;
    if (n >= CPU_MAP_MIN) {
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        base = m;
        *(size_t *)base = len;
    } else {
        base = aligned_alloc(64, len);
        if (!base)
            return NULL;
        memset(base, 0, len);
    }
    /* Under AddressSanitizer the header and everything past nbytes (the
     * rounding, and a mapping's last page) are poisoned, as the heap's
     * redzones would be: a read or write past a buffer is reported, also in
     * a mapped block, which has no redzones of its own. */
    const size_t span = n >= CPU_MAP_MIN ? cpu_map_span(len) : len;
    cpu_poison(base, CPU_BLOCK_HEADER, 1);
    cpu_poison(base + CPU_BLOCK_HEADER + nbytes, span - CPU_BLOCK_HEADER - nbytes, 1);
    return base + CPU_BLOCK_HEADER;
}

static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    if (!p)
        return;
    char *base = (char *)p - CPU_BLOCK_HEADER;
    cpu_poison(base, CPU_BLOCK_HEADER, 0);
    const size_t len = *(size_t *)base;
    if (len) {
        /* a mapping's shadow outlives it: the next one there starts clean */
        cpu_poison(base, cpu_map_span(len), 0);
        munmap(base, len);
    } else {
        free(base);
    }
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t n)
{
    (void)ctx;
    if (n)
        memmove(dst, src, n);
}

static const void *cpu_weight_map(void *ctx, const void *host, size_t nbytes, int *owned)
{
    (void)ctx;
    (void)nbytes;
    *owned = 0;
    return host;
}

static void cpu_sync(void *ctx)
{
    (void)ctx;
}

static void *cpu_host_alloc(void *ctx, size_t nbytes)
{
    (void)ctx;
    return malloc(nbytes ? nbytes : 1);
}

static void cpu_host_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static int cpu_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    (void)ctx;
    return tdm_host_memory(free_bytes, total_bytes, NULL);
}

/* --- elementwise and row ops -------------------------------------------- */

static void cpu_embed(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H)
{
    (void)ctx;
    for (int r = 0; r < R; r++) {
        size_t off = (size_t)ids[r] * (size_t)H;
        float *yr = y + (size_t)r * (size_t)H;
        if (ids[r] < 0) { /* a token another rank's slice holds */
            memset(yr, 0, (size_t)H * sizeof(float));
        } else if (e.dtype == TDM_DTYPE_BF16) {
            const uint16_t *w = (const uint16_t *)e.data + off;
            for (int i = 0; i < H; i++)
                yr[i] = cpu_bf16_to_f32(w[i]);
        } else if (e.dtype == TDM_DTYPE_FP8) {
            const uint8_t *w = (const uint8_t *)e.data + off;
            const float scale = ldexpf(1.0f, e.scale_exp);
            for (int i = 0; i < H; i++)
                yr[i] = cpu_fp8_to_f32(w[i], scale);
        } else {
            memcpy(yr, (const float *)e.data + off, (size_t)H * sizeof(float));
        }
    }
}

static void cpu_matmul_slot(void *ctx, float *y, const float *x, tdm_weight w, int R, int in,
                            int out, int accumulate)
{
    cpu_matmul(ctx, y, x, w, R, in, out, accumulate);
}

static void cpu_rmsnorm(void *ctx, float *y, const float *x, const float *w, int R, int n,
                        float eps, int zero_centred)
{
    (void)ctx;
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * (size_t)n;
        float *yr = y + (size_t)r * (size_t)n;
        float ss = 0;
        for (int i = 0; i < n; i++)
            ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++)
            yr[i] = (xr[i] * inv) * (zero_centred ? 1.0f + w[i] : w[i]);
    }
}

static inline float silu(float v)
{
    return v / (1.0f + expf(-v));
}

static inline float sigmoid(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

static void cpu_rmsnorm_gated(void *ctx, float *y, const float *x, const float *z, const float *w,
                              int R, int n, float eps)
{
    (void)ctx;
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * (size_t)n;
        const float *zr = z + (size_t)r * (size_t)n;
        float *yr = y + (size_t)r * (size_t)n;
        float ss = 0;
        for (int i = 0; i < n; i++)
            ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++)
            yr[i] = (w[i] * (xr[i] * inv)) * silu(zr[i]);
    }
}

static void cpu_split_qgate(void *ctx, float *q, float *gate, const float *qg, int R, int nH, int D)
{
    (void)ctx;
    for (int r = 0; r < R; r++)
        for (int h = 0; h < nH; h++) {
            const float *src = qg + ((size_t)r * (size_t)nH + (size_t)h) * 2 * (size_t)D;
            size_t dst = ((size_t)r * (size_t)nH + (size_t)h) * (size_t)D;
            memcpy(q + dst, src, (size_t)D * sizeof(float));
            memcpy(gate + dst, src + D, (size_t)D * sizeof(float));
        }
}

static void cpu_rope(void *ctx, float *x, const int32_t *pos, const float *inv_freq, int R, int nH,
                     int D, int rot)
{
    (void)ctx;
    int half = rot / 2;
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < half; i++) {
            /* fp32 angle as the reference computes it: inv_freq * position. */
            float ang = inv_freq[i] * (float)pos[r];
            float c = cosf(ang), s = sinf(ang);
            for (int h = 0; h < nH; h++) {
                float *xh = x + ((size_t)r * (size_t)nH + (size_t)h) * (size_t)D;
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c - x2 * s;
                xh[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

/* The split, norms and rotations of an attention layer's rows; k's rows are
 * normed and rotated in the caches, where they are copied first. */
static void cpu_attn_prep(void *ctx, float *q, float *gate, const float *qg, const float *k,
                          const float *v, const float *q_norm, const float *k_norm, float eps,
                          const int32_t *pos, const float *inv_freq, int rot,
                          const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D)
{
    const size_t W = (size_t)nKV * (size_t)D, QW = (size_t)nH * (size_t)D;
    for (int i = 0; i < nseg; i++) {
        const tdm_attn_seg *sg = &segs[i];
        const int n = sg->nrows;
        float *qr = q + (size_t)sg->row0 * QW;
        cpu_split_qgate(ctx, qr, gate + (size_t)sg->row0 * QW, qg + (size_t)sg->row0 * 2 * QW, n,
                        nH, D);
        cpu_rmsnorm(ctx, qr, qr, q_norm, n * nH, D, eps, 1);
        cpu_rope(ctx, qr, pos + sg->row0, inv_freq, n, nH, D, rot);
        float *kc = sg->k_cache + (size_t)sg->n_past * W, *vc = sg->v_cache + (size_t)sg->n_past * W;
        memcpy(kc, k + (size_t)sg->row0 * W, (size_t)n * W * sizeof(float));
        memcpy(vc, v + (size_t)sg->row0 * W, (size_t)n * W * sizeof(float));
        cpu_rmsnorm(ctx, kc, kc, k_norm, n * nKV, D, eps, 1);
        cpu_rope(ctx, kc, pos + sg->row0, inv_freq, n, nKV, D, rot);
    }
}

static void cpu_silu_mul(void *ctx, float *y, const float *a, const float *b, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        y[i] = silu(a[i]) * b[i];
}

/* The delta rule's gates of row r, v-head h (backend.h gdn_recurrent). */
static void gdn_gate(const tdm_gdn_gates *gt, size_t i, int h, float *g, float *beta)
{
    float u = gt->a[i] + gt->dt_bias[h];
    /* torch softplus(beta=1, threshold=20) */
    float sp = u > 20.0f ? u : log1pf(expf(u));
    *g = -expf(gt->A_log[h]) * sp;
    *beta = sigmoid(gt->b[i]);
}

static void cpu_conv_silu(void *ctx, float *y, const float *x, const float *w,
                          const tdm_conv_seg *segs, int nseg, int C, int K)
{
    (void)ctx;
    const int S = K - 1;
    for (int si = 0; si < nseg; si++) {
        const tdm_conv_seg *sg = &segs[si];
        for (int i = 0; i < sg->nrows; i++) {
            float *yr = y + (size_t)(sg->row0 + i) * (size_t)C;
            for (int c = 0; c < C; c++) {
                float acc = 0;
                for (int j = 0; j < K; j++) {
                    int m = i - S + j; /* input index relative to the segment */
                    float v = m < 0 ? sg->state[(size_t)(S + m) * (size_t)C + (size_t)c]
                                    : x[(size_t)(sg->row0 + m) * (size_t)C + (size_t)c];
                    acc += w[(size_t)c * (size_t)K + (size_t)j] * v;
                }
                yr[c] = silu(acc);
            }
            if (sg->states_out) {
                /* state after row i: inputs i-S+1 .. i */
                float *so = sg->states_out + (size_t)i * (size_t)S * (size_t)C;
                for (int j = 0; j < S; j++) {
                    int m = i - S + 1 + j;
                    const float *src = m < 0 ? sg->state + (size_t)(S + m) * (size_t)C
                                             : x + (size_t)(sg->row0 + m) * (size_t)C;
                    memcpy(so + (size_t)j * (size_t)C, src, (size_t)C * sizeof(float));
                }
            }
        }
        if (!sg->states_out && sg->nrows > 0) {
            int n = sg->nrows;
            for (int j = 0; j < S; j++) {
                int m = n - S + j;
                /* rows move forward, so reading index S+m >= j is safe in place */
                if (m < 0)
                    memmove(sg->state + (size_t)j * (size_t)C,
                            sg->state + (size_t)(S + m) * (size_t)C, (size_t)C * sizeof(float));
                else
                    memcpy(sg->state + (size_t)j * (size_t)C,
                           x + (size_t)(sg->row0 + m) * (size_t)C, (size_t)C * sizeof(float));
            }
        }
    }
}

/* --- gated delta rule -------------------------------------------------- */

typedef struct gdn_args {
    float *out;
    const float *qkv;
    int stride;
    tdm_gdn_gates gt;
    const tdm_gdn_seg *segs;
    int nseg, Hk, Hv, Dk, Dv;
} gdn_args;

/* 1/|x| of a row's q or k (eps 1e-6). */
static float gdn_inorm(const float *x, int Dk)
{
    float s = 0;
    for (int d = 0; d < Dk; d++)
        s += x[d] * x[d];
    return 1.0f / sqrtf(s + 1e-6f);
}

/* out[e] = Σ_d S[d, e]·x[d] over S [Dk, Dv], d in increasing order. */
CPU_UNCHECKED static void gdn_st_dot(const float *S, const float *x, int Dk, int Dv, float *out)
{
    for (int e = 0; e < Dv; e++)
        out[e] = 0;
    for (int d = 0; d < Dk; d++) {
        const float *Sr = S + (size_t)d * (size_t)Dv;
        for (int e = 0; e < Dv; e++)
            out[e] += Sr[e] * x[d];
    }
}

/* One position of one v-head: S [Dk, Dv] *= decay, then the delta rule's
 * update with k as read, ik = gdn_inorm(k), and v; kn gets the normalised
 * k, kv is scratch. The recurrent rows and a replay both go through here, so
 * a replayed state is bit for bit the one the rows left. */
CPU_UNCHECKED static void gdn_advance(float *S, const float *k, float ik, const float *v,
                                      float decay, float beta, int Dk, int Dv, float *kn, float *kv)
{
    for (int d = 0; d < Dk; d++)
        kn[d] = k[d] * ik;
    const size_t hs = (size_t)Dk * (size_t)Dv;
    for (size_t j = 0; j < hs; j++)
        S[j] *= decay;
    gdn_st_dot(S, kn, Dk, Dv, kv);
    for (int e = 0; e < Dv; e++)
        kv[e] = (v[e] - kv[e]) * beta; /* delta */
    for (int d = 0; d < Dk; d++) {
        float *Sr = S + (size_t)d * (size_t)Dv;
        for (int e = 0; e < Dv; e++)
            Sr[e] += kn[d] * kv[e];
    }
}

/* S advanced by record rows 0 .. n-1 of v-head hv. */
static void gdn_replay_rows(float *S, const float *rec, int n, int hv, int Hk, int Hv, int Dk,
                            int Dv, float *kn, float *kv)
{
    const int hk = hv / (Hv / Hk);
    const size_t kd = (size_t)Hk * (size_t)Dk, vd = (size_t)Hv * (size_t)Dv;
    cpu_check_range(S, (size_t)Dk * (size_t)Dv * sizeof(float), "delta rule state");
    cpu_check_range(rec, (size_t)n * tdm_gdn_input_floats(Hk, Hv, Dk, Dv) * sizeof(float),
                    "delta rule record");
    for (int i = 0; i < n; i++) {
        const float *r = rec + (size_t)i * tdm_gdn_input_floats(Hk, Hv, Dk, Dv);
        gdn_advance(S, r + (size_t)hk * (size_t)Dk, r[kd + vd + 2 * (size_t)Hv + (size_t)hk],
                    r + kd + (size_t)hv * (size_t)Dv, r[kd + vd + hv], r[kd + vd + (size_t)Hv + hv],
                    Dk, Dv, kn, kv);
    }
}

static void gdn_task(void *vp, int u)
{
    const gdn_args *a = vp;
    const int Dk = a->Dk, Dv = a->Dv, Hk = a->Hk, Hv = a->Hv, r = a->Hv / a->Hk;
    const size_t hs = (size_t)Dk * (size_t)Dv; /* one head's state */
    float qn[512], kn[512], kv[512];
    const float scale = 1.0f / sqrtf((float)Dk);
    const tdm_gdn_seg *sg = &a->segs[u / Hv];
    const int hv = u % Hv, hk = hv / r;
    const size_t kd = (size_t)Hk * (size_t)Dk, vd = (size_t)Hv * (size_t)Dv;
    const float *prev = sg->state + (size_t)hv * hs;
    float *scratch = NULL; /* a record's rows run on a copy: the state stays */
    if (sg->inputs && !sg->states_out && sg->nrows > 0) {
        scratch = tdm_xmalloc(hs * sizeof(float));
        memcpy(scratch, prev, hs * sizeof(float));
        gdn_replay_rows(scratch, sg->inputs, sg->replayed, hv, Hk, Hv, Dk, Dv, kn, kv);
        prev = scratch;
    }
    for (int i = 0; i < sg->nrows; i++) {
        size_t row = (size_t)(sg->row0 + i);
        float *S = sg->states_out ? sg->states_out + ((size_t)i * (size_t)Hv + (size_t)hv) * hs
                   : scratch      ? scratch
                                  : sg->state + (size_t)hv * hs;
        if (S != prev)
            memcpy(S, prev, hs * sizeof(float));
        const float *q = a->qkv + row * (size_t)a->stride + (size_t)hk * (size_t)Dk;
        const float *k = q + kd;
        const float *v = a->qkv + row * (size_t)a->stride + 2 * kd + (size_t)hv * (size_t)Dv;
        const float iq = gdn_inorm(q, Dk);
        for (int d = 0; d < Dk; d++)
            qn[d] = (q[d] * iq) * scale;
        float g, b;
        gdn_gate(&a->gt, row * (size_t)Hv + (size_t)hv, hv, &g, &b);
        const float decay = expf(g), ik = gdn_inorm(k, Dk);
        float *out = a->out + (row * (size_t)Hv + (size_t)hv) * (size_t)Dv;
        cpu_check_range(S, hs * sizeof(float), "delta rule state");
        cpu_check_range(v, (size_t)Dv * sizeof(float), "delta rule v");
        cpu_check_range(out, (size_t)Dv * sizeof(float), "delta rule output");
        gdn_advance(S, k, ik, v, decay, b, Dk, Dv, kn, kv);
        gdn_st_dot(S, qn, Dk, Dv, out);
        if (sg->inputs) {
            /* the record's row: k by the first v-head of its k-head */
            float *rr =
                sg->inputs + (size_t)(sg->replayed + i) * tdm_gdn_input_floats(Hk, Hv, Dk, Dv);
            if (hv % r == 0) {
                memcpy(rr + (size_t)hk * (size_t)Dk, k, (size_t)Dk * sizeof(float));
                rr[kd + vd + 2 * (size_t)Hv + (size_t)hk] = ik;
            }
            memcpy(rr + kd + (size_t)hv * (size_t)Dv, v, (size_t)Dv * sizeof(float));
            rr[kd + vd + (size_t)hv] = decay;
            rr[kd + vd + (size_t)Hv + (size_t)hv] = b;
        }
        prev = S;
    }
    free(scratch);
}

static void cpu_gdn_recurrent(void *ctx, float *out, const float *qkv, int stride, tdm_gdn_gates gt,
                              const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk, int Dv)
{
    cpu_ctx *c = ctx;
    TDM_ASSERT(Dk <= 512 && Dv <= 512);
    gdn_args a = {out, qkv, stride, gt, segs, nseg, Hk, Hv, Dk, Dv};
    tdm_pool_run(c->pool, gdn_task, &a, nseg * Hv);
}

static void gdn_replay_task(void *vp, int u)
{
    const gdn_args *a = vp;
    float kn[512], kv[512];
    const tdm_gdn_seg *sg = &a->segs[u / a->Hv];
    const int hv = u % a->Hv;
    gdn_replay_rows(sg->state + (size_t)hv * (size_t)a->Dk * (size_t)a->Dv, sg->inputs, sg->nrows,
                    hv, a->Hk, a->Hv, a->Dk, a->Dv, kn, kv);
}

static void cpu_gdn_replay(void *ctx, const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk,
                           int Dv)
{
    cpu_ctx *c = ctx;
    TDM_ASSERT(Dk <= 512 && Dv <= 512);
    gdn_args a = {.segs = segs, .nseg = nseg, .Hk = Hk, .Hv = Hv, .Dk = Dk, .Dv = Dv};
    tdm_pool_run(c->pool, gdn_replay_task, &a, nseg * Hv);
}

/* --- attention ------------------------------------------------------------ */

typedef struct attn_args {
    float *out;
    const float *q, *gate;
    const tdm_attn_seg *segs;
    int nseg, nH, nKV, D;
} attn_args;

/* Keys scored a tile at a time: the running maximum (and the rescale of the
 * output it brings) moves once per tile, not once per key. */
#define ATT_TILE 32
#define ATT_CPU_MAXD 1024

/* q · k over n floats in eight interleaved partial sums, combined in a fixed
 * order: the compiler turns it into vector instructions, and the result
 * depends on the two rows alone, never on the batch. */
static inline float attn_dot(const float *q, const float *k, int n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            s[l] += q[i + l] * k[i + l];
    float t = 0;
    for (; i < n; i++)
        t += q[i] * k[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + t;
}

/* o += p * v over n floats, eight at a time (vectorised like attn_dot; each
 * element is one multiply-add either way). */
static inline void attn_axpy(float *restrict o, float p, const float *restrict v, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            o[i + l] += p * v[i + l];
    for (; i < n; i++)
        o[i] += p * v[i];
}

static void attn_task(void *vp, int u)
{
    const attn_args *a = vp;
    const int nH = a->nH, D = a->D, grp = a->nH / a->nKV;
    const size_t kvw = (size_t)a->nKV * (size_t)D;
    const float scale = 1.0f / sqrtf((float)D);
    /* Map the unit to (segment, row, head) by walking segments: rows are few. */
    int row_unit = u / nH, h = u % nH, si = 0, acc = 0;
    while (acc + a->segs[si].nrows <= row_unit)
        acc += a->segs[si++].nrows;
    const tdm_attn_seg *sg = &a->segs[si];
    int i = row_unit - acc, n = sg->n_past + i + 1, kh = h / grp;
    size_t row = (size_t)(sg->row0 + i);
    const float *q = a->q + (row * (size_t)nH + (size_t)h) * (size_t)D;
    float *o = a->out + (row * (size_t)nH + (size_t)h) * (size_t)D;
    const float *kc = sg->k_cache + (size_t)kh * (size_t)D;
    const float *vc = sg->v_cache + (size_t)kh * (size_t)D;
    /* One pass with a running maximum (online softmax): no scratch of the
     * context's length, whatever the context. */
    /* The output accumulates in a local row (no alias with the caches: the
     * compiler vectorises its updates); D is at most ATT_CPU_MAXD. */
    float mx = -INFINITY, sum = 0, sc[ATT_TILE], ob[ATT_CPU_MAXD];
    TDM_ASSERT(D <= ATT_CPU_MAXD);
    for (int d = 0; d < D; d++)
        ob[d] = 0;
    for (int j0 = 0; j0 < n; j0 += ATT_TILE) {
        const int nt = n - j0 < ATT_TILE ? n - j0 : ATT_TILE;
        float tmax = -INFINITY;
        for (int t = 0; t < nt; t++) {
            sc[t] = attn_dot(q, kc + (size_t)(j0 + t) * kvw, D) * scale;
            tmax = sc[t] > tmax ? sc[t] : tmax;
        }
        if (tmax > mx) {
            float c = expf(mx - tmax); /* 0 on the first tile */
            sum *= c;
            for (int d = 0; d < D; d++)
                ob[d] *= c;
            mx = tmax;
        }
        for (int t = 0; t < nt; t++) {
            float p = expf(sc[t] - mx);
            sum += p;
            attn_axpy(ob, p, vc + (size_t)(j0 + t) * kvw, D);
        }
    }
    float inv = 1.0f / sum;
    for (int d = 0; d < D; d++)
        o[d] = ob[d] * inv;
    if (a->gate) {
        const float *g = a->gate + (row * (size_t)nH + (size_t)h) * (size_t)D;
        for (int d = 0; d < D; d++)
            o[d] = o[d] * sigmoid(g[d]);
    }
}

static void cpu_attention(void *ctx, float *out, const float *q, const float *gate,
                          const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D)
{
    cpu_ctx *c = ctx;
    int rows = 0;
    for (int i = 0; i < nseg; i++)
        rows += segs[i].nrows;
    attn_args a = {out, q, gate, segs, nseg, nH, nKV, D};
    tdm_pool_run(c->pool, attn_task, &a, rows * nH);
}

/* --- sampling helpers ----------------------------------------------------- */

static void cpu_argmax(void *ctx, int32_t *out, const float *x, int R, int n)
{
    (void)ctx;
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * (size_t)n;
        int best = 0;
        for (int i = 1; i < n; i++)
            if (xr[i] > xr[best])
                best = i;
        out[r] = best;
    }
}

static void cpu_argmax_to(void *ctx, int32_t *out, const float *x, const int32_t *rows, int nrows,
                          int n, const int32_t *map)
{
    for (int i = 0; i < nrows; i++) {
        cpu_argmax(ctx, out + i, x + (size_t)rows[i] * (size_t)n, 1, n);
        if (map)
            out[i] = map[out[i]];
    }
}

/* Backend memory is host memory here: the ids are read as they are. */
static void cpu_embed_dev(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H)
{
    cpu_embed(ctx, y, e, ids, R, H);
}

static void cpu_softmax(void *ctx, float *x, int R, int n)
{
    (void)ctx;
    for (int r = 0; r < R; r++) {
        float *xr = x + (size_t)r * (size_t)n;
        float mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++)
            mx = xr[i] > mx ? xr[i] : mx;
        for (int i = 0; i < n; i++) {
            xr[i] = expf(xr[i] - mx);
            sum += xr[i];
        }
        for (int i = 0; i < n; i++)
            xr[i] /= sum;
    }
}

/* --- lifetime ----------------------------------------------------------- */

static void cpu_destroy(tdm_backend *be)
{
    if (!be)
        return;
    cpu_ctx *c = be->ctx;
    tdm_pool_destroy(c->pool);
    free(c);
    free(be);
}

int tdm_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

tdm_backend *tdm_backend_cpu_create(int nthreads)
{
    if (nthreads <= 0)
        nthreads = tdm_cpu_count();
    tdm_backend *be = calloc(1, sizeof(*be));
    cpu_ctx *c = calloc(1, sizeof(*c));
    if (!be || !c || !(c->pool = tdm_pool_create(nthreads, true))) {
        free(be);
        free(c);
        return NULL;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    c->use_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    if (getenv("TANDEM_CPU_NO_SIMD"))
        c->use_avx2 = 0;
    be->name = "cpu";
    be->ctx = c;
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->copy = cpu_copy;
    be->weight_map = cpu_weight_map;
    be->sync = cpu_sync;
    be->host_alloc = cpu_host_alloc;
    be->host_free = cpu_host_free;
    be->mem_info = cpu_mem_info;
    /* graph_begin / graph_end stay NULL: every op runs as it is called. */
    be->embed = cpu_embed;
    be->matmul = cpu_matmul_slot;
    be->rmsnorm = cpu_rmsnorm;
    be->rmsnorm_gated = cpu_rmsnorm_gated;
    be->attn_prep = cpu_attn_prep;
    be->attention = cpu_attention;
    be->silu_mul = cpu_silu_mul;
    be->conv_silu = cpu_conv_silu;
    be->gdn_recurrent = cpu_gdn_recurrent;
    be->gdn_replay = cpu_gdn_replay;
    be->argmax = cpu_argmax;
    be->argmax_to = cpu_argmax_to;
    be->embed_dev = cpu_embed_dev;
    be->softmax = cpu_softmax;
    be->sample = cpu_sample;
    be->sample_to = cpu_sample_to;
    return be;
}
