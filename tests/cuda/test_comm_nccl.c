/*
 * test_comm_nccl.c - the NCCL communicator (kernels/cuda/comm_nccl.cu) over
 * every visible device, one rank per device, each on its own thread with
 * its own CUDA backend:
 *  - all_reduce_sum of rank-dependent values equals a host reference, for
 *    1, 1000 and 1 << 20 floats, called again with new values (the values
 *    are small integers, so every order of additions gives the bits of the
 *    reference and every rank the same bits);
 *  - all_gather out of place and in place puts every rank's send in every
 *    rank's recv;
 *  - the same three collectives inside a recorded step (graph_begin /
 *    graph_end): measured, captured, then replayed with new values each
 *    step; a step whose collective names another buffer is refused and run
 *    again eagerly;
 *  - n == 0 does nothing;
 *  - a group with two ranks on one device (one backend twice, or two
 *    backends of one device), a CPU backend or no rank is refused with an
 *    error, not a crash.
 */
#include "comm_nccl.h"
#include "cuda_test.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#define MAX_RANKS 8
#define STEP_KEY 0x636f6d6d5f746573ull

static pthread_barrier_t g_bar; /* the ranks and main */
static tdm_backend *g_bes[MAX_RANKS];
static tdm_comm *g_comms[MAX_RANKS];

/* Rank r's value i for round `rep`: small integers, exact in any sum of a
 * few of them. */
static float val(int rep, int r, size_t i)
{
    return (float)((int)((i * 7 + (size_t)r * 13 + (size_t)rep * 5) % 64) - 32) + 0.5f * (float)r;
}

static void check_bits(const float *got, const float *want, size_t n, const char *what, int rank,
                       size_t len, int rep)
{
    for (size_t i = 0; i < n; i++)
        CHECK(memcmp(&got[i], &want[i], sizeof(float)) == 0,
              "%s, rank %d, n %zu, round %d: [%zu] = %a, want %a", what, rank, len, rep, i,
              (double)got[i], (double)want[i]);
}

/* Device buffers of one rank for collectives of len floats, and their host
 * copies and references. */
typedef struct bufs {
    size_t len;
    float *ar, *send, *recv, *recv_in; /* device: [len], [len], [P, len], [P, len] */
    float *h, *ref;                    /* host: [P * len] each */
} bufs;

static void bufs_init(bufs *b, tdm_backend *be, size_t len, int size)
{
    b->len = len;
    b->ar = ct_put(be, NULL, len * sizeof(float));
    b->send = ct_put(be, NULL, len * sizeof(float));
    b->recv = ct_put(be, NULL, (size_t)size * len * sizeof(float));
    b->recv_in = ct_put(be, NULL, (size_t)size * len * sizeof(float));
    b->h = malloc((size_t)size * len * sizeof(float));
    b->ref = malloc((size_t)size * len * sizeof(float));
    CHECK(b->h && b->ref, "out of memory");
}

static void bufs_free(bufs *b, tdm_backend *be)
{
    be->free(be->ctx, b->ar);
    be->free(be->ctx, b->send);
    be->free(be->ctx, b->recv);
    be->free(be->ctx, b->recv_in);
    free(b->h);
    free(b->ref);
}

/* Round rep's inputs: ar and send from val(), recv poisoned, recv_in
 * poisoned but for the rank's own slot. */
static void upload_inputs(const bufs *b, tdm_backend *be, int rank, int size, int rep)
{
    const size_t len = b->len;
    for (size_t i = 0; i < len; i++)
        b->h[i] = val(rep, rank, i);
    be->upload(be->ctx, b->ar, b->h, len * sizeof(float));
    for (size_t i = 0; i < len; i++)
        b->h[i] = val(rep + 100, rank, i);
    be->upload(be->ctx, b->send, b->h, len * sizeof(float));
    ct_poison(be, b->recv, (size_t)size * len * sizeof(float));
    ct_poison(be, b->recv_in, (size_t)size * len * sizeof(float));
    be->upload(be->ctx, b->recv_in + (size_t)rank * len, b->h, len * sizeof(float));
}

/* The three collectives of a round, in the same order on every rank. */
static void collectives(const bufs *b, tdm_comm *c, float *ar)
{
    c->all_reduce_sum(c->ctx, ar, b->len);
    c->all_gather(c->ctx, b->send, b->recv, b->len);
    c->all_gather(c->ctx, b->recv_in + (size_t)c->rank * b->len, b->recv_in, b->len);
}

static void check_outputs(const bufs *b, tdm_backend *be, const float *ar, int rank, int size,
                          int rep)
{
    const size_t len = b->len;
    for (size_t i = 0; i < len; i++) {
        b->ref[i] = val(rep, 0, i);
        for (int r = 1; r < size; r++)
            b->ref[i] += val(rep, r, i);
    }
    be->download(be->ctx, b->h, ar, len * sizeof(float));
    check_bits(b->h, b->ref, len, "all_reduce_sum", rank, len, rep);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < len; i++)
            b->ref[(size_t)r * len + i] = val(rep + 100, r, i);
    be->download(be->ctx, b->h, b->recv, (size_t)size * len * sizeof(float));
    check_bits(b->h, b->ref, (size_t)size * len, "all_gather", rank, len, rep);
    be->download(be->ctx, b->h, b->recv_in, (size_t)size * len * sizeof(float));
    check_bits(b->h, b->ref, (size_t)size * len, "in-place all_gather", rank, len, rep);
}

/* Rounds inside a recorded step: round 0 is measured, 1 captured, 2 and 3
 * replayed; round 4 reduces another buffer under the same key, which the
 * backend must refuse (the caller then runs it eagerly). */
static void graph_rounds(tdm_backend *be, tdm_comm *c, int size)
{
    if (!be->graph_begin) {
        printf("rank %d: the backend records no graphs (TANDEM_CUDA_OPSTATS?): graph part "
               "skipped\n",
               c->rank);
        return;
    }
    bufs b;
    bufs_init(&b, be, 1000, size);
    float *other = ct_put(be, NULL, b.len * sizeof(float));
    int refused = 0;
    for (int rep = 0; rep < 5; rep++) {
        upload_inputs(&b, be, c->rank, size, 10 + rep);
        float *ar = rep == 4 ? other : b.ar;
        if (rep == 4)
            be->copy(be->ctx, other, b.ar, b.len * sizeof(float));
        be->graph_begin(be->ctx, STEP_KEY);
        collectives(&b, c, ar);
        if (be->graph_end(be->ctx)) {
            refused++;
            collectives(&b, c, ar);
        }
        check_outputs(&b, be, ar, c->rank, size, 10 + rep);
    }
    tdm_cuda_graph_stats st;
    tdm_cuda_graph_stats_get(be, &st);
    CHECK(st.captured == 1 && st.replayed == 2 && st.refused == 1 && refused == 1,
          "rank %d: captured %llu replayed %llu refused %llu (graph_end refused %d), want 1, 2, "
          "1",
          c->rank, (unsigned long long)st.captured, (unsigned long long)st.replayed,
          (unsigned long long)st.refused, refused);
    be->free(be->ctx, other);
    bufs_free(&b, be);
}

static void *rank_main(void *arg)
{
    const int rank = (int)(intptr_t)arg;
    tdm_error err;
    /* Created here: the backend makes its device this thread's. */
    g_bes[rank] = tdm_backend_cuda_create(rank, &err);
    CHECK(g_bes[rank], "rank %d: CUDA backend on device %d: %s", rank, rank, err.msg);
    pthread_barrier_wait(&g_bar); /* main makes the group */
    pthread_barrier_wait(&g_bar);
    tdm_backend *be = g_bes[rank];
    tdm_comm *c = g_comms[rank];
    const int size = c->size;

    const size_t lens[] = {1, 1000, (size_t)1 << 20};
    for (size_t k = 0; k < TDM_ARRAY_LEN(lens); k++) {
        bufs b;
        bufs_init(&b, be, lens[k], size);
        for (int rep = 0; rep < 2; rep++) {
            upload_inputs(&b, be, rank, size, rep);
            collectives(&b, c, b.ar);
            check_outputs(&b, be, b.ar, rank, size, rep);
        }
        bufs_free(&b, be);
    }
    c->all_reduce_sum(c->ctx, NULL, 0);
    c->all_gather(c->ctx, NULL, NULL, 0);
    graph_rounds(be, c, size);

    c->destroy(c); /* before the backend (comm_nccl.h) */
    be->destroy(be);
    return NULL;
}

static void check_refusals(void)
{
    tdm_error err;
    tdm_comm *out[2] = {NULL, NULL};
    tdm_backend *be = ct_gpu();
    tdm_backend *bes[2] = {be, be};
    CHECK(tdm_comm_nccl_group(bes, 2, out, &err) == TDM_ERR_INVALID_ARGUMENT && !out[0],
          "one backend twice must be refused");
    CHECK(strstr(err.msg, "device 0"), "the refusal should name the device: %s", err.msg);
    printf("one backend twice: %s\n", err.msg);

    tdm_backend *be2 = ct_gpu();
    bes[1] = be2;
    CHECK(tdm_comm_nccl_group(bes, 2, out, &err) == TDM_ERR_INVALID_ARGUMENT && !out[0],
          "two backends of one device must be refused");
    CHECK(strstr(err.msg, "device 0"), "the refusal should name the device: %s", err.msg);
    be2->destroy(be2);

    tdm_backend *cpu = ct_cpu();
    bes[1] = cpu;
    CHECK(tdm_comm_nccl_group(bes, 2, out, &err) == TDM_ERR_INVALID_ARGUMENT && !out[0],
          "a CPU backend must be refused");
    CHECK(strstr(err.msg, "rank 1") && strstr(err.msg, "cpu"), "the refusal should name it: %s",
          err.msg);
    printf("a CPU backend: %s\n", err.msg);
    cpu->destroy(cpu);

    CHECK(tdm_comm_nccl_group(bes, 0, out, &err) == TDM_ERR_INVALID_ARGUMENT,
          "a group of no rank must be refused");
    be->destroy(be);
}

int main(void)
{
    ct_require_gpu();
    const int v = tdm_comm_nccl_version();
    printf("NCCL %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
    check_refusals();

    int n = tdm_cuda_device_count(NULL, 0);
    if (n > MAX_RANKS)
        n = MAX_RANKS;
    CHECK(pthread_barrier_init(&g_bar, NULL, (unsigned)n + 1) == 0, "pthread_barrier_init");
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++)
        CHECK(pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r) == 0, "pthread_create");
    pthread_barrier_wait(&g_bar);
    tdm_error err;
    CHECK(tdm_comm_nccl_group(g_bes, n, g_comms, &err) == TDM_OK, "a group over %d device(s): %s",
          n, err.msg);
    for (int r = 0; r < n; r++)
        CHECK(g_comms[r]->rank == r && g_comms[r]->size == n &&
                  strcmp(g_comms[r]->name, "nccl") == 0,
              "rank %d of %d says rank %d of %d (%s)", r, n, g_comms[r]->rank, g_comms[r]->size,
              g_comms[r]->name);
    pthread_barrier_wait(&g_bar);
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g_bar);
    printf("cuda comm_nccl: %d rank(s): collectives, eager and recorded, as the references\n", n);
    return 0;
}
