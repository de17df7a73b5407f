/*
 * norm.cu - RMSNorm and gated RMSNorm: one block per row; the sum of squares
 * is reduced in a fixed order (cuda_block_sum), the block size depends only
 * on n, so a row's bits never depend on R. y may be x: each thread reads its
 * elements before the reduction's barriers and writes only its own after.
 */
#include "norm.cuh"

static unsigned norm_threads(int n)
{
    return n >= 512 ? 256 : n >= 128 ? 128 : 32;
}

__global__ void rmsnorm_kernel(float *y, const float *x, const float *__restrict__ w, int n,
                               float eps, int zero_centred)
{
    cuda_kernel_begin();
    __shared__ float scratch[33];
    const float *xr = x + (size_t)blockIdx.x * (size_t)n;
    float *yr = y + (size_t)blockIdx.x * (size_t)n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss = fmaf(xr[i], xr[i], ss);
    ss = cuda_block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = (xr[i] * inv) * (zero_centred ? 1.0f + w[i] : w[i]);
}

__global__ void rmsnorm_gated_kernel(float *y, const float *x, const float *__restrict__ z,
                                     const float *__restrict__ w, int n, float eps)
{
    cuda_kernel_begin();
    __shared__ float scratch[33];
    const size_t off = (size_t)blockIdx.x * (size_t)n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss = fmaf(x[off + i], x[off + i], ss);
    ss = cuda_block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        y[off + i] = (w[i] * (x[off + i] * inv)) * cuda_silu(z[off + i]);
}

void cuda_rmsnorm(void *ctx, float *y, const float *x, const float *w, int R, int n, float eps,
                  int zero_centred)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || n <= 0)
        return;
    cuda_launch(c, rmsnorm_kernel, (unsigned)R, norm_threads(n), 0, y, x, w, n, eps, zero_centred);
}

void cuda_rmsnorm_gated(void *ctx, float *y, const float *x, const float *z, const float *w, int R,
                        int n, float eps)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || n <= 0)
        return;
    cuda_launch(c, rmsnorm_gated_kernel, (unsigned)R, norm_threads(n), 0, y, x, z, w, n, eps);
}
