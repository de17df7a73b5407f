/* matmul.cuh - y [R,out] (+)= x [R,in] · wᵀ on the GPU (see matmul.cu). */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_CUH

#include "common.cuh"

void cuda_matmul(void *ctx, float *y, const float *x, tdm_weight w, int R, int in, int out,
                 int accumulate);

/* ys[i] [R, outs[i]] = x [R, in] · ws[i]ᵀ for i < n: the same results as n
 * cuda_matmul calls, bf16 weights sharing one launch. */
void cuda_matmul_n(void *ctx, const float *x, int R, int in, int n, float *const *ys,
                   const tdm_weight *ws, const int *outs);

/* y [R, out] = silu(x · gateᵀ) ⊙ (x · upᵀ): bit for bit cuda_matmul_n of
 * the two, then cuda_silu_mul; bf16 weights in one launch, the SiLU product
 * taken where the sums are made. */
void cuda_matmul_silu(void *ctx, float *y, const float *x, tdm_weight gate, tdm_weight up, int R,
                      int in, int out);

/* backend.h's norm_matmul: xn = rmsnorm(x), then cuda_matmul_n of xn (up
 * NULL) or cuda_matmul_silu of xn with ws[0] and *up, bit for bit; decode
 * rows (one or two) in one launch. */
void cuda_norm_matmul(void *ctx, float *xn, const float *x, const float *w, float eps,
                      int zero_centred, int R, int in, int n, float *const *ys,
                      const tdm_weight *ws, const tdm_weight *up, const int *outs);

/* ---- a prompt prefill's matmuls on cuBLAS (bulk.cu) ----------------------- */

/* backend.h's bulk slot. */
int cuda_bulk(void *ctx, int R);
void cuda_bulk_destroy(cuda_ctx *c);
/* Whether a matmul of these operands goes to cuBLAS now (inside a bulk
 * call, bf16 weights of at least TDM_CUDA_BULK_MIN_WEIGHTS elements, the vector
 * paths' alignment). */
int cuda_bulk_takes(const cuda_ctx *c, const float *x, const void *w, tdm_dtype dt, int in,
                    int out);
/* cuda_matmul_n (with accumulate) and cuda_matmul_silu on cuBLAS: equal to
 * them up to rounding. */
void cuda_bulk_matmul_n(cuda_ctx *c, const float *x, int R, int in, int n, float *const *ys,
                        const uint16_t *const *ws, const int *outs, int accumulate);
void cuda_bulk_matmul_silu(cuda_ctx *c, float *y, const float *x, const uint16_t *gate,
                           const uint16_t *up, int R, int in, int out);

/* ---- activations split for the tensor-core path --------------------------
 *
 * Three rows or more of fp32 x reach the tensor cores as bf16 parts hi +
 * mid + lo, in the order the matmul's lanes load them (matmul.cu). When the
 * rows are 64-value aligned (in % 64 == 0) that layout depends only on the
 * flat index of a value, so the kernel producing x (a norm, the attention
 * gate, the gate/up pair's SiLU product) can write the parts as it writes
 * x, and the matmul reading x next skips its own split kernel. */

/* bf16 bits of v rounded to nearest even (v finite). */
__device__ __forceinline__ uint32_t mmt_bf16(float v)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* Splits a, b exactly into bf16 pairs: hi + mid + lo == the fp32 values. */
__device__ __forceinline__ void mmt_split(float a, float b, uint32_t *hi, uint32_t *mid,
                                          uint32_t *lo)
{
    const uint32_t ah = mmt_bf16(a), bh = mmt_bf16(b);
    const float ar = a - __uint_as_float(ah << 16), br = b - __uint_as_float(bh << 16);
    const uint32_t am = mmt_bf16(ar), bm = mmt_bf16(br);
    const float ar2 = ar - __uint_as_float(am << 16), br2 = br - __uint_as_float(bm << 16);
    *hi = ah | (bh << 16);
    *mid = am | (bm << 16);
    *lo = mmt_bf16(ar2) | (mmt_bf16(br2) << 16);
}

/* The parts of values f .. f + 3 (f % 4 == 0) of a 64-aligned x into xs:
 * 96 words per 64 values (a row's step), part-major; inside a part, the
 * pair of elements e, e + 1 of the step is word 4c + t with t = e / 16 and
 * chunk c = 2 (e % 16 / 4) + e % 4 / 2 (the k order of matmul.cu: a chunk
 * is one mma's k-half). The one writer of the layout: the matmul's own
 * split kernel uses it too. */
__device__ __forceinline__ void cuda_xs_put4(uint32_t *xs, size_t f, float4 v)
{
    uint32_t a[3], b[3];
    mmt_split(v.x, v.y, &a[0], &a[1], &a[2]);
    mmt_split(v.z, v.w, &b[0], &b[1], &b[2]);
    const int e = (int)(f % 64), t = e >> 4, c = 2 * ((e >> 2) & 3);
    uint32_t *o = xs + (f / 64) * 96 + 4 * c + t;
#pragma unroll
    for (int p = 0; p < 3; p++) {
        o[32 * p] = a[p];
        o[32 * p + 4] = b[p];
    }
}

/* Whether a tensor-core matmul of R rows takes x as parts (fewer rows it
 * splits in its warps): producers that know the rows ask before writing
 * parts nobody reads. */
int cuda_xs_rows(int R);

/* Where a kernel about to write n values of x should also write their
 * parts: mm_xs, grown to hold them, or NULL when n is not 64-aligned. */
uint32_t *cuda_xs_target(cuda_ctx *c, size_t n);

/* After launching the kernel that wrote the parts of y's n values into
 * `parts` (cuda_xs_target's buffer, or the gate/up pair's own). */
void cuda_xs_written(cuda_ctx *c, const float *y, size_t n, uint32_t *parts);

#endif
