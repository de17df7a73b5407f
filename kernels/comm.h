/*
 * comm.h - collectives between the ranks of a tensor-parallel model.
 *
 * A tensor-parallel model runs one rank per backend (one GPU, or one CPU
 * thread group), each holding a slice of every weight. Ranks exchange partial
 * results through a communicator: a struct of function pointers plus an
 * opaque context, like a backend (backend.h). Two implementations:
 *  - local (kernels/cpu/comm_local.c): the ranks are threads of one process
 *    on CPU backends; buffers are host memory; a call returns when every rank
 *    has its result.
 *  - nccl (kernels/cuda/comm_nccl.cu): the ranks are threads of one process,
 *    each on its own CUDA backend and device; a call is queued on the rank's
 *    backend stream like an op (and is captured with the step when the
 *    backend records graphs).
 *
 * Every rank of a group makes the same calls in the same order with the same
 * sizes (collectives). Buffers are the rank backend's memory.
 *
 * Determinism: all_reduce_sum gives every rank the same bits, and the same
 * bits from one call to the next for the same inputs (the local communicator
 * sums rank 0 + rank 1 + ... in that order; NCCL's ring and tree orders are
 * fixed for a given group and size).
 */
#ifndef TANDEM_KERNELS_COMM_H
#define TANDEM_KERNELS_COMM_H

#include "status.h"

#include <stddef.h>

typedef struct tdm_comm tdm_comm;

struct tdm_comm {
    const char *name; /* "local", "nccl" */
    int rank, size;
    /* 1: a collective called between a backend's graph_begin and graph_end
     * is recorded with the step and replayed with it (nccl: a node of the
     * CUDA graph); 0: it runs as it is called, so steps with collectives run
     * outside graph brackets (local). */
    int in_graphs;
    void *ctx;
    /* buf[0..n) := the sum over ranks of every rank's buf[0..n). */
    void (*all_reduce_sum)(void *ctx, float *buf, size_t n);
    /* recv[r*n .. (r+1)*n) := rank r's send[0..n) for every r. send may be
     * recv + rank*n (in place); otherwise the two do not overlap. */
    void (*all_gather)(void *ctx, const float *send, float *recv, size_t n);
    /* Frees this rank's communicator (each rank destroys its own, after the
     * group's last collective). */
    void (*destroy)(tdm_comm *c);
};

/* A group of n in-process ranks for CPU backends: out[0..n) (rank r is
 * out[r]), each to be driven by its own thread. */
tdm_status tdm_comm_local_group(int n, tdm_comm **out, tdm_error *err);

#endif
