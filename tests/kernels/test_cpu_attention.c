/*
 * test_cpu_attention.c - the CPU backend's attention-layer ops against a
 * reference written here from the model's formulas in double precision
 * (hybrid-model-notes.md: q/gate split, zero-centred per-head RMSNorm,
 * rotate-half RoPE on the first rot_dim dims, causal GQA softmax attention,
 * the sigmoid output gate):
 *  - attn_prep over three segments at other cache positions: q, the cached
 *    k rows within 1e-5 (normalised error), the gate and the cached v rows
 *    exactly, cache rows around the segments untouched;
 *  - each segment alone (its rows at their row0, as attention takes them)
 *    gives the batch's bits;
 *  - attention with the gate against the reference, and without it against
 *    the reference's ungated output.
 */
#include "backend.h"
#include "check.h" /* tests/config */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

enum { NSEG = 3, NH = 4, NKV = 2, D = 32, ROT = 16, W = NKV * D, QW = NH * D };
static const int seg_rows[NSEG] = {1, 4, 2}, seg_past[NSEG] = {0, 9, 30};
static const float EPS = 1e-6f;

static uint32_t rng = 12345;
static float urand(void) /* [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

static void fill(float *p, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        p[i] = a * urand();
}

/* ‖a − b‖ / ‖b‖ */
static double nerr(const float *a, const double *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += b[i] * b[i];
    }
    return sqrt(d / (s > 0 ? s : 1));
}

/* One head of D values normed by w (zero-centred) and rotated at pos. */
static void ref_head(double *y, const float *x, const float *w, const float *inv, int pos)
{
    double ss = 0;
    for (int i = 0; i < D; i++)
        ss += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(ss / D + EPS);
    for (int i = 0; i < D; i++)
        y[i] = x[i] * r * (1.0 + w[i]);
    for (int i = 0; i < ROT / 2; i++) {
        const double a = (double)inv[i] * pos, c = cos(a), s = sin(a);
        const double x1 = y[i], x2 = y[i + ROT / 2];
        y[i] = x1 * c - x2 * s;
        y[i + ROT / 2] = x2 * c + x1 * s;
    }
}

int main(void)
{
    tdm_backend *be = tdm_backend_cpu_create(2);
    CHECK(be != NULL, "no CPU backend");
    if (!be)
        return 1;
    int R = 0, cap[NSEG];
    for (int i = 0; i < NSEG; i++) {
        R += seg_rows[i];
        cap[i] = seg_past[i] + seg_rows[i] + 2; /* two rows past the segment's */
    }
    float *qg = malloc((size_t)R * 2 * QW * 4), *k = malloc((size_t)R * W * 4);
    float *v = malloc((size_t)R * W * 4), qn[D], kn[D], inv[ROT / 2];
    int32_t pos[16];
    fill(qg, (size_t)R * 2 * QW, 2.0f);
    fill(k, (size_t)R * W, 2.0f);
    fill(v, (size_t)R * W, 1.0f);
    fill(qn, D, 0.5f);
    fill(kn, D, 0.5f);
    for (int i = 0; i < ROT / 2; i++)
        inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / ROT);
    float *init[NSEG];
    for (int s = 0, r = 0; s < NSEG; s++)
        for (int j = 0; j < seg_rows[s]; j++, r++)
            pos[r] = seg_past[s] + j;
    for (int s = 0; s < NSEG; s++) {
        init[s] = malloc((size_t)cap[s] * W * 4);
        fill(init[s], (size_t)cap[s] * W, 1.0f);
    }

    /* [batched, one segment at a time] */
    float *q[2], *gate[2], *kc[2][NSEG], *vc[2][NSEG];
    for (int b = 0; b < 2; b++) {
        q[b] = malloc((size_t)R * QW * 4);
        gate[b] = malloc((size_t)R * QW * 4);
        tdm_attn_seg as[NSEG];
        for (int s = 0, r = 0; s < NSEG; s++) {
            kc[b][s] = malloc((size_t)cap[s] * W * 4);
            vc[b][s] = malloc((size_t)cap[s] * W * 4);
            memcpy(kc[b][s], init[s], (size_t)cap[s] * W * 4);
            memcpy(vc[b][s], init[s], (size_t)cap[s] * W * 4);
            as[s] = (tdm_attn_seg){r, seg_rows[s], seg_past[s], kc[b][s], vc[b][s]};
            r += seg_rows[s];
        }
        if (b == 0)
            be->attn_prep(be->ctx, q[b], gate[b], qg, k, v, qn, kn, EPS, pos, inv, ROT, as, NSEG,
                          NH, NKV, D);
        else
            for (int s = 0; s < NSEG; s++)
                be->attn_prep(be->ctx, q[b], gate[b], qg, k, v, qn, kn, EPS, pos, inv, ROT, &as[s],
                              1, NH, NKV, D);
    }

    /* the reference of q, and of each segment's cached k rows */
    double *qref = malloc((size_t)R * QW * sizeof(double)), kref[D];
    int same_gate = 1, same_v = 1, rest = 1;
    double kerr = 0;
    for (int r = 0; r < R; r++)
        for (int h = 0; h < NH; h++) {
            const float *src = qg + ((size_t)r * NH + h) * 2 * D;
            ref_head(qref + ((size_t)r * NH + h) * D, src, qn, inv, pos[r]);
            same_gate &= memcmp(gate[0] + ((size_t)r * NH + h) * D, src + D, D * 4) == 0;
        }
    for (int s = 0, r = 0; s < NSEG; s++) {
        const size_t at = (size_t)seg_past[s] * W, n = (size_t)seg_rows[s] * W;
        for (int j = 0; j < seg_rows[s]; j++, r++)
            for (int h = 0; h < NKV; h++) {
                ref_head(kref, k + ((size_t)r * NKV + h) * D, kn, inv, pos[r]);
                kerr += nerr(kc[0][s] + at + (size_t)j * W + (size_t)h * D, kref, D);
            }
        same_v &= memcmp(vc[0][s] + at, v + (size_t)(r - seg_rows[s]) * W, n * 4) == 0;
        rest &= memcmp(kc[0][s], init[s], at * 4) == 0 &&
                memcmp(kc[0][s] + at + n, init[s] + at + n, 2 * (size_t)W * 4) == 0 &&
                memcmp(vc[0][s], init[s], at * 4) == 0;
    }
    const double qerr = nerr(q[0], qref, (size_t)R * QW);
    printf("attn_prep: q nerr %.3g, cached k nerr %.3g (sum over heads)\n", qerr, kerr);
    CHECK(qerr < 1e-5, "q off the reference: %.3g", qerr);
    CHECK(kerr < 1e-5, "cached k rows off the reference: %.3g", kerr);
    CHECK(same_gate, "the gate is not qg's second halves");
    CHECK(same_v, "the cached v rows are not the v rows");
    CHECK(rest, "cache rows outside the segments' were written");
    CHECK(memcmp(q[1], q[0], (size_t)R * QW * 4) == 0 &&
              memcmp(gate[1], gate[0], (size_t)R * QW * 4) == 0,
          "q or gate: one segment at a time differs from the batch");
    for (int s = 0; s < NSEG; s++)
        CHECK(memcmp(kc[1][s], kc[0][s], (size_t)cap[s] * W * 4) == 0 &&
                  memcmp(vc[1][s], vc[0][s], (size_t)cap[s] * W * 4) == 0,
              "segment %d's caches: one segment at a time differs from the batch", s);

    /* Attention over the caches attn_prep filled, gated and not. */
    tdm_attn_seg as[NSEG];
    for (int s = 0, r = 0; s < NSEG; s++) {
        as[s] = (tdm_attn_seg){r, seg_rows[s], seg_past[s], kc[0][s], vc[0][s]};
        r += seg_rows[s];
    }
    float *out = malloc((size_t)R * QW * 4), *outg = malloc((size_t)R * QW * 4);
    be->attention(be->ctx, out, q[0], NULL, as, NSEG, NH, NKV, D);
    be->attention(be->ctx, outg, q[0], gate[0], as, NSEG, NH, NKV, D);
    double *ref = malloc((size_t)R * QW * sizeof(double));
    double *refg = malloc((size_t)R * QW * sizeof(double));
    for (int s = 0, r = 0; s < NSEG; s++)
        for (int j = 0; j < seg_rows[s]; j++, r++)
            for (int h = 0; h < NH; h++) {
                const int kh = h / (NH / NKV), nk = seg_past[s] + j + 1;
                const float *qh = q[0] + ((size_t)r * NH + h) * D;
                double m = -INFINITY, sc[64], l = 0, o[D] = {0};
                for (int t = 0; t < nk; t++) {
                    double dot = 0;
                    for (int i = 0; i < D; i++)
                        dot += (double)qh[i] * kc[0][s][(size_t)t * W + (size_t)kh * D + i];
                    sc[t] = dot / sqrt((double)D);
                    m = sc[t] > m ? sc[t] : m;
                }
                for (int t = 0; t < nk; t++) {
                    const double p = exp(sc[t] - m);
                    l += p;
                    for (int i = 0; i < D; i++)
                        o[i] += p * vc[0][s][(size_t)t * W + (size_t)kh * D + i];
                }
                for (int i = 0; i < D; i++) {
                    const size_t e = ((size_t)r * NH + h) * D + i;
                    ref[e] = o[i] / l;
                    refg[e] = ref[e] / (1.0 + exp(-(double)gate[0][e]));
                }
            }
    const double aerr = nerr(out, ref, (size_t)R * QW), gerr = nerr(outg, refg, (size_t)R * QW);
    printf("attention: nerr %.3g, gated %.3g\n", aerr, gerr);
    CHECK(aerr < 1e-5, "attention off the reference: %.3g", aerr);
    CHECK(gerr < 1e-5, "gated attention off the reference: %.3g", gerr);

    for (int b = 0; b < 2; b++) {
        free(q[b]);
        free(gate[b]);
        for (int s = 0; s < NSEG; s++) {
            free(kc[b][s]);
            free(vc[b][s]);
        }
    }
    for (int s = 0; s < NSEG; s++)
        free(init[s]);
    free(qg);
    free(k);
    free(v);
    free(qref);
    free(out);
    free(outg);
    free(ref);
    free(refg);
    be->destroy(be);
    printf("%s\n", g_failures ? "cpu attention: FAILED" : "cpu attention: all checks passed");
    return g_failures ? 1 : 0;
}
