/*
 * cuda_ops_bench.cu - GPU time per call of the CUDA backend's ops other
 * than matmul, at the shapes of a Qwen3.5-0.8B / -4B step.
 *
 *   bench_cuda_ops_bench [--shape 0.8b|4b|all] [--reps N] [--ctx N,N,...] [--launch]
 *
 * Rows: 1, 9 and 17 rows of one sequence (decode, verify of 8 and 16
 * drafts) and 8 sequences of 1 and 9 rows. Sequences with one row update
 * their conv and delta-rule states in place; longer ones write a state per
 * row (extra_buffer verify). Attention runs at each --ctx key count
 * (default 32 and 4096 keys before the block).
 *
 * Timing: the N calls are queued while a spin kernel keeps the GPU busy,
 * between two events on the backend's stream, so (t1 - t0) / N is GPU time
 * per call with back-to-back launches, not the host's launch cost (which a
 * replayed graph does not pay either). Ops that stage host arguments
 * (embed, attn_prep, attention, conv, delta rule) also queue one small host to
 * device copy per call, which a replayed graph does not; the "staging copy"
 * line times that copy alone, to subtract. A cell marked '*' was queued
 * slower than the spin lasted: there it is host-bound. argmax reads its
 * result back and waits, so it is wall time per call.
 *
 * --launch instead measures kernel boundaries: a graph of empty kernels with
 * and without programmatic dependent launch, and when a dependent kernel's
 * blocks start and pass their wait relative to the end of the kernel ahead.
 *
 * CUDA C++ rather than C: it needs the backend's stream (common.cuh).
 */
#include "bench_util.h"
#include "common.cuh"

extern "C" {
#include "cuda_backend.h"
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "cuda_ops_bench: %s: %s\n", #x, cudaGetErrorString(e_));               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define MAXSEQ 8
#define MAXROWS 72  /* 8 x 9 */
#define MAXBLOCK 17 /* rows per sequence */
#define EMBED_ROWS 65536
#define SPIN_NS 20000000ull /* 20 ms: longer than queuing any op's calls */

typedef struct shape {
    const char *name;
    int H, I, nH, nKV, D, rot, Hk, Hv, Dk, Dv, K, V;
} shape;

static const shape shapes[] = {
    {"0.8b", 1024, 3584, 8, 2, 256, 64, 16, 16, 128, 128, 4, 248320},
    {"4b", 2560, 9216, 16, 4, 256, 64, 16, 32, 128, 128, 4, 248320},
};

typedef struct layout {
    const char *name;
    int nseq, rows; /* rows per sequence */
} layout;

static const layout layouts[] = {
    {"1", 1, 1}, {"9", 1, 9}, {"17", 1, 17}, {"8x1", 8, 1}, {"8x9", 8, 9}};

enum {
    OP_EMBED,
    OP_RMSNORM,
    OP_QNORM,
    OP_GATED,
    OP_ATTN_PREP,
    OP_SILU_MUL,
    OP_CONV,
    OP_GDN,
    OP_ATTENTION,
    OP_SOFTMAX,
    OP_ARGMAX,
    OP_STAGE,
};

/* Everything one shape's ops touch, sized for the largest layout. */
typedef struct bench {
    tdm_backend *be;
    cuda_ctx *c;
    const shape *s;
    int C, ctx_max;
    float *x, *q, *qg, *gate, *qkv, *qkvc, *z, *o, *o2, *a, *b, *h1, *h2;
    float *logits, *norm_w, *qnorm_w, *gnorm_w, *conv_w, *A_log, *dt_bias, *inv_freq_h;
    void *embed;
    float *conv_st[MAXSEQ], *conv_out, *rec_st[MAXSEQ], *rec_out, *kc[MAXSEQ], *vc[MAXSEQ];
    int32_t ids[MAXROWS], pos[MAXROWS];
} bench;

/* n floats of backend memory, uniform in [lo, hi). */
static float *dev_rand(bench *B, size_t n, float lo, float hi)
{
    float *d = (float *)B->be->alloc(B->be->ctx, n * sizeof(float));
    if (!d) {
        fprintf(stderr, "cuda_ops_bench: out of device memory\n");
        exit(1);
    }
    const size_t chunk = 1 << 20;
    float *h = (float *)malloc(chunk * sizeof(float));
    for (size_t off = 0; off < n; off += chunk) {
        const size_t m = n - off < chunk ? n - off : chunk;
        for (size_t i = 0; i < m; i++)
            h[i] = lo + (hi - lo) * 0.5f * (bench_urand() + 1.0f);
        B->be->upload(B->be->ctx, d + off, h, m * sizeof(float));
    }
    free(h);
    return d;
}

static void bench_init(bench *B, const shape *s, int ctx_max)
{
    memset(B, 0, sizeof(*B));
    tdm_error err;
    B->be = tdm_backend_cuda_create(0, &err);
    if (!B->be) {
        fprintf(stderr, "cuda_ops_bench: %s\n", err.msg);
        exit(1);
    }
    B->c = (cuda_ctx *)B->be->ctx;
    B->s = s;
    B->ctx_max = ctx_max;
    B->C = 2 * s->Hk * s->Dk + s->Hv * s->Dv;
    const size_t R = MAXROWS, VD = (size_t)s->Hv * s->Dv, QD = (size_t)s->nH * s->D;
    const size_t hs = (size_t)s->Hv * s->Dk * s->Dv, kvw = (size_t)s->nKV * s->D;
    const size_t S = (size_t)(s->K - 1) * B->C;
    B->x = dev_rand(B, R * s->H, -1, 1);
    B->q = dev_rand(B, R * QD, -1, 1);
    B->qg = dev_rand(B, R * 2 * QD, -1, 1);
    B->gate = dev_rand(B, R * QD, -1, 1);
    B->qkv = dev_rand(B, R * B->C, -1, 1);
    B->qkvc = dev_rand(B, R * B->C, -1, 1);
    B->z = dev_rand(B, R * VD, -1, 1);
    B->o = dev_rand(B, R * VD, -1, 1);
    B->o2 = dev_rand(B, R * VD, -1, 1);
    B->a = dev_rand(B, R * s->Hv, -1, 1);
    B->b = dev_rand(B, R * s->Hv, -1, 1);
    B->h1 = dev_rand(B, R * s->I, -1, 1);
    B->h2 = dev_rand(B, R * s->I, -1, 1);
    B->logits = dev_rand(B, R * s->V, -10, 10);
    B->norm_w = dev_rand(B, s->H, -0.1f, 0.1f);
    B->qnorm_w = dev_rand(B, s->D, -0.1f, 0.1f);
    B->gnorm_w = dev_rand(B, s->Dv, 0.9f, 1.1f);
    B->conv_w = dev_rand(B, (size_t)B->C * s->K, -0.5f, 0.5f);
    B->A_log = dev_rand(B, s->Hv, -1, 1);
    B->dt_bias = dev_rand(B, s->Hv, -1, 1);
    B->embed = dev_rand(B, (size_t)EMBED_ROWS * s->H / 2, -1, 1); /* bf16 bits, any values */
    B->conv_out = dev_rand(B, R * S, -1, 1);
    B->rec_out = dev_rand(B, R * hs, -0.1f, 0.1f);
    for (int i = 0; i < MAXSEQ; i++) {
        B->conv_st[i] = dev_rand(B, S, -1, 1);
        B->rec_st[i] = dev_rand(B, hs, -0.1f, 0.1f);
        B->kc[i] = dev_rand(B, (size_t)(ctx_max + MAXBLOCK) * kvw, -1, 1);
        B->vc[i] = dev_rand(B, (size_t)(ctx_max + MAXBLOCK) * kvw, -1, 1);
    }
    B->inv_freq_h = (float *)malloc((size_t)s->rot / 2 * sizeof(float));
    for (int i = 0; i < s->rot / 2; i++)
        B->inv_freq_h[i] = 1.0f / powf(10000000.0f, (float)(2 * i) / (float)s->rot);
    for (int r = 0; r < MAXROWS; r++) {
        B->ids[r] = (int32_t)((bench_urand() + 1.0f) * 0.5f * (EMBED_ROWS - 1));
        B->pos[r] = ctx_max + r % MAXBLOCK;
    }
}

static void bench_free(bench *B)
{
    void *bufs[] = {B->x,     B->q,       B->qg,     B->gate,     B->qkv,     B->qkvc,
                    B->z,     B->o,       B->o2,     B->a,        B->b,       B->h1,
                    B->h2,    B->logits,  B->norm_w, B->qnorm_w,  B->gnorm_w, B->conv_w,
                    B->A_log, B->dt_bias, B->embed,  B->conv_out, B->rec_out};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        B->be->free(B->be->ctx, bufs[i]);
    for (int i = 0; i < MAXSEQ; i++) {
        B->be->free(B->be->ctx, B->conv_st[i]);
        B->be->free(B->be->ctx, B->rec_st[i]);
        B->be->free(B->be->ctx, B->kc[i]);
        B->be->free(B->be->ctx, B->vc[i]);
    }
    free(B->inv_freq_h);
    B->be->destroy(B->be);
}

/* One call of op on layout L (attention at ctx keys before the block). */
static void run_op(bench *B, int op, const layout *L, int ctx)
{
    const shape *s = B->s;
    tdm_backend *be = B->be;
    void *bx = be->ctx;
    const int R = L->nseq * L->rows, C = B->C;
    const size_t hs = (size_t)s->Hv * s->Dk * s->Dv, S = (size_t)(s->K - 1) * C;
    tdm_conv_seg cs[MAXSEQ];
    tdm_gdn_seg gs[MAXSEQ];
    tdm_attn_seg as[MAXSEQ];
    for (int i = 0; i < L->nseq; i++) {
        const int r0 = i * L->rows, extra = L->rows > 1;
        cs[i] = tdm_conv_seg{r0, L->rows, B->conv_st[i], extra ? B->conv_out + r0 * S : NULL};
        gs[i] = tdm_gdn_seg{};
        gs[i].row0 = r0;
        gs[i].nrows = L->rows;
        gs[i].state = B->rec_st[i];
        gs[i].states_out = extra ? B->rec_out + r0 * hs : NULL;
        as[i] = tdm_attn_seg{r0, L->rows, ctx, B->kc[i], B->vc[i]};
    }
    switch (op) {
    case OP_EMBED:
        be->embed(bx, B->x, tdm_weight{B->embed, TDM_DTYPE_BF16, 0}, B->ids, R, s->H);
        break;
    case OP_RMSNORM:
        be->rmsnorm(bx, B->x, B->x, B->norm_w, R, s->H, 1e-6f, 1);
        break;
    case OP_QNORM:
        be->rmsnorm(bx, B->q, B->q, B->qnorm_w, R * s->nH, s->D, 1e-6f, 1);
        break;
    case OP_GATED:
        be->rmsnorm_gated(bx, B->o2, B->o, B->z, B->gnorm_w, R * s->Hv, s->Dv, 1e-6f);
        break;
    case OP_ATTN_PREP: /* k and v: any rows of the right length (x and z are longer) */
        be->attn_prep(bx, B->q, B->gate, B->qg, B->x, B->z, B->qnorm_w, B->qnorm_w, 1e-6f, B->pos,
                      B->inv_freq_h, s->rot, as, L->nseq, s->nH, s->nKV, s->D);
        break;
    case OP_SILU_MUL:
        be->silu_mul(bx, B->h1, B->h1, B->h2, (size_t)R * s->I);
        break;
    case OP_CONV:
        be->conv_silu(bx, B->qkvc, B->qkv, B->conv_w, cs, L->nseq, C, s->K);
        break;
    case OP_GDN:
        be->gdn_recurrent(bx, B->o, B->qkvc, C, (tdm_gdn_gates){B->a, B->b, B->A_log, B->dt_bias},
                          gs, L->nseq, s->Hk, s->Hv, s->Dk, s->Dv);
        break;
    case OP_ATTENTION:
        be->attention(bx, B->qg, B->q, B->gate, as, L->nseq, s->nH, s->nKV, s->D);
        break;
    case OP_SOFTMAX:
        be->softmax(bx, B->logits, R, s->V);
        break;
    case OP_ARGMAX: {
        int32_t out[MAXROWS];
        be->argmax(bx, out, B->logits, R, s->V);
        break;
    }
    case OP_STAGE:
        cuda_stage(B->c, B->ids, 64);
        break;
    }
}

__device__ __forceinline__ unsigned long long gtimer(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void spin_kernel(unsigned long long ns)
{
    cuda_kernel_begin();
    const unsigned long long t0 = gtimer();
    while (gtimer() - t0 < ns) {
    }
}

/* ---- launches: what a kernel boundary costs inside a step ---------------- */

__global__ void empty_kernel(int *sink)
{
    cuda_kernel_begin();
    if (sink && threadIdx.x == 0 && blockIdx.x == 0)
        *sink = 1;
}

/* A: every block spins ns and records when it ends; B: every block records
 * when it starts (before its wait) and when its wait returns. */
__global__ void probe_a_kernel(unsigned long long *end, unsigned long long ns)
{
    cuda_kernel_begin();
    const unsigned long long t0 = gtimer();
    while (gtimer() - t0 < ns) {
    }
    if (threadIdx.x == 0)
        end[blockIdx.x] = gtimer();
}

__global__ void probe_b_kernel(unsigned long long *start, unsigned long long *go)
{
    const unsigned long long t = gtimer();
    cuda_kernel_begin();
    if (threadIdx.x == 0) {
        start[blockIdx.x] = t;
        go[blockIdx.x] = gtimer();
    }
}

static void launch_chain(cuda_ctx *c, int n, int pdl)
{
    for (int i = 0; i < n; i++) {
        if (pdl)
            cuda_launch(c, empty_kernel, 1, 32, 0, (int *)NULL);
        else
            empty_kernel<<<1, 32, 0, c->stream>>>(NULL);
    }
}

typedef struct graph_reps {
    cudaGraphExec_t ge;
    cudaStream_t stream;
    int reps;
} graph_reps;

static void launch_graph(void *arg)
{
    const graph_reps *g = (const graph_reps *)arg;
    for (int r = 0; r < g->reps; r++)
        CK(cudaGraphLaunch(g->ge, g->stream));
}

/* µs per kernel of a chain of n empty kernels replayed as a graph. */
static double chain_us(cuda_ctx *c, int n, int pdl)
{
    cudaGraph_t g;
    graph_reps gr = {NULL, c->stream, 10};
    CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    launch_chain(c, n, pdl);
    CK(cudaStreamEndCapture(c->stream, &g));
    CK(cudaGraphInstantiate(&gr.ge, g, 0));
    CK(cudaGraphLaunch(gr.ge, c->stream));
    CK(cudaStreamSynchronize(c->stream));
    const float ms = tdm_cuda_time_ms(c, launch_graph, &gr);
    CK(cudaGraphExecDestroy(gr.ge));
    CK(cudaGraphDestroy(g));
    return 1e3 * ms / (gr.reps * (double)n);
}

static void run_launch(void)
{
    tdm_error err;
    tdm_backend *be = tdm_backend_cuda_create(0, &err);
    if (!be) {
        fprintf(stderr, "cuda_ops_bench: %s\n", err.msg);
        exit(1);
    }
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    printf("\nkernel boundaries (graph of 400 empty kernels): %.2f us each with programmatic "
           "dependent launch, %.2f us without\n",
           chain_us(c, 400, 1), chain_us(c, 400, 0));
    const int nb = 132 * 2;
    unsigned long long *d, h[3][264];
    CK(cudaMalloc(&d, 3 * nb * sizeof(unsigned long long)));
    for (int graph = 0; graph < 2; graph++) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        if (graph)
            CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
        for (int rep = 0; rep < (graph ? 1 : 3); rep++) {
            cuda_launch(c, probe_a_kernel, nb, 128, 0, d, 20000ull);
            cuda_launch(c, probe_b_kernel, nb, 128, 0, d + nb, d + 2 * nb);
        }
        if (graph) {
            CK(cudaStreamEndCapture(c->stream, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int rep = 0; rep < 3; rep++)
                CK(cudaGraphLaunch(ge, c->stream));
        }
        CK(cudaStreamSynchronize(c->stream));
        CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
        unsigned long long aend = 0, bstart = ~0ull, bgo = ~0ull;
        for (int i = 0; i < nb; i++) {
            aend = h[0][i] > aend ? h[0][i] : aend;
            bstart = h[1][i] < bstart ? h[1][i] : bstart;
            bgo = h[2][i] < bgo ? h[2][i] : bgo;
        }
        printf("%s: the next kernel's first block started %+.2f us after the last block of the "
               "one ahead ended; its wait returned %+.2f us after\n",
               graph ? "graph" : "stream", ((double)bstart - (double)aend) / 1e3,
               ((double)bgo - (double)aend) / 1e3);
        if (graph) {
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
    }
    CK(cudaFree(d));
    be->destroy(be);
}

typedef struct op_reps {
    bench *B;
    int op;
    const layout *L;
    int ctx, reps;
    double queued_s; /* host seconds the calls took to queue */
} op_reps;

static void queue_ops(void *arg)
{
    op_reps *q = (op_reps *)arg;
    const double h0 = bench_now();
    for (int i = 0; i < q->reps; i++)
        run_op(q->B, q->op, q->L, q->ctx);
    q->queued_s = bench_now() - h0;
}

/* GPU microseconds per call of op (see the header), *host_bound set when
 * queuing the calls took longer than the spin. */
static double time_op(bench *B, int op, const layout *L, int ctx, int reps, int *host_bound)
{
    cuda_ctx *c = B->c;
    run_op(B, op, L, ctx); /* warm-up: first launches, shared memory limits */
    B->be->sync(B->be->ctx);
    *host_bound = 0;
    if (op == OP_ARGMAX) {
        const double t0 = bench_now();
        for (int i = 0; i < reps; i++)
            run_op(B, op, L, ctx);
        return 1e6 * (bench_now() - t0) / reps;
    }
    cuda_launch(c, spin_kernel, 1, 32, 0, SPIN_NS);
    op_reps q = {B, op, L, ctx, reps, 0.0};
    const float ms = tdm_cuda_time_ms(c, queue_ops, &q);
    *host_bound = q.queued_s > 1e-9 * (double)SPIN_NS;
    return 1e3 * (double)ms / reps;
}

static void run_shape(const shape *s, const int *ctxs, int nctx, int reps)
{
    int ctx_max = 0;
    for (int i = 0; i < nctx; i++)
        ctx_max = ctxs[i] > ctx_max ? ctxs[i] : ctx_max;
    bench B;
    bench_init(&B, s, ctx_max);
    printf("\n%s shape (H %d, %d q / %d kv heads of %d, delta rule %d/%d heads of %d, conv %d x "
           "%d): us per call\n",
           s->name, s->H, s->nH, s->nKV, s->D, s->Hk, s->Hv, s->Dk, B.C, s->K);
    printf("%-30s", "op \\ rows");
    for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++)
        printf(" %9s", layouts[l].name);
    printf("\n");
    struct {
        int op;
        const char *name;
    } rows[] = {
        {OP_EMBED, "embed (bf16)"},
        {OP_RMSNORM, "rmsnorm (hidden)"},
        {OP_QNORM, "rmsnorm (q heads)"},
        {OP_GATED, "rmsnorm_gated (v heads)"},
        {OP_ATTN_PREP, "attn_prep (q, k, caches)"},
        {OP_SILU_MUL, "silu_mul"},
        {OP_CONV, "conv_silu"},
        {OP_GDN, "gdn_recurrent"},
        {OP_ATTENTION, "attention (gated)"},
        {OP_SOFTMAX, "softmax (vocab)"},
        {OP_ARGMAX, "argmax (vocab, wall)"},
        {OP_STAGE, "staging copy (64 B)"},
    };
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        const int nc = rows[r].op == OP_ATTENTION ? nctx : 1;
        for (int ci = 0; ci < nc; ci++) {
            char name[64];
            if (rows[r].op == OP_ATTENTION)
                snprintf(name, sizeof(name), "%s, %d keys before", rows[r].name, ctxs[ci]);
            else
                snprintf(name, sizeof(name), "%s", rows[r].name);
            printf("%-30s", name);
            for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++) {
                int hb;
                const double us = time_op(&B, rows[r].op, &layouts[l], ctxs[ci], reps, &hb);
                printf(" %8.2f%c", us, hb ? '*' : ' ');
                fflush(stdout);
            }
            printf("\n");
        }
    }
    bench_free(&B);
}

int main(int argc, char **argv)
{
    const char *which = "all";
    int reps = 200, ctxs[8] = {32, 4096}, nctx = 2, launch = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            which = argv[++i];
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--launch")) {
            launch = 1;
        } else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) {
            if ((nctx = bench_ints(argv[++i], ctxs, 8, 1, 1 << 20)) < 0)
                return 2;
        } else {
            fprintf(stderr,
                    "usage: %s [--shape 0.8b|4b|all] [--reps N] [--ctx N,N,...] [--launch]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || nctx < 1) {
        fprintf(stderr, "cuda_ops_bench: --reps and --ctx need positive numbers\n");
        return 2;
    }
    char why[160];
    if (tdm_cuda_device_count(why, sizeof(why)) == 0) {
        printf("cuda_ops_bench: %s\n", why);
        return 0;
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    if (launch) {
        run_launch();
        return 0;
    }
    printf("cuda_ops_bench: %s, %d calls per cell; '*' host-bound\n", p.name, reps);
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        if (!strcmp(which, "all") || !strcmp(which, shapes[i].name))
            run_shape(&shapes[i], ctxs, nctx, reps);
    return 0;
}
