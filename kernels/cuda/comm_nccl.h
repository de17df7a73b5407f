/*
 * comm_nccl.h - the NCCL communicator (comm.h) between CUDA backends of one
 * process, one device per rank.
 *
 * Rank r's collectives are queued on the stream of its backend like an op:
 * they return before the data has moved, order after the ops queued before
 * them and before the ops queued after, and are recorded with a forward step
 * when the backend records graphs (graph_begin / graph_end; a replayed step
 * launches them from the graph). Buffers are device memory of the rank's
 * backend. Like the backend's ops, a call never waits for the GPU.
 *
 * Built where NCCL is found (TANDEM_HAVE_NCCL is then defined for C code
 * that links the kernels); this header is C, the implementation CUDA C++.
 */
#ifndef TANDEM_KERNELS_CUDA_COMM_NCCL_H
#define TANDEM_KERNELS_CUDA_COMM_NCCL_H

#include "backend.h"
#include "comm.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A group of n ranks: rank r (out[r]) runs on the CUDA backend bes[r]; each
 * backend on its own device (two ranks on one device are refused, naming
 * it). Creates the group's NCCL communicators (ncclCommInitAll), from the
 * calling thread; its current device is left as it was. On failure nothing
 * is written to out and err names why. Each rank destroys its communicator
 * after the group's last collective and before its backend (the backends
 * stay the caller's): that waits for the rank's stream and drops the steps
 * its backend recorded as graphs, which may hold the collectives. */
tdm_status tdm_comm_nccl_group(tdm_backend *const *bes, int n, tdm_comm **out, tdm_error *err);

/* The NCCL library's version code (ncclGetVersion: 22809 for 2.28.9); 0
 * when it cannot be read. */
int tdm_comm_nccl_version(void);

#ifdef __cplusplus
}
#endif

#endif
