/*
 * sample.c - the CPU backend's sample op: per row, the token that
 * tdm_sampling_probs + tdm_sampling_draw (spec/sampling.c) give. The
 * sampling arithmetic lives there once; this only runs it per row on the
 * pool, each row with scratch of its own (the sort context is thread-local).
 */
#include "cpu_internal.h"
#include "alloc.h"
#include "sampling.h"

#include <stdlib.h>

typedef struct sample_args {
    int32_t *out;
    const float *x;
    const tdm_sample_row *rows;
    int n;
} sample_args;

static void sample_task(void *vp, int r)
{
    const sample_args *a = vp;
    const tdm_sample_row *row = &a->rows[r];
    const tdm_sampling s = {row->temperature, row->top_p, row->top_k};
    const float *x = a->x + (size_t)r * (size_t)a->n;
    if (tdm_sampling_is_greedy(&s)) {
        a->out[r] = tdm_sampling_argmax(x, a->n);
        return;
    }
    float *probs = tdm_xmalloc(sizeof(float) * (size_t)a->n);
    int *order = tdm_xmalloc(sizeof(int) * (size_t)a->n);
    tdm_sampling_probs(&s, x, a->n, probs, order);
    a->out[r] = tdm_sampling_draw(probs, a->n, row->u);
    free(order);
    free(probs);
}

void cpu_sample(void *ctx, int32_t *out, const float *x, int R, int n, const tdm_sample_row *rows)
{
    cpu_ctx *c = ctx;
    if (R <= 0 || n <= 0)
        return;
    sample_args a = {out, x, rows, n};
    tdm_pool_run(c->pool, sample_task, &a, R);
}
