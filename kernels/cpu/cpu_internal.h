/*
 * cpu_internal.h - shared between the CPU backend's files; not part of the
 * backend interface.
 */
#ifndef TANDEM_KERNELS_CPU_INTERNAL_H
#define TANDEM_KERNELS_CPU_INTERNAL_H

#include "backend.h"
#include "pool.h"
#include "status.h"

#include <stdint.h>
#include <string.h>

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

/* y [R,out] (+)= x [R,in] · wᵀ on the pool. */
void cpu_matmul(cpu_ctx *c, float *y, const float *x, tdm_weight w, int R, int in, int out,
                int accumulate);

/* The sample slot (sample.c): spec/sampling.c's draw, bit for bit. */
void cpu_sample(void *ctx, int32_t *out, const float *x, int R, int n, const tdm_sample_row *rows);

#endif
