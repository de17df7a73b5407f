/* gdn_ref.c - see gdn_ref.h. */
#include "gdn_ref.h"

#include <math.h>
#include <stdlib.h>

/* q and k rows of one position and k-head: l2-normalised, q scaled. */
static void ref_qk(double *qn, double *kn, const float *qkv, int stride, int row, int Hk, int hk,
                   int Dk)
{
    const float *q = qkv + (size_t)row * (size_t)stride + (size_t)hk * (size_t)Dk;
    const float *k = q + (size_t)Hk * (size_t)Dk;
    double sq = 0, sk = 0;
    for (int d = 0; d < Dk; d++) {
        sq += (double)q[d] * q[d];
        sk += (double)k[d] * k[d];
    }
    const double iq = 1.0 / sqrt(sq + 1e-6) / sqrt((double)Dk), ik = 1.0 / sqrt(sk + 1e-6);
    for (int d = 0; d < Dk; d++) {
        qn[d] = q[d] * iq;
        kn[d] = k[d] * ik;
    }
}

static const float *ref_v(const float *qkv, int stride, int row, int Hk, int Dk, int hv, int Dv)
{
    return qkv + (size_t)row * (size_t)stride + 2 * (size_t)Hk * (size_t)Dk +
           (size_t)hv * (size_t)Dv;
}

void gdn_ref_recurrent(double *out, double *state, const float *qkv, int stride, const float *g,
                       const float *beta, int T, int Hk, int Hv, int Dk, int Dv)
{
    double *qn = malloc((size_t)Dk * sizeof(double)), *kn = malloc((size_t)Dk * sizeof(double));
    double *dl = malloc((size_t)Dv * sizeof(double));
    if (!qn || !kn || !dl)
        abort();
    for (int hv = 0; hv < Hv; hv++) {
        double *S = state + (size_t)hv * (size_t)Dk * (size_t)Dv; /* [Dk, Dv] */
        for (int t = 0; t < T; t++) {
            ref_qk(qn, kn, qkv, stride, t, Hk, hv / (Hv / Hk), Dk);
            const float *v = ref_v(qkv, stride, t, Hk, Dk, hv, Dv);
            const double decay = exp((double)g[(size_t)t * Hv + hv]);
            const double b = beta[(size_t)t * Hv + hv];
            for (size_t x = 0; x < (size_t)Dk * (size_t)Dv; x++)
                S[x] *= decay;
            for (int e = 0; e < Dv; e++) {
                double kv = 0;
                for (int d = 0; d < Dk; d++)
                    kv += S[(size_t)d * Dv + e] * kn[d];
                dl[e] = b * (v[e] - kv);
            }
            double *o = out + ((size_t)t * Hv + hv) * (size_t)Dv;
            for (int e = 0; e < Dv; e++) {
                double acc = 0;
                for (int d = 0; d < Dk; d++) {
                    S[(size_t)d * Dv + e] += kn[d] * dl[e];
                    acc += S[(size_t)d * Dv + e] * qn[d];
                }
                o[e] = acc;
            }
        }
    }
    free(qn);
    free(kn);
    free(dl);
}
