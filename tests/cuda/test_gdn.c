/*
 * test_gdn.c - the gated delta rule on the GPU (kernels/cuda/gdn.cu, as a
 * prompt's prefill calls it: one long segment, no record) against the
 * double-precision recurrence (gdn_ref.c).
 *
 * Shapes: the 4B model's (Hk=16, Hv=32, Dk=Dv=128), a small odd one (Hk=2,
 * Hv=6, Dk=40, Dv=48: key groups not a multiple of 32, a half-filled column
 * tile) and the largest key head (Hk=1, Hv=2, Dk=256, Dv=80). Segment
 * lengths 1, 64, 100, 1000 and 4096, starting at row 2 of the call. Decays by
 * head: weak (g in (-0.05, 0)), moderate (-0.7, -0.02), strong (-8.5, -3.9),
 * from the gates' inputs a, b, A_log and dt_bias (the kernel makes its gates
 * from them; the reference takes g and β computed here the same way in
 * fp32); β in (0, 1); a random initial state.
 *
 * Checks, by normalised error ‖a − b‖ / ‖b‖: outputs and final state against
 * the reference, against 1e-5. The fp32 recurrence is ~3e-7 from the truth
 * over 4096 positions; 1e-5 leaves a margin of ~30, while a wrong index or
 * term gives 1e-3 or more. Also: rows outside the segment are not written
 * (outputs poisoned with NaN first), and three runs give the same bits.
 * For each length it prints the kernel's GPU time (CUDA events on the
 * backend's stream, after a first run of the same case).
 */
#include "cuda_test.h"
#include "gdn_ref.h"

#include <math.h>
#include <string.h>

#define ROW0 2 /* first row of the segment; one more row follows it */

static tdm_backend *G;
static int failures;

static void report(const char *cas, const char *what, double err, double thr)
{
    const int ok = err <= thr;
    printf("%-34s %-30s nerr=%.3g thr=%.0e %s\n", cas, what, err, thr, ok ? "ok" : "FAIL");
    if (!ok)
        failures++;
}

static void report_ok(const char *cas, const char *what, int ok)
{
    printf("%-34s %-30s %s\n", cas, what, ok ? "ok" : "FAIL");
    if (!ok)
        failures++;
}

typedef struct gc_run {
    float *out, *qkv;
    tdm_gdn_gates gt;
    tdm_gdn_seg seg;
    int stride, Hk, Hv, Dk, Dv;
} gc_run;

static void gc_op(void *arg)
{
    gc_run *r = arg;
    G->gdn_recurrent(G->ctx, r->out, r->qkv, r->stride, r->gt, &r->seg, 1, r->Hk, r->Hv, r->Dk,
                     r->Dv);
}

/* g and β as backend.h's gdn_recurrent makes them (fp32, the CPU backend's
 * formulas). */
static void gc_gates(float *g, float *beta, const float *a, const float *b, const float *A_log,
                     const float *dt_bias, int R, int Hv)
{
    for (int r = 0; r < R; r++)
        for (int h = 0; h < Hv; h++) {
            const size_t i = (size_t)r * Hv + h;
            const float u = a[i] + dt_bias[h];
            const float sp = u > 20.0f ? u : log1pf(expf(u));
            g[i] = -expf(A_log[h]) * sp;
            beta[i] = 1.0f / (1.0f + expf(-b[i]));
        }
}

typedef struct gc_result {
    float *out, *state; /* host [R, Hv, Dv], [Hv, Dk, Dv] */
    float ms;
} gc_result;

/* One run over the segment from state st0; device inputs given. */
static gc_result gc_do(float *dqkv, tdm_gdn_gates gt, const float *st0, int n, int Hk, int Hv,
                       int Dk, int Dv)
{
    const int R = n + ROW0 + 1;
    const size_t hs = (size_t)Hv * Dk * Dv, no = (size_t)R * Hv * Dv;
    gc_run r = {ct_put(G, NULL, no * 4),
                dqkv,
                gt,
                {.row0 = ROW0, .nrows = n},
                2 * Hk * Dk + Hv * Dv,
                Hk,
                Hv,
                Dk,
                Dv};
    r.seg.state = ct_put(G, st0, hs * 4);
    ct_poison(G, r.out, no * 4);
    gc_result res;
    res.ms = tdm_cuda_time_ms(G->ctx, gc_op, &r);
    res.out = ct_get(G, r.out, no * 4);
    res.state = ct_get(G, r.seg.state, hs * 4);
    G->free(G->ctx, r.out);
    G->free(G->ctx, r.seg.state);
    return res;
}

static void test_case(int Hk, int Hv, int Dk, int Dv, int n)
{
    const int R = n + ROW0 + 1, stride = 2 * Hk * Dk + Hv * Dv;
    const size_t hs = (size_t)Hv * Dk * Dv, nseg = (size_t)n * Hv * Dv, row = (size_t)Hv * Dv;
    const size_t M = (size_t)R * Hv;
    float *qkv = malloc((size_t)R * stride * 4), *g = malloc(M * 4), *beta = malloc(M * 4);
    float *ga = malloc(M * 4), *gb = malloc(M * 4), *al = malloc(Hv * 4), *dt = malloc(Hv * 4);
    float *st0 = malloc(hs * 4);
    CHECK(qkv && g && beta && ga && gb && al && dt && st0, "out of memory");
    ct_fill(qkv, (size_t)R * stride, 1.0f);
    ct_fill(ga, M, 1.0f);
    ct_fill(gb, M, 4.0f);
    ct_fill(st0, hs, 0.5f);
    /* By head: exp(A_log) 0.05, 1 or 4; u = a + dt_bias in (-5, 0.5),
     * (-4, 0) or (0.5, 2), so softplus(u) in (0.007, 0.97), (0.018, 0.69)
     * or (0.97, 2.13). */
    for (int h = 0; h < Hv; h++) {
        al[h] = h % 3 == 0 ? logf(0.05f) : h % 3 == 1 ? 0.0f : logf(4.0f);
        dt[h] = h % 3 == 0 ? -2.25f : h % 3 == 1 ? -2.0f : 1.25f;
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < Hv; h++)
            ga[(size_t)r * Hv + h] *= h % 3 == 0 ? 2.75f : h % 3 == 1 ? 2.0f : 0.75f;
    gc_gates(g, beta, ga, gb, al, dt, R, Hv);
    float *dqkv = ct_put(G, qkv, (size_t)R * stride * 4);
    float *dga = ct_put(G, ga, M * 4), *dgb = ct_put(G, gb, M * 4);
    float *dal = ct_put(G, al, Hv * 4), *ddt = ct_put(G, dt, Hv * 4);
    const tdm_gdn_gates gt = {dga, dgb, dal, ddt};
    gc_result warm = gc_do(dqkv, gt, st0, n, Hk, Hv, Dk, Dv); /* the shape's first launch */
    gc_result rec = gc_do(dqkv, gt, st0, n, Hk, Hv, Dk, Dv);
    gc_result again = gc_do(dqkv, gt, st0, n, Hk, Hv, Dk, Dv);

    double *oref = malloc(nseg * sizeof(double)), *sref = malloc(hs * sizeof(double));
    float *of = malloc(nseg * 4), *sf = malloc(hs * 4);
    CHECK(oref && sref && of && sf, "out of memory");
    for (size_t i = 0; i < hs; i++)
        sref[i] = st0[i];
    gdn_ref_recurrent(oref, sref, qkv + (size_t)ROW0 * stride, stride, g + (size_t)ROW0 * Hv,
                      beta + (size_t)ROW0 * Hv, n, Hk, Hv, Dk, Dv);
    for (size_t i = 0; i < nseg; i++)
        of[i] = (float)oref[i];
    for (size_t i = 0; i < hs; i++)
        sf[i] = (float)sref[i];

    char cas[64];
    snprintf(cas, sizeof(cas), "Hk=%d Hv=%d Dk=%d Dv=%d n=%d", Hk, Hv, Dk, Dv, n);
    const float *orr = rec.out + ROW0 * row;
    report(cas, "out: vs double", ct_nerr(orr, of, nseg), 1e-5);
    report(cas, "state: vs double", ct_nerr(rec.state, sf, hs), 1e-5);
    /* Poison is all-ones bytes: rows before and after the segment keep it. */
    int untouched = 1;
    for (size_t i = 0; i < row * ROW0; i++)
        untouched &= isnan(rec.out[i]);
    for (size_t i = (size_t)(ROW0 + n) * row; i < (size_t)R * row; i++)
        untouched &= isnan(rec.out[i]);
    report_ok(cas, "rows outside the segment kept", untouched);
    report_ok(cas, "three runs: same bits",
              memcmp(again.out, rec.out, (size_t)R * row * 4) == 0 &&
                  memcmp(again.state, rec.state, hs * 4) == 0 &&
                  memcmp(warm.out, rec.out, (size_t)R * row * 4) == 0 &&
                  memcmp(warm.state, rec.state, hs * 4) == 0);
    printf("%-34s time: %.3f ms (%.3f us a row)\n", cas, rec.ms, 1e3 * rec.ms / n);

    gc_result *all[3] = {&warm, &rec, &again};
    for (int i = 0; i < 3; i++) {
        free(all[i]->out);
        free(all[i]->state);
    }
    free(oref);
    free(sref);
    free(of);
    free(sf);
    G->free(G->ctx, dqkv);
    G->free(G->ctx, dga);
    G->free(G->ctx, dgb);
    G->free(G->ctx, dal);
    G->free(G->ctx, ddt);
    free(qkv);
    free(g);
    free(beta);
    free(ga);
    free(gb);
    free(al);
    free(dt);
    free(st0);
}

int main(void)
{
    ct_require_gpu();
    G = ct_gpu();
    /* Hk, Hv, Dk, Dv */
    const int shapes[][4] = {{16, 32, 128, 128}, {2, 6, 40, 48}, {1, 2, 256, 80}};
    const int lengths[] = {1, 64, 100, 1000, 4096};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
        for (size_t l = 0; l < TDM_ARRAY_LEN(lengths); l++)
            test_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], lengths[l]);
    G->destroy(G);
    if (failures) {
        printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
