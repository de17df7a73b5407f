/*
 * spin.h - busy polling for the waits of the drafter<->verifier exchange.
 *
 * A thread that sleeps on a condition variable or in epoll is woken by the
 * kernel on another core; on a host whose idle cores drop into deep sleep
 * states (virtual machines especially) each such wake-up costs 50-600 us,
 * and one exchange crosses half a dozen threads. A thread that polls
 * instead keeps its core awake and sees the event at once, at the price of
 * that core's time. The process-wide busy-poll time (the services'
 * `busy_poll` setting; 0 = off) bounds how long a hot wait polls before it
 * sleeps as before, so an idle server uses no CPU.
 *
 * The pattern: a waiter reads an event counter under its lock, checks its
 * condition, and when it must wait, unlocks, polls the counter
 * (tdm_spin_changed), locks again and checks the condition once more
 * before it sleeps; signallers bump the counter (tdm_spin_bump) before
 * they signal. A signal that comes while the waiter polls is never lost:
 * the waiter checks its condition under the lock after polling.
 */
#ifndef TANDEM_COMMON_SPIN_H
#define TANDEM_COMMON_SPIN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Sets the process's busy-poll time in microseconds (0: never poll). */
void tdm_busy_poll_set(int64_t us);
int64_t tdm_busy_poll_us(void);

/* One pause of a polling loop (the CPU's spin-wait hint). */
static inline void tdm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Marks an event for pollers of c. */
static inline void tdm_spin_bump(_Atomic uint64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_release);
}

/* Polls until *c differs from `seen` or the busy-poll time has passed;
 * true when it changed. Returns false at once when busy polling is off. */
bool tdm_spin_changed(const _Atomic uint64_t *c, uint64_t seen);

/* Polls until *flag is true (read atomically; the writer stores it with
 * __atomic_store_n or under a lock the reader does not hold) or the
 * busy-poll time has passed; true when it became true. */
bool tdm_spin_flag(const bool *flag);

/* The pattern above as one call: with mu held (and held again on return),
 * waits until *c differs from `seen` or `until` (CLOCK_REALTIME) passes:
 * polls with mu released for up to the busy-poll time, then, after looking
 * at *c once more under mu, sleeps on cv. A bump made while mu was free
 * (signallers bump under mu, so their signal found no waiter) is seen
 * before sleeping. True: *c changed. */
bool tdm_spin_wait(pthread_mutex_t *mu, pthread_cond_t *cv, const _Atomic uint64_t *c,
                   uint64_t seen, const struct timespec *until);

/* Microseconds on the monotonic clock. */
int64_t tdm_spin_now_us(void);

/* The process's last busy-polled wait: every polling wait notes when it
 * started (those above, and the gRPC layer's), so that the gRPC layer's
 * server workers keep polling while the process's exchange does (rpc.h). */
void tdm_spin_note_poll(int64_t now_us);
int64_t tdm_spin_last_poll_us(void);

#endif
