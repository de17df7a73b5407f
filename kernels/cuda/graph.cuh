/* graph.cuh - forward steps as CUDA graphs: the graph_begin / graph_end
 * slots and where host arguments are staged inside a recorded step. */
#ifndef TANDEM_KERNELS_CUDA_GRAPH_CUH
#define TANDEM_KERNELS_CUDA_GRAPH_CUH

#include "common.cuh"

/* An empty graph cache; NULL when out of memory. */
struct cuda_graphs *cuda_graphs_create(void);
/* Frees c->graphs and every graph in it; the stream must be idle. */
void cuda_graphs_destroy(cuda_ctx *c);

/* Frees every recorded graph of c (its keys are captured anew when they
 * come back); the stream must be idle and no step open. For when something
 * the graphs hold goes away: a communicator's collectives (comm_nccl.cu). */
void cuda_graphs_drop_all(cuda_ctx *c);

int cuda_graph_begin(void *ctx, uint64_t key);
int cuda_graph_end(void *ctx);

/* cuda_stage while a step is captured or replayed: the device address of n
 * host bytes (`need`: n rounded up to 16) in the step's graph area, the
 * bytes written to its host area. NULL when the step runs eagerly: the
 * caller stages through the ring. */
void *cuda_graph_stage(cuda_ctx *c, const void *host, size_t n, size_t need);

#endif
