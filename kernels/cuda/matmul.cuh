/* matmul.cuh - y [R,out] (+)= x [R,in] · wᵀ on the GPU (see matmul.cu). */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_CUH

#include "common.cuh"

void cuda_matmul(void *ctx, float *y, const float *x, tdm_weight w, int R, int in, int out,
                 int accumulate);

#endif
