/* elementwise.cuh - ops without reductions: embedding rows, q/gate split,
 * partial RoPE, KV store, sigmoid gate, SiLU·mul. */
#ifndef TANDEM_KERNELS_CUDA_ELEMENTWISE_CUH
#define TANDEM_KERNELS_CUDA_ELEMENTWISE_CUH

#include "common.cuh"

void cuda_embed(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H);
void cuda_embed_dev(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H);
void cuda_split_qgate(void *ctx, float *q, float *gate, const float *qg, int R, int nH, int D);
void cuda_rope(void *ctx, float *x, const int32_t *positions, const float *inv_freq, int R, int nH,
               int D, int rot_dim);
void cuda_kv_store(void *ctx, float *k_cache, float *v_cache, const float *k, const float *v,
                   int at, int nrows, int kv_width);
void cuda_mul_sigmoid(void *ctx, float *y, const float *gate, size_t n);
void cuda_silu_mul(void *ctx, float *y, const float *a, const float *b, size_t n);

#endif
