/* sample.cuh - per-row argmax and sampling (to host, or to device memory for
 * the next step of a draft chain), softmax over logits. */
#ifndef TANDEM_KERNELS_CUDA_SAMPLE_CUH
#define TANDEM_KERNELS_CUDA_SAMPLE_CUH

#include "common.cuh"

void cuda_argmax(void *ctx, int32_t *out, const float *x, int R, int n);
void cuda_argmax_to(void *ctx, int32_t *out, const float *x, const int32_t *rows, int nrows, int n,
                    const int32_t *map);
void cuda_softmax(void *ctx, float *x, int R, int n);
void cuda_sample(void *ctx, int32_t *out, const float *x, int R, int n, const tdm_sample_row *rows);
void cuda_sample_to(void *ctx, int32_t *out, float *probs, const float *x, const int32_t *rows,
                    int nrows, int n, const int32_t *map, const tdm_sample_row *srows);

#endif
