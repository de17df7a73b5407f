/*
 * norm.cu - RMSNorm and gated RMSNorm.
 *
 * A row of n values is cut into groups of 4 consecutive values; the T
 * threads of a row take groups t, t+T, t+2T, ... and keep them in registers,
 * so x (and z) are read once and y written once. T follows from n alone:
 * one warp per row up to n = 1024 (NORM_WARP_ROWS rows per block, no
 * barrier at all), beyond that 32 * ceil(groups / 128) threads (at most
 * 1024), one row per block. Rows longer than NORM_REG_MAX values take a
 * loop that reads x twice, with the same layout at T = 1024.
 *
 * Sum of squares: each thread over its groups in order, a butterfly over
 * the warp, then the row's warps in order. The layout and this order depend
 * only on n, so a row's bits never depend on R or on the block it lands in.
 * float4 loads are used when n % 4 == 0 and the pointers are 16-byte
 * aligned; they read the same groups as scalar loads, so the arithmetic is
 * the same either way.
 *
 * y may be x: every thread reads all the values it writes before writing
 * any, and no thread writes a value another reads.
 *
 * Where the tensor-core matmul that reads y next takes x in bf16 parts
 * (matmul.cuh), the parts are written here too, so it needs no split kernel
 * of its own: float4 rows whose total is 64-aligned, and a plain norm's R
 * rows three or more (cuda_xs_rows); a gated norm's rows are heads, not the
 * matmul's rows, so it writes them whatever R is.
 */
#include "norm.cuh"
#include "matmul.cuh"

#include <stdint.h>

#define NORM_WARP_ROWS 4
#define NORM_MAX_G 8 /* groups of 4 per thread held in registers */
#define NORM_REG_MAX (1024 * NORM_MAX_G * 4)

typedef struct norm_args {
    float *y;
    const float *x, *z, *w; /* z: NULL for the plain norm */
    uint32_t *xs;           /* non-NULL: y's bf16 parts for the matmul after (matmul.cuh) */
    int R, n, T;
    float eps;
    int zero_centred, vec;
} norm_args;
/* Passed by value: no padding bytes (graph replays compare argument bytes). */
static_assert(sizeof(norm_args) == 5 * sizeof(void *) + 6 * sizeof(int), "norm_args is packed");

/* Loads group gi of a row (4 values, fewer at the end of the row; 0 past it). */
__device__ __forceinline__ float4 norm_load(const float *p, int gi, int n, int vec)
{
    const int i = 4 * gi;
    if (vec)
        return *(const float4 *)(p + i);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    v.x = p[i];
    if (i + 1 < n)
        v.y = p[i + 1];
    if (i + 2 < n)
        v.z = p[i + 2];
    if (i + 3 < n)
        v.w = p[i + 3];
    return v;
}

__device__ __forceinline__ void norm_store(float *p, int gi, int n, int vec, float4 v)
{
    const int i = 4 * gi;
    if (vec) {
        *(float4 *)(p + i) = v;
        return;
    }
    p[i] = v.x;
    if (i + 1 < n)
        p[i + 1] = v.y;
    if (i + 2 < n)
        p[i + 2] = v.z;
    if (i + 3 < n)
        p[i + 3] = v.w;
}

/* One output value: the CPU backend's formulas. */
__device__ __forceinline__ float norm_one(float x, float inv, float w, float z, bool gated,
                                          int zero_centred)
{
    if (gated)
        return (w * (x * inv)) * cuda_silu(z);
    return cuda_norm_one(x, inv, w, zero_centred);
}

__device__ __forceinline__ float4 norm_four(float4 x, float inv, float4 w, float4 z, bool gated,
                                            int zc)
{
    return make_float4(
        norm_one(x.x, inv, w.x, z.x, gated, zc), norm_one(x.y, inv, w.y, z.y, gated, zc),
        norm_one(x.z, inv, w.z, z.z, gated, zc), norm_one(x.w, inv, w.w, z.w, gated, zc));
}

/* Sum over the T threads of a row: butterfly per warp, then the row's warps
 * in order through red (shared, one slot per warp of the block). T == 32
 * needs no barrier; otherwise the block is one row. */
__device__ __forceinline__ float norm_row_sum(float ss, int T, float *red)
{
    ss = cuda_warp_sum(ss);
    if (T == 32)
        return ss;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        red[warp] = ss;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < T / 32; i++)
        s += red[i];
    return s;
}

template <int G, bool GATED> __global__ void norm_kernel(norm_args a)
{
    cuda_kernel_begin();
    __shared__ float red[32];
    const int T = a.T, rows = T == 32 ? NORM_WARP_ROWS : 1;
    const int r = (int)blockIdx.x * rows + (int)threadIdx.x / T, t = (int)threadIdx.x % T;
    if (r >= a.R) /* only with T == 32, where no barrier follows */
        return;
    const int n = a.n, ng = (n + 3) / 4;
    const size_t off = (size_t)r * (size_t)n;
    const float *xr = a.x + off;
    float4 xv[G], wv[G], zv[G];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < G; k++) {
        const int gi = t + k * T;
        xv[k] = wv[k] = zv[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (gi < ng) {
            xv[k] = norm_load(xr, gi, n, a.vec);
            wv[k] = norm_load(a.w, gi, n, a.vec);
            if (GATED)
                zv[k] = norm_load(a.z + off, gi, n, a.vec);
            ss = cuda_norm_sq4(xv[k], ss);
        }
    }
    ss = norm_row_sum(ss, T, red);
    const float inv = cuda_norm_inv(ss, n, a.eps);
#pragma unroll
    for (int k = 0; k < G; k++) {
        const int gi = t + k * T;
        if (gi < ng) {
            const float4 y = norm_four(xv[k], inv, wv[k], zv[k], GATED, a.zero_centred);
            norm_store(a.y + off, gi, n, a.vec, y);
            if (a.xs)
                cuda_xs_put4(a.xs, off + 4 * (size_t)gi, y);
        }
    }
}

/* Rows longer than NORM_REG_MAX: the same layout at T = 1024, reading x
 * twice instead of holding it. */
template <bool GATED> __global__ void norm_long_kernel(norm_args a)
{
    cuda_kernel_begin();
    __shared__ float red[32];
    const int n = a.n, ng = (n + 3) / 4, t = (int)threadIdx.x;
    const size_t off = (size_t)blockIdx.x * (size_t)n;
    float ss = 0.0f;
    for (int gi = t; gi < ng; gi += 1024)
        ss = cuda_norm_sq4(norm_load(a.x + off, gi, n, a.vec), ss);
    ss = norm_row_sum(ss, 1024, red);
    const float inv = cuda_norm_inv(ss, n, a.eps);
    for (int gi = t; gi < ng; gi += 1024) {
        const float4 x = norm_load(a.x + off, gi, n, a.vec), w = norm_load(a.w, gi, n, a.vec);
        const float4 z = GATED ? norm_load(a.z + off, gi, n, a.vec) : x;
        const float4 y = norm_four(x, inv, w, z, GATED, a.zero_centred);
        norm_store(a.y + off, gi, n, a.vec, y);
        if (a.xs)
            cuda_xs_put4(a.xs, off + 4 * (size_t)gi, y);
    }
}

int cuda_norm_threads(int n)
{
    const int ng = (n + 3) / 4;
    if (ng <= 32 * NORM_MAX_G)
        return 32;
    const int T = 32 * ((ng + 127) / 128);
    return T > 1024 ? 1024 : T;
}

template <bool GATED> static void norm_go(cuda_ctx *c, norm_args a)
{
    const int ng = (a.n + 3) / 4;
    if (a.n > NORM_REG_MAX) {
        a.T = 1024;
        cuda_launch(c, norm_long_kernel<GATED>, (unsigned)a.R, 1024, 0, a);
        return;
    }
    a.T = cuda_norm_threads(a.n);
    const int g = (ng + a.T - 1) / a.T;
    const unsigned blocks =
        a.T == 32 ? (unsigned)((a.R + NORM_WARP_ROWS - 1) / NORM_WARP_ROWS) : (unsigned)a.R;
    const unsigned threads = a.T == 32 ? 32 * NORM_WARP_ROWS : (unsigned)a.T;
    if (g <= 1)
        cuda_launch(c, norm_kernel<1, GATED>, blocks, threads, 0, a);
    else if (g <= 2)
        cuda_launch(c, norm_kernel<2, GATED>, blocks, threads, 0, a);
    else if (g <= 4)
        cuda_launch(c, norm_kernel<4, GATED>, blocks, threads, 0, a);
    else
        cuda_launch(c, norm_kernel<NORM_MAX_G, GATED>, blocks, threads, 0, a);
}

/* Also writes y's parts for the matmul that reads y next, where it takes
 * them (float4 rows, and rows the matmul takes as parts: a plain norm's
 * rows are the matmul's, a gated norm's are heads, so it always writes). */
template <bool GATED> static void norm_launch(cuda_ctx *c, norm_args a)
{
    const size_t total = (size_t)a.R * (size_t)a.n;
    a.xs = a.vec && (GATED || cuda_xs_rows(a.R)) ? cuda_xs_target(c, total) : NULL;
    norm_go<GATED>(c, a);
    if (a.xs)
        cuda_xs_written(c, a.y, total, a.xs);
}

static int norm_vec(int n, const void *a, const void *b, const void *c, const void *d)
{
    const uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    return n % 4 == 0 && bits % 16 == 0;
}

void cuda_rmsnorm(void *ctx, float *y, const float *x, const float *w, int R, int n, float eps,
                  int zero_centred)
{
    if (R <= 0 || n <= 0)
        return;
    const norm_args a = {
        y, x, NULL, w, NULL, R, n, 0, eps, zero_centred, norm_vec(n, y, x, w, NULL)};
    norm_launch<false>((cuda_ctx *)ctx, a);
}

void cuda_rmsnorm_gated(void *ctx, float *y, const float *x, const float *z, const float *w, int R,
                        int n, float eps)
{
    if (R <= 0 || n <= 0)
        return;
    const norm_args a = {y, x, z, w, NULL, R, n, 0, eps, 0, norm_vec(n, y, x, w, z)};
    norm_launch<true>((cuda_ctx *)ctx, a);
}
