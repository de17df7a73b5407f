/*
 * test_comm_local.c - the local communicator (kernels/cpu/comm_local.c) with
 * 1 to 4 ranks on threads:
 *  - all_reduce_sum gives every rank the bits of a reference summed here in
 *    rank order ((x_0 + x_1) + x_2) + ..., for sizes 1, 7, 1000 and 1 << 20,
 *    called many times in a row with new data each time and alternating with
 *    all_gather (a barrier reused wrongly shows up as a wrong sum);
 *  - all_gather, out of place and in place, puts every rank's send in every
 *    rank's recv;
 *  - NaN and infinities propagate as in the reference, with the same bits on
 *    every rank;
 *  - n == 0 does nothing (NULL buffers too); a group of fewer than one rank
 *    is refused.
 */
#include "check.h" /* tests/config */
#include "comm.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 4

/* A value of (rep, rank, i), with magnitudes from 2^-8 to 2^8 so that the
 * order of additions shows in the sum's bits. */
static float gen(int rep, int rank, size_t i)
{
    uint64_t z = ((uint64_t)rep << 40) ^ ((uint64_t)rank << 32) ^ (uint64_t)i;
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = (float)(z >> 40) / (float)(1u << 24) * 2.0f - 1.0f; /* [-1, 1) */
    return ldexpf(u, (int)((z >> 8) % 17) - 8);
}

/* Rank `rank`'s all_reduce input of the special-values case: NaN on the
 * last rank, infinities of both signs on the first, so that inf + -inf
 * and NaN + inf both occur. */
static float gen_special(int rank, int size, size_t i)
{
    if (rank == size - 1 && i % 7 == 0)
        return NAN;
    if (rank == size - 1 && i % 7 == 1)
        return INFINITY;
    if (rank == 0 && i % 7 == 1)
        return -INFINITY;
    if (rank == 0 && i % 7 == 2)
        return INFINITY;
    return gen(0, rank, i);
}

/* Equal bits, or both NaN (the compiler may put either operand of an
 * addition first, which picks which NaN's payload survives). */
static int same(float a, float b)
{
    return memcmp(&a, &b, sizeof(a)) == 0 || (isnan(a) && isnan(b));
}

typedef struct rank_job {
    tdm_comm *c;
    size_t len;
    int reps;
    int special; /* the NaN / infinity case instead of reps of gen() */
    float *keep; /* [len]: this rank's last all_reduce result */
    /* What went wrong, for the main thread to report. */
    long bad_reduce, bad_gather, bad_gather_in_place;
    int bad_rep;
    size_t bad_i;
    float got, want;
} rank_job;

static void note_bad(rank_job *j, long *count, int rep, size_t i, float got, float want)
{
    if (j->bad_reduce + j->bad_gather + j->bad_gather_in_place == 0) {
        j->bad_rep = rep;
        j->bad_i = i;
        j->got = got;
        j->want = want;
    }
    (*count)++;
}

static void check_reduce(rank_job *j, int rep, float *buf, float *ref)
{
    const int size = j->c->size, rank = j->c->rank;
    for (size_t i = 0; i < j->len; i++) {
        buf[i] = j->special ? gen_special(rank, size, i) : gen(rep, rank, i);
        ref[i] = j->special ? gen_special(0, size, i) : gen(rep, 0, i);
        for (int r = 1; r < size; r++)
            ref[i] += j->special ? gen_special(r, size, i) : gen(rep, r, i);
    }
    j->c->all_reduce_sum(j->c->ctx, buf, j->len);
    for (size_t i = 0; i < j->len; i++)
        if (!same(buf[i], ref[i]))
            note_bad(j, &j->bad_reduce, rep, i, buf[i], ref[i]);
    memcpy(j->keep, buf, j->len * sizeof(float));
}

/* recv [size, len] poisoned with NaN, filled by all_gather (in place: the
 * rank's own slot holds its send beforehand), then checked slot by slot. */
static void check_gather(rank_job *j, int rep, float *send, float *recv, int in_place)
{
    const int size = j->c->size, rank = j->c->rank;
    for (size_t i = 0; i < (size_t)size * j->len; i++)
        recv[i] = NAN;
    float *mine = in_place ? recv + (size_t)rank * j->len : send;
    for (size_t i = 0; i < j->len; i++)
        mine[i] = gen(rep + 1000, rank, i);
    j->c->all_gather(j->c->ctx, mine, recv, j->len);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < j->len; i++) {
            const float want = gen(rep + 1000, r, i), got = recv[(size_t)r * j->len + i];
            if (!same(got, want))
                note_bad(j, in_place ? &j->bad_gather_in_place : &j->bad_gather, rep, i, got, want);
        }
}

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    const size_t len = j->len, size = (size_t)j->c->size;
    float *buf = malloc((len ? len : 1) * sizeof(float));
    float *ref = malloc((len ? len : 1) * sizeof(float));
    float *send = malloc((len ? len : 1) * sizeof(float));
    float *recv = malloc((len ? len * size : 1) * sizeof(float));
    if (!buf || !ref || !send || !recv) {
        fprintf(stderr, "out of memory\n");
        abort();
    }
    for (int rep = 0; rep < j->reps; rep++) {
        check_reduce(j, rep, buf, ref);
        if (j->special)
            continue;
        check_gather(j, rep, send, recv, rep % 2);
        /* Two of a kind in a row: one rank may leave the first while
         * another still waits in its last barrier. */
        check_reduce(j, rep + 5000, buf, ref);
        check_gather(j, rep, send, recv, !(rep % 2));
    }
    /* n == 0 with NULL and with real buffers: nothing happens. */
    j->c->all_reduce_sum(j->c->ctx, NULL, 0);
    j->c->all_gather(j->c->ctx, NULL, NULL, 0);
    j->c->all_reduce_sum(j->c->ctx, buf, 0);
    j->c->all_gather(j->c->ctx, send, recv, 0);
    free(buf);
    free(ref);
    free(send);
    free(recv);
    j->c->destroy(j->c); /* each rank its own, after the last collective */
    return NULL;
}

/* Runs rank_main on n ranks and reports what each found. */
static void run_group(int n, size_t len, int reps, int special)
{
    tdm_comm *comms[MAX_RANKS];
    tdm_error err;
    if (tdm_comm_local_group(n, comms, &err) != TDM_OK) {
        CHECK(0, "a group of %d: %s", n, err.msg);
        return;
    }
    rank_job jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        CHECK(comms[r]->rank == r && comms[r]->size == n && strcmp(comms[r]->name, "local") == 0,
              "rank %d of %d: says rank %d of %d (%s)", r, n, comms[r]->rank, comms[r]->size,
              comms[r]->name);
        memset(&jobs[r], 0, sizeof(jobs[r]));
        jobs[r].c = comms[r];
        jobs[r].len = len;
        jobs[r].reps = reps;
        jobs[r].special = special;
        jobs[r].keep = malloc((len ? len : 1) * sizeof(float));
        CHECK(jobs[r].keep, "out of memory");
        CHECK(pthread_create(&th[r], NULL, rank_main, &jobs[r]) == 0, "pthread_create");
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
        const rank_job *j = &jobs[r];
        CHECK(j->bad_reduce + j->bad_gather + j->bad_gather_in_place == 0,
              "%d ranks, n %zu%s, rank %d: %ld all_reduce_sum, %ld all_gather, %ld in-place "
              "all_gather values wrong; first at rep %d index %zu: %a, want %a",
              n, len, special ? " (NaN/inf)" : "", r, j->bad_reduce, j->bad_gather,
              j->bad_gather_in_place, j->bad_rep, j->bad_i, j->got, j->want);
        CHECK(memcmp(j->keep, jobs[0].keep, len * sizeof(float)) == 0,
              "%d ranks, n %zu%s: rank %d's all_reduce_sum bits differ from rank 0's", n, len,
              special ? " (NaN/inf)" : "", r);
    }
    for (int r = 0; r < n; r++)
        free(jobs[r].keep);
    printf("%d rank(s), n %zu%s, %d rep(s): ok\n", n, len, special ? " (NaN/inf)" : "", reps);
}

int main(void)
{
    tdm_comm *comms[1];
    tdm_error err;
    for (int n = -1; n <= 0; n++) {
        CHECK(tdm_comm_local_group(n, comms, &err) == TDM_ERR_INVALID_ARGUMENT,
              "a group of %d must be refused", n);
        CHECK_HAS(err.msg, "local communicator");
    }
    printf("refused: %s\n", err.msg);

    for (int n = 1; n <= MAX_RANKS; n++) {
        run_group(n, 0, 3, 0);
        run_group(n, 1, 200, 0);
        run_group(n, 7, 200, 0);
        run_group(n, 1000, 50, 0);
        run_group(n, (size_t)1 << 20, 2, 0);
        run_group(n, 1000, 1, 1);
    }
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("comm local: all collectives as the references\n");
    return 0;
}
