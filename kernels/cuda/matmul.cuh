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

/* y [R, out] = silu(x · gateᵀ) ⊙ (x · upᵀ): bit for bit cuda_matmul_n of
 * the two, then cuda_silu_mul; bf16 weights in one launch, the SiLU product
 * taken where the sums are made. */
void cuda_matmul_silu(void *ctx, float *y, const float *x, tdm_weight gate, tdm_weight up, int R,
                      int in, int out);

#endif
