/*
 * pool.h - a persistent worker pool: the CPU backend's kernels, the
 * verifier's sampled verdicts.
 *
 * Owns nthreads-1 pthreads that live as long as the pool. tdm_pool_run splits
 * a job into n independent chunks; the calling thread and the workers claim
 * chunks one at a time until none is left, and the call returns when every
 * chunk is done. Claiming (rather than a fixed split) keeps a job moving when
 * a worker is descheduled on a busy machine: whoever runs takes the work. A
 * chunk's result must not depend on which thread computes it.
 */
#ifndef TANDEM_COMMON_POOL_H
#define TANDEM_COMMON_POOL_H

#include <stdbool.h>

typedef struct tdm_pool tdm_pool;

/* fn(arg, chunk) runs once for each chunk in [0, nchunks). */
typedef void (*tdm_pool_fn)(void *arg, int chunk);

/* NULL when threads cannot be started. With spin, an idle worker polls for
 * the next job a while (about a millisecond) before it sleeps: for jobs that
 * come back to back, such as a step's kernels; without, it sleeps at once
 * and leaves the cores to other threads between jobs. */
tdm_pool *tdm_pool_create(int nthreads, bool spin);
void tdm_pool_destroy(tdm_pool *p);
int tdm_pool_size(const tdm_pool *p);
/* Not reentrant: one run at a time per pool. */
void tdm_pool_run(tdm_pool *p, tdm_pool_fn fn, void *arg, int nchunks);

#endif
