/*
 * elementwise.cu - one thread per output element, or per 4 consecutive ones
 * (float4) where the op streams long rows and the pointers allow; the same
 * formulas as the CPU backend (accurate expf/sinf/cosf, no fast-math
 * intrinsics). Every element is computed on its own, so how elements are
 * grouped never changes a bit.
 */
#include "elementwise.cuh"
#include "matmul.cuh"

#include <stdint.h>

#define EW_THREADS 256

/* Whether float4 accesses at element offsets that are multiples of 4 are
 * aligned for all of these pointers. */
static int ew_aligned(const void *a, const void *b, const void *c)
{
    return ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

__global__ void embed_kernel(float *y, const void *e, tdm_dtype dt, const int32_t *ids, int R,
                             int H)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * (size_t)H)
        return;
    const size_t r = i / (size_t)H, c = i % (size_t)H;
    y[i] = ids[r] < 0 ? 0.0f : cuda_wload(e, dt, (size_t)ids[r] * (size_t)H + c);
}

void cuda_embed(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || H <= 0)
        return;
    const int32_t *dids = (const int32_t *)cuda_stage(c, ids, (size_t)R * sizeof(int32_t));
    const size_t n = (size_t)R * (size_t)H;
    cuda_launch(c, embed_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, y, e.data, e.dtype,
                dids, R, H);
}

void cuda_embed_dev(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || H <= 0)
        return;
    const size_t n = (size_t)R * (size_t)H;
    cuda_launch(c, embed_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, y, e.data, e.dtype,
                ids, R, H);
}

/* One thread per W consecutive elements of [R, nH, D] (W = 4 when D % 4 == 0
 * and the pointers are aligned, so the W never straddle two heads). */
template <int W>
__global__ void split_qgate_kernel(float *q, float *gate, const float *qg, size_t n, int D)
{
    cuda_kernel_begin();
    const size_t i = W * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n)
        return;
    const size_t head = i / (size_t)D, d = i % (size_t)D;
    const float *src = qg + head * 2 * (size_t)D;
    if (W == 4) {
        *(float4 *)(q + i) = *(const float4 *)(src + d);
        *(float4 *)(gate + i) = *(const float4 *)(src + D + d);
    } else {
        q[i] = src[d];
        gate[i] = src[D + d];
    }
}

void cuda_split_qgate(void *ctx, float *q, float *gate, const float *qg, int R, int nH, int D)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const size_t n = (size_t)R * (size_t)nH * (size_t)D;
    if (n == 0)
        return;
    if (D % 4 == 0 && ew_aligned(q, gate, qg))
        cuda_launch(c, split_qgate_kernel<4>, cuda_blocks(n / 4, EW_THREADS), EW_THREADS, 0, q,
                    gate, qg, n, D);
    else
        cuda_launch(c, split_qgate_kernel<1>, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, q, gate,
                    qg, n, D);
}

/* One thread per (row, head, i < rot/2): rotates the pair (i, i + rot/2). */
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int R, int nH,
                            int D, int half)
{
    cuda_kernel_begin();
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)R * (size_t)nH * (size_t)half)
        return;
    const int i = (int)(t % (size_t)half);
    const size_t rh = t / (size_t)half; /* row * nH + head */
    const int r = (int)(rh / (size_t)nH);
    const float ang = inv_freq[i] * (float)pos[r];
    const float cs = cosf(ang), sn = sinf(ang);
    float *xh = x + rh * (size_t)D;
    const float x1 = xh[i], x2 = xh[i + half];
    xh[i] = x1 * cs - x2 * sn;
    xh[i + half] = x2 * cs + x1 * sn;
}

void cuda_rope(void *ctx, float *x, const int32_t *positions, const float *inv_freq, int R, int nH,
               int D, int rot_dim)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const int half = rot_dim / 2;
    const size_t n = (size_t)R * (size_t)nH * (size_t)half;
    if (n == 0)
        return;
    const int32_t *dpos = (const int32_t *)cuda_stage(c, positions, (size_t)R * sizeof(int32_t));
    const float *dfreq = (const float *)cuda_stage(c, inv_freq, (size_t)half * sizeof(float));
    cuda_launch(c, rope_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, x, dpos, dfreq, R, nH, D,
                half);
}

/* Where kv_store writes: per sequence and step (the caches move when they
 * grow), so it is staged rather than passed by value, and a replayed graph
 * writes where this call says. */
typedef struct kv_dest {
    float *k_cache, *v_cache;
    long long at; /* first element: row `at` times kv_width */
} kv_dest;

__global__ void kv_store_kernel(const kv_dest *dst, const float *k, const float *v, size_t n)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const size_t o = (size_t)dst->at + i;
    dst->k_cache[o] = k[i];
    dst->v_cache[o] = v[i];
}

void cuda_kv_store(void *ctx, float *k_cache, float *v_cache, const float *k, const float *v,
                   int at, int nrows, int kv_width)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const size_t n = (size_t)nrows * (size_t)kv_width;
    if (n == 0)
        return;
    const kv_dest h = {k_cache, v_cache, (long long)at * (long long)kv_width};
    const kv_dest *d = (const kv_dest *)cuda_stage(c, &h, sizeof(h));
    cuda_launch(c, kv_store_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, d, k, v, n);
}

/* mul_sigmoid and silu_mul: one thread per 4 consecutive elements, float4
 * when the pointers are aligned, scalar for the tail and otherwise. */
__device__ __forceinline__ float ew_mul_sigmoid(float y, float g)
{
    return y * cuda_sigmoid(g);
}

__device__ __forceinline__ float ew_silu_mul(float a, float b)
{
    return cuda_silu(a) * b;
}

/* y[i] = f(a[i], b[i]) for 4 elements from i. */
template <float (*F)(float, float)>
__device__ __forceinline__ void ew_four(float *y, const float *a, const float *b, size_t i,
                                        size_t n, int vec)
{
    if (vec && i + 4 <= n) {
        const float4 u = *(const float4 *)(a + i), v = *(const float4 *)(b + i);
        *(float4 *)(y + i) = make_float4(F(u.x, v.x), F(u.y, v.y), F(u.z, v.z), F(u.w, v.w));
        return;
    }
    for (size_t j = i; j < n && j < i + 4; j++)
        y[j] = F(a[j], b[j]);
}

/* xs non-NULL (float4 path, n % 64 == 0): y's bf16 parts too, for the
 * matmul that reads y next (the attention output into o_proj). */
__global__ void mul_sigmoid_kernel(float *y, const float *gate, size_t n, int vec, uint32_t *xs)
{
    cuda_kernel_begin();
    const size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n)
        return;
    ew_four<ew_mul_sigmoid>(y, y, gate, i, n, vec);
    if (xs)
        cuda_xs_put4(xs, i, *(const float4 *)(y + i));
}

void cuda_mul_sigmoid(void *ctx, float *y, const float *gate, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (n == 0)
        return;
    const int vec = ew_aligned(y, gate, NULL);
    uint32_t *xs = vec ? cuda_xs_target(c, n) : NULL; /* its rows are unknown here */
    cuda_launch(c, mul_sigmoid_kernel, cuda_blocks((n + 3) / 4, EW_THREADS), EW_THREADS, 0, y, gate,
                n, vec, xs);
    if (xs)
        cuda_xs_written(c, y, n, xs);
}

__global__ void silu_mul_kernel(float *y, const float *a, const float *b, size_t n, int vec)
{
    cuda_kernel_begin();
    const size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        ew_four<ew_silu_mul>(y, a, b, i, n, vec);
}

void cuda_silu_mul(void *ctx, float *y, const float *a, const float *b, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (n == 0)
        return;
    cuda_launch(c, silu_mul_kernel, cuda_blocks((n + 3) / 4, EW_THREADS), EW_THREADS, 0, y, a, b, n,
                ew_aligned(y, a, b));
}
