/*
 * comm_nccl.cu - the NCCL communicator (comm_nccl.h): one NCCL communicator
 * per rank, created together by ncclCommInitAll over the ranks' devices.
 *
 * A collective is one NCCL call on the rank's backend stream:
 * all_reduce_sum is ncclAllReduce (ncclFloat, ncclSum) in place, all_gather
 * is ncclAllGather (in place when send == recv + rank*n, which NCCL takes
 * as such). NCCL enqueues and returns; nothing here waits for the stream,
 * so a call made while the backend captures a step becomes a node of its
 * graph.
 *
 * Graphs (graph.cu): a collective behaves like an op's kernel launch. While
 * a step is captured or replayed it folds what it was called with (which
 * collective, the buffers, n) into the step's hash, so a replay whose
 * collectives differ from the capture's is refused; while a step is
 * replayed it queues nothing, since the graph holds the NCCL work.
 *
 * Order of additions: NCCL's, fixed for a given group, size and NCCL
 * version (its ring and tree send each reduced chunk to every rank, so every
 * rank gets the same bits); not the local communicator's rank order.
 *
 * Lifetime: a rank's communicator goes before its backend. Destroying it
 * waits for the rank's stream and drops the graphs its backend recorded
 * (they may hold its collectives, and NCCL's destroy would wait for them
 * forever).
 *
 * Errors: creating a group checks what NCCL would fail on obscurely (a
 * backend that is not CUDA, two ranks on one device) and names it; a failed
 * NCCL call inside a collective, which has no way to report, prints the
 * rank, device, call and NCCL's reason and aborts, as CUDA_CHECK does.
 */
#include "common.cuh"
#include "graph.cuh"

#include <nccl.h>

extern "C" {
#include "comm_nccl.h"
#include "log.h"
}

/* Words that tell the collectives apart in a step's hash. */
#define NC_SHAPE_ALL_REDUCE 0x6e63636c61726564ull
#define NC_SHAPE_ALL_GATHER 0x6e63636c67617468ull

/* One rank's communicator; pub.ctx points back at it. */
typedef struct nccl_comm {
    tdm_comm pub;
    ncclComm_t comm;
    cuda_ctx *cu; /* the rank's backend: its device and stream */
} nccl_comm;

static void nc_check(ncclResult_t r, const nccl_comm *nc, const char *what)
{
    if (r == ncclSuccess)
        return;
    fprintf(stderr, "tandem: NCCL error on rank %d of %d (CUDA device %d) in %s: %s (%s)\n",
            nc->pub.rank, nc->pub.size, nc->cu->device, what, ncclGetErrorString(r),
            ncclGetLastError(nc->comm));
    abort();
}

/* What every collective does before queuing: drops matmul.cu's split of a
 * buffer the collective may overwrite, and says whether to queue (not
 * while a graph replays its own copy of the call). */
static int nc_begin(cuda_ctx *c, uint64_t kind, const void *send, const void *recv, size_t n)
{
    c->xs_src = NULL;
    if (c->shaping) {
        cuda_shape_word(c, kind);
        cuda_shape_arg(c, send);
        cuda_shape_arg(c, recv);
        cuda_shape_arg(c, n);
    }
    return !c->replaying;
}

static void nc_all_reduce_sum(void *ctx, float *buf, size_t n)
{
    nccl_comm *nc = (nccl_comm *)ctx;
    if (n == 0 || !nc_begin(nc->cu, NC_SHAPE_ALL_REDUCE, buf, buf, n))
        return;
    nc_check(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, nc->comm, nc->cu->stream), nc,
             "ncclAllReduce");
}

static void nc_all_gather(void *ctx, const float *send, float *recv, size_t n)
{
    nccl_comm *nc = (nccl_comm *)ctx;
    if (n == 0 || !nc_begin(nc->cu, NC_SHAPE_ALL_GATHER, send, recv, n))
        return;
    nc_check(ncclAllGather(send, recv, n, ncclFloat, nc->comm, nc->cu->stream), nc,
             "ncclAllGather");
}

static void nc_destroy(tdm_comm *tc)
{
    if (!tc)
        return;
    nccl_comm *nc = (nccl_comm *)tc;
    cuda_ctx *c = nc->cu;
    int saved = 0;
    CUDA_CHECK(cudaGetDevice(&saved));
    CUDA_CHECK(cudaSetDevice(c->device));
    /* Steps the backend recorded may hold this rank's collectives: they
     * must not replay once the communicator is gone, and ncclCommDestroy
     * waits until every graph holding them is freed. */
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cuda_graphs_drop_all(c);
    const ncclResult_t r = ncclCommDestroy(nc->comm);
    if (r != ncclSuccess)
        tdm_log_warn("nccl", "rank %d of %d (CUDA device %d): ncclCommDestroy: %s (%s)",
                     nc->pub.rank, nc->pub.size, c->device, ncclGetErrorString(r),
                     ncclGetLastError(NULL));
    CUDA_CHECK(cudaSetDevice(saved));
    free(nc);
}

extern "C" tdm_status tdm_comm_nccl_group(tdm_backend *const *bes, int n, tdm_comm **out,
                                          tdm_error *err)
{
    if (n < 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "NCCL communicator: a group of %d ranks (at least 1 is needed)", n);
    for (int r = 0; r < n; r++)
        if (!bes[r] || strcmp(bes[r]->name, "cuda") != 0)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "NCCL communicator: rank %d's backend is %s, not a CUDA backend",
                                 r, bes[r] ? bes[r]->name : "missing");
    for (int r = 0; r < n; r++)
        for (int q = 0; q < r; q++) {
            const int dev = ((cuda_ctx *)bes[r]->ctx)->device;
            if (((cuda_ctx *)bes[q]->ctx)->device == dev)
                return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                     "NCCL communicator: ranks %d and %d are both on CUDA device "
                                     "%d; NCCL needs a device of its own for every rank",
                                     q, r, dev);
        }

    int *devs = (int *)calloc((size_t)n, sizeof(int));
    ncclComm_t *comms = (ncclComm_t *)calloc((size_t)n, sizeof(ncclComm_t));
    nccl_comm **ncs = (nccl_comm **)calloc((size_t)n, sizeof(nccl_comm *));
    int ok = devs && comms && ncs;
    for (int r = 0; ok && r < n; r++)
        ok = (ncs[r] = (nccl_comm *)calloc(1, sizeof(nccl_comm))) != NULL;
    tdm_status st = TDM_OK;
    if (!ok) {
        st = tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                           "NCCL communicator: out of memory for a group of %d ranks", n);
    } else {
        char list[256] = "";
        for (int r = 0; r < n; r++) {
            devs[r] = ((cuda_ctx *)bes[r]->ctx)->device;
            const size_t len = strlen(list);
            snprintf(list + len, sizeof(list) - len, "%s%d", r ? ", " : "", devs[r]);
        }
        int saved = 0;
        CUDA_CHECK(cudaGetDevice(&saved));
        const ncclResult_t rc = ncclCommInitAll(comms, n, devs);
        CUDA_CHECK(cudaSetDevice(saved));
        if (rc != ncclSuccess)
            st = tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                               "NCCL communicator: ncclCommInitAll over CUDA devices %s: %s (%s)",
                               list, ncclGetErrorString(rc), ncclGetLastError(NULL));
    }
    for (int r = 0; r < n; r++) {
        nccl_comm *nc = ncs ? ncs[r] : NULL;
        if (st != TDM_OK) {
            free(nc);
            continue;
        }
        nc->comm = comms[r];
        nc->cu = (cuda_ctx *)bes[r]->ctx;
        nc->pub.name = "nccl";
        nc->pub.in_graphs = 1;
        nc->pub.rank = r;
        nc->pub.size = n;
        nc->pub.ctx = nc;
        nc->pub.all_reduce_sum = nc_all_reduce_sum;
        nc->pub.all_gather = nc_all_gather;
        nc->pub.destroy = nc_destroy;
        out[r] = &nc->pub;
    }
    free(devs);
    free(comms);
    free(ncs);
    return st;
}

extern "C" int tdm_comm_nccl_version(void)
{
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}
