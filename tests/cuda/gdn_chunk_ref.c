/*
 * gdn_chunk_ref.c - see gdn_chunk_ref.h.
 *
 * The chunked form, derived from the recurrence. Inside a chunk with state
 * S0 before it, positions i, j and γ_i = g_0 + ... + g_i (from the chunk
 * start), the state after position i unrolls to
 *   S_i = e^{γ_i} S0 + Σ_{j<=i} e^{γ_i-γ_j} k_j δ_jᵀ
 * and the recurrence's delta, read against the decayed previous state, is
 *   δ_i = β_i (v_i - e^{γ_i} S0ᵀk_i - Σ_{j<i} e^{γ_i-γ_j} (k_i·k_j) δ_j).
 * With A[i][j] = β_i e^{γ_i-γ_j} (k_i·k_j) for j < i that is the triangular
 * system (I + A) Δ = diag(β) V - diag(β e^γ) K S0, so with T = (I + A)^-1,
 *   W = T diag(β e^γ) K,  U = T diag(β) V,  Δ = V' = U - W S0,
 *   O = diag(e^γ) Q S0 + ((Q Kᵀ) ⊙ M) V',  M[i][j] = e^{γ_i-γ_j} (j <= i),
 *   S1 = e^{γ_last} S0 + (diag(e^{γ_last-γ}) K)ᵀ V'.
 * Every decay factor is e to a sum of g over a range of positions, taken
 * from that range directly (a running sum from j+1 up), never e^{γ_i} times
 * e^{-γ_j}: γ reaches far below the exponent range over a chunk of strong
 * decays, and the ranges that matter are short.
 */
#include "gdn_chunk_ref.h"

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

void gdn_ref_chunked(double *out, double *state, const float *qkv, int stride, const float *g,
                     const float *beta, int T, int Hk, int Hv, int Dk, int Dv, int L)
{
    const size_t LL = (size_t)L * L, LK = (size_t)L * Dk, LV = (size_t)L * Dv;
    double *Q = malloc(LK * sizeof(double)), *K = malloc(LK * sizeof(double));  /* [L, Dk] */
    double *W = malloc(LK * sizeof(double));                                    /* [L, Dk] */
    double *U = malloc(LV * sizeof(double)), *Vp = malloc(LV * sizeof(double)); /* [L, Dv] */
    double *A = malloc(LL * sizeof(double)), *Tm = malloc(LL * sizeof(double)); /* [L, L] */
    double *G = malloc(LL * sizeof(double)); /* [L, L]: e^{γ_i-γ_j}, j <= i */
    double *eg = malloc((size_t)L * sizeof(double)), *bt = malloc((size_t)L * sizeof(double));
    if (!Q || !K || !W || !U || !Vp || !A || !Tm || !G || !eg || !bt)
        abort();
    for (int hv = 0; hv < Hv; hv++) {
        double *S = state + (size_t)hv * (size_t)Dk * (size_t)Dv; /* [Dk, Dv] */
        for (int c0 = 0; c0 < T; c0 += L) {
            const int n = T - c0 < L ? T - c0 : L;
            for (int i = 0; i < n; i++) {
                ref_qk(Q + (size_t)i * Dk, K + (size_t)i * Dk, qkv, stride, c0 + i, Hk,
                       hv / (Hv / Hk), Dk);
                bt[i] = beta[(size_t)(c0 + i) * Hv + hv];
            }
            /* Decays: e^{γ_i} = e^{g_0+..+g_i}, e^{γ_i-γ_j} = e^{g_{j+1}+..+g_i}. */
            double s = 0;
            for (int i = 0; i < n; i++) {
                s += g[(size_t)(c0 + i) * Hv + hv];
                eg[i] = exp(s);
            }
            for (int j = 0; j < n; j++) {
                s = 0;
                G[(size_t)j * L + j] = 1;
                for (int i = j + 1; i < n; i++) {
                    s += g[(size_t)(c0 + i) * Hv + hv];
                    G[(size_t)i * L + j] = exp(s);
                }
            }
            /* A, then T = (I + A)^-1 by forward substitution, row by row:
             * T[i][j] = [i == j] - Σ_{j<=m<i} A[i][m] T[m][j]. */
            for (int i = 0; i < n; i++)
                for (int j = 0; j < i; j++) {
                    double kk = 0;
                    for (int d = 0; d < Dk; d++)
                        kk += K[(size_t)i * Dk + d] * K[(size_t)j * Dk + d];
                    A[(size_t)i * L + j] = bt[i] * G[(size_t)i * L + j] * kk;
                }
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                    double t = i == j ? 1.0 : 0.0;
                    for (int m = j; m < i; m++)
                        t -= A[(size_t)i * L + m] * Tm[(size_t)m * L + j];
                    Tm[(size_t)i * L + j] = j <= i ? t : 0.0;
                }
            /* W = T diag(β e^γ) K, U = T diag(β) V, V' = U - W S0. */
            for (int i = 0; i < n; i++) {
                for (int d = 0; d < Dk; d++) {
                    double w = 0;
                    for (int m = 0; m <= i; m++)
                        w += Tm[(size_t)i * L + m] * bt[m] * eg[m] * K[(size_t)m * Dk + d];
                    W[(size_t)i * Dk + d] = w;
                }
                for (int e = 0; e < Dv; e++) {
                    double u = 0;
                    for (int m = 0; m <= i; m++)
                        u += Tm[(size_t)i * L + m] * bt[m] *
                             ref_v(qkv, stride, c0 + m, Hk, Dk, hv, Dv)[e];
                    U[(size_t)i * Dv + e] = u;
                }
            }
            for (int i = 0; i < n; i++)
                for (int e = 0; e < Dv; e++) {
                    double ws = 0;
                    for (int d = 0; d < Dk; d++)
                        ws += W[(size_t)i * Dk + d] * S[(size_t)d * Dv + e];
                    Vp[(size_t)i * Dv + e] = U[(size_t)i * Dv + e] - ws;
                }
            /* O = diag(e^γ) Q S0 + ((Q Kᵀ) ⊙ M) V'. */
            for (int i = 0; i < n; i++) {
                double *o = out + ((size_t)(c0 + i) * Hv + hv) * (size_t)Dv;
                for (int e = 0; e < Dv; e++) {
                    double qs = 0;
                    for (int d = 0; d < Dk; d++)
                        qs += Q[(size_t)i * Dk + d] * S[(size_t)d * Dv + e];
                    o[e] = eg[i] * qs;
                }
                for (int j = 0; j <= i; j++) {
                    double qk = 0;
                    for (int d = 0; d < Dk; d++)
                        qk += Q[(size_t)i * Dk + d] * K[(size_t)j * Dk + d];
                    const double p = qk * G[(size_t)i * L + j];
                    for (int e = 0; e < Dv; e++)
                        o[e] += p * Vp[(size_t)j * Dv + e];
                }
            }
            /* S1 = e^{γ_last} S0 + (diag(e^{γ_last-γ}) K)ᵀ V'. */
            for (int d = 0; d < Dk; d++)
                for (int e = 0; e < Dv; e++) {
                    double acc = eg[n - 1] * S[(size_t)d * Dv + e];
                    for (int j = 0; j < n; j++)
                        acc += G[(size_t)(n - 1) * L + j] * K[(size_t)j * Dk + d] *
                               Vp[(size_t)j * Dv + e];
                    S[(size_t)d * Dv + e] = acc;
                }
        }
    }
    free(Q);
    free(K);
    free(W);
    free(U);
    free(Vp);
    free(A);
    free(Tm);
    free(G);
    free(eg);
    free(bt);
}
