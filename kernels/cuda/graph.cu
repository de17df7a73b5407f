/*
 * graph.cu - forward steps as CUDA graphs (backend.h: graph_begin,
 * graph_end).
 *
 * The first time a key is seen its step runs eagerly and the bytes its ops
 * stage are counted. The second time the step is captured
 * (cudaStreamBeginCapture on the backend's stream, thread-local mode): the
 * kernels are recorded, and cuda_stage hands out addresses in a device area
 * of the graph's own, sized from the first run, writing the host bytes to
 * the graph's pinned host area without queuing a copy. graph_end
 * instantiates the graph, copies the used host area to the device area in
 * one cudaMemcpyAsync and launches the graph. Later steps with the key
 * replay: the ops are called as usual but launch nothing (c->replaying),
 * their host arguments land at the offsets the capture gave them (the calls
 * come in the same order), and graph_end does the one copy and the one
 * launch.
 *
 * The check. While a step is captured or replayed, every kernel launch
 * (kernel, grid, block, shared memory, each argument's bytes) and every
 * staged size is folded into a hash (common.cuh). A graph is a fixed list
 * of launches with fixed arguments that read the staged area, so replaying
 * it does the work of the calls made exactly when they would have launched
 * the same kernels with the same arguments and staged the same sizes: equal
 * hashes and byte counts. Otherwise nothing is launched, graph_end returns
 * 1, the graph is dropped and the engine makes the calls again eagerly.
 * Hashing the launches rather than the op slots' arguments also catches an
 * op whose launch configuration follows what it stages (a row's key count,
 * say), which no key built by the engine can carry.
 *
 * A graph names the scratch buffers of its capture. Where a larger step has
 * since replaced one (cuda_grow: c->grown counts the replacements), a replay
 * folds to another hash: the graph is outgrown, not wrong. It is dropped and
 * its key measured and captured again, as after a mismatch, but neither
 * counted as a miss nor reported (before, every process that ran graphs
 * warned once as its warm-up outgrew its first graphs, and a key outgrown
 * twice before a good replay stayed eager). A mismatch with nothing grown
 * since the capture means what it says: the key misses something the
 * launches carry.
 *
 * Policy: at most GR_GRAPHS graphs, least recently used evicted first; keys
 * seen once are remembered apart (GR_SEEN, also LRU), so one-off shapes
 * such as prompt chunks of odd lengths never push a graph out. A key whose
 * graph mismatches GR_MAX_MISSES times without a good replay in between
 * stays eager while it is remembered: its steps depend on something the key
 * does not carry, and recapturing every other step would cost more than the
 * launches saved.
 */
#include "graph.cuh"

extern "C" {
#include "cuda_backend.h"
#include "log.h"
}

#define GR_GRAPHS 32
#define GR_SEEN 64
#define GR_MAX_MISSES 2
#define GR_SEED 0x6a09e667f3bcc908ull

typedef struct gr_graph {
    uint64_t key;
    uint64_t used; /* tick of the last use; 0: a free slot */
    cudaGraphExec_t exec;
    unsigned char *host;  /* pinned [cap]: the step's staged host arguments */
    unsigned char *dev;   /* device [cap]: where the graph's kernels read them */
    size_t cap, bytes;    /* bytes: what the capture staged */
    uint64_t shape;       /* the capture's hash */
    uint64_t grown;       /* c->grown when it was captured */
    cudaEvent_t uploaded; /* after the last copy out of host */
    int misses;           /* mismatches since the key's last good replay */
} gr_graph;

typedef struct gr_seen {
    uint64_t key;
    uint64_t used; /* 0: a free slot */
    size_t bytes;  /* staged by the key's last eager run */
    int measured;  /* bytes is known */
    int misses;
} gr_seen;

enum { GR_IDLE, GR_EAGER, GR_MEASURE, GR_CAPTURE, GR_REPLAY };

struct cuda_graphs {
    gr_graph graph[GR_GRAPHS];
    gr_seen seen[GR_SEEN];
    uint64_t tick;
    int mode;      /* of the open step */
    gr_graph *cur; /* GR_CAPTURE, GR_REPLAY */
    gr_seen *meas; /* GR_MEASURE */
    size_t off;    /* bytes staged since graph_begin */
    int overflow;  /* more was staged than the graph's area holds */
    int warned;
    tdm_cuda_graph_stats stats;
};

struct cuda_graphs *cuda_graphs_create(void)
{
    return (struct cuda_graphs *)calloc(1, sizeof(struct cuda_graphs));
}

/* Frees what g holds and marks the slot free; nothing may still use it. */
static void gr_release(gr_graph *g)
{
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    if (g->uploaded)
        cudaEventDestroy(g->uploaded);
    cudaFreeHost(g->host);
    cudaFree(g->dev);
    memset(g, 0, sizeof(*g));
}

void cuda_graphs_destroy(cuda_ctx *c)
{
    struct cuda_graphs *G = c->graphs;
    if (!G)
        return;
    for (int i = 0; i < GR_GRAPHS; i++)
        if (G->graph[i].used)
            gr_release(&G->graph[i]);
    free(G);
    c->graphs = NULL;
}

void cuda_graphs_drop_all(cuda_ctx *c)
{
    struct cuda_graphs *G = c->graphs;
    TDM_ASSERT(!c->in_step);
    if (!G)
        return;
    for (int i = 0; i < GR_GRAPHS; i++)
        if (G->graph[i].used)
            gr_release(&G->graph[i]);
}

static gr_graph *gr_find(struct cuda_graphs *G, uint64_t key)
{
    for (int i = 0; i < GR_GRAPHS; i++)
        if (G->graph[i].used && G->graph[i].key == key)
            return &G->graph[i];
    return NULL;
}

/* The seen entry of key: the existing one, else a free or the least
 * recently used slot, cleared. */
static gr_seen *gr_remember(struct cuda_graphs *G, uint64_t key)
{
    gr_seen *s = NULL;
    for (int i = 0; i < GR_SEEN; i++)
        if (G->seen[i].used && G->seen[i].key == key)
            return &G->seen[i];
    for (int i = 0; i < GR_SEEN; i++) {
        gr_seen *e = &G->seen[i];
        if (!e->used) {
            s = e;
            break;
        }
        if (!s || e->used < s->used)
            s = e;
    }
    memset(s, 0, sizeof(*s));
    s->key = key;
    return s;
}

/* Forgets g's graph; its key goes back to the seen keys with `misses`, to
 * be measured and captured again. */
static void gr_drop(cuda_ctx *c, gr_graph *g, int misses)
{
    struct cuda_graphs *G = c->graphs;
    const uint64_t key = g->key;
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* an earlier launch may still read it */
    gr_release(g);
    gr_seen *s = gr_remember(G, key);
    s->used = G->tick;
    s->misses = misses;
}

/* A graph slot for key with areas of `bytes`, its capture begun; NULL when
 * the memory for the areas is short (the step then runs eagerly). */
static gr_graph *gr_capture_begin(cuda_ctx *c, uint64_t key, size_t bytes)
{
    struct cuda_graphs *G = c->graphs;
    gr_graph *g = NULL;
    for (int i = 0; i < GR_GRAPHS; i++) {
        gr_graph *e = &G->graph[i];
        if (!e->used) {
            g = e;
            break;
        }
        if (!g || e->used < g->used)
            g = e;
    }
    if (g->used) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        gr_release(g);
        G->stats.evicted++;
    }
    const size_t cap = bytes ? bytes : 16;
    if (cudaMallocHost((void **)&g->host, cap) != cudaSuccess ||
        cuda_malloc(c, (void **)&g->dev, cap) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->uploaded, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is an answer, not a sticky error */
        gr_release(g);
        return NULL;
    }
    g->key = key;
    g->used = G->tick;
    g->cap = cap;
    /* Thread-local: other threads (other backends, allocations) go on; on
     * this one the engine calls nothing but op slots until graph_end. */
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    return g;
}

static int gr_open(cuda_ctx *c, gr_graph *g, int mode)
{
    c->graphs->mode = mode;
    c->graphs->cur = g;
    c->shaping = 1;
    c->shape = GR_SEED;
    c->replaying = mode == GR_REPLAY;
    return 1;
}

int cuda_graph_begin(void *ctx, uint64_t key)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    struct cuda_graphs *G = c->graphs;
    TDM_ASSERT(!c->in_step);
    c->in_step = 1;
    G->tick++;
    G->off = 0;
    G->overflow = 0;
    gr_graph *g = gr_find(G, key);
    if (g) {
        g->used = G->tick;
        /* The host area is about to be rewritten: its last upload must
         * have been read (the engine syncs each step, so this waits for
         * nothing in practice). */
        CUDA_CHECK(cudaEventSynchronize(g->uploaded));
        return gr_open(c, g, GR_REPLAY);
    }
    gr_seen *s = gr_remember(G, key);
    s->used = G->tick;
    if (s->measured && s->misses < GR_MAX_MISSES && (g = gr_capture_begin(c, key, s->bytes))) {
        g->misses = s->misses;
        s->used = 0; /* the key has a graph now */
        return gr_open(c, g, GR_CAPTURE);
    }
    G->stats.eager++;
    G->mode = s->misses < GR_MAX_MISSES ? GR_MEASURE : GR_EAGER;
    G->stats.measured += G->mode == GR_MEASURE;
    G->meas = s;
    return 0;
}

int cuda_graph_end(void *ctx)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    struct cuda_graphs *G = c->graphs;
    TDM_ASSERT(c->in_step);
    const int mode = G->mode;
    gr_graph *g = G->cur;
    c->in_step = 0;
    c->shaping = 0;
    c->replaying = 0;
    G->mode = GR_IDLE;
    G->cur = NULL;
    if (mode == GR_MEASURE) {
        G->meas->bytes = G->off;
        G->meas->measured = 1;
    }
    if (mode == GR_MEASURE || mode == GR_EAGER)
        return 0;
    if (mode == GR_CAPTURE) {
        cudaGraph_t graph = NULL;
        CUDA_CHECK(cudaStreamEndCapture(c->stream, &graph));
        /* More staged than the measured run: not the step that was measured. */
        cudaError_t e =
            G->overflow ? cudaErrorInvalidValue : cudaGraphInstantiate(&g->exec, graph, 0ull);
        CUDA_CHECK(cudaGraphDestroy(graph));
        if (e != cudaSuccess) {
            /* Out of memory for the instantiation is an answer too: the
             * key stays eager. */
            (void)cudaGetLastError();
            g->exec = NULL;
            G->stats.refused++;
            gr_drop(c, g, G->overflow ? g->misses + 1 : GR_MAX_MISSES);
            return 1;
        }
        g->bytes = G->off;
        g->shape = c->shape;
        g->grown = c->grown;
        G->stats.captured++;
    } else if (G->overflow || G->off != g->bytes || c->shape != g->shape) {
        G->stats.refused++;
        if (g->grown != c->grown) { /* outgrown: captured before scratch was replaced */
            gr_drop(c, g, g->misses);
            return 1;
        }
        if (!G->warned) {
            G->warned = 1;
            tdm_log_warn("cuda",
                         "a replayed step (key %016llx) did not match its captured graph; it ran "
                         "eagerly and the graph was dropped (reported once per backend)",
                         (unsigned long long)g->key);
        }
        gr_drop(c, g, g->misses + 1);
        return 1;
    } else {
        g->misses = 0;
        G->stats.replayed++;
    }
    if (G->off)
        CUDA_CHECK(cudaMemcpyAsync(g->dev, g->host, G->off, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaEventRecord(g->uploaded, c->stream));
    CUDA_CHECK(cudaGraphLaunch(g->exec, c->stream));
    return 0;
}

void *cuda_graph_stage(cuda_ctx *c, const void *host, size_t n, size_t need)
{
    struct cuda_graphs *G = c->graphs;
    if (G->mode == GR_MEASURE)
        G->off += need;
    if (G->mode != GR_CAPTURE && G->mode != GR_REPLAY)
        return NULL;
    gr_graph *g = G->cur;
    cuda_shape_word(c, (uint64_t)n);
    if (G->overflow || G->off + need > g->cap) {
        /* This step will not be launched: graph_end refuses it. */
        G->overflow = 1;
        return g->dev;
    }
    unsigned char *d = g->dev + G->off;
    if (n)
        memcpy(g->host + G->off, host, n);
    G->off += need;
    return d;
}

extern "C" void tdm_cuda_graph_stats_get(const tdm_backend *be, tdm_cuda_graph_stats *out)
{
    TDM_ASSERT(strcmp(be->name, "cuda") == 0);
    const cuda_ctx *c = (const cuda_ctx *)be->ctx;
    if (c->graphs)
        *out = c->graphs->stats;
    else
        memset(out, 0, sizeof(*out));
}
