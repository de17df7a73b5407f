/*
 * elementwise.cu - one thread per output element, or per 4 consecutive ones
 * (float4) where the op streams long rows and the pointers allow; the same
 * formulas as the CPU backend (accurate expf, no fast-math intrinsics). Every element is computed
 * on its own, so how elements are grouped never changes a bit.
 */
#include "elementwise.cuh"

#include <math.h>
#include <stdint.h>

#define EW_THREADS 256

/* Whether float4 accesses at element offsets that are multiples of 4 are
 * aligned for all of these pointers. */
static int ew_aligned(const void *a, const void *b, const void *c)
{
    return ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

/* scale: 2^scale_exp for FP8 codes. A code's bits moved into a float's
 * (sign to 31, eeee mmm to 26..20) are its value times 2^-120 exactly, so
 * times 2^120 and the scale, exactly the weight (tdm_fp8_value). */
__global__ void embed_kernel(float *y, const void *e, tdm_dtype dt, float scale, const int32_t *ids,
                             int R, int H)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * (size_t)H)
        return;
    const size_t r = i / (size_t)H, c = i % (size_t)H;
    if (ids[r] < 0) {
        y[i] = 0.0f;
    } else if (dt == TDM_DTYPE_FP8) {
        const unsigned u = ((const uint8_t *)e)[(size_t)ids[r] * (size_t)H + c];
        y[i] = __uint_as_float(((u & 0x80u) << 24) | ((u & 0x7fu) << 20)) * 0x1p120f * scale;
    } else {
        y[i] = cuda_wload(e, dt, (size_t)ids[r] * (size_t)H + c);
    }
}

static float embed_scale(tdm_weight e)
{
    return e.dtype == TDM_DTYPE_FP8 ? ldexpf(1.0f, e.scale_exp) : 1.0f;
}

void cuda_embed(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || H <= 0)
        return;
    const int32_t *dids = (const int32_t *)cuda_stage(c, ids, (size_t)R * sizeof(int32_t));
    const size_t n = (size_t)R * (size_t)H;
    cuda_launch(c, embed_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, y, e.data, e.dtype,
                embed_scale(e), dids, R, H);
}

void cuda_embed_dev(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || H <= 0)
        return;
    const size_t n = (size_t)R * (size_t)H;
    cuda_launch(c, embed_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, y, e.data, e.dtype,
                embed_scale(e), ids, R, H);
}

/* y[i] = f(a[i], b[i]) for 4 elements from i, float4 when the pointers are
 * aligned, scalar for the tail and otherwise. */
__device__ __forceinline__ float ew_silu_mul(float a, float b)
{
    return cuda_silu(a) * b;
}

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
