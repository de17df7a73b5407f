/* norm.cuh - RMSNorm (plain or zero-centred) and gated RMSNorm per row. */
#ifndef TANDEM_KERNELS_CUDA_NORM_CUH
#define TANDEM_KERNELS_CUDA_NORM_CUH

#include "common.cuh"

void cuda_rmsnorm(void *ctx, float *y, const float *x, const float *w, int R, int n, float eps,
                  int zero_centred);
void cuda_rmsnorm_gated(void *ctx, float *y, const float *x, const float *z, const float *w, int R,
                        int n, float eps);

#endif
