/* attention.cuh - causal GQA attention of query rows against per-sequence
 * KV caches (decode, verify and prefill rows alike), with the output gate. */
#ifndef TANDEM_KERNELS_CUDA_ATTENTION_CUH
#define TANDEM_KERNELS_CUDA_ATTENTION_CUH

#include "common.cuh"

void cuda_attention(void *ctx, float *out, const float *q, const float *gate,
                    const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D);

#endif
