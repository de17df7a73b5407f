/* spin.c - see spin.h. */
#include "spin.h"

#include <time.h>

static _Atomic int64_t g_busy_us;
static _Atomic int64_t g_last_poll_us; /* when a wait last started polling */

void tdm_busy_poll_set(int64_t us)
{
    atomic_store(&g_busy_us, us > 0 ? us : 0);
}

int64_t tdm_busy_poll_us(void)
{
    return atomic_load_explicit(&g_busy_us, memory_order_relaxed);
}

int64_t tdm_spin_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void tdm_spin_note_poll(int64_t now_us)
{
    atomic_store_explicit(&g_last_poll_us, now_us, memory_order_relaxed);
}

int64_t tdm_spin_last_poll_us(void)
{
    return atomic_load_explicit(&g_last_poll_us, memory_order_relaxed);
}

/* Polls test(arg) for up to the busy-poll time; its last answer. */
static bool spin_until(bool (*test)(const void *), const void *arg)
{
    const int64_t budget = tdm_busy_poll_us();
    if (budget <= 0)
        return false;
    const int64_t t0 = tdm_spin_now_us();
    tdm_spin_note_poll(t0);
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (test(arg))
                return true;
            tdm_cpu_relax();
        }
        if (tdm_spin_now_us() - t0 >= budget)
            return test(arg);
    }
}

typedef struct changed_arg {
    const _Atomic uint64_t *c;
    uint64_t seen;
} changed_arg;

static bool test_changed(const void *arg)
{
    const changed_arg *a = arg;
    return atomic_load_explicit(a->c, memory_order_acquire) != a->seen;
}

static bool test_flag(const void *arg)
{
    return __atomic_load_n((const bool *)arg, __ATOMIC_ACQUIRE);
}

bool tdm_spin_changed(const _Atomic uint64_t *c, uint64_t seen)
{
    const changed_arg a = {c, seen};
    return spin_until(test_changed, &a);
}

bool tdm_spin_flag(const bool *flag)
{
    return spin_until(test_flag, flag);
}

bool tdm_spin_wait(pthread_mutex_t *mu, pthread_cond_t *cv, const _Atomic uint64_t *c,
                   uint64_t seen, const struct timespec *until)
{
    pthread_mutex_unlock(mu);
    const bool polled = tdm_spin_changed(c, seen);
    pthread_mutex_lock(mu);
    if (polled || atomic_load(c) != seen)
        return true;
    pthread_cond_timedwait(cv, mu, until);
    return atomic_load(c) != seen;
}
