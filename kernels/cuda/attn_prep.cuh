/* attn_prep.cuh - an attention layer's q/gate split, per-head q and k norms, RoPE and KV-cache
 * store, in one launch. */
#ifndef TANDEM_KERNELS_CUDA_ATTN_PREP_CUH
#define TANDEM_KERNELS_CUDA_ATTN_PREP_CUH

#include "common.cuh"

void cuda_attn_prep(void *ctx, float *q, float *gate, const float *qg, const float *k,
                    const float *v, const float *q_norm, const float *k_norm, float eps,
                    const int32_t *positions, const float *inv_freq, int rot_dim,
                    const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D);

#endif
