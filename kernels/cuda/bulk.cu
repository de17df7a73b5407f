/*
 * bulk.cu - a prompt prefill's matmuls on cuBLAS (backend.h: bulk).
 *
 * The exact matmul (matmul.cu) streams the weights once per group of at most 10 rows: right for
 * decode and verify steps, 5x cuBLAS at 72 rows, and a prompt's prefill is all rows. Between
 * bulk(ctx, R) and bulk(ctx, 0) for R >= BULK_MIN_ROWS (16), a bf16 matmul instead splits x
 * exactly into three bf16 parts (hi + mid + lo, each product with a weight exact in fp32),
 * stacks them as 3R rows, runs one cuBLAS GEMM with fp32 accumulation (cublasGemmEx,
 * CUBLAS_COMPUTE_32F) and adds the three row blocks: the same products, summed in cuBLAS's
 * order instead of matmul.cu's. So a prefill's rows equal the exact ones up to rounding, not bit
 * for bit, which backend.h allows for a prompt's prefill. In a recorded step the GEMMs are
 * captured into the step's graph with the kernels around them (the workspace is set, so cuBLAS
 * allocates nothing there) and a replay launches none of them. Everything else (decode, verify,
 * drafts, short prefills, other weight types) keeps matmul.cu, and so do weights of fewer than
 * TDM_CUDA_BULK_MIN_WEIGHTS elements (cuda_backend.h): a small matrix stays in L2 across the
 * exact kernel's row groups, where cuBLAS's three launches cost more than the products (the demo
 * target's 256-wide layers, one H100: prompts of 16, 64 and 256 tokens 0.38, 0.52 and 1.42 ms
 * through cuBLAS, 0.32, 0.48 and 1.34 exact; the 0.8B shape's, whose k and v projections of
 * 0.5M elements now stay exact, the same 2.83 ms at 64 tokens).
 *
 * The answer depends on R alone, so a prompt split the same way gets the same bits every time
 * (cuBLAS picks its algorithm from the shapes; the prefix cache's fixed grid relies on that).
 * TANDEM_CUDA_BULK=0 in the environment keeps every matmul exact (bench, tests). Where cuBLAS
 * cannot start (not installed, or no device memory for its handle or workspace) the backend says
 * so once and stays exact.
 *
 * cuBLAS is opened (dlopen) at the first call that takes it, not linked: its libraries'
 * initializers cost 0.4 s of CPU at every start of a process that loads them, which a CPU run,
 * a CLI command or a service that never prefills a long prompt would pay for nothing.
 *
 * Scratch: x's parts [3R, in] bf16 and the GEMM's output [3R, columns] fp32, the columns taken
 * in slices of at most BULK_C_BYTES (an LM head's 248320 columns do not fit at once).
 */
#include "common.cuh"
#include "cuda_backend.h"
#include "matmul.cuh"

#include <cublas_v2.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The rows from which a prompt's prefill call takes cuBLAS: from 16 rows its
 * GEMM over 3R rows (still bound by the weights' bytes) beats the exact
 * kernel's row groups (matmul.cu: 4B shapes, 17 rows 7.2 ms a step against
 * cuBLAS's 3.7 at 9 to 72 rows). */
#define BULK_MIN_ROWS 16
#define BULK_WORKSPACE ((size_t)32 << 20)
#define BULK_C_BYTES ((size_t)64 << 20)

/* ---- cuBLAS, opened at first use -------------------------------------------- */

#define CB_STR_(x) #x
#define CB_STR(x) CB_STR_(x) /* a name after macro expansion (cublasCreate: cublasCreate_v2) */
/* The major version this build was compiled against: its soname. */
#define CUBLAS_SONAME "libcublas.so." CB_STR(CUBLAS_VER_MAJOR)

/* cublasGemmEx has a C++ overload (64-bit sizes): the C one. */
typedef cublasStatus_t (*cb_gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void *, const void *, cudaDataType, int,
                                        const void *, cudaDataType, int, const void *, void *,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
/* (unevaluated: it compiles only where the header declares exactly that one) */
static_assert(sizeof(static_cast<cb_gemm_ex_fn>(&cublasGemmEx)) > 0, "cublasGemmEx's C form");

static struct {
    decltype(&cublasCreate) create;
    decltype(&cublasDestroy) destroy;
    decltype(&cublasSetStream) set_stream;
    decltype(&cublasSetWorkspace) set_workspace;
    cb_gemm_ex_fn gemm_ex;
    decltype(&cublasGetStatusString) status_string;
    char error[256]; /* "" once every function above is resolved */
} cb;
static pthread_once_t cb_once = PTHREAD_ONCE_INIT;

template <typename F> static bool cb_sym(void *h, const char *name, F *f)
{
    *f = (F)dlsym(h, name);
    if (!*f)
        snprintf(cb.error, sizeof(cb.error), "%s has no %s", CUBLAS_SONAME, name);
    return *f != NULL;
}

static void cb_open(void)
{
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(cb.error, sizeof(cb.error), "%s", e ? e : CUBLAS_SONAME ": cannot be opened");
        return;
    }
    if (cb_sym(h, CB_STR(cublasCreate), &cb.create) &&
        cb_sym(h, CB_STR(cublasDestroy), &cb.destroy) &&
        cb_sym(h, CB_STR(cublasSetStream), &cb.set_stream) &&
        cb_sym(h, CB_STR(cublasSetWorkspace), &cb.set_workspace) &&
        cb_sym(h, CB_STR(cublasGemmEx), &cb.gemm_ex) &&
        cb_sym(h, CB_STR(cublasGetStatusString), &cb.status_string))
        return;
    dlclose(h); /* cb.error names the missing function */
}

int tdm_cuda_cublas_open(char *why, size_t why_len)
{
    pthread_once(&cb_once, cb_open);
    if (why && why_len)
        snprintf(why, why_len, "%s", cb.error);
    return cb.error[0] ? -1 : 0;
}

int cuda_bulk(void *ctx, int R)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    c->bulk = 0;
    if (R < BULK_MIN_ROWS || c->bulk_off)
        return 0;
    if (!c->cublas) {
        const char *env = getenv("TANDEM_CUDA_BULK");
        if (env && !strcmp(env, "0")) {
            c->bulk_off = 1;
            return 0;
        }
        char why[256];
        if (tdm_cuda_cublas_open(why, sizeof(why)) != 0) {
            fprintf(stderr,
                    "tandem cuda: cuBLAS did not start (%s); prompt prefill keeps the exact "
                    "matmuls\n",
                    why);
            c->bulk_off = 1;
            return 0;
        }
        cublasHandle_t h = NULL;
        void *ws = NULL;
        cublasStatus_t st = cb.create(&h);
        if (st == CUBLAS_STATUS_SUCCESS && cuda_malloc(c, &ws, BULK_WORKSPACE) != cudaSuccess)
            st = CUBLAS_STATUS_ALLOC_FAILED;
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cb.set_stream(h, c->stream);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cb.set_workspace(h, ws, BULK_WORKSPACE);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr,
                    "tandem cuda: cuBLAS did not start (%s); prompt prefill keeps the exact "
                    "matmuls\n",
                    cb.status_string(st));
            if (h)
                cb.destroy(h);
            cudaFree(ws);
            c->bulk_off = 1;
            return 0;
        }
        c->cublas = h;
        c->bulk_ws = ws;
    }
    c->bulk = 1;
    return 1;
}

void cuda_bulk_destroy(cuda_ctx *c)
{
    if (c->cublas)
        cb.destroy((cublasHandle_t)c->cublas);
    cudaFree(c->bulk_ws);
    cudaFree(c->bulk_x);
    cudaFree(c->bulk_c);
}

/* Whether a matmul of these operands goes to cuBLAS now. */
int cuda_bulk_takes(const cuda_ctx *c, const float *x, const void *w, tdm_dtype dt, int in, int out)
{
    return c->bulk && dt == TDM_DTYPE_BF16 && in % 8 == 0 && (uintptr_t)w % 16 == 0 &&
           (uintptr_t)x % 16 == 0 && (size_t)in * (size_t)out >= TDM_CUDA_BULK_MIN_WEIGHTS;
}

/* xs [3, R, in] = x's exact bf16 parts: hi keeps x's top 8 significand bits (the low 16 bits of
 * its word cleared), mid the next 8 of the remainder, lo what is left (at most 8 bits, so it is
 * a bf16 exactly). */
__global__ void bulk_split_kernel(uint16_t *xs, const float *x, size_t n)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float v = x[i];
    const uint32_t hb = __float_as_uint(v) & 0xffff0000u;
    const float r = v - __uint_as_float(hb);
    const uint32_t mb = __float_as_uint(r) & 0xffff0000u;
    const float l = r - __uint_as_float(mb);
    xs[i] = (uint16_t)(hb >> 16);
    xs[n + i] = (uint16_t)(mb >> 16);
    xs[2 * n + i] = (uint16_t)(__float_as_uint(l) >> 16);
}

/* The part sums of output (r, o) of a column slice: hi + mid + lo. */
__device__ __forceinline__ float bulk_sum(const float *C, size_t plane, int ldc, int r, int o)
{
    const size_t i = (size_t)r * (size_t)ldc + (size_t)o;
    return (C[i] + C[plane + i]) + C[2 * plane + i];
}

/* y[r, o0 + o] (+)= the part sums, for the slice's oc columns. */
__global__ void bulk_add_kernel(float *y, const float *C, int R, int oc, int ystride, int o0,
                                int accumulate)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * (size_t)oc)
        return;
    const int r = (int)(i / (size_t)oc), o = (int)(i % (size_t)oc);
    const float v = bulk_sum(C, (size_t)R * (size_t)oc, oc, r, o);
    float *yp = y + (size_t)r * (size_t)ystride + o0 + o;
    *yp = accumulate ? *yp + v : v;
}

/* y[r, o0 + o] = silu(gate sums) * up sums; G and U each a slice's [3, R, oc]. */
__global__ void bulk_silu_kernel(float *y, const float *G, const float *U, int R, int oc,
                                 int ystride, int o0)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * (size_t)oc)
        return;
    const int r = (int)(i / (size_t)oc), o = (int)(i % (size_t)oc);
    const size_t plane = (size_t)R * (size_t)oc;
    y[(size_t)r * (size_t)ystride + o0 + o] =
        cuda_silu(bulk_sum(G, plane, oc, r, o)) * bulk_sum(U, plane, oc, r, o);
}

/* x's parts in scratch. */
static const uint16_t *bulk_split(cuda_ctx *c, const float *x, int R, int in)
{
    const size_t n = (size_t)R * (size_t)in;
    uint16_t *xs =
        (uint16_t *)cuda_grow(c, (void **)&c->bulk_x, &c->bulk_x_cap, 3 * n * sizeof(uint16_t));
    cuda_launch(c, bulk_split_kernel, cuda_blocks(n, 256), 256, 0, xs, x, n);
    return xs;
}

/* C [3R, oc] fp32 = xs [3R, in] · w[o0 .. o0 + oc)ᵀ (row-major; cuBLAS sees the transposes). */
static void bulk_gemm(cuda_ctx *c, float *C, const uint16_t *xs, const uint16_t *w, int R, int in,
                      int o0, int oc)
{
    if (c->replaying) /* the step's graph holds the GEMM (captured with it) */
        return;
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t st =
        cb.gemm_ex((cublasHandle_t)c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, oc, 3 * R, in, &one,
                   w + (size_t)o0 * (size_t)in, CUDA_R_16BF, in, xs, CUDA_R_16BF, in, &zero, C,
                   CUDA_R_32F, oc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "tandem cuda: cublasGemmEx (%d x %d x %d): %s\n", oc, 3 * R, in,
                cb.status_string(st));
        abort();
    }
}

/* Columns of a slice: `planes` [3R, oc] outputs fit BULK_C_BYTES. */
static int bulk_cols(int R, int out, int planes)
{
    const size_t per_col = (size_t)planes * 3 * (size_t)R * sizeof(float);
    size_t oc = BULK_C_BYTES / per_col;
    oc = oc < 64 ? 64 : oc & ~(size_t)63;
    return oc < (size_t)out ? (int)oc : out;
}

static float *bulk_scratch(cuda_ctx *c, int R, int oc, int planes)
{
    return (float *)cuda_grow(c, (void **)&c->bulk_c, &c->bulk_c_cap,
                              (size_t)planes * 3 * (size_t)R * (size_t)oc * sizeof(float));
}

void cuda_bulk_matmul_n(cuda_ctx *c, const float *x, int R, int in, int n, float *const *ys,
                        const uint16_t *const *ws, const int *outs, int accumulate)
{
    const uint16_t *xs = bulk_split(c, x, R, in);
    for (int i = 0; i < n; i++) {
        const int oc = bulk_cols(R, outs[i], 1);
        float *C = bulk_scratch(c, R, oc, 1);
        for (int o0 = 0; o0 < outs[i]; o0 += oc) {
            const int m = outs[i] - o0 < oc ? outs[i] - o0 : oc;
            bulk_gemm(c, C, xs, ws[i], R, in, o0, m);
            cuda_launch(c, bulk_add_kernel, cuda_blocks((size_t)R * (size_t)m, 256), 256, 0, ys[i],
                        (const float *)C, R, m, outs[i], o0, accumulate);
        }
    }
}

void cuda_bulk_matmul_silu(cuda_ctx *c, float *y, const float *x, const uint16_t *gate,
                           const uint16_t *up, int R, int in, int out)
{
    const uint16_t *xs = bulk_split(c, x, R, in);
    const int oc = bulk_cols(R, out, 2);
    float *G = bulk_scratch(c, R, oc, 2);
    for (int o0 = 0; o0 < out; o0 += oc) {
        const int m = out - o0 < oc ? out - o0 : oc;
        float *U = G + 3 * (size_t)R * (size_t)m;
        bulk_gemm(c, G, xs, gate, R, in, o0, m);
        bulk_gemm(c, U, xs, up, R, in, o0, m);
        cuda_launch(c, bulk_silu_kernel, cuda_blocks((size_t)R * (size_t)m, 256), 256, 0, y,
                    (const float *)G, (const float *)U, R, m, out, o0);
    }
}
