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
    float *probs; /* NULL: scratch of the task's own; else [R, n] */
    const float *x;
    const int32_t *xrows; /* NULL: row r of x for row r */
    const int32_t *map;
    const tdm_sample_row *rows;
    int n;
} sample_args;

static void sample_task(void *vp, int r)
{
    const sample_args *a = vp;
    const tdm_sample_row *row = &a->rows[r];
    const tdm_sampling s = {row->temperature, row->top_p, row->top_k};
    const float *x = a->x + (size_t)(a->xrows ? a->xrows[r] : r) * (size_t)a->n;
    int32_t t;
    if (tdm_sampling_is_greedy(&s)) {
        t = tdm_sampling_argmax(x, a->n);
    } else {
        float *probs = a->probs ? a->probs + (size_t)r * (size_t)a->n
                                : tdm_xmalloc(sizeof(float) * (size_t)a->n);
        int *order = tdm_xmalloc(sizeof(int) * (size_t)a->n);
        tdm_sampling_probs(&s, x, a->n, probs, order);
        t = tdm_sampling_draw(probs, a->n, row->u);
        free(order);
        if (!a->probs)
            free(probs);
    }
    a->out[r] = a->map ? a->map[t] : t;
}

void cpu_sample(void *ctx, int32_t *out, const float *x, int R, int n, const tdm_sample_row *rows)
{
    cpu_ctx *c = ctx;
    if (R <= 0 || n <= 0)
        return;
    sample_args a = {out, NULL, x, NULL, NULL, rows, n};
    tdm_pool_run(c->pool, sample_task, &a, R);
}

/* Backend memory is host memory here. */
void cpu_sample_to(void *ctx, int32_t *out, float *probs, const float *x, const int32_t *rows,
                   int nrows, int n, const int32_t *map, const tdm_sample_row *srows)
{
    cpu_ctx *c = ctx;
    if (nrows <= 0 || n <= 0)
        return;
    sample_args a = {out, probs, x, rows, map, srows, n};
    tdm_pool_run(c->pool, sample_task, &a, nrows);
}
