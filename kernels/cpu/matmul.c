/*
 * matmul.c - y [R,out] (+)= x [R,in] · wᵀ for fp32 and bf16 weights.
 *
 * Threads split the output columns. Each (row, column) dot product follows
 * one fixed order of operations whether its row is computed alone or in a
 * tile of four: two 8-lane accumulators over 16-element steps, one optional
 * 8-element step into the first, a horizontal sum, then the scalar tail. So
 * results do not depend on R or on how rows are batched, which the engine's
 * bit-identical commit strategies rely on. An AVX2/FMA path is chosen at run
 * time; the portable path follows the same lane structure.
 */
#include "cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MM_TILE 4

typedef struct mm_args {
    float *y;
    const float *x;
    const void *w;
    tdm_dtype dt;
    int R, in, out, acc, avx2;
    int cols; /* columns per chunk, a multiple of 8 */
} mm_args;

static inline float mm_w(const void *w, tdm_dtype dt, size_t i)
{
    return dt == TDM_DTYPE_BF16 ? cpu_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* Portable path: emulates the 2x8-lane structure with arrays. */
static float mm_dot_portable(const float *x, const void *w, tdm_dtype dt, size_t wo, int in)
{
    float a0[8] = {0}, a1[8] = {0};
    int k = 0;
    for (; k + 16 <= in; k += 16)
        for (int l = 0; l < 8; l++) {
            a0[l] += mm_w(w, dt, wo + (size_t)k + (size_t)l) * x[k + l];
            a1[l] += mm_w(w, dt, wo + (size_t)k + 8 + (size_t)l) * x[k + 8 + l];
        }
    if (k + 8 <= in) {
        for (int l = 0; l < 8; l++)
            a0[l] += mm_w(w, dt, wo + (size_t)k + (size_t)l) * x[k + l];
        k += 8;
    }
    float s = 0;
    for (int l = 0; l < 8; l++)
        s += a0[l] + a1[l];
    for (; k < in; k++)
        s += mm_w(w, dt, wo + (size_t)k) * x[k];
    return s;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static inline __m256 mm_load8(const void *w, tdm_dtype dt,
                                                                   size_t i)
{
    if (dt == TDM_DTYPE_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w + i);
}

__attribute__((target("avx2,fma"))) static inline float mm_hsum(__m256 a0, __m256 a1)
{
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(a0, a1));
    float s = 0;
    for (int l = 0; l < 8; l++)
        s += t[l];
    return s;
}

/* Columns [o0, o1) for all rows, rows in tiles of MM_TILE. */
__attribute__((target("avx2,fma"))) static void mm_avx2(const mm_args *a, int o0, int o1)
{
    const int in = a->in;
    for (int o = o0; o < o1; o++) {
        size_t wo = (size_t)o * (size_t)in;
        int r = 0;
        for (; r + MM_TILE <= a->R; r += MM_TILE) {
            /* Explicit registers: arrays of __m256 end up on the stack. */
            const float *x0 = a->x + (size_t)r * (size_t)in, *x1 = x0 + in, *x2 = x1 + in,
                        *x3 = x2 + in;
            __m256 p0 = _mm256_setzero_ps(), q0 = p0, p1 = p0, q1 = p0, p2 = p0, q2 = p0,
                   p3 = p0, q3 = p0;
            int k = 0;
            for (; k + 16 <= in; k += 16) {
                __m256 w0 = mm_load8(a->w, a->dt, wo + (size_t)k);
                __m256 w1 = mm_load8(a->w, a->dt, wo + (size_t)k + 8);
                p0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), p0);
                q0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), q0);
                p1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), p1);
                q1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), q1);
                p2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + k), p2);
                q2 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + k + 8), q2);
                p3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + k), p3);
                q3 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + k + 8), q3);
            }
            int k8 = k;
            if (k + 8 <= in) {
                __m256 w0 = mm_load8(a->w, a->dt, wo + (size_t)k);
                p0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), p0);
                p1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), p1);
                p2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + k), p2);
                p3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + k), p3);
                k8 = k + 8;
            }
            float s[MM_TILE] = {mm_hsum(p0, q0), mm_hsum(p1, q1), mm_hsum(p2, q2),
                                mm_hsum(p3, q3)};
            for (int t = 0; t < MM_TILE; t++) {
                const float *xr = a->x + (size_t)(r + t) * (size_t)in;
                for (int kk = k8; kk < in; kk++)
                    s[t] += mm_w(a->w, a->dt, wo + (size_t)kk) * xr[kk];
                float *yp = a->y + (size_t)(r + t) * (size_t)a->out + o;
                *yp = a->acc ? *yp + s[t] : s[t];
            }
        }
        for (; r < a->R; r++) {
            const float *xr = a->x + (size_t)r * (size_t)in;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            int k = 0;
            for (; k + 16 <= in; k += 16) {
                a0 = _mm256_fmadd_ps(mm_load8(a->w, a->dt, wo + (size_t)k), _mm256_loadu_ps(xr + k),
                                     a0);
                a1 = _mm256_fmadd_ps(mm_load8(a->w, a->dt, wo + (size_t)k + 8),
                                     _mm256_loadu_ps(xr + k + 8), a1);
            }
            if (k + 8 <= in) {
                a0 = _mm256_fmadd_ps(mm_load8(a->w, a->dt, wo + (size_t)k), _mm256_loadu_ps(xr + k),
                                     a0);
                k += 8;
            }
            float s = mm_hsum(a0, a1);
            for (; k < in; k++)
                s += mm_w(a->w, a->dt, wo + (size_t)k) * xr[k];
            float *yp = a->y + (size_t)r * (size_t)a->out + o;
            *yp = a->acc ? *yp + s : s;
        }
    }
}
#endif

static void mm_task(void *vp, int chunk)
{
    const mm_args *a = vp;
    /* Contiguous column ranges, aligned to 8 so threads do not share cache
     * lines of y more than necessary. */
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
        for (int r = 0; r < a->R; r++) {
            float s = mm_dot_portable(a->x + (size_t)r * (size_t)a->in, a->w, a->dt,
                                      (size_t)o * (size_t)a->in, a->in);
            float *yp = a->y + (size_t)r * (size_t)a->out + o;
            *yp = a->acc ? *yp + s : s;
        }
}

void cpu_matmul(cpu_ctx *c, float *y, const float *x, tdm_weight w, int R, int in, int out,
                int accumulate)
{
    /* About 8 chunks per thread: small enough to rebalance when a thread
     * stalls, large enough to keep the claim cost negligible. */
    int nth = tdm_pool_size(c->pool);
    int cols = (out + 8 * nth - 1) / (8 * nth);
    cols = (cols + 7) & ~7;
    if ((size_t)R * (size_t)in * (size_t)out < 32768)
        cols = (out + 7) & ~7;
    mm_args a = {y, x, w.data, w.dtype, R, in, out, accumulate, c->use_avx2, cols};
    tdm_pool_run(c->pool, mm_task, &a, (out + cols - 1) / cols);
}
