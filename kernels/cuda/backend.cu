/*
 * backend.cu - the CUDA backend's lifetime, memory and copies, the staging
 * ring for host-side arguments, and the table of op slots (backend.h).
 */
#include "attn_prep.cuh"
#include "attention.cuh"
#include "elementwise.cuh"
#include "gdn.cuh"
#include "graph.cuh"
#include "matmul.cuh"
#include "norm.cuh"
#include "sample.cuh"

extern "C" {
#include "alloc.h"
#include "cuda_backend.h"
#include "log.h"
}

#include <string.h>

#define STAGE_INITIAL (1u << 20)

/* ---- staging ------------------------------------------------------------- */

static void stage_grow(cuda_ctx *c, size_t need)
{
    size_t cap = c->stage_cap ? c->stage_cap : STAGE_INITIAL;
    while (cap < need)
        cap *= 2;
    /* Queued copies may still read the old ring. */
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaFreeHost(c->stage_host));
    CUDA_CHECK(cudaFree(c->stage_dev));
    c->stage_host = NULL;
    c->stage_dev = NULL;
    CUDA_CHECK(cudaMallocHost((void **)&c->stage_host, cap));
    CUDA_CHECK(cuda_malloc(c, (void **)&c->stage_dev, cap));
    c->stage_cap = cap;
    c->stage_off = 0;
}

void *cuda_stage(cuda_ctx *c, const void *host, size_t n)
{
    const size_t need = (n + 15) & ~(size_t)15;
    if (c->graphs) {
        void *d = cuda_graph_stage(c, host, n, need);
        if (d)
            return d;
    }
    if (need > c->stage_cap)
        stage_grow(c, need);
    if (c->stage_off + need > c->stage_cap) {
        /* Wrapping: every earlier region's copy must have run before its
         * host bytes are overwritten. */
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        c->stage_off = 0;
    }
    unsigned char *h = c->stage_host + c->stage_off, *d = c->stage_dev + c->stage_off;
    c->stage_off += need;
    if (n) {
        memcpy(h, host, n);
        CUDA_CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, c->stream));
    }
    return d;
}

/* Gives the device what the pool keeps from freed buffers, after an
 * allocation found the device full. Frees still queued are given back once
 * the stream passes them, so it waits for the stream first (not inside a
 * capture, which must not wait). */
static void pool_give_back(cuda_ctx *c)
{
    (void)cudaGetLastError(); /* the allocation's out of memory */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusActive;
    if (cudaStreamIsCapturing(c->stream, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone)
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaMemPoolTrimTo(c->pool, 0));
}

cudaError_t cuda_malloc(cuda_ctx *c, void **p, size_t n)
{
    cudaError_t e = cudaMalloc(p, n);
    if (e == cudaErrorMemoryAllocation && c->pooled) {
        pool_give_back(c);
        e = cudaMalloc(p, n);
    }
    return e;
}

void cuda_retire(cuda_ctx *c, void *p)
{
    if (!p)
        return;
    if (c->nretired == c->retired_cap) {
        const int cap = c->retired_cap ? 2 * c->retired_cap : 16;
        void **r = (void **)realloc(c->retired, (size_t)cap * sizeof(void *));
        TDM_ASSERT(r != NULL);
        c->retired = r;
        c->retired_cap = cap;
    }
    c->retired[c->nretired++] = p;
}

void *cuda_grow(cuda_ctx *c, void **buf, size_t *cap, size_t bytes)
{
    if (bytes > *cap) {
        size_t n = *cap ? *cap : 1u << 16;
        while (n < bytes)
            n *= 2;
        void *p = NULL;
        CUDA_CHECK(cuda_malloc(c, &p, n));
        CUDA_CHECK(cudaMemsetAsync(p, 0, n, c->stream));
        cuda_retire(c, *buf);
        *buf = p;
        *cap = n;
        c->grown++;
    }
    return *buf;
}

/* ---- per-op timing (TANDEM_CUDA_OPSTATS=1) ---------------------------------
 * Every op slot is wrapped by a pair of events on the stream; at each sync
 * the pairs are resolved into GPU milliseconds per slot, printed to stderr
 * when the backend is destroyed. Gaps between ops (launch overhead, host
 * work) are what a step's wall time has beyond the sum. */

enum {
    ST_EMBED,
    ST_MATMUL,
    ST_RMSNORM,
    ST_RMSNORM_GATED,
    ST_ATTN_PREP,
    ST_ATTENTION,
    ST_SILU_MUL,
    ST_CONV,
    ST_GDN,
    ST_GDN_REPLAY,
    ST_ARGMAX,
    ST_SOFTMAX,
    ST_SAMPLE,
    ST_DOWNLOAD,
    ST_N
};
static const char *const st_names[ST_N] = {
    "embed",     "matmul",   "rmsnorm",   "rmsnorm_gated", "attn_prep",
    "attention", "silu_mul", "conv_silu", "gdn_recurrent", "gdn_replay",
    "argmax",    "softmax",  "sample",    "download"};

#define ST_MAXEV 4096

typedef struct cuda_stats {
    cudaEvent_t ev[2 * ST_MAXEV];
    int slot[ST_MAXEV];
    int nev;
    double ms[ST_N];
    long calls[ST_N];
} cuda_stats;

static void st_resolve(cuda_ctx *c)
{
    cuda_stats *st = c->stats;
    if (!st->nev)
        return;
    CUDA_CHECK(cudaEventSynchronize(st->ev[2 * st->nev - 1]));
    for (int i = 0; i < st->nev; i++) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, st->ev[2 * i], st->ev[2 * i + 1]));
        st->ms[st->slot[i]] += ms;
        st->calls[st->slot[i]]++;
    }
    st->nev = 0;
}

static void st_begin(cuda_ctx *c)
{
    if (c->stats->nev == ST_MAXEV)
        st_resolve(c);
    CUDA_CHECK(cudaEventRecord(c->stats->ev[2 * c->stats->nev], c->stream));
}

static void st_end(cuda_ctx *c, int slot)
{
    cuda_stats *st = c->stats;
    CUDA_CHECK(cudaEventRecord(st->ev[2 * st->nev + 1], c->stream));
    st->slot[st->nev++] = slot;
}

static void st_print(cuda_ctx *c)
{
    cuda_stats *st = c->stats;
    st_resolve(c);
    double total = 0;
    for (int i = 0; i < ST_N; i++)
        total += st->ms[i];
    fprintf(stderr, "CUDA backend op times (GPU ms between events, all calls):\n");
    for (int i = 0; i < ST_N; i++)
        if (st->calls[i])
            fprintf(stderr, "  %-14s %8ld calls %10.3f ms %8.2f us/call %5.1f%%\n", st_names[i],
                    st->calls[i], st->ms[i], 1e3 * st->ms[i] / (double)st->calls[i],
                    total > 0 ? 100.0 * st->ms[i] / total : 0.0);
    fprintf(stderr, "  %-14s %8s       %10.3f ms\n", "sum", "", total);
}

#define ST_WRAP(name, slot, params, args)                                                          \
    static void st_##name params                                                                   \
    {                                                                                              \
        cuda_ctx *c = (cuda_ctx *)ctx;                                                             \
        st_begin(c);                                                                               \
        cuda_##name args;                                                                          \
        st_end(c, slot);                                                                           \
    }

ST_WRAP(embed, ST_EMBED, (void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H),
        (ctx, y, e, ids, R, H))
ST_WRAP(matmul, ST_MATMUL,
        (void *ctx, float *y, const float *x, tdm_weight w, int R, int in, int out, int acc),
        (ctx, y, x, w, R, in, out, acc))
ST_WRAP(matmul_silu, ST_MATMUL,
        (void *ctx, float *y, const float *x, tdm_weight g, tdm_weight u, int R, int in, int out),
        (ctx, y, x, g, u, R, in, out))
ST_WRAP(rmsnorm, ST_RMSNORM,
        (void *ctx, float *y, const float *x, const float *w, int R, int n, float eps, int zc),
        (ctx, y, x, w, R, n, eps, zc))
ST_WRAP(rmsnorm_gated, ST_RMSNORM_GATED,
        (void *ctx, float *y, const float *x, const float *z, const float *w, int R, int n,
         float eps),
        (ctx, y, x, z, w, R, n, eps))
ST_WRAP(attn_prep, ST_ATTN_PREP,
        (void *ctx, float *q, float *gate, const float *qg, const float *k, const float *v,
         const float *qn, const float *kn, float eps, const int32_t *pos, const float *f, int rot,
         const tdm_attn_seg *s, int n, int nH, int nKV, int D),
        (ctx, q, gate, qg, k, v, qn, kn, eps, pos, f, rot, s, n, nH, nKV, D))
ST_WRAP(attention, ST_ATTENTION,
        (void *ctx, float *out, const float *q, const float *g, const tdm_attn_seg *s, int n,
         int nH, int nKV, int D),
        (ctx, out, q, g, s, n, nH, nKV, D))
ST_WRAP(silu_mul, ST_SILU_MUL, (void *ctx, float *y, const float *a, const float *b, size_t n),
        (ctx, y, a, b, n))
ST_WRAP(conv_silu, ST_CONV,
        (void *ctx, float *y, const float *x, const float *w, const tdm_conv_seg *s, int n, int C,
         int K),
        (ctx, y, x, w, s, n, C, K))
ST_WRAP(gdn_recurrent, ST_GDN,
        (void *ctx, float *out, const float *qkv, int stride, tdm_gdn_gates gt,
         const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk, int Dv),
        (ctx, out, qkv, stride, gt, segs, nseg, Hk, Hv, Dk, Dv))
ST_WRAP(gdn_replay, ST_GDN_REPLAY,
        (void *ctx, const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk, int Dv),
        (ctx, segs, nseg, Hk, Hv, Dk, Dv))
ST_WRAP(argmax, ST_ARGMAX, (void *ctx, int32_t *out, const float *x, int R, int n),
        (ctx, out, x, R, n))
ST_WRAP(softmax, ST_SOFTMAX, (void *ctx, float *x, int R, int n), (ctx, x, R, n))
ST_WRAP(sample, ST_SAMPLE,
        (void *ctx, int32_t *out, const float *x, int R, int n, const tdm_sample_row *rows),
        (ctx, out, x, R, n, rows))

/* ---- memory --------------------------------------------------------------- *
 * None of these may run inside a step (backend.h): they allocate, free or
 * wait, which a capture must not see and a replay would run out of order. */

/* Device memory for be->alloc and be->weight_map, NULL when exhausted.
 *
 * Sequences come and go with requests, each with a few hundred buffers
 * (every layer's states and KV caches): through cudaMalloc and cudaFree
 * that cost milliseconds a sequence, and cudaFree waits for the whole
 * device. The pool keeps what is freed (its release threshold is
 * unlimited) and hands it out again in stream order, in microseconds: all
 * of the backend's work is on its one stream, so memory freed there is
 * reused only after the work queued before the free. What the pool keeps
 * is at most the peak the process held, which admission bounds
 * (capacity.h). When the device cannot give more, the pool first returns
 * what it keeps (freed pieces too small for the request) and tries once
 * more. */
static void *dev_alloc(cuda_ctx *c, size_t nbytes)
{
    void *p = NULL;
    const size_t n = nbytes ? nbytes : 16;
    if (!c->pooled) {
        if (cudaMalloc(&p, n) != cudaSuccess) {
            (void)cudaGetLastError(); /* out of memory is an answer, not a sticky error */
            return NULL;
        }
        return p;
    }
    cudaError_t e = cudaMallocFromPoolAsync(&p, n, c->pool, c->stream);
    if (e == cudaErrorMemoryAllocation) {
        pool_give_back(c);
        e = cudaMallocFromPoolAsync(&p, n, c->pool, c->stream);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void *cu_alloc(void *ctx, size_t nbytes)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(!c->in_step);
    c->xs_src = NULL; /* a split of x left by a kernel may be stale now */
    void *p = dev_alloc(c, nbytes);
    if (p)
        CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes ? nbytes : 16, c->stream));
    return p;
}

static void cu_free(void *ctx, void *p)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(!c->in_step);
    if (!p)
        return;
    if (c->pooled)
        CUDA_CHECK(cudaFreeAsync(p, c->stream)); /* after the work queued before it */
    else
        CUDA_CHECK(cudaFree(p)); /* waits for work that may still use p */
}

/* The pool dev_alloc takes from, where the device has pools and one can
 * allocate (a trial allocation; an MPS client of an old server may be
 * refused); else allocations go through cudaMalloc. */
static void pool_open(cuda_ctx *c)
{
    int supported = 0;
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, c->device) !=
            cudaSuccess ||
        !supported) {
        (void)cudaGetLastError();
        tdm_log_info("cuda", "device %d has no memory pools: sequences' memory through cudaMalloc",
                     c->device);
        return;
    }
    cudaMemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = c->device;
    uint64_t keep = UINT64_MAX;
    void *p = NULL;
    cudaError_t e = cudaMemPoolCreate(&c->pool, &props);
    if (e == cudaSuccess)
        e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e == cudaSuccess)
        e = cudaMallocFromPoolAsync(&p, 1 << 20, c->pool, c->stream);
    if (e == cudaSuccess)
        e = cudaFreeAsync(p, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        tdm_log_info("cuda",
                     "device %d: a memory pool cannot allocate (%s): sequences' memory through "
                     "cudaMalloc",
                     c->device, cudaGetErrorString(e));
        if (c->pool)
            (void)cudaMemPoolDestroy(c->pool);
        c->pool = NULL;
        return;
    }
    c->pooled = 1;
}

static void cu_upload(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(!c->in_step);
    c->xs_src = NULL; /* a split of x left by a kernel may be stale now */
    if (!n)
        return;
    /* Synchronous: the caller may reuse src as soon as this returns. */
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cu_download(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(!c->in_step);
    if (!n)
        return;
    if (c->stats)
        st_begin(c);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->stream));
    if (c->stats)
        st_end(c, ST_DOWNLOAD);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cu_copy(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(!c->in_step);
    c->xs_src = NULL; /* a split of x left by a kernel may be stale now */
    if (n)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream));
}

/* One copy of copy_n: [dst, dst + bytes) = [src, ...). No padding (staged). */
typedef struct cu_copy_job {
    char *dst;
    const char *src;
    unsigned long long bytes;
} cu_copy_job;

/* Copy blockIdx.y, its 16-byte chunks spread over the x blocks (bytes one by
 * one where a pointer or the size is not a multiple of 16). */
__global__ void copy_n_kernel(const cu_copy_job *jobs)
{
    cuda_kernel_begin();
    const cu_copy_job j = jobs[blockIdx.y];
    const size_t step = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if ((((uintptr_t)j.dst | (uintptr_t)j.src | (uintptr_t)j.bytes) & 15) == 0) {
        uint4 *d = (uint4 *)j.dst;
        const uint4 *s = (const uint4 *)j.src;
        for (; i < j.bytes / 16; i += step)
            d[i] = s[i];
    } else {
        for (; i < j.bytes; i += step)
            j.dst[i] = j.src[i];
    }
}

#define COPY_THREADS 256

static void cu_copy_n(void *ctx, int n, void *const *dst, const void *const *src,
                      const size_t *nbytes)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(!c->in_step);
    if (n <= 0)
        return;
    cu_copy_job *jobs = (cu_copy_job *)tdm_xcalloc((size_t)n, sizeof(*jobs));
    size_t most = 0;
    for (int i = 0; i < n; i++) {
        jobs[i] = (cu_copy_job){(char *)dst[i], (const char *)src[i], nbytes[i]};
        most = nbytes[i] > most ? nbytes[i] : most;
    }
    const cu_copy_job *d = (const cu_copy_job *)cuda_stage(c, jobs, (size_t)n * sizeof(*jobs));
    free(jobs);
    /* about 8 chunks a thread for the largest copy, at most 256 blocks */
    size_t bx = (most / 16 + 8 * COPY_THREADS - 1) / (8 * COPY_THREADS);
    bx = bx < 1 ? 1 : bx > 256 ? 256 : bx;
    cuda_launch(c, copy_n_kernel, dim3((unsigned)bx, (unsigned)n), COPY_THREADS, 0, d);
}

static const void *cu_weight_map(void *ctx, const void *host, size_t nbytes, int *owned)
{
    TDM_ASSERT(!((cuda_ctx *)ctx)->in_step);
    *owned = 0;
    void *p = dev_alloc((cuda_ctx *)ctx, nbytes);
    if (!p)
        return NULL;
    cu_upload(ctx, p, host, nbytes);
    *owned = 1;
    return p;
}

static void cu_sync(void *ctx)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(!c->in_step);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (c->stats)
        st_resolve(c);
}

/* Page-locked, so a download is one DMA rather than a copy through the
 * driver's bounce buffer (~100 us per MB of logits into pageable memory). */
static void *cu_host_alloc(void *ctx, size_t nbytes)
{
    TDM_ASSERT(!((cuda_ctx *)ctx)->in_step);
    void *p = NULL;
    if (cudaMallocHost(&p, nbytes ? nbytes : 16) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(void *ctx, void *p)
{
    TDM_ASSERT(!((cuda_ctx *)ctx)->in_step);
    if (p)
        CUDA_CHECK(cudaFreeHost(p));
}

static int cu_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    TDM_ASSERT(!((cuda_ctx *)ctx)->in_step);
    const cuda_ctx *c = (const cuda_ctx *)ctx;
    *free_bytes = *total_bytes = 0;
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess)
        return -1;
    /* What the pool keeps from freed buffers is free to this process. */
    uint64_t reserved = 0, used = 0;
    if (c->pooled &&
        cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
            cudaSuccess &&
        cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess &&
        reserved > used)
        *free_bytes += (size_t)(reserved - used);
    return 0;
}

/* argmax reads its result back and waits: never inside a step. */
static void cu_argmax(void *ctx, int32_t *out, const float *x, int R, int n)
{
    TDM_ASSERT(!((cuda_ctx *)ctx)->in_step);
    cuda_argmax(ctx, out, x, R, n);
}

/* So does sample. */
static void cu_sample(void *ctx, int32_t *out, const float *x, int R, int n,
                      const tdm_sample_row *rows)
{
    TDM_ASSERT(!((cuda_ctx *)ctx)->in_step);
    cuda_sample(ctx, out, x, R, n, rows);
}

/* ---- lifetime ------------------------------------------------------------- */

static void cu_destroy(tdm_backend *be)
{
    if (!be)
        return;
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream)
            cudaStreamSynchronize(c->stream);
        cuda_graphs_destroy(c);
        cudaFreeHost(c->stage_host);
        cudaFree(c->stage_dev);
        cudaFree(c->argmax_dev);
        cudaFree(c->sample_spill);
        cudaFree(c->mm_part);
        cudaFree(c->mm_count);
        cudaFree(c->mm_xs);
        cudaFree(c->mm_ys);
        cudaFree(c->mm_up);
        cuda_bulk_destroy(c);
        for (int i = 0; i < c->nretired; i++)
            cudaFree(c->retired[i]);
        free(c->retired);
        if (c->pool) {
            cudaStreamSynchronize(c->stream);
            cudaMemPoolDestroy(c->pool); /* with what it holds */
        }
        if (c->stats) {
            st_print(c);
            for (int i = 0; i < 2 * ST_MAXEV; i++)
                cudaEventDestroy(c->stats->ev[i]);
            free(c->stats);
        }
        if (c->stream)
            cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

extern "C" int tdm_cuda_use_device(int device)
{
    return cudaSetDevice(device) == cudaSuccess ? 0 : -1;
}

extern "C" int tdm_cuda_device_count(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        int rt = 0;
        cudaRuntimeGetVersion(&rt);
        if (!why || !why_len)
            return 0;
        if (e == cudaErrorNoDevice)
            snprintf(why, why_len, "no CUDA device present");
        else if (e == cudaErrorInsufficientDriver)
            /* also what the runtime says when there is no driver at all */
            snprintf(why, why_len,
                     "no NVIDIA driver, or one older than this build's CUDA runtime %d.%d",
                     rt / 1000, rt % 1000 / 10);
        else
            snprintf(why, why_len, "no usable CUDA device (%s)", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0 && why && why_len)
        snprintf(why, why_len, "no CUDA device present");
    return n;
}

extern "C" int tdm_cuda_device_mps(int device)
{
    int on = 0;
    if (cudaDeviceGetAttribute(&on, cudaDevAttrMpsEnabled, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return on != 0;
}

extern "C" int tdm_cuda_device_uuid(int device, char *out, size_t len)
{
    if (!len)
        return 0;
    out[0] = 0;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
    return 1;
}

extern "C" tdm_backend *tdm_backend_cuda_create(int device, tdm_error *err)
{
    char why[160];
    int n = tdm_cuda_device_count(why, sizeof(why));
    if (n == 0) {
        tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "CUDA backend: %s", why);
        return NULL;
    }
    if (device < 0 || device >= n) {
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                      "CUDA backend: device %d does not exist (%d present)", device, n);
        return NULL;
    }
    tdm_backend *be = (tdm_backend *)calloc(1, sizeof(*be));
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    c->device = device;
    be->ctx = c;
    be->destroy = cu_destroy;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMallocHost((void **)&c->stage_host, STAGE_INITIAL);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&c->stage_dev, STAGE_INITIAL);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&c->argmax_dev, 64 * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&c->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        tdm_error_set(err, TDM_ERR_UNAVAILABLE, "CUDA backend on device %d: %s", device,
                      cudaGetErrorString(e));
        cu_destroy(be);
        return NULL;
    }
    c->stage_cap = STAGE_INITIAL;
    c->argmax_cap = 64;
    pool_open(c);
    const char *st = getenv("TANDEM_CUDA_OPSTATS");
    if (st && strcmp(st, "1") == 0) {
        c->stats = (cuda_stats *)calloc(1, sizeof(cuda_stats));
        for (int i = 0; c->stats && i < 2 * ST_MAXEV; i++)
            CUDA_CHECK(cudaEventCreate(&c->stats->ev[i]));
    } else if (!(c->graphs = cuda_graphs_create())) {
        tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
        cu_destroy(be);
        return NULL;
    }
    be->name = "cuda";
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->copy = cu_copy;
    be->copy_n = cu_copy_n;
    be->weight_map = cu_weight_map;
    be->sync = cu_sync;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->mem_info = cu_mem_info;
    if (c->graphs) {
        be->graph_begin = cuda_graph_begin;
        be->graph_end = cuda_graph_end;
    }
    be->embed = cuda_embed;
    be->matmul = cuda_matmul;
    be->matmul_n = cuda_matmul_n;
    be->matmul_silu = cuda_matmul_silu;
    be->norm_matmul = cuda_norm_matmul;
    be->bulk = cuda_bulk;
    be->rmsnorm = cuda_rmsnorm;
    be->rmsnorm_gated = cuda_rmsnorm_gated;
    be->attn_prep = cuda_attn_prep;
    be->attention = cuda_attention;
    be->silu_mul = cuda_silu_mul;
    be->conv_silu = cuda_conv_silu;
    be->gdn_recurrent = cuda_gdn_recurrent;
    be->gdn_replay = cuda_gdn_replay;
    be->argmax = cu_argmax;
    be->argmax_to = cuda_argmax_to;
    be->embed_dev = cuda_embed_dev;
    be->softmax = cuda_softmax;
    be->sample = cu_sample;
    be->sample_to = cuda_sample_to;
    if (c->stats) {
        be->embed = st_embed;
        be->matmul = st_matmul;
        be->matmul_silu = st_matmul_silu;
        be->matmul_n = NULL; /* each projection timed on its own */
        be->norm_matmul = NULL; /* the norm and the products timed apart */
        be->rmsnorm = st_rmsnorm;
        be->rmsnorm_gated = st_rmsnorm_gated;
        be->attn_prep = st_attn_prep;
        be->attention = st_attention;
        be->silu_mul = st_silu_mul;
        be->conv_silu = st_conv_silu;
        be->gdn_recurrent = st_gdn_recurrent;
        be->gdn_replay = st_gdn_replay;
        be->argmax = st_argmax;
        be->softmax = st_softmax;
        be->sample = st_sample;
    }
    return be;
}

extern "C" float tdm_cuda_time_ms(void *ctx, void (*fn)(void *arg), void *arg)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, c->stream));
    fn(arg);
    CUDA_CHECK(cudaEventRecord(e1, c->stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return ms;
}

extern "C" double tdm_cuda_copy_bandwidth(int device, size_t nbytes)
{
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&a, nbytes) != cudaSuccess ||
        cudaMalloc(&b, nbytes) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess ||
        cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    CUDA_CHECK(cudaMemset(a, 1, nbytes));
    CUDA_CHECK(cudaMemcpy(b, a, nbytes, cudaMemcpyDeviceToDevice)); /* warm-up */
    for (int rep = 0; rep < 5; rep++) {
        float ms = 0;
        CUDA_CHECK(cudaEventRecord(e0));
        CUDA_CHECK(cudaMemcpy(b, a, nbytes, cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaEventRecord(e1));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        double bw = 2.0 * (double)nbytes / ((double)ms * 1e-3);
        best = bw > best ? bw : best;
    }
out:
    (void)cudaGetLastError();
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return best;
}
