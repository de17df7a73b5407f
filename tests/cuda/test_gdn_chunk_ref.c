/*
 * test_gdn_chunk_ref.c - the chunked form of the gated delta rule equals the
 * recurrent form (tests/cuda/gdn_chunk_ref.c, both in double precision) on
 * random inputs: segment lengths 1, 63, 64, 65 and 200 (inside one chunk,
 * one short of it, exactly one, one over, several with a short last one),
 * chunks of 64 and of 16, Hv > Hk, a random initial state, and decays weak
 * (g in (-0.05, 0]), strong (g in (-8, -2]), beyond the exponent range over a
 * chunk (g in (-40, -20]: γ falls below -745 within 64 positions) and mixed
 * per position. Outputs and final states are compared by normalised error
 * ‖chunked − recurrent‖ / ‖recurrent‖ against 1e-12: both forms are exact
 * algebra in double, so what remains is rounding (~1e-15), while any wrong
 * term in the derivation gives O(1e-3) or more. Needs no GPU.
 */
#include "gdn_chunk_ref.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* Uniform in [lo, hi). */
static double uni(double lo, double hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (double)(rng >> 11) / (double)(1ull << 53);
}

static double nerr(const double *a, const double *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        r += b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

enum { DECAY_WEAK, DECAY_STRONG, DECAY_UNDERFLOW, DECAY_MIXED };
static const char *const decay_name[] = {"weak", "strong", "underflow", "mixed"};

static float decay_draw(int kind)
{
    switch (kind) {
    case DECAY_WEAK:
        return (float)uni(-0.05, 0);
    case DECAY_STRONG:
        return (float)uni(-8, -2);
    case DECAY_UNDERFLOW:
        return (float)uni(-40, -20);
    default:
        return decay_draw((int)uni(0, 3));
    }
}

int main(void)
{
    /* Hk, Hv, Dk, Dv */
    const int shapes[][4] = {{2, 4, 16, 12}, {1, 3, 32, 20}};
    const int lengths[] = {1, 63, 64, 65, 200};
    const int chunks[] = {64, 16};
    const double thr = 1e-12;
    int failures = 0;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++)
            for (int kind = 0; kind < 4; kind++)
                for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
                    const int Hk = shapes[s][0], Hv = shapes[s][1], Dk = shapes[s][2];
                    const int Dv = shapes[s][3], T = lengths[l], L = chunks[c];
                    const int stride = 2 * Hk * Dk + Hv * Dv;
                    const size_t hs = (size_t)Hv * Dk * Dv, no = (size_t)T * Hv * Dv;
                    float *qkv = malloc((size_t)T * stride * sizeof(float));
                    float *g = malloc((size_t)T * Hv * sizeof(float));
                    float *beta = malloc((size_t)T * Hv * sizeof(float));
                    double *s0 = malloc(hs * sizeof(double)), *s1 = malloc(hs * sizeof(double));
                    double *o0 = malloc(no * sizeof(double)), *o1 = malloc(no * sizeof(double));
                    if (!qkv || !g || !beta || !s0 || !s1 || !o0 || !o1) {
                        fprintf(stderr, "out of memory\n");
                        return 1;
                    }
                    for (size_t i = 0; i < (size_t)T * stride; i++)
                        qkv[i] = (float)uni(-1, 1);
                    for (size_t i = 0; i < (size_t)T * Hv; i++) {
                        g[i] = decay_draw(kind);
                        beta[i] = (float)uni(0, 1);
                    }
                    for (size_t i = 0; i < hs; i++)
                        s0[i] = s1[i] = uni(-0.5, 0.5);
                    gdn_ref_recurrent(o0, s0, qkv, stride, g, beta, T, Hk, Hv, Dk, Dv);
                    gdn_ref_chunked(o1, s1, qkv, stride, g, beta, T, Hk, Hv, Dk, Dv, L);
                    const double eo = nerr(o1, o0, no), es = nerr(s1, s0, hs);
                    const int ok = eo <= thr && es <= thr;
                    printf("Hk=%d Hv=%d Dk=%2d Dv=%2d T=%3d L=%2d %-9s out nerr=%.2e state "
                           "nerr=%.2e thr=%.0e %s\n",
                           Hk, Hv, Dk, Dv, T, L, decay_name[kind], eo, es, thr, ok ? "ok" : "FAIL");
                    failures += !ok;
                    free(qkv);
                    free(g);
                    free(beta);
                    free(s0);
                    free(s1);
                    free(o0);
                    free(o1);
                }
    if (failures)
        printf("%d case(s) FAILED\n", failures);
    return failures ? 1 : 0;
}
