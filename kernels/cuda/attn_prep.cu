/*
 * attn_prep.cu - an attention layer's rows between its projections and attention, in one launch:
 * q and gate split from qg [R, nH, 2D] (each head's first and second D values), q and k
 * [R, nKV, D] RMS-normed per head (zero-centred weights [D]), rotate-half RoPE on the first
 * rot_dim dims at the row's position, the rotated k rows and the v rows into each segment's
 * caches at rows n_past ... (the caches' row stride nKV·D). k and v are only read.
 *
 * Invariants a change must keep:
 *  - A head's bits are a function of its own values, weights and position alone: never of R, of
 *    the segmentation or of which rows share the launch (decode, verify and prefill rows alike).
 *  - The norm is the plain RMSNorm's arithmetic for a row of D values (norm.cu at D <= 1024):
 *    lane l takes the 4-value groups l, l + 32, ... in order, sums their squares by fmaf, then a
 *    butterfly over the warp; y = (x · 1/rms) · (1 + w).
 *  - RoPE is the CPU backend's formula with accurate cosf/sinf of inv_freq[i] · position.
 *
 * Work split: a warp per (row, head) unit, rows in segment order (seglist.cuh), a row's nH query
 * heads first, then its nKV key heads (whose warp also copies the head's v row); PREP_WARPS
 * warps a block. A unit's values go
 * through the warp's D floats of shared memory between the norm and the rotation, which pairs
 * values a lane does not hold. D % 4 == 0, D <= 4 · 32 · PREP_MAX_G, 16-byte aligned rows.
 */
#include "attn_prep.cuh"
#include "seglist.cuh"

#include <math.h>
#include <stdint.h>

#define PREP_WARPS 4
#define PREP_MAX_G 4 /* 4-value groups a lane holds: D <= 512 */

typedef struct prep_args {
    float *q, *gate;
    const float *qg, *k, *v, *q_norm, *k_norm;
    const int32_t *pos;       /* staged, by row: [the last segment row + 1] */
    const float *inv_freq;    /* staged [rot / 2] */
    const tdm_attn_seg *segs; /* staged [nseg] */
    int nseg, R, nH, nKV, D, half; /* R: the segments' rows in all */
    float eps;
    int pad; /* 0 */
} prep_args;
/* Passed by value: no padding bytes (graph replays compare argument bytes). */
static_assert(sizeof(prep_args) == 10 * sizeof(void *) + 8 * sizeof(int), "prep_args is packed");

struct prep_units {
    __device__ int operator()(const tdm_attn_seg &s) const
    {
        return s.nrows;
    }
};

template <int G> __global__ void __launch_bounds__(PREP_WARPS * 32) prep_kernel(prep_args a)
{
    cuda_kernel_begin();
    __shared__ float4 buf4[PREP_WARPS][G * 32];
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int heads = a.nH + a.nKV;
    const long long u = (long long)blockIdx.x * PREP_WARPS + warp;
    if (u >= (long long)a.R * heads)
        return; /* the whole warp: no block barrier below */
    int first;
    const int si = cuda_seg_find(a.segs, a.nseg, (int)(u / heads), prep_units(), &first);
    const tdm_attn_seg sg = a.segs[si]; /* si >= 0: u is below the units */
    const int i = (int)(u / heads) - first, r = sg.row0 + i, h = (int)(u % heads);
    const int D = a.D, ng = D / 4;
    const bool isq = h < a.nH;
    const int kh = h - a.nH;
    const float *src = isq ? a.qg + ((size_t)r * (size_t)a.nH + (size_t)h) * 2 * (size_t)D
                           : a.k + ((size_t)r * (size_t)a.nKV + (size_t)kh) * (size_t)D;
    const float *w = isq ? a.q_norm : a.k_norm;
    float4 xv[G];
    float ss = 0.0f;
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int gi = lane + 32 * g;
        xv[g] = gi < ng ? *(const float4 *)(src + 4 * gi) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss = fmaf(xv[g].x, xv[g].x, ss);
        ss = fmaf(xv[g].y, xv[g].y, ss);
        ss = fmaf(xv[g].z, xv[g].z, ss);
        ss = fmaf(xv[g].w, xv[g].w, ss);
    }
    ss = cuda_warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)D + a.eps);
    float *buf = (float *)buf4[warp];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int gi = lane + 32 * g;
        if (gi < ng) {
            const float4 x = xv[g], wv = *(const float4 *)(w + 4 * gi);
            buf4[warp][gi] = make_float4((x.x * inv) * (1.0f + wv.x), (x.y * inv) * (1.0f + wv.y),
                                         (x.z * inv) * (1.0f + wv.z), (x.w * inv) * (1.0f + wv.w));
        }
    }
    __syncwarp();
    const float p = (float)a.pos[r];
    for (int i = lane; i < a.half; i += 32) {
        const float ang = a.inv_freq[i] * p;
        const float cs = cosf(ang), sn = sinf(ang);
        const float x1 = buf[i], x2 = buf[i + a.half];
        buf[i] = x1 * cs - x2 * sn;
        buf[i + a.half] = x2 * cs + x1 * sn;
    }
    __syncwarp();
    float *dst, *vdst = NULL;
    const float *vsrc = NULL;
    if (isq) {
        const size_t o = ((size_t)r * (size_t)a.nH + (size_t)h) * (size_t)D;
        dst = a.q + o;
        for (int gi = lane; gi < ng; gi += 32)
            *(float4 *)(a.gate + o + 4 * gi) = *(const float4 *)(src + D + 4 * gi);
    } else {
        const size_t at = ((size_t)(sg.n_past + i) * (size_t)a.nKV + (size_t)kh) * (size_t)D;
        dst = sg.k_cache + at;
        vdst = sg.v_cache + at;
        vsrc = a.v + ((size_t)r * (size_t)a.nKV + (size_t)kh) * (size_t)D;
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int gi = lane + 32 * g;
        if (gi < ng) {
            *(float4 *)(dst + 4 * gi) = buf4[warp][gi];
            if (vdst)
                *(float4 *)(vdst + 4 * gi) = *(const float4 *)(vsrc + 4 * gi);
        }
    }
}

void cuda_attn_prep(void *ctx, float *q, float *gate, const float *qg, const float *k,
                    const float *v, const float *q_norm, const float *k_norm, float eps,
                    const int32_t *positions, const float *inv_freq, int rot_dim,
                    const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    int R = 0, rows = 0; /* rows: the last segment row + 1 */
    for (int i = 0; i < nseg; i++) {
        R += segs[i].nrows;
        if (segs[i].nrows > 0 && segs[i].row0 + segs[i].nrows > rows)
            rows = segs[i].row0 + segs[i].nrows;
        TDM_ASSERT(((uintptr_t)segs[i].k_cache | (uintptr_t)segs[i].v_cache) % 16 == 0);
    }
    if (R == 0 || nH + nKV == 0)
        return;
    const uintptr_t bits = (uintptr_t)q | (uintptr_t)gate | (uintptr_t)qg | (uintptr_t)k |
                           (uintptr_t)v | (uintptr_t)q_norm | (uintptr_t)k_norm;
    TDM_ASSERT(D > 0 && D % 4 == 0 && D <= 128 * PREP_MAX_G && bits % 16 == 0);
    TDM_ASSERT(rot_dim >= 0 && rot_dim <= D && rot_dim % 2 == 0);
    const int half = rot_dim / 2;
    prep_args a = {};
    a.q = q;
    a.gate = gate;
    a.qg = qg;
    a.k = k;
    a.v = v;
    a.q_norm = q_norm;
    a.k_norm = k_norm;
    a.pos = (const int32_t *)cuda_stage(c, positions, (size_t)rows * sizeof(int32_t));
    a.inv_freq =
        half > 0 ? (const float *)cuda_stage(c, inv_freq, (size_t)half * sizeof(float)) : NULL;
    a.segs = (const tdm_attn_seg *)cuda_stage(c, segs, (size_t)nseg * sizeof(tdm_attn_seg));
    a.nseg = nseg;
    a.R = R;
    a.nH = nH;
    a.nKV = nKV;
    a.D = D;
    a.half = half;
    a.eps = eps;
    const size_t units = (size_t)R * (size_t)(nH + nKV);
    const unsigned blocks = cuda_blocks(units, PREP_WARPS);
    const int g = (D / 4 + 31) / 32;
    if (g <= 1)
        cuda_launch(c, prep_kernel<1>, blocks, PREP_WARPS * 32, 0, a);
    else if (g <= 2)
        cuda_launch(c, prep_kernel<2>, blocks, PREP_WARPS * 32, 0, a);
    else
        cuda_launch(c, prep_kernel<PREP_MAX_G>, blocks, PREP_WARPS * 32, 0, a);
}
