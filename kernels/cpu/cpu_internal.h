/*
 * cpu_internal.h - shared between the CPU backend's files; not part of the
 * backend interface.
 */
#ifndef TANDEM_KERNELS_CPU_INTERNAL_H
#define TANDEM_KERNELS_CPU_INTERNAL_H

#include "backend.h"
#include "pool.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Under AddressSanitizer the innermost loops (the matmul's tiles, the delta
 * rule's state updates) run uninstrumented (CPU_UNCHECKED): a check on
 * every load and store made them most of a sanitizer build's time. Their
 * callers check each operand's whole range first (cpu_check_range), so a
 * call that reaches past a buffer or into freed memory is still reported,
 * with the buffer's allocation, and the process aborts. */
#if defined(__SANITIZE_ADDRESS__)
#define CPU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CPU_ASAN 1
#endif
#endif
#ifdef CPU_ASAN
#define CPU_UNCHECKED __attribute__((no_sanitize("address")))
void cpu_check_range(const void *p, size_t bytes, const char *what);
#else
#define CPU_UNCHECKED
static inline void cpu_check_range(const void *p, size_t bytes, const char *what)
{
    (void)p;
    (void)bytes;
    (void)what;
}
#endif

typedef struct cpu_ctx {
    tdm_pool *pool;
    int use_avx2; /* AVX2 + FMA present at run time */
} cpu_ctx;

static inline float cpu_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* An FP8 E4M3 code's weight (backend.h, TDM_DTYPE_FP8), scale = 2^scale_exp:
 * the code's bits moved into a float's (sign to 31, eeee mmm to 26..20) are
 * its value times 2^-120, a tiny normal or subnormal float exactly; times
 * 2^120, exactly its value (at most 448); times the scale, exactly the
 * weight (tdm_fp8_value). */
#define CPU_F8_UNBIAS 0x1p120f
static inline float cpu_fp8_to_f32(uint8_t c, float scale)
{
    const uint32_t u = ((uint32_t)(c & 0x80) << 24) | ((uint32_t)(c & 0x7f) << 20);
    float f;
    memcpy(&f, &u, sizeof(f));
    return f * CPU_F8_UNBIAS * scale;
}

/* y [R,out] (+)= x [R,in] · wᵀ on the pool. */
void cpu_matmul(cpu_ctx *c, float *y, const float *x, tdm_weight w, int R, int in, int out,
                int accumulate);

/* The sample slot (sample.c): spec/sampling.c's draw, bit for bit. */
void cpu_sample(void *ctx, int32_t *out, const float *x, int R, int n, const tdm_sample_row *rows);
/* The sample_to slot: the same draws, from chosen rows, with their
 * distributions (backend.h). */
void cpu_sample_to(void *ctx, int32_t *out, float *probs, const float *x, const int32_t *rows,
                   int nrows, int n, const int32_t *map, const tdm_sample_row *srows);

#endif
