/*
 * The CPU backend's sample op draws exactly the token that
 * tdm_sampling_probs + tdm_sampling_draw give: for every combination of
 * greedy, temperature, top-k and top-p settings, on rows with and without
 * tied logits, with u at random, at 0, just below 1 and exactly on the
 * reference's cumulative boundaries, rows batched in one call.
 */
#include "backend.h"
#include "sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, checked;

/* Logits in [-a, a); with ties, rounded to steps of 0.25 (many equal
 * values, so equal probabilities straddle every cut) and with a tied
 * maximum planted twice. */
static void make_row(tdm_rng *rng, float *x, int n, float a, int ties)
{
    for (int i = 0; i < n; i++) {
        float v = (float)((2.0 * tdm_rng_uniform(rng) - 1.0) * a);
        x[i] = ties ? roundf(v * 4.0f) / 4.0f : v;
    }
    if (ties && n > 1) {
        x[tdm_rng_next(rng) % (uint64_t)n] = a + 1.0f;
        x[tdm_rng_next(rng) % (uint64_t)n] = a + 1.0f;
    }
}

/* u for draw j of a row: 0, just below 1, on a cumulative boundary of the
 * reference distribution, or at random. */
static double pick_u(tdm_rng *rng, int j, const float *probs, int n)
{
    if (j == 0)
        return 0.0;
    if (j == 1)
        return nextafter(1.0, 0.0);
    if (j == 2) {
        /* The running sum the reference compares against, after a random
         * token of the support: u on it draws the next token. */
        int stop = (int)(tdm_rng_next(rng) % (uint64_t)n);
        double acc = 0.0;
        for (int i = 0; i <= stop; i++)
            if (probs[i] > 0.0f)
                acc += probs[i];
        return acc < 1.0 ? acc : 0.5;
    }
    return tdm_rng_uniform(rng);
}

#define DRAWS 5

static void run_case(tdm_backend *be, tdm_rng *rng, int n, const tdm_sampling *s, float a, int ties)
{
    /* One call over DRAWS rows of each of two logit rows: batched rows
     * that share nothing but the call. */
    const int R = 2 * DRAWS;
    float *x = malloc(sizeof(float) * (size_t)R * (size_t)n);
    float *probs = malloc(sizeof(float) * (size_t)n);
    int *order = malloc(sizeof(int) * (size_t)n);
    tdm_sample_row rows[2 * DRAWS];
    int want[2 * DRAWS];
    for (int b = 0; b < 2; b++) {
        float *xb = x + (size_t)b * DRAWS * (size_t)n;
        make_row(rng, xb, n, a, ties);
        tdm_sampling_probs(s, xb, n, probs, order);
        for (int j = 0; j < DRAWS; j++) {
            int r = b * DRAWS + j;
            if (j > 0)
                memcpy(x + (size_t)r * (size_t)n, xb, sizeof(float) * (size_t)n);
            rows[r] =
                (tdm_sample_row){s->temperature, s->top_p, s->top_k, 0, pick_u(rng, j, probs, n)};
            want[r] = tdm_sampling_draw(probs, n, rows[r].u);
        }
    }
    int32_t got[2 * DRAWS];
    be->sample(be->ctx, got, x, R, n, rows);
    for (int r = 0; r < R; r++) {
        checked++;
        if (got[r] != want[r]) {
            failures++;
            printf("FAIL n=%d T=%g top_k=%u top_p=%g ties=%d u=%.17g: backend %d, reference %d\n",
                   n, (double)s->temperature, s->top_k, (double)s->top_p, ties, rows[r].u, got[r],
                   want[r]);
        }
    }
    free(order);
    free(probs);
    free(x);
}

int main(void)
{
    tdm_backend *be = tdm_backend_cpu_create(2);
    if (!be || !be->sample) {
        printf("FAIL: no CPU backend with a sample op\n");
        return 1;
    }
    tdm_rng rng;
    tdm_rng_seed(&rng, 20261201);
    const int vocabs[] = {1, 2, 7, 1000, 20011};
    const float temps[] = {0.0f, -1.0f, 0.5f, 1.0f, 2.0f};
    const float top_ps[] = {0.0f, 0.5f, 0.9f, 0.999f, 1.0f};
    for (size_t v = 0; v < sizeof(vocabs) / sizeof(vocabs[0]); v++) {
        const int n = vocabs[v];
        const uint32_t top_ks[] = {0, 1, 5, 50, (uint32_t)n - 1, (uint32_t)n, (uint32_t)n + 3};
        for (size_t t = 0; t < sizeof(temps) / sizeof(temps[0]); t++)
            for (size_t k = 0; k < sizeof(top_ks) / sizeof(top_ks[0]); k++)
                for (size_t p = 0; p < sizeof(top_ps) / sizeof(top_ps[0]); p++)
                    for (int ties = 0; ties < 2; ties++) {
                        tdm_sampling s = {temps[t], top_ps[p], top_ks[k]};
                        /* Logits spread wide enough that some probabilities
                         * underflow to 0 at low temperature. */
                        run_case(be, &rng, n, &s, ties ? 4.0f : 30.0f, ties);
                    }
    }
    /* The full vocabulary, a few settings (the reference sorts it per row). */
    const tdm_sampling big[] = {
        {1.0f, 0.9f, 0}, {0.7f, 0.0f, 50}, {2.0f, 0.999f, 0}, {1.0f, 0.0f, 0}, {0.0f, 0.0f, 0}};
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++)
        run_case(be, &rng, 248320, &big[i], 12.0f, (int)(i & 1));
    be->destroy(be);
    if (failures) {
        printf("sample backend: %d of %d draws differ from the reference\n", failures, checked);
        return 1;
    }
    printf("sample backend: %d draws equal the reference\n", checked);
    return 0;
}
