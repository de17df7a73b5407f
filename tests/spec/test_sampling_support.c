/*
 * test_sampling_support.c - tdm_sampling_probs against the distribution's
 * definition written out plainly: softmax(logits / T), every token sorted
 * by descending probability (ascending id on ties), the first top_k kept,
 * then the shortest prefix of them whose mass reaches top_p, renormalised
 * in that order. tdm_sampling_probs selects and sorts only the tokens it
 * needs; its probabilities and support size must be the reference's bit for
 * bit, over peaked, flat and tied logits, every kind of setting, and
 * vocabularies from 2 to 150,000 tokens.
 */
#include "sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const float *ref_p;

static int ref_cmp(const void *a, const void *b)
{
    int ia = *(const int *)a, ib = *(const int *)b;
    if (ref_p[ia] != ref_p[ib])
        return ref_p[ia] > ref_p[ib] ? -1 : 1;
    return (ia > ib) - (ia < ib);
}

static int reference(const tdm_sampling *s, const float *logits, int V, float *p, int *order)
{
    float maxl = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > maxl)
            maxl = logits[i];
    double sum = 0.0, inv_t = 1.0 / (double)s->temperature;
    for (int i = 0; i < V; i++) {
        double e = exp(((double)logits[i] - (double)maxl) * inv_t);
        p[i] = (float)e;
        sum += e;
    }
    for (int i = 0; i < V; i++)
        p[i] = (float)((double)p[i] / sum);
    int keep = V;
    if (s->top_k > 0 && s->top_k < (uint32_t)V)
        keep = (int)s->top_k;
    const int p_on = s->top_p > 0.0f && s->top_p < 1.0f;
    if (keep == V && !p_on)
        return V;
    for (int i = 0; i < V; i++)
        order[i] = i;
    ref_p = p;
    qsort(order, (size_t)V, sizeof(int), ref_cmp);
    if (p_on) {
        double mass = 0.0;
        int n = 0;
        while (n < keep) {
            mass += p[order[n++]];
            if (mass >= (double)s->top_p)
                break;
        }
        keep = n;
    }
    double kept = 0.0;
    for (int i = 0; i < keep; i++)
        kept += p[order[i]];
    float *out = malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < V; i++)
        out[i] = 0.0f;
    for (int i = 0; i < keep; i++)
        out[order[i]] = (float)((double)p[order[i]] / kept);
    memcpy(p, out, sizeof(float) * (size_t)V);
    free(out);
    return keep;
}

static double normal(tdm_rng *r)
{
    double u = tdm_rng_uniform(r), v = tdm_rng_uniform(r);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

int main(void)
{
    static const int vocabs[] = {2, 3, 7, 64, 1000, 5003, 150000};
    static const float scales[] = {0.0f, 0.01f, 1.0f, 4.0f, 30.0f, 300.0f};
    static const float temps[] = {0.3f, 1.0f, 2.5f};
    static const float top_ps[] = {0.0f, 0.05f, 0.5f, 0.9f, 0.95f, 0.999f, 0.9999999f};
    tdm_rng rng;
    tdm_rng_seed(&rng, 42);
    int cases = 0, failures = 0;
    for (size_t vi = 0; vi < sizeof(vocabs) / sizeof(vocabs[0]); vi++) {
        const int V = vocabs[vi];
        float *logits = malloc(sizeof(float) * (size_t)V);
        float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
        int *oa = malloc(sizeof(int) * (size_t)V), *ob = malloc(sizeof(int) * (size_t)V);
        const uint32_t top_ks[] = {0, 2, 5, 40, (uint32_t)V - 1, (uint32_t)V, (uint32_t)V + 3};
        for (size_t si = 0; si < sizeof(scales) / sizeof(scales[0]); si++)
            for (int tied = 0; tied < 2; tied++) {
                for (int i = 0; i < V; i++) {
                    float x = (float)normal(&rng) * scales[si];
                    logits[i] = tied ? roundf(x) : x; /* tied: few distinct values */
                }
                for (size_t ti = 0; ti < sizeof(temps) / sizeof(temps[0]); ti++)
                    for (size_t ki = 0; ki < sizeof(top_ks) / sizeof(top_ks[0]); ki++)
                        for (size_t pi = 0; pi < sizeof(top_ps) / sizeof(top_ps[0]); pi++) {
                            const tdm_sampling s = {temps[ti], top_ps[pi], top_ks[ki]};
                            /* the largest vocabulary: a few settings (each a sort) */
                            if (tdm_sampling_is_greedy(&s) ||
                                (V > 10000 && (ti != 1 || si % 2 || ki % 3 || pi % 2)))
                                continue;
                            const int ka = tdm_sampling_probs(&s, logits, V, a, oa);
                            const int kb = reference(&s, logits, V, b, ob);
                            cases++;
                            if (ka != kb || memcmp(a, b, sizeof(float) * (size_t)V) != 0) {
                                int at = 0;
                                while (at < V && a[at] == b[at])
                                    at++;
                                if (failures++ < 10)
                                    fprintf(stderr,
                                            "FAIL V=%d scale=%g tied=%d T=%g top_k=%u top_p=%.7g: "
                                            "support %d, reference %d; first difference at "
                                            "token %d\n",
                                            V, scales[si], tied, temps[ti], s.top_k, s.top_p, ka,
                                            kb, at);
                            }
                        }
            }
        free(logits);
        free(a);
        free(b);
        free(oa);
        free(ob);
    }
    printf("%d settings and logits, %d differ from the reference\n", cases, failures);
    return failures || cases == 0 ? 1 : 0;
}
