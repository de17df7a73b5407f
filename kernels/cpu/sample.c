/*
 * sample.c - the CPU backend's sample op: per row, the token that
 * tdm_sampling_probs + tdm_sampling_draw (spec/sampling.c) give, bit for bit.
 *
 * The arithmetic is spec/sampling.c's, step for step (kernels do not link
 * spec/, and the backend's version is pinned to it by
 * tests/spec/test_sample_backend.c): the softmax normaliser summed in double
 * in index order, probabilities rounded to float, the support taken from
 * the order "descending probability, ascending id", the top-p mass and the
 * kept mass summed in double in that order, the draw's running sum in double
 * in index order. The order is total, so any correct sort gives the
 * reference's permutation; sorting (probability, id) pairs instead of ids
 * through a comparator that looks the probabilities up is only faster.
 * Rows run in parallel on the pool, each with scratch of its own.
 */
#include "cpu_internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct sample_key {
    float p;
    int id;
} sample_key;

static int sample_key_cmp(const void *a, const void *b)
{
    const sample_key *x = a, *y = b;
    if (x->p > y->p)
        return -1;
    if (x->p < y->p)
        return 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int sample_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* probs [n]: the distribution of tdm_sampling_probs for a non-greedy row.
 * order [n]: scratch. */
static void sample_probs(const tdm_sample_row *s, const float *x, int n, float *probs,
                         sample_key *order)
{
    float maxl = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > maxl)
            maxl = x[i];
    double inv_t = 1.0 / (double)s->temperature;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        double e = exp(((double)x[i] - (double)maxl) * inv_t);
        probs[i] = (float)e;
        sum += e;
    }
    for (int i = 0; i < n; i++)
        probs[i] = (float)((double)probs[i] / sum);

    int use_k = s->top_k > 0 && s->top_k < (uint32_t)n;
    int use_p = s->top_p > 0.0f && s->top_p < 1.0f;
    if (!use_k && !use_p)
        return;
    for (int i = 0; i < n; i++)
        order[i] = (sample_key){probs[i], i};
    qsort(order, (size_t)n, sizeof(*order), sample_key_cmp);
    int keep = use_k ? (int)s->top_k : n;
    if (use_p) {
        double mass = 0.0;
        int m = 0;
        while (m < keep) {
            mass += order[m].p;
            m++;
            if (mass >= (double)s->top_p)
                break;
        }
        keep = m;
    }
    double kept = 0.0;
    for (int i = 0; i < keep; i++)
        kept += order[i].p;
    for (int i = keep; i < n; i++)
        probs[order[i].id] = 0.0f;
    for (int i = 0; i < keep; i++)
        probs[order[i].id] = (float)((double)order[i].p / kept);
}

static int sample_draw(const float *probs, int n, double u)
{
    double acc = 0.0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (probs[i] <= 0.0f)
            continue;
        acc += probs[i];
        last = i;
        if (u < acc)
            return i;
    }
    /* Rounding left u above the total mass: the last token in the support. */
    return last >= 0 ? last : 0;
}

typedef struct sample_args {
    int32_t *out;
    const float *x;
    const tdm_sample_row *rows;
    int n;
} sample_args;

static void sample_task(void *vp, int r)
{
    const sample_args *a = vp;
    const tdm_sample_row *s = &a->rows[r];
    const float *x = a->x + (size_t)r * (size_t)a->n;
    if (!(s->temperature > 0.0f) || s->top_k == 1) {
        a->out[r] = sample_argmax(x, a->n);
        return;
    }
    float *probs = malloc(sizeof(float) * (size_t)a->n);
    sample_key *order = malloc(sizeof(sample_key) * (size_t)a->n);
    TDM_ASSERT(probs && order);
    sample_probs(s, x, a->n, probs, order);
    a->out[r] = sample_draw(probs, a->n, s->u);
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
