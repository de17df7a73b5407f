/*
 * matmul.cu - y [R,out] (+)= x [R,in] · wᵀ, w [out,in] in bf16, fp16 or fp32,
 * fp32 accumulation.
 *
 * One warp per output column, one block per (8 columns, up to MM_ROWS rows).
 * Lane l owns the 8-element groups l, l+32, l+64, ... of k and accumulates
 * them in increasing k with fmaf, then the warp sums its lanes in a fixed
 * butterfly. That order depends on nothing but `in`, so a row's result is the
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

#define MM_ROWS 8
#define MM_WARPS 8

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

__global__ void mm_kernel(float *__restrict__ y, const float *__restrict__ x, const void *w,
                          tdm_dtype dt, int R, int in, int out, int accumulate, int vec)
{
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.y * MM_WARPS + (threadIdx.x >> 5);
    const int r0 = blockIdx.x * MM_ROWS;
    const int nr = min(MM_ROWS, R - r0);
    if (o >= out)
        return;
    const size_t wo = (size_t)o * (size_t)in;
    const float *xb = x + (size_t)r0 * (size_t)in;
    float acc[MM_ROWS];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++)
        acc[r] = 0.0f;
    const int ngroups = (in + 7) / 8;
    int g = lane;
    if (vec) {
        /* Four groups in flight per lane, then the rest one by one; the
         * arithmetic order per lane is increasing k either way. */
        for (; g + 96 < ngroups; g += 128) {
            float wv[4][8];
#pragma unroll
            for (int u = 0; u < 4; u++)
                mm_load8(w, dt, wo + (size_t)(g + 32 * u) * 8, wv[u]);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int k = (g + 32 * u) * 8;
#pragma unroll
                for (int r = 0; r < MM_ROWS; r++) {
                    if (r < nr) {
                        const float4 *xp = (const float4 *)(xb + (size_t)r * (size_t)in + k);
                        float4 a = __ldg(xp), b = __ldg(xp + 1);
                        float s = acc[r];
                        s = fmaf(wv[u][0], a.x, s);
                        s = fmaf(wv[u][1], a.y, s);
                        s = fmaf(wv[u][2], a.z, s);
                        s = fmaf(wv[u][3], a.w, s);
                        s = fmaf(wv[u][4], b.x, s);
                        s = fmaf(wv[u][5], b.y, s);
                        s = fmaf(wv[u][6], b.z, s);
                        s = fmaf(wv[u][7], b.w, s);
                        acc[r] = s;
                    }
                }
            }
        }
        for (; g < ngroups; g += 32) {
            float wv[8];
            mm_load8(w, dt, wo + (size_t)g * 8, wv);
            const int k = g * 8;
#pragma unroll
            for (int r = 0; r < MM_ROWS; r++) {
                if (r < nr) {
                    const float4 *xp = (const float4 *)(xb + (size_t)r * (size_t)in + k);
                    float4 a = __ldg(xp), b = __ldg(xp + 1);
                    float s = acc[r];
                    s = fmaf(wv[0], a.x, s);
                    s = fmaf(wv[1], a.y, s);
                    s = fmaf(wv[2], a.z, s);
                    s = fmaf(wv[3], a.w, s);
                    s = fmaf(wv[4], b.x, s);
                    s = fmaf(wv[5], b.y, s);
                    s = fmaf(wv[6], b.z, s);
                    s = fmaf(wv[7], b.w, s);
                    acc[r] = s;
                }
            }
        }
    } else {
        /* Unaligned or odd sizes: the same groups and order, scalar loads. */
        for (; g < ngroups; g += 32) {
            const int k0 = g * 8, k1 = min(k0 + 8, in);
            for (int k = k0; k < k1; k++) {
                const float wk = cuda_wload(w, dt, wo + (size_t)k);
#pragma unroll
                for (int r = 0; r < MM_ROWS; r++)
                    if (r < nr)
                        acc[r] = fmaf(wk, xb[(size_t)r * (size_t)in + k], acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        const float s = cuda_warp_sum(acc[r]);
        if (r < nr && lane == 0) {
            float *yp = y + (size_t)(r0 + r) * (size_t)out + (size_t)o;
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
    dim3 grid((unsigned)((R + MM_ROWS - 1) / MM_ROWS), (unsigned)((out + MM_WARPS - 1) / MM_WARPS));
    mm_kernel<<<grid, MM_WARPS * 32, 0, c->stream>>>(y, x, w.data, w.dtype, R, in, out, accumulate,
                                                     vec);
    CUDA_CHECK_LAUNCH();
}
