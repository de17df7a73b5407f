/*
 * backend.cu - the CUDA backend's lifetime, memory and copies, the staging
 * ring for host-side arguments, and the table of op slots (backend.h).
 */
#include "attention.cuh"
#include "elementwise.cuh"
#include "gdn.cuh"
#include "matmul.cuh"
#include "norm.cuh"
#include "sample.cuh"

extern "C" {
#include "cuda_backend.h"
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
    CUDA_CHECK(cudaMalloc((void **)&c->stage_dev, cap));
    c->stage_cap = cap;
    c->stage_off = 0;
}

void *cuda_stage(cuda_ctx *c, const void *host, size_t n)
{
    const size_t need = (n + 15) & ~(size_t)15;
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

/* ---- memory --------------------------------------------------------------- */

static void *cu_alloc(void *ctx, size_t nbytes)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    void *p = NULL;
    if (cudaMalloc(&p, nbytes ? nbytes : 16) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is an answer, not a sticky error */
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes ? nbytes : 16, c->stream));
    return p;
}

static void cu_free(void *ctx, void *p)
{
    (void)ctx;
    if (p)
        CUDA_CHECK(cudaFree(p)); /* waits for work that may still use p */
}

static void cu_upload(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!n)
        return;
    /* Synchronous: the caller may reuse src as soon as this returns. */
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cu_download(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!n)
        return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cu_copy(void *ctx, void *dst, const void *src, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (n)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream));
}

static const void *cu_weight_map(void *ctx, const void *host, size_t nbytes, int *owned)
{
    void *p = NULL;
    *owned = 0;
    if (cudaMalloc(&p, nbytes ? nbytes : 16) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    cu_upload(ctx, p, host, nbytes);
    *owned = 1;
    return p;
}

static void cu_sync(void *ctx)
{
    CUDA_CHECK(cudaStreamSynchronize(((cuda_ctx *)ctx)->stream));
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
        cudaFreeHost(c->stage_host);
        cudaFree(c->stage_dev);
        cudaFree(c->argmax_dev);
        if (c->stream)
            cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

extern "C" int tdm_cuda_device_count(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (why && why_len)
            snprintf(why, why_len, "no usable CUDA device (%s)", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0 && why && why_len)
        snprintf(why, why_len, "no CUDA device present");
    return n;
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
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        tdm_error_set(err, TDM_ERR_UNAVAILABLE, "CUDA backend on device %d: %s", device,
                      cudaGetErrorString(e));
        cu_destroy(be);
        return NULL;
    }
    c->stage_cap = STAGE_INITIAL;
    c->argmax_cap = 64;
    be->name = "cuda";
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->copy = cu_copy;
    be->weight_map = cu_weight_map;
    be->sync = cu_sync;
    be->embed = cuda_embed;
    be->matmul = cuda_matmul;
    be->rmsnorm = cuda_rmsnorm;
    be->rmsnorm_gated = cuda_rmsnorm_gated;
    be->split_qgate = cuda_split_qgate;
    be->rope = cuda_rope;
    be->kv_store = cuda_kv_store;
    be->attention = cuda_attention;
    be->mul_sigmoid = cuda_mul_sigmoid;
    be->silu_mul = cuda_silu_mul;
    be->conv_silu = cuda_conv_silu;
    be->gdn_gates = cuda_gdn_gates;
    be->gdn_recurrent = cuda_gdn_recurrent;
    be->argmax = cuda_argmax;
    be->softmax = cuda_softmax;
    return be;
}
