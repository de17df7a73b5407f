/* norm.cuh - RMSNorm (plain or zero-centred) and gated RMSNorm per row. */
#ifndef TANDEM_KERNELS_CUDA_NORM_CUH
#define TANDEM_KERNELS_CUDA_NORM_CUH

#include "common.cuh"

/* ---- a row's norm, shared with kernels that normalize what they read ------
 *
 * norm.cu's arithmetic, for a kernel that applies a norm to its own input
 * (matmul.cu: a norm with the projections that read it, in one launch) and
 * must give the bits cuda_rmsnorm gives. A row of n values is cut into
 * groups of 4; thread t of the row's T (cuda_norm_threads) adds the squares
 * of groups t, t + T, ... in that order (cuda_norm_sq4 per group), each warp
 * of 32 consecutive threads sums by butterfly (cuda_warp_sum), and the
 * warps' sums are added in warp order from zero. */

/* Threads of a row of n values: a warp up to n = 1024, then
 * 32 * ceil(groups / 128), at most 1024 (rows longer than 32,768 values: a
 * two-pass kernel with the same layout at 1024). */
int cuda_norm_threads(int n);

__device__ __forceinline__ float cuda_norm_sq4(float4 v, float ss)
{
    ss = fmaf(v.x, v.x, ss);
    ss = fmaf(v.y, v.y, ss);
    ss = fmaf(v.z, v.z, ss);
    return fmaf(v.w, v.w, ss);
}

/* 1 / rms from a row's sum of squares. */
__device__ __forceinline__ float cuda_norm_inv(float ss, int n, float eps)
{
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* One output value of a plain norm: the CPU backend's formula. */
__device__ __forceinline__ float cuda_norm_one(float x, float inv, float w, int zero_centred)
{
    return (x * inv) * (zero_centred ? 1.0f + w : w);
}

void cuda_rmsnorm(void *ctx, float *y, const float *x, const float *w, int R, int n, float eps,
                  int zero_centred);
void cuda_rmsnorm_gated(void *ctx, float *y, const float *x, const float *z, const float *w, int R,
                        int n, float eps);

#endif
