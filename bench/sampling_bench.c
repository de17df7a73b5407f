/*
 * sampling_bench.c - the host's cost of a sampled row's distribution
 * (tdm_sampling_probs: softmax, top-k, top-p), which the verifier pays for
 * every sampled row it verifies or samples and a drafter for every sampled
 * draft, on every backend. Beside it: the softmax alone (temperature only,
 * the floor) and a full sort of the vocabulary by probability (what finding
 * a top-k / top-p support cost when every token was sorted).
 *   bench_sampling_bench [--vocab N] [--reps N]
 * Logits are normal with three spreads (1, 3, 8: flat to peaked).
 */
#include "bench_util.h"
#include "sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const float *g_p;

static int by_prob(const void *a, const void *b)
{
    const float pa = g_p[*(const int *)a], pb = g_p[*(const int *)b];
    return (pa < pb) - (pa > pb);
}

static double median_ms(double *t, int n)
{
    bench_sort(t, n);
    return t[n / 2] * 1e3;
}

int main(int argc, char **argv)
{
    int V = 248320, reps = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab"))
            V = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    if (V < 2 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: bench_sampling_bench [--vocab N>=2] [--reps 1..1000]\n");
        return 2;
    }
    float *l = malloc(sizeof(float) * (size_t)V), *p = malloc(sizeof(float) * (size_t)V);
    int *order = malloc(sizeof(int) * (size_t)V);
    double *t = malloc(sizeof(double) * (size_t)reps);
    const float spreads[] = {1.0f, 3.0f, 8.0f};
    const tdm_sampling settings[] = {
        {1.0f, 0.0f, 0}, {1.0f, 0.9f, 0}, {0.7f, 0.95f, 50}, {1.0f, 0.0f, 40}};
    printf("vocabulary %d, median of %d\n", V, reps);
    printf("%-7s %-28s %8s %10s %14s\n", "spread", "setting", "support", "ms a row",
           "full sort, ms");
    for (size_t si = 0; si < sizeof(spreads) / sizeof(spreads[0]); si++) {
        for (int i = 0; i < V; i++) {
            /* a normal from two uniforms (Box-Muller) */
            double u = 0.5 * (bench_urand() + 1.0) + 1e-12, v = 0.5 * (bench_urand() + 1.0);
            l[i] = (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v)) * spreads[si];
        }
        for (int r = 0; r < reps; r++) {
            tdm_sampling_probs(&settings[0], l, V, p, order);
            for (int i = 0; i < V; i++)
                order[i] = i;
            g_p = p;
            const double t0 = bench_now();
            qsort(order, (size_t)V, sizeof(int), by_prob);
            t[r] = bench_now() - t0;
        }
        const double sort_ms = median_ms(t, reps);
        for (size_t ci = 0; ci < sizeof(settings) / sizeof(settings[0]); ci++) {
            const tdm_sampling *s = &settings[ci];
            int support = 0;
            for (int r = 0; r < reps; r++) {
                const double t0 = bench_now();
                support = tdm_sampling_probs(s, l, V, p, order);
                t[r] = bench_now() - t0;
            }
            char name[64];
            snprintf(name, sizeof(name), "T %.1f top_p %.2f top_k %u", s->temperature, s->top_p,
                     s->top_k);
            printf("%-7.0f %-28s %8d %10.2f %14.2f\n", spreads[si], name, support,
                   median_ms(t, reps), sort_ms);
        }
    }
    free(l);
    free(p);
    free(order);
    free(t);
    return 0;
}
