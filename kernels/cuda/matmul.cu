/*
 * matmul.cu - y [R,out] (+)= x [R,in] · wᵀ, w [out,in] in bf16, fp16 or fp32,
 * fp32 accumulation.
 *
 * One block per (MM_COLS output columns, up to MM_ROWS rows; 2, 8 or 16 by R), with KW warps
 * splitting k (KW from `in` alone). Lane l of warp w owns the 8-element
 * groups j = 32w + l, then + 32·KW, ... of k and accumulates them in
 * increasing k with fmaf; the warp sums its lanes in a fixed butterfly and
 * the block its warps in warp order. That order depends on nothing but `in`,
 * so a row's result is the
 * same bits whatever R is and however the rows are batched (backend.h), and
 * the weights of a column stream from memory once per MM_ROWS rows (decode
 * and verify blocks read them once). Blocks that share columns are adjacent
 * in launch order so longer prefills find the weights in L2.
 *
 * Precision: fp32 products of the exact weight values; no rounding of the
 * activations to bf16 (cuBLAS' bf16 tensor-core path would round them, an
 * error of ~4e-3 relative per product).
 */
#include "matmul.cuh"

#define MM_COLS 4   /* columns per block: each x load serves 4 columns */
#define MM_KWARPS 8 /* at most this many warps split k */

/* 8 consecutive weights from element i (vector path: i multiple of 8, aligned). */
__device__ __forceinline__ void mm_load8(const void *w, tdm_dtype dt, size_t i, float *f)
{
    if (dt == TDM_DTYPE_F32) {
        float4 a = __ldg((const float4 *)((const float *)w + i));
        float4 b = __ldg((const float4 *)((const float *)w + i + 4));
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
        f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
        return;
    }
    uint4 u = __ldg((const uint4 *)((const uint16_t *)w + i));
    const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (dt == TDM_DTYPE_BF16) {
            f[2 * j] = __uint_as_float(p[j] << 16);
            f[2 * j + 1] = __uint_as_float(p[j] & 0xffff0000u);
        } else {
            f[2 * j] = __half2float(__ushort_as_half((unsigned short)(p[j] & 0xffffu)));
            f[2 * j + 1] = __half2float(__ushort_as_half((unsigned short)(p[j] >> 16)));
        }
    }
}

/* acc[c][r] += the 8 products of group k of row r and column c, in k order. */
template <int MM_ROWS>
__device__ __forceinline__ void mm_group(float (*acc)[MM_ROWS], float (*wv)[8], const float *xb,
                                         int in, int k, int nr)
{
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        if (r < nr) {
            const float4 *xp = (const float4 *)(xb + (size_t)r * (size_t)in + k);
            const float4 a = __ldg(xp), b = __ldg(xp + 1);
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int c = 0; c < MM_COLS; c++) {
                float s = acc[c][r];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    s = fmaf(wv[c][j], xv[j], s);
                acc[c][r] = s;
            }
        }
    }
}

/* Warps that split k: each lane gets at least two 8-element groups; a
 * function of `in` alone, so the order of additions is too. */
static int mm_kwarps(int in)
{
    int kw = (in + 7) / 8 / 64;
    return kw < 1 ? 1 : kw > MM_KWARPS ? MM_KWARPS : kw;
}

/* Block: KW warps x 32 lanes over k, MM_COLS columns, up to MM_ROWS rows.
 * Linear block index = column block * row chunks + row chunk, so the blocks
 * that share columns run next to each other (weights reused from L2). */
template <int MM_ROWS>
__global__ void __launch_bounds__(MM_KWARPS * 32)
    mm_kernel(float *__restrict__ y, const float *__restrict__ x, const void *w, tdm_dtype dt,
              int R, int in, int out, int accumulate, int vec, int nchunks)
{
    cuda_kernel_begin();
    __shared__ float red[MM_KWARPS][MM_COLS][MM_ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kw = blockDim.x >> 5;
    const int o0 = (int)(blockIdx.x / (unsigned)nchunks) * MM_COLS;
    const int r0 = (int)(blockIdx.x % (unsigned)nchunks) * MM_ROWS;
    const int nr = min(MM_ROWS, R - r0), nc = min(MM_COLS, out - o0);
    const float *xb = x + (size_t)r0 * (size_t)in;
    float acc[MM_COLS][MM_ROWS];
#pragma unroll
    for (int c = 0; c < MM_COLS; c++)
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++)
            acc[c][r] = 0.0f;
    const int ngroups = (in + 7) / 8, step = 32 * kw;
    int g = warp * 32 + lane;
    if (vec) {
        /* Two groups of every column in flight per lane, then the rest one by
         * one; the order of additions per lane is increasing k either way. */
        for (; g + step < ngroups; g += 2 * step) {
            float wv[2][MM_COLS][8];
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int c = 0; c < MM_COLS; c++) {
                    if (c < nc)
                        mm_load8(w, dt, (size_t)(o0 + c) * (size_t)in + (size_t)(g + step * u) * 8,
                                 wv[u][c]);
                    else
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            wv[u][c][j] = 0.0f;
                }
#pragma unroll
            for (int u = 0; u < 2; u++)
                mm_group<MM_ROWS>(acc, wv[u], xb, in, (g + step * u) * 8, nr);
        }
        for (; g < ngroups; g += step) {
            float wv[MM_COLS][8];
#pragma unroll
            for (int c = 0; c < MM_COLS; c++) {
                if (c < nc)
                    mm_load8(w, dt, (size_t)(o0 + c) * (size_t)in + (size_t)g * 8, wv[c]);
                else
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        wv[c][j] = 0.0f;
            }
            mm_group<MM_ROWS>(acc, wv, xb, in, g * 8, nr);
        }
    } else {
        /* Unaligned or odd sizes: the same groups and order, scalar loads. */
        for (; g < ngroups; g += step) {
            const int k0 = g * 8, k1 = min(k0 + 8, in);
            for (int k = k0; k < k1; k++) {
#pragma unroll
                for (int c = 0; c < MM_COLS; c++) {
                    if (c < nc) {
                        const float wk = cuda_wload(w, dt, (size_t)(o0 + c) * (size_t)in + k);
#pragma unroll
                        for (int r = 0; r < MM_ROWS; r++)
                            if (r < nr)
                                acc[c][r] = fmaf(wk, xb[(size_t)r * (size_t)in + k], acc[c][r]);
                    }
                }
            }
        }
    }
    /* Lanes by butterfly, then warps in warp order. */
#pragma unroll
    for (int c = 0; c < MM_COLS; c++)
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++) {
            const float s = cuda_warp_sum(acc[c][r]);
            if (lane == 0)
                red[warp][c][r] = s;
        }
    __syncthreads();
    for (int t = threadIdx.x; t < MM_COLS * MM_ROWS; t += blockDim.x) {
        const int c = t / MM_ROWS, r = t % MM_ROWS;
        if (c < nc && r < nr) {
            float s = red[0][c][r];
            for (int i = 1; i < kw; i++)
                s += red[i][c][r];
            float *yp = y + (size_t)(r0 + r) * (size_t)out + (size_t)(o0 + c);
            *yp = accumulate ? *yp + s : s;
        }
    }
}

void cuda_matmul(void *ctx, float *y, const float *x, tdm_weight w, int R, int in, int out,
                 int accumulate)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || out <= 0)
        return;
    /* The vector path needs every row of w and x 16-byte aligned. */
    const int vec = in % 8 == 0 && ((uintptr_t)w.data % 16) == 0 && ((uintptr_t)x % 16) == 0;
    /* Rows per block: the fewest that hold the whole call (up to 16), so a
     * verify block of k <= 15 streams the weights once and a decode step
     * keeps few registers. Each row's arithmetic is the same in every
     * variant. */
    const int rows = R <= 2 ? 2 : R <= 8 ? 8 : 16;
    const int nchunks = (R + rows - 1) / rows, kw = mm_kwarps(in);
    const size_t blocks = (size_t)((out + MM_COLS - 1) / MM_COLS) * (size_t)nchunks;
    TDM_ASSERT(blocks < (1u << 31));
#define MM_LAUNCH(N)                                                                               \
    cuda_launch(c, mm_kernel<N>, (unsigned)blocks, (unsigned)kw * 32, 0, y, x, w.data, w.dtype, R, \
                in, out, accumulate, vec, nchunks)
    if (rows == 2)
        MM_LAUNCH(2);
    else if (rows == 8)
        MM_LAUNCH(8);
    else
        MM_LAUNCH(16);
#undef MM_LAUNCH
}
