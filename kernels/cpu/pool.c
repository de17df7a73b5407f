/* pool.c - see pool.h. */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define POOL_SPIN 50000

typedef struct pool_worker {
    tdm_pool *pool;
    int ith;
    pthread_t thread;
} pool_worker;

struct tdm_pool {
    int n;
    pool_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    atomic_uint gen;     /* bumped for every run */
    atomic_int pending;  /* workers still running the current function */
    atomic_int stop;
    tdm_pool_fn fn;
    void *arg;
};

static inline void pool_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *pool_main(void *vp)
{
    pool_worker *w = vp;
    tdm_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop) && spins < POOL_SPIN) {
            pool_relax();
            spins++;
        }
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->work_cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        p->fn(p->arg, w->ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

tdm_pool *tdm_pool_create(int nthreads)
{
    if (nthreads < 1)
        nthreads = 1;
    tdm_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->n = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->workers = calloc((size_t)nthreads, sizeof(pool_worker));
    if (!p->workers) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i;
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
    pthread_cond_destroy(&p->done_cv);
    free(p->workers);
    free(p);
}

int tdm_pool_size(const tdm_pool *p)
{
    return p->n;
}

void tdm_pool_run(tdm_pool *p, tdm_pool_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0 && spins < POOL_SPIN) {
        pool_relax();
        spins++;
    }
    if (atomic_load(&p->pending) != 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) != 0)
            pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
