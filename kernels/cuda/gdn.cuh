/* gdn.cuh - the Gated DeltaNet mixer's stateful ops: the causal conv with its
 * window state, and the recurrent gated delta rule. */
#ifndef TANDEM_KERNELS_CUDA_GDN_CUH
#define TANDEM_KERNELS_CUDA_GDN_CUH

#include "common.cuh"

void cuda_conv_silu(void *ctx, float *y, const float *x, const float *w, const tdm_conv_seg *segs,
                    int nseg, int C, int K);
void cuda_gdn_recurrent(void *ctx, float *out, const float *qkv, int qkv_stride, tdm_gdn_gates gt,
                        const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk, int Dv);
/* backend.h gdn_replay: one launch for all segments (layers, sequences). */
void cuda_gdn_replay(void *ctx, const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk, int Dv);

#endif
