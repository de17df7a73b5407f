/*
 * comm_local.c - the local communicator (comm.h): the ranks are threads of
 * one process and their buffers are host memory.
 *
 * The group state is shared by every rank's communicator: a barrier (mutex,
 * condition variable and a generation counter, so that it can be reused at
 * once by the next collective) and one published pointer per rank.
 *
 * all_reduce_sum, on n floats with P ranks:
 *  1. each rank publishes its buffer; barrier (every rank's input is ready);
 *  2. rank r owns the indices [r*c, (r+1)*c) (c: n/P rounded up to whole
 *     64-byte lines, so no two ranks write one cache line), sums them over
 *     every rank's buffer and writes the sum into every rank's buffer;
 *     barrier (every rank's output is complete, and no rank still reads a
 *     pointer the next collective will publish).
 * An index is read and written by its owner only, so a buffer can be both
 * input and output without a scratch copy.
 *
 * Invariants a change must keep: the sum of index i is
 * ((buf_0[i] + buf_1[i]) + buf_2[i]) + ... in rank order, whatever P and n,
 * computed once and stored to every rank, so every rank gets the same bits,
 * the same from one call to the next. The order of additions per index is
 * what blocking or vectorising may not change.
 *
 * all_gather: each rank publishes its send pointer; barrier; each copies
 * every rank's send into its own recv; barrier. In place (send == recv +
 * rank*n), other ranks read this rank's slot of its recv while it writes the
 * other slots only; its own slot is already in place.
 *
 * A group of one rank, or a call with n == 0 (every rank passes the same
 * n), does no synchronisation: all_reduce_sum leaves the buffer as it is and
 * all_gather copies send to recv (the pointers may be NULL when n == 0).
 */
#include "comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LOCAL_ALIGN 16  /* floats: 64 bytes, one cache line */
#define LOCAL_BLOCK 256 /* floats summed at a time on the stack */

typedef struct local_group {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;         /* ranks waiting at the barrier */
    unsigned long gen;   /* barriers completed */
    int refs;            /* communicators not yet destroyed */
    float **bufs;        /* [size] all_reduce_sum: each rank's buffer */
    const float **sends; /* [size] all_gather: each rank's send */
} local_group;

/* One rank's communicator; pub.ctx points back at it. */
typedef struct local_comm {
    tdm_comm pub;
    local_group *g;
} local_comm;

/* Returns when every rank of the group has called it; reusable at once. */
static void local_barrier(local_group *g)
{
    pthread_mutex_lock(&g->mu);
    const unsigned long gen = g->gen;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->gen == gen)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

/* The indices [*lo, *hi) of n that rank owns. */
static void local_chunk(size_t n, int size, int rank, size_t *lo, size_t *hi)
{
    size_t per = (n + (size_t)size - 1) / (size_t)size;
    per = (per + LOCAL_ALIGN - 1) / LOCAL_ALIGN * LOCAL_ALIGN;
    const size_t start = per * (size_t)rank;
    *lo = start < n ? start : n;
    *hi = n - *lo < per ? n : *lo + per;
}

static void local_all_reduce_sum(void *ctx, float *buf, size_t n)
{
    local_comm *lc = ctx;
    local_group *g = lc->g;
    const int size = g->size;
    if (size == 1 || n == 0)
        return;
    g->bufs[lc->pub.rank] = buf;
    local_barrier(g);
    size_t lo, hi;
    local_chunk(n, size, lc->pub.rank, &lo, &hi);
    float s[LOCAL_BLOCK];
    for (size_t b = lo; b < hi; b += LOCAL_BLOCK) {
        const size_t m = hi - b < LOCAL_BLOCK ? hi - b : LOCAL_BLOCK;
        memcpy(s, g->bufs[0] + b, m * sizeof(float));
        for (int r = 1; r < size; r++) {
            const float *x = g->bufs[r] + b;
            for (size_t i = 0; i < m; i++)
                s[i] += x[i];
        }
        for (int r = 0; r < size; r++)
            memcpy(g->bufs[r] + b, s, m * sizeof(float));
    }
    local_barrier(g);
}

static void local_all_gather(void *ctx, const float *send, float *recv, size_t n)
{
    local_comm *lc = ctx;
    local_group *g = lc->g;
    const int size = g->size, rank = lc->pub.rank;
    if (n == 0)
        return;
    const int in_place = send == recv + (size_t)rank * n;
    if (size == 1) {
        if (!in_place)
            memcpy(recv, send, n * sizeof(float));
        return;
    }
    g->sends[rank] = send;
    local_barrier(g);
    for (int r = 0; r < size; r++)
        if (r != rank || !in_place)
            memcpy(recv + (size_t)r * n, g->sends[r], n * sizeof(float));
    local_barrier(g);
}

static void local_group_free(local_group *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->bufs);
    free(g->sends);
    free(g);
}

static void local_destroy(tdm_comm *c)
{
    if (!c)
        return;
    local_comm *lc = (local_comm *)c;
    local_group *g = lc->g;
    pthread_mutex_lock(&g->mu);
    const int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last)
        local_group_free(g);
    free(lc);
}

tdm_status tdm_comm_local_group(int n, tdm_comm **out, tdm_error *err)
{
    if (n < 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "local communicator: a group of %d ranks (at least 1 is needed)", n);
    local_group *g = calloc(1, sizeof(*g));
    local_comm **cs = calloc((size_t)n, sizeof(*cs));
    int ok = g && cs;
    if (ok) {
        g->size = n;
        g->bufs = calloc((size_t)n, sizeof(*g->bufs));
        g->sends = calloc((size_t)n, sizeof(*g->sends));
        ok = g->bufs && g->sends;
    }
    for (int r = 0; ok && r < n; r++)
        ok = (cs[r] = calloc(1, sizeof(**cs))) != NULL;
    if (ok && pthread_mutex_init(&g->mu, NULL) != 0)
        ok = 0;
    if (ok && pthread_cond_init(&g->cv, NULL) != 0) {
        pthread_mutex_destroy(&g->mu);
        ok = 0;
    }
    if (!ok) {
        for (int r = 0; cs && r < n; r++)
            free(cs[r]);
        free(cs);
        if (g) {
            free(g->bufs);
            free(g->sends);
        }
        free(g);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "local communicator: out of memory for a group of %d ranks", n);
    }
    g->refs = n;
    for (int r = 0; r < n; r++) {
        local_comm *lc = cs[r];
        lc->g = g;
        lc->pub.name = "local";
        lc->pub.in_graphs = 0;
        lc->pub.rank = r;
        lc->pub.size = n;
        lc->pub.ctx = lc;
        lc->pub.all_reduce_sum = local_all_reduce_sum;
        lc->pub.all_gather = local_all_gather;
        lc->pub.destroy = local_destroy;
        out[r] = &lc->pub;
    }
    free(cs);
    return TDM_OK;
}
