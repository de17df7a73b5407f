/* matmul.cuh - y [R,out] (+)= x [R,in] · wᵀ on the GPU (see matmul.cu). */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_CUH

#include "common.cuh"

void cuda_matmul(void *ctx, float *y, const float *x, tdm_weight w, int R, int in, int out,
                 int accumulate);

/* ys[i] [R, outs[i]] = x [R, in] · ws[i]ᵀ for i < n: the same results as n
 * cuda_matmul calls, bf16 weights sharing one launch. */
void cuda_matmul_n(void *ctx, const float *x, int R, int in, int n, float *const *ys,
                   const tdm_weight *ws, const int *outs);

/* y (+)= act(a, b) · wᵀ (backend.h matmul_act): the activation inside the
 * tensor-core matmul for bf16 weights, else into scratch first. */
void cuda_matmul_act(void *ctx, float *y, const float *a, const float *b, tdm_act act, tdm_weight w,
                     int R, int in, int out, int accumulate);

#endif
