/*
 * sample.cu - argmax and softmax, one block per row, fixed-order reductions.
 * argmax keeps the first index among equal maxima, as the CPU backend does;
 * only its [R] result crosses to the host.
 */
#include "sample.cuh"

#include <math.h>

#define SAMPLE_THREADS 1024

/* (value, index) with "better" = larger value, then smaller index. NaN is
 * never better, like `x > best` on the CPU. */
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

__global__ void argmax_kernel(int32_t *out, const float *x, int n)
{
    cuda_kernel_begin();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *xr = x + (size_t)blockIdx.x * (size_t)n;
    float bv = xr[0];
    int bi = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (am_better(xr[i], i, bv, bi))
            bv = xr[i], bi = i;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi))
            bv = ov, bi = oi;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (am_better(sv[w], si[w], bv, bi))
                bv = sv[w], bi = si[w];
        out[blockIdx.x] = bi;
    }
}

void cuda_argmax(void *ctx, int32_t *out, const float *x, int R, int n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || n <= 0)
        return;
    if (R > c->argmax_cap) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        CUDA_CHECK(cudaFree(c->argmax_dev));
        c->argmax_dev = NULL;
        CUDA_CHECK(cudaMalloc((void **)&c->argmax_dev, (size_t)R * sizeof(int32_t)));
        c->argmax_cap = R;
    }
    cuda_launch(c, argmax_kernel, (unsigned)R, SAMPLE_THREADS, 0, c->argmax_dev, x, n);
    CUDA_CHECK(cudaMemcpyAsync(out, c->argmax_dev, (size_t)R * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

__global__ void softmax_kernel(float *x, int n)
{
    cuda_kernel_begin();
    __shared__ float scratch[33];
    float *xr = x + (size_t)blockIdx.x * (size_t)n;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        mx = fmaxf(mx, xr[i]);
    mx = cuda_block_max(mx, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(xr[i] - mx);
        xr[i] = e;
        sum += e;
    }
    sum = cuda_block_sum(sum, scratch);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        xr[i] /= sum;
}

void cuda_softmax(void *ctx, float *x, int R, int n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || n <= 0)
        return;
    cuda_launch(c, softmax_kernel, (unsigned)R, SAMPLE_THREADS, 0, x, n);
}
