/* elementwise.cuh - ops without reductions: embedding rows, SiLU·mul. */
#ifndef TANDEM_KERNELS_CUDA_ELEMENTWISE_CUH
#define TANDEM_KERNELS_CUDA_ELEMENTWISE_CUH

#include "common.cuh"

void cuda_embed(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H);
void cuda_embed_dev(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H);
void cuda_silu_mul(void *ctx, float *y, const float *a, const float *b, size_t n);

#endif
