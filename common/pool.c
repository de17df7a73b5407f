/* pool.c - see pool.h.
 *
 * The job state is one 64-bit word: the job's generation in the high 32 bits
 * and the next unclaimed chunk in the low 32. A worker that wakes late, after
 * its job has finished and another begun, sees a different generation in its
 * claim and backs off, so it never runs an old function on a new job. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#define POOL_SPIN 20000

typedef struct pool_worker {
    tdm_pool *pool;
    pthread_t thread;
} pool_worker;

struct tdm_pool {
    int n;
    int spin; /* polls before an idle worker sleeps */
    pool_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    _Atomic uint64_t job; /* gen << 32 | next chunk */
    atomic_int done;      /* chunks finished in the current job */
    atomic_int stop;
    /* Written before the job word is published (release), read after it. */
    tdm_pool_fn fn;
    void *arg;
    int nchunks;
};

static inline void pool_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claims and runs chunks of job generation `gen` until none is left. */
static void pool_work(tdm_pool *p, uint32_t gen, tdm_pool_fn fn, void *arg, int n)
{
    uint64_t v = atomic_load_explicit(&p->job, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(v >> 32) != gen || (int)(uint32_t)v >= n)
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->job, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(arg, (int)(uint32_t)v);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        v = atomic_load_explicit(&p->job, memory_order_acquire);
    }
}

static void *pool_main(void *vp)
{
    pool_worker *w = vp;
    tdm_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = (uint32_t)(atomic_load_explicit(&p->job, memory_order_acquire) >> 32)) ==
                   seen &&
               !atomic_load(&p->stop) && spins < p->spin) {
            /* now and then the core goes to a thread that can run there
             * (the verifier's scheduler and its Runs, on a CPU backend of
             * few cores: the demo pair on two, 2-8 % more tokens/s) */
            pool_relax();
            if (++spins % 256 == 0)
                sched_yield();
        }
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((g = (uint32_t)(atomic_load(&p->job) >> 32)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->work_cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        /* fn/arg/nchunks belong to generation g as long as the job word still
         * says g; pool_work re-checks that with every claim. They are read
         * under the mutex so a concurrent publish cannot tear them. */
        pthread_mutex_lock(&p->mu);
        tdm_pool_fn fn = p->fn;
        void *arg = p->arg;
        int n = p->nchunks;
        uint32_t cur = (uint32_t)(atomic_load(&p->job) >> 32);
        pthread_mutex_unlock(&p->mu);
        if (cur == g)
            pool_work(p, g, fn, arg, n);
    }
}

tdm_pool *tdm_pool_create(int nthreads, bool spin)
{
    if (nthreads < 1)
        nthreads = 1;
    tdm_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->n = nthreads;
    p->spin = spin ? POOL_SPIN : 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    p->workers = calloc((size_t)nthreads, sizeof(pool_worker));
    if (!p->workers) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {
        p->workers[i].pool = p;
        if (pthread_create(&p->workers[i].thread, NULL, pool_main, &p->workers[i]) != 0) {
            p->n = i; /* the ones started so far */
            tdm_pool_destroy(p);
            return NULL;
        }
    }
    return p;
}

void tdm_pool_destroy(tdm_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    free(p->workers);
    free(p);
}

int tdm_pool_size(const tdm_pool *p)
{
    return p->n;
}

void tdm_pool_run(tdm_pool *p, tdm_pool_fn fn, void *arg, int nchunks)
{
    if (nchunks <= 0)
        return;
    if (p->n == 1 || nchunks == 1) {
        for (int i = 0; i < nchunks; i++)
            fn(arg, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->nchunks = nchunks;
    atomic_store(&p->done, 0);
    uint32_t gen = (uint32_t)(atomic_load(&p->job) >> 32) + 1;
    atomic_store_explicit(&p->job, (uint64_t)gen << 32, memory_order_release);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    pool_work(p, gen, fn, arg, nchunks);
    /* Chunks still running belong to workers that are on a CPU right now;
     * yield now and then in case one was preempted mid-chunk. */
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < nchunks) {
        pool_relax();
        if (++spins % 256 == 0)
            sched_yield();
    }
}
