/* gdn_chunk.cuh - the gated delta rule in its chunked form, for the long
 * segments of a prompt prefill (tdm_gdn_seg.chunked): equal to the recurrent
 * form of gdn.cu up to rounding, with 64 positions per sequential step
 * instead of one.
 *
 * The C part below is for tests and benchmarks, which reach the kernel and
 * the stream of a backend made by tdm_backend_cuda_create through be->ctx. */
#ifndef TANDEM_KERNELS_CUDA_GDN_CHUNK_CUH
#define TANDEM_KERNELS_CUDA_GDN_CHUNK_CUH

#ifdef __cplusplus
#include "common.cuh"

/* Prefill segments at least this long take the chunked form (one chunk). */
#define GDN_CHUNK_MIN 64

/* Whether the chunked kernel's shared memory for key head dim Dk fits this
 * device (Dk <= 256 does on sm_90). */
int cuda_gdn_chunked_fits(cuda_ctx *c, int Dk);

/* One segment (states_out NULL, any nrows >= 1) in the chunked form: reads
 * seg->state, writes out rows seg->row0 .. +nrows ([R, Hv, Dv]) and the state
 * after the last row in place. Arguments as backend.h's gdn_recurrent, but
 * the gates as arrays g, beta [R, Hv] (gdn.cu makes them from the
 * projections).
 * Deterministic; the bits depend on where the segment starts (chunks are
 * 64 rows from row0), not on other segments or calls. */
void cuda_gdn_chunked(cuda_ctx *c, float *out, const float *qkv, int qkv_stride, const float *g,
                      const float *beta, const tdm_gdn_seg *seg, int Hk, int Hv, int Dk, int Dv);

extern "C" {
#else
#include "backend.h"
#endif

/* cuda_gdn_chunked on the CUDA backend context ctx (be->ctx). */
void tdm_cuda_gdn_chunked(void *ctx, float *out, const float *qkv, int qkv_stride, const float *g,
                          const float *beta, const tdm_gdn_seg *seg, int Hk, int Hv, int Dk,
                          int Dv);

#ifdef __cplusplus
}
#endif

#endif
