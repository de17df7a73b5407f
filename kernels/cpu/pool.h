/*
 * pool.h - the CPU backend's persistent worker pool.
 *
 * Owns nthreads-1 pthreads that live as long as the pool. tdm_pool_run hands
 * one function to all of them plus the calling thread and returns when every
 * one has finished. Workers spin briefly before sleeping, because the ops of
 * one decode step follow each other within microseconds.
 */
#ifndef TANDEM_KERNELS_CPU_POOL_H
#define TANDEM_KERNELS_CPU_POOL_H

typedef struct tdm_pool tdm_pool;

/* fn(arg, ith, nth) runs once for each ith in [0, nth). */
typedef void (*tdm_pool_fn)(void *arg, int ith, int nth);

/* NULL when threads cannot be started. */
tdm_pool *tdm_pool_create(int nthreads);
void tdm_pool_destroy(tdm_pool *p);
int tdm_pool_size(const tdm_pool *p);
/* Not reentrant: one run at a time per pool. */
void tdm_pool_run(tdm_pool *p, tdm_pool_fn fn, void *arg);

#endif
