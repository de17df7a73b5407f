/*
 * cuda_backend.h - the CUDA implementation of the backend interface
 * (kernels/backend.h) on one GPU.
 *
 * Owns: a CUDA stream on the chosen device, device memory handed out by
 * alloc/weight_map, a staging ring through which host-side op arguments
 * (token ids, positions, segment lists) reach the device inside each call,
 * and a cache of forward steps captured as CUDA graphs (graph_begin /
 * graph_end; each graph with a staging area of its own). Every op runs on
 * that one stream; download, argmax and sync wait for it.
 *
 * Numbers: activations, caches and states are fp32; matrices may be bf16,
 * fp16 or fp32 and every product accumulates in fp32 (no tensor-core
 * rounding of activations). Each op computes a row with the same order of
 * operations whatever the batch, so batched and single-row calls agree to the
 * bit, as backend.h requires.
 *
 * Threading: one caller at a time (backend.h). CUDA's current device is per
 * thread and ops do not switch it: callers of a backend on a device other
 * than 0 (the default of every thread, and what engine/runtime.c uses) must
 * run on threads where that device is current.
 *
 * Only this header is C; the implementation is CUDA C++ (the .cu files beside it)
 * behind extern "C".
 */
#ifndef TANDEM_KERNELS_CUDA_BACKEND_H
#define TANDEM_KERNELS_CUDA_BACKEND_H

#include "backend.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Inside a prompt prefill's call (backend.h bulk), bf16 weights of at least
 * this many elements take cuBLAS; smaller ones the exact kernel (bulk.cu). */
#define TDM_CUDA_BULK_MIN_WEIGHTS ((size_t)1 << 20)

/* Opens cuBLAS (the soname of the major this build was compiled against),
 * once a process, for a prompt prefill's matmuls (bulk.cu); needs no GPU.
 * 0, or -1 with *why (may be NULL) naming what is missing. */
int tdm_cuda_cublas_open(char *why, size_t why_len);

/* Number of CUDA devices usable by this process; 0 when there is no GPU or no
 * driver. *why (may be NULL) receives a short reason when 0. */
int tdm_cuda_device_count(char *why, size_t why_len);

/* The UUID of CUDA device `device` as nvidia-smi prints it
 * ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") into out; 0 when it cannot be
 * read (out is then ""). Two processes compute on the same GPU exactly when
 * their devices' UUIDs are equal. */
int tdm_cuda_device_uuid(int device, char *out, size_t len);

/* 1 when this process's work on CUDA device `device` goes through an MPS
 * server (cudaDevAttrMpsEnabled: an MPS control daemon answered at the
 * process's CUDA_MPS_PIPE_DIRECTORY), 0 when it runs in a context of its own
 * or that cannot be read. Processes that share a GPU as contexts of their
 * own take turns on it; MPS clients of one server run at once. */
int tdm_cuda_device_mps(int device);

/* Makes `device` the calling thread's current device (the one a backend's
 * ops on that device need); 0, or -1 when it cannot. */
int tdm_cuda_use_device(int device);

/* A backend on CUDA device `device` (which it also makes the calling
 * thread's current device). NULL on failure with err (may be NULL)
 * naming why (no such device, out of memory, ...). The caller destroys it
 * with be->destroy(be). */
tdm_backend *tdm_backend_cuda_create(int device, tdm_error *err);

/* What the graph slots did since the backend was created. */
typedef struct tdm_cuda_graph_stats {
    uint64_t captured; /* steps captured into a graph (and launched) */
    uint64_t replayed; /* steps run by replaying a graph */
    uint64_t refused;  /* graph_end returned 1: the calls differed from the capture
                          (or, capturing, from the run measured before); run again eagerly */
    uint64_t eager;    /* steps run eagerly inside a bracket (key new, or given up) */
    uint64_t measured; /* of those, the runs of a key new (or forgotten) */
    uint64_t evicted;  /* graphs dropped to make room for another */
} tdm_cuda_graph_stats;

/* be: a CUDA backend. All zeros when graphs are off (TANDEM_CUDA_OPSTATS=1). */
void tdm_cuda_graph_stats_get(const tdm_backend *be, tdm_cuda_graph_stats *out);

/* Device memory bandwidth as a device-to-device copy of nbytes sees it:
 * bytes read + bytes written per second, best of 5; 0 on failure. For
 * benchmarks' floor (weight bytes / bandwidth). */
double tdm_cuda_copy_bandwidth(int device, size_t nbytes);

/* GPU milliseconds of the work fn(arg) queues on the stream of the CUDA
 * backend context ctx (be->ctx), between events recorded before and after
 * it; waits for the second event. For benchmarks and timed tests. */
float tdm_cuda_time_ms(void *ctx, void (*fn)(void *arg), void *arg);

#ifdef __cplusplus
}
#endif

#endif
