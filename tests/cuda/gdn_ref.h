/*
 * gdn_ref.h - the gated delta rule in double precision, position after
 * position, as plain C: the truth the CUDA kernel (gdn.cu) is measured
 * against over long segments.
 *
 * Layout as backend.h's gdn_recurrent: qkv [T, stride] holds q [Hk, Dk] at
 * offset 0, k [Hk, Dk] at Hk*Dk and v [Hv, Dv] at 2*Hk*Dk of each row; g and
 * beta [T, Hv]; q and k are l2-normalised (eps 1e-6) and q is scaled by
 * Dk^-0.5; v head j reads q/k head j / (Hv/Hk). state [Hv, Dk, Dv] is read
 * and replaced by the state after the last row; out [T, Hv, Dv].
 */
#ifndef TANDEM_TESTS_CUDA_GDN_REF_H
#define TANDEM_TESTS_CUDA_GDN_REF_H

/* Position after position: S = e^g S; delta = beta (v - Sᵀk); S += k deltaᵀ;
 * o = Sᵀq. */
void gdn_ref_recurrent(double *out, double *state, const float *qkv, int stride, const float *g,
                       const float *beta, int T, int Hk, int Hv, int Dk, int Dv);

#endif
