/*
 * common.cuh - what every CUDA op file shares: the error check, the backend
 * context, weight loads by dtype, fixed-order reductions and the staging of
 * host-side op arguments.
 */
#ifndef TANDEM_KERNELS_CUDA_COMMON_CUH
#define TANDEM_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

extern "C" {
#include "backend.h"
#include "status.h"
}

/* A failed CUDA call inside an op is a broken invariant (ops cannot fail on
 * input the engine has validated), so it prints device, statement, file and
 * line and aborts, as ggml does. */
#define CUDA_CHECK(stmt)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (stmt);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            int dev_ = -1;                                                                         \
            cudaGetDevice(&dev_);                                                                  \
            fprintf(stderr, "tandem: CUDA error on device %d: %s\n  in %s\n  at %s:%d\n", dev_,    \
                    cudaGetErrorString(err_), #stmt, __FILE__, __LINE__);                          \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

typedef struct cuda_ctx {
    int device;
    int smem_optin; /* shared memory a block may opt in to, bytes (a device constant) */
    int sm_count;   /* multiprocessors */
    cudaStream_t stream;
    /* Where cu_alloc takes device memory from (backend.cu): a stream-ordered
     * pool of the backend's own that keeps what is freed for the next
     * allocation (pooled), or cudaMalloc where the device has no pools. */
    cudaMemPool_t pool;
    int pooled;
    /* Staging ring for host-side op arguments: host bytes are written to the
     * pinned ring and copied to the device ring on the stream, so the caller's
     * arrays may change as soon as the op returns. Wrapping waits for the
     * stream, which makes reuse of a region safe. */
    unsigned char *stage_host; /* pinned [stage_cap] */
    unsigned char *stage_dev;  /* device [stage_cap] */
    size_t stage_cap, stage_off;
    int32_t *argmax_dev; /* device [argmax_cap] */
    int argmax_cap;
    /* sample.cu: probabilities of rows too long for shared memory [cap floats] */
    float *sample_spill;
    size_t sample_spill_cap;
    struct cuda_stats *stats; /* NULL unless TANDEM_CUDA_OPSTATS=1 (backend.cu) */
    /* Set while a captured graph is being replayed: ops stage their host
     * arguments at the captured addresses but launch nothing (the graph does). */
    int replaying;
    /* Forward steps as graphs (graph.cu); NULL while TANDEM_CUDA_OPSTATS is
     * on (events inside a capture would become graph nodes). */
    struct cuda_graphs *graphs;
    /* Set between graph_begin and graph_end: only op slots may run. */
    int in_step;
    /* Set while a step is captured or replayed: every kernel launch (kernel,
     * configuration, argument values) and every staged size is folded into
     * `shape`. A replay is only valid when it folds to the capture's value:
     * the staged bytes are the only thing a replay can change. */
    int shaping;
    uint64_t shape;
    /* Scratch grown by cuda_grow, each with its capacity in bytes. */
    float *mm_part;     /* matmul.cu: split-k partial sums */
    unsigned *mm_count; /* matmul.cu: split-k arrivals per output tile */
    uint32_t *mm_xs;    /* matmul.cu: activations split into bf16 parts (cuda_xs_*) */
    uint32_t *mm_ys;    /* matmul.cu: a gate/up pair's output in parts, for down */
    float *mm_up;       /* matmul.cu: matmul_silu's up products off the tensor-core path */
    size_t mm_part_cap, mm_count_cap, mm_xs_cap, mm_ys_cap, mm_up_cap;
    /* Scratch buffers replaced so far (cuda_grow): a graph captured before
     * one was replaced may name it (graph.cu: outgrown graphs). */
    uint64_t grown;
    /* Kernels launched (counted in replays too), and which output the
     * kernel launched last left split into bf16 parts: xs_n values from
     * xs_src in xs_parts, valid while xs_launch == nlaunch (matmul.cu). */
    unsigned long long nlaunch, xs_launch;
    const float *xs_src;
    uint32_t *xs_parts;
    size_t xs_n;
    /* bulk.cu: a prompt prefill's matmuls on cuBLAS. bulk is set between
     * bulk calls that take it; bulk_off where TANDEM_CUDA_BULK=0 or cuBLAS
     * did not start; the handle (a cublasHandle_t) and its workspace are
     * made at the first bulk call; x's parts and the GEMM's output. */
    int bulk, bulk_off;
    void *cublas, *bulk_ws;
    uint16_t *bulk_x;
    float *bulk_c;
    size_t bulk_x_cap, bulk_c_cap;
    /* Device buffers replaced while graphs may still name them: freed with
     * the backend. */
    void **retired;
    int nretired, retired_cap;
} cuda_ctx;

/* Keeps p (device memory, or NULL) until the backend is destroyed. */
void cuda_retire(cuda_ctx *c, void *p);

/* cudaMalloc for the backend's own buffers (staging, scratch, graphs): where
 * the device is full, the memory the pool keeps from freed buffers is given
 * back first and the allocation tried once more (backend.cu). */
cudaError_t cuda_malloc(cuda_ctx *c, void **p, size_t n);

/* Device scratch *buf of at least `bytes` (capacity *cap): grown, never
 * shrunk, and a replaced buffer stays allocated until the backend goes (a
 * captured graph may still name it). New bytes are zero. Ops that grow
 * scratch do so on a step's first, eager run (a capture follows one of the
 * same shape), never inside a capture. */
void *cuda_grow(cuda_ctx *c, void **buf, size_t *cap, size_t bytes);

/* Copies n host bytes to device memory valid for the ops queued next on the
 * stream; 16-byte aligned. Inside a recorded step the bytes go to that
 * graph's own area at the same offset on every replay (graph.cu), so an op
 * must stage in the same order and sizes whenever its by-value arguments
 * are the same. */
void *cuda_stage(cuda_ctx *c, const void *host, size_t n);

static inline void cuda_shape_word(cuda_ctx *c, uint64_t v)
{
    uint64_t h = (c->shape ^ v) * 0x9e3779b97f4a7c15ull;
    c->shape = h ^ (h >> 29);
}

/* A kernel argument by its bytes: scalars and pointers (device addresses a
 * recorded graph holds). A struct passed by value must have no padding, or
 * its indeterminate padding bytes make replays mismatch (and fall back). */
template <typename T> static inline void cuda_shape_arg(cuda_ctx *c, const T &v)
{
    static_assert(std::is_trivially_copyable<T>::value, "kernel arguments are plain data");
    const unsigned char *p = (const unsigned char *)&v;
    for (size_t i = 0; i < sizeof(T); i += 8) {
        uint64_t w = 0;
        memcpy(&w, p + i, sizeof(T) - i < 8 ? sizeof(T) - i : 8);
        cuda_shape_word(c, w);
    }
}

template <typename... Params, typename... Args>
static inline void cuda_shape_launch(cuda_ctx *c, void (*kernel)(Params...), dim3 grid, dim3 block,
                                     size_t smem, Args... args)
{
    const uint64_t words[] = {(uint64_t)(uintptr_t)(const void *)kernel,
                              grid.x,
                              grid.y,
                              grid.z,
                              block.x,
                              block.y,
                              block.z,
                              smem};
    for (uint64_t w : words)
        cuda_shape_word(c, w);
    /* As the kernel receives them: converted to its parameter types. */
    [c](Params... p) { (cuda_shape_arg(c, p), ...); }(args...);
}

/* Every kernel launches through here: with programmatic dependent launch, so
 * the next kernel's blocks are scheduled while this one drains (the launch
 * gap disappears), and nothing at all while a graph replays. cluster > 1:
 * blocks in clusters of that many along x (grid.x a multiple of it). */
template <typename... Params, typename... Args>
static inline void cuda_launch_cluster(cuda_ctx *c, void (*kernel)(Params...), dim3 grid,
                                       dim3 block, size_t smem, unsigned cluster, Args... args)
{
    c->nlaunch++;
    if (c->shaping) {
        cuda_shape_word(c, cluster);
        cuda_shape_launch(c, kernel, grid, block, smem, args...);
    }
    if (c->replaying)
        return;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = cluster;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cfg.attrs = attr;
    cfg.numAttrs = cluster > 1 ? 2 : 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <typename... Params, typename... Args>
static inline void cuda_launch(cuda_ctx *c, void (*kernel)(Params...), dim3 grid, dim3 block,
                               size_t smem, Args... args)
{
    cuda_launch_cluster(c, kernel, grid, block, smem, 1, args...);
}

/* The first statement of every kernel (nothing a kernel does before it may
 * read what an earlier kernel writes, or write anything): let the next
 * kernel's blocks be scheduled as soon as all of this one's have started,
 * then wait until the kernel before this one has finished and its writes
 * are visible (a no-op without a programmatic predecessor). Waiting blocks
 * only hold their slots; the wait is transitive, so order is kept. On the
 * H200 (bench_cuda_ops_bench --launch) the next kernel's blocks start
 * 20-25 us before the one ahead ends and pass the wait 0.5-0.8 us after; a
 * graph of empty kernels costs 0.43 us per kernel (0.51 without). */
__device__ __forceinline__ void cuda_kernel_begin(void)
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* One weight element as fp32. */
__device__ __forceinline__ float cuda_wload(const void *w, tdm_dtype dt, size_t i)
{
    if (dt == TDM_DTYPE_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
    if (dt == TDM_DTYPE_F16)
        return __half2float(((const __half *)w)[i]);
    return ((const float *)w)[i];
}

__device__ __forceinline__ float cuda_warp_sum(float v)
{
    /* Butterfly: every lane ends with the same bits (each step adds the same
     * two values, in either order, which is exact-commutative). */
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cuda_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed
 * order: per warp, then warp results in order. Every thread gets the result.
 * scratch: shared [33]. */
__device__ __forceinline__ float cuda_block_sum(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cuda_warp_sum(v);
    __syncthreads(); /* scratch may still be read from a previous call */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0;
        for (int i = 0; i < nw; i++)
            s += scratch[i];
        scratch[32] = s;
    }
    __syncthreads();
    return scratch[32];
}

__device__ __forceinline__ float cuda_block_max(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cuda_warp_max(v);
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = scratch[0];
        for (int i = 1; i < nw; i++)
            s = fmaxf(s, scratch[i]);
        scratch[32] = s;
    }
    __syncthreads();
    return scratch[32];
}

__device__ __forceinline__ float cuda_silu(float v)
{
    return v / (1.0f + expf(-v));
}

__device__ __forceinline__ float cuda_sigmoid(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

#endif
