/* spin.c - see spin.h. */
#include "spin.h"

#include <time.h>

static _Atomic int64_t g_busy_us;

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

bool tdm_spin_changed(const _Atomic uint64_t *c, uint64_t seen)
{
    const int64_t budget = tdm_busy_poll_us();
    if (budget <= 0)
        return false;
    const int64_t t0 = tdm_spin_now_us();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(c, memory_order_acquire) != seen)
                return true;
            tdm_cpu_relax();
        }
        if (tdm_spin_now_us() - t0 >= budget)
            return atomic_load_explicit(c, memory_order_acquire) != seen;
    }
}

bool tdm_spin_flag(const bool *flag)
{
    const int64_t budget = tdm_busy_poll_us();
    if (budget <= 0)
        return false;
    const int64_t t0 = tdm_spin_now_us();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (__atomic_load_n(flag, __ATOMIC_ACQUIRE))
                return true;
            tdm_cpu_relax();
        }
        if (tdm_spin_now_us() - t0 >= budget)
            return __atomic_load_n(flag, __ATOMIC_ACQUIRE);
    }
}
