/*
 * matmul.c - y [R,out] (+)= x [R,in] · wᵀ for fp32, bf16 and fp8 (E4M3, scaled) weights.
 *
 * Threads claim chunks of output columns. Every (row, column) dot product
 * follows one fixed order of operations: one 8-lane accumulator over the
 * 8-element steps of k, a horizontal sum of its lanes in order, then the
 * scalar tail. Tiles only decide how many of these independent dot products
 * run side by side (4 x 2, 1 x 2, 1 x 4 or 1 x 1 rows x columns), never how
 * one is computed. So a row's
 * result does not depend on R or on how rows are batched, which the engine's
 * bit-identical commit strategies rely on. An AVX2/FMA path is chosen at run
 * time; the portable path has the same lane structure (without FMA).
 */
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct mm_args {
    float *y;
    const float *x;
    const void *w;
    tdm_dtype dt;
    int R, in, out, acc, avx2;
    int cols;    /* columns per chunk, a multiple of 8 */
    float scale; /* TDM_DTYPE_FP8: 2^scale_exp */
} mm_args;

/* FP8 codes into floats: cpu_fp8_to_f32, the AVX2 path 8 at a time. */
CPU_UNCHECKED static inline float mm_f8(const mm_args *a, uint8_t c)
{
    return cpu_fp8_to_f32(c, a->scale);
}

CPU_UNCHECKED static inline float mm_w(const mm_args *a, size_t i)
{
    if (a->dt == TDM_DTYPE_FP8)
        return mm_f8(a, ((const uint8_t *)a->w)[i]);
    return a->dt == TDM_DTYPE_BF16 ? cpu_bf16_to_f32(((const uint16_t *)a->w)[i])
                                   : ((const float *)a->w)[i];
}

CPU_UNCHECKED static inline void mm_store(const mm_args *a, int r, int o, float s)
{
    float *yp = a->y + (size_t)r * (size_t)a->out + (size_t)o;
    *yp = a->acc ? *yp + s : s;
}

/* Portable path: the same 8-lane structure with an array. */
CPU_UNCHECKED static float mm_dot_portable(const mm_args *a, const float *x, size_t wo)
{
    const int in = a->in;
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= in; k += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += mm_w(a, wo + (size_t)k + (size_t)l) * x[k + l];
    float s = 0;
    for (int l = 0; l < 8; l++)
        s += acc[l];
    for (; k < in; k++)
        s += mm_w(a, wo + (size_t)k) * x[k];
    return s;
}

#if defined(__x86_64__)
#define MM_AVX CPU_UNCHECKED __attribute__((target("avx2,fma")))

MM_AVX static inline __m256 mm_load8(const mm_args *a, size_t i)
{
    if (a->dt == TDM_DTYPE_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)a->w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (a->dt == TDM_DTYPE_FP8) { /* mm_f8, 8 at a time */
        const __m256i c =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((const uint8_t *)a->w + i)));
        const __m256i f =
            _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24),
                            _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20));
        const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(f), _mm256_set1_ps(CPU_F8_UNBIAS));
        return _mm256_mul_ps(v, _mm256_set1_ps(a->scale));
    }
    return _mm256_loadu_ps((const float *)a->w + i);
}

/* Lanes summed in order 0..7, then the scalar tail from k8. */
MM_AVX static inline float mm_finish(const mm_args *a, __m256 acc, const float *x, size_t wo,
                                     int k8)
{
    float t[8];
    _mm256_storeu_ps(t, acc);
    float s = 0;
    for (int l = 0; l < 8; l++)
        s += t[l];
    for (int k = k8; k < a->in; k++)
        s += mm_w(a, wo + (size_t)k) * x[k];
    return s;
}

/* 4 rows x 2 columns. */
MM_AVX static void mm_tile_4x2(const mm_args *a, int r, int o)
{
    const int in = a->in, K8 = in & ~7;
    const float *x0 = a->x + (size_t)r * (size_t)in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
    const size_t w0o = (size_t)o * (size_t)in, w1o = w0o + (size_t)in;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00;
    for (int k = 0; k < K8; k += 8) {
        __m256 w0 = mm_load8(a, w0o + (size_t)k);
        __m256 w1 = mm_load8(a, w1o + (size_t)k);
        __m256 v = _mm256_loadu_ps(x0 + k);
        c00 = _mm256_fmadd_ps(w0, v, c00);
        c01 = _mm256_fmadd_ps(w1, v, c01);
        v = _mm256_loadu_ps(x1 + k);
        c10 = _mm256_fmadd_ps(w0, v, c10);
        c11 = _mm256_fmadd_ps(w1, v, c11);
        v = _mm256_loadu_ps(x2 + k);
        c20 = _mm256_fmadd_ps(w0, v, c20);
        c21 = _mm256_fmadd_ps(w1, v, c21);
        v = _mm256_loadu_ps(x3 + k);
        c30 = _mm256_fmadd_ps(w0, v, c30);
        c31 = _mm256_fmadd_ps(w1, v, c31);
    }
    mm_store(a, r, o, mm_finish(a, c00, x0, w0o, K8));
    mm_store(a, r, o + 1, mm_finish(a, c01, x0, w1o, K8));
    mm_store(a, r + 1, o, mm_finish(a, c10, x1, w0o, K8));
    mm_store(a, r + 1, o + 1, mm_finish(a, c11, x1, w1o, K8));
    mm_store(a, r + 2, o, mm_finish(a, c20, x2, w0o, K8));
    mm_store(a, r + 2, o + 1, mm_finish(a, c21, x2, w1o, K8));
    mm_store(a, r + 3, o, mm_finish(a, c30, x3, w0o, K8));
    mm_store(a, r + 3, o + 1, mm_finish(a, c31, x3, w1o, K8));
}

/* 1 row x 4 columns: four independent chains keep the FMA unit busy while
 * the weights stream (the batch-1 decode case). */
MM_AVX static void mm_tile_1x4(const mm_args *a, int r, int o)
{
    const int in = a->in, K8 = in & ~7;
    const float *x0 = a->x + (size_t)r * (size_t)in;
    const size_t w0o = (size_t)o * (size_t)in, w1o = w0o + (size_t)in, w2o = w1o + (size_t)in,
                 w3o = w2o + (size_t)in;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int k = 0; k < K8; k += 8) {
        __m256 v = _mm256_loadu_ps(x0 + k);
        c0 = _mm256_fmadd_ps(mm_load8(a, w0o + (size_t)k), v, c0);
        c1 = _mm256_fmadd_ps(mm_load8(a, w1o + (size_t)k), v, c1);
        c2 = _mm256_fmadd_ps(mm_load8(a, w2o + (size_t)k), v, c2);
        c3 = _mm256_fmadd_ps(mm_load8(a, w3o + (size_t)k), v, c3);
    }
    mm_store(a, r, o, mm_finish(a, c0, x0, w0o, K8));
    mm_store(a, r, o + 1, mm_finish(a, c1, x0, w1o, K8));
    mm_store(a, r, o + 2, mm_finish(a, c2, x0, w2o, K8));
    mm_store(a, r, o + 3, mm_finish(a, c3, x0, w3o, K8));
}

/* 1 row x 2 columns: the rows left over after 4-row tiles, run on the
 * column pair those tiles just brought into L1. */
MM_AVX static void mm_tile_1x2(const mm_args *a, int r, int o)
{
    const int in = a->in, K8 = in & ~7;
    const float *x0 = a->x + (size_t)r * (size_t)in;
    const size_t w0o = (size_t)o * (size_t)in, w1o = w0o + (size_t)in;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0;
    for (int k = 0; k < K8; k += 8) {
        __m256 v = _mm256_loadu_ps(x0 + k);
        c0 = _mm256_fmadd_ps(mm_load8(a, w0o + (size_t)k), v, c0);
        c1 = _mm256_fmadd_ps(mm_load8(a, w1o + (size_t)k), v, c1);
    }
    mm_store(a, r, o, mm_finish(a, c0, x0, w0o, K8));
    mm_store(a, r, o + 1, mm_finish(a, c1, x0, w1o, K8));
}

MM_AVX static void mm_tile_1x1(const mm_args *a, int r, int o)
{
    const int in = a->in, K8 = in & ~7;
    const float *x0 = a->x + (size_t)r * (size_t)in;
    const size_t wo = (size_t)o * (size_t)in;
    __m256 c = _mm256_setzero_ps();
    for (int k = 0; k < K8; k += 8)
        c = _mm256_fmadd_ps(mm_load8(a, wo + (size_t)k), _mm256_loadu_ps(x0 + k), c);
    mm_store(a, r, o, mm_finish(a, c, x0, wo, K8));
}

/* Rows [r0, r1) x columns [o0, o1). With four rows or more, column pairs
 * are outer so a pair's weights stay in L1 while every row passes over them
 * (4-row tiles, then the 1-3 rows left); fewer rows take 4 columns at a time. */
MM_AVX static void mm_block(const mm_args *a, int r0, int r1, int o0, int o1)
{
    const int R4 = r0 + ((r1 - r0) & ~3);
    int o = o0;
    if (R4 > r0) {
        for (; o + 2 <= o1; o += 2) {
            for (int r = r0; r < R4; r += 4)
                mm_tile_4x2(a, r, o);
            for (int r = R4; r < r1; r++)
                mm_tile_1x2(a, r, o);
        }
        for (; o < o1; o++)
            for (int r = r0; r < r1; r++)
                mm_tile_1x1(a, r, o);
        return;
    }
    for (int r = r0; r < r1; r++) {
        o = o0;
        for (; o + 4 <= o1; o += 4)
            mm_tile_1x4(a, r, o);
        for (; o < o1; o++)
            mm_tile_1x1(a, r, o);
    }
}

/* Columns [o0, o1) for all rows, in blocks of rows whose x fits in L1 (the
 * chunk's weights then come from L2 once per block). Up to 12 rows (decode,
 * verify) stay one block so the weights stream from memory once. */
MM_AVX static void mm_avx2(const mm_args *a, int o0, int o1)
{
    int rb = a->R;
    if (rb > 12) {
        rb = (24 * 1024 / (a->in * 4)) & ~3;
        if (rb < 4)
            rb = 4;
    }
    for (int r0 = 0; r0 < a->R; r0 += rb)
        mm_block(a, r0, r0 + rb < a->R ? r0 + rb : a->R, o0, o1);
}
#endif

CPU_UNCHECKED static void mm_task(void *vp, int chunk)
{
    const mm_args *a = vp;
    int o0 = chunk * a->cols, o1 = o0 + a->cols;
    if (o1 > a->out)
        o1 = a->out;
    if (o0 >= o1)
        return;
#if defined(__x86_64__)
    if (a->avx2) {
        mm_avx2(a, o0, o1);
        return;
    }
#endif
    for (int o = o0; o < o1; o++)
        for (int r = 0; r < a->R; r++)
            mm_store(
                a, r, o,
                mm_dot_portable(a, a->x + (size_t)r * (size_t)a->in, (size_t)o * (size_t)a->in));
}

void cpu_matmul(cpu_ctx *c, float *y, const float *x, tdm_weight w, int R, int in, int out,
                int accumulate)
{
    /* About 8 chunks per thread: small enough to rebalance when a thread
     * stalls, large enough to keep the claim cost negligible. Chunks hold a
     * multiple of 8 columns so threads do not share cache lines of y. */
    int nth = tdm_pool_size(c->pool);
    int cols = (out + 8 * nth - 1) / (8 * nth);
    cols = (cols + 7) & ~7;
    if ((size_t)R * (size_t)in * (size_t)out < 32768)
        cols = (out + 7) & ~7;
    cpu_check_range(x, (size_t)R * (size_t)in * sizeof(float), "matmul x");
    cpu_check_range(w.data, (size_t)out * (size_t)in * tdm_dtype_size(w.dtype), "matmul weights");
    cpu_check_range(y, (size_t)R * (size_t)out * sizeof(float), "matmul y");
    mm_args a = {y,
                 x,
                 w.data,
                 w.dtype,
                 R,
                 in,
                 out,
                 accumulate,
                 c->use_avx2,
                 cols,
                 w.dtype == TDM_DTYPE_FP8 ? ldexpf(1.0f, w.scale_exp) : 1.0f};
    tdm_pool_run(c->pool, mm_task, &a, (out + cols - 1) / cols);
}
