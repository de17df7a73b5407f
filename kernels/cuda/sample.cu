/*
 * sample.cu - argmax and softmax over rows of logits (a vocabulary of
 * ~250k values is 1 MB a row, too much for one SM to stream quickly).
 *
 * A row is cut into SAMPLE_SPLITS contiguous slices, slice s starting at
 * s·n/SAMPLE_SPLITS, each worked by one block of a thread-block cluster;
 * the blocks combine their results through distributed shared memory, in
 * rank order, so no scratch memory is needed and the order depends on n
 * alone: a row's bits never depend on R.
 *  - argmax keeps the first index among equal maxima, as the CPU backend
 *    does (NaN is never better, and every thread starts from element 0, as
 *    the CPU's scan does); only its [R] result crosses to the host.
 *  - softmax: the row maximum (exact in any order), then exp(x - max) and
 *    the slices' sums, added in rank order by every block, then the
 *    division. Sums per slice: per thread, per warp, warps in order.
 */
#include "sample.cuh"

#include <cooperative_groups.h>

#include <math.h>

namespace cg = cooperative_groups;

#define SAMPLE_THREADS 1024
#define SAMPLE_SPLITS 8

/* (value, index) with "better" = larger value, then smaller index. NaN is
 * never better, like `x > best` on the CPU. */
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ int sample_begin(int n, int s)
{
    return (int)((long long)n * s / SAMPLE_SPLITS);
}

__global__ void __cluster_dims__(SAMPLE_SPLITS, 1, 1) __launch_bounds__(SAMPLE_THREADS)
    argmax_kernel(int32_t *out, const float *x, int n)
{
    cuda_kernel_begin();
    __shared__ float sv[32];
    __shared__ int si[32];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const float *xr = x + (size_t)blockIdx.y * (size_t)n;
    const int end = sample_begin(n, rank + 1);
    float bv = xr[0];
    int bi = 0;
    for (int i = sample_begin(n, rank) + (int)threadIdx.x; i < end; i += SAMPLE_THREADS)
        if (am_better(xr[i], i, bv, bi))
            bv = xr[i], bi = i;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi))
            bv = ov, bi = oi;
    }
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SAMPLE_THREADS / 32; w++)
            if (am_better(sv[w], si[w], bv, bi))
                bv = sv[w], bi = si[w];
        sv[0] = bv;
        si[0] = bi;
    }
    cluster.sync(); /* every slice's best is in sv[0], si[0] of its block */
    if (rank == 0 && threadIdx.x == 0) {
        for (int r = 1; r < SAMPLE_SPLITS; r++) {
            const float v = *cluster.map_shared_rank(&sv[0], r);
            const int i = *cluster.map_shared_rank(&si[0], r);
            if (am_better(v, i, bv, bi))
                bv = v, bi = i;
        }
        out[blockIdx.y] = bi;
    }
    cluster.sync(); /* block 0 has read them: the others may exit */
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
    cuda_launch(c, argmax_kernel, dim3(SAMPLE_SPLITS, (unsigned)R), SAMPLE_THREADS, 0,
                c->argmax_dev, x, n);
    CUDA_CHECK(cudaMemcpyAsync(out, c->argmax_dev, (size_t)R * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

/* Every block reads the SAMPLE_SPLITS values v of the cluster in rank order. */
__device__ __forceinline__ float sample_all_max(cg::cluster_group &cluster, float *v)
{
    float m = *cluster.map_shared_rank(v, 0);
    for (int r = 1; r < SAMPLE_SPLITS; r++)
        m = fmaxf(m, *cluster.map_shared_rank(v, r));
    return m;
}

__device__ __forceinline__ float sample_all_sum(cg::cluster_group &cluster, float *v)
{
    float s = 0.0f;
    for (int r = 0; r < SAMPLE_SPLITS; r++)
        s += *cluster.map_shared_rank(v, r);
    return s;
}

__global__ void __cluster_dims__(SAMPLE_SPLITS, 1, 1) __launch_bounds__(SAMPLE_THREADS)
    softmax_kernel(float *x, int n)
{
    cuda_kernel_begin();
    __shared__ float scratch[33];
    __shared__ float part[2]; /* the slice's max, then its sum */
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    float *xr = x + (size_t)blockIdx.y * (size_t)n;
    const int b = sample_begin(n, rank) + (int)threadIdx.x, end = sample_begin(n, rank + 1);
    float mx = -INFINITY;
    for (int i = b; i < end; i += SAMPLE_THREADS)
        mx = fmaxf(mx, xr[i]);
    mx = cuda_block_max(mx, scratch);
    if (threadIdx.x == 0)
        part[0] = mx;
    cluster.sync();
    mx = sample_all_max(cluster, &part[0]);
    float sum = 0.0f;
    for (int i = b; i < end; i += SAMPLE_THREADS) {
        const float e = expf(xr[i] - mx);
        xr[i] = e;
        sum += e;
    }
    sum = cuda_block_sum(sum, scratch);
    if (threadIdx.x == 0)
        part[1] = sum;
    cluster.sync();
    sum = sample_all_sum(cluster, &part[1]);
    for (int i = b; i < end; i += SAMPLE_THREADS)
        xr[i] /= sum;
    cluster.sync(); /* every block has read the others' sums: they may exit */
}

void cuda_softmax(void *ctx, float *x, int R, int n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || n <= 0)
        return;
    cuda_launch(c, softmax_kernel, dim3(SAMPLE_SPLITS, (unsigned)R), SAMPLE_THREADS, 0, x, n);
}
