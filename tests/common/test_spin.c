/*
 * test_spin.c - tdm_spin_wait (common/spin.h), with busy polling off and on:
 *  - an event bumped while the waiter had let go of its lock (its signal
 *    found no waiter) ends the wait at once, not at the deadline: the lost
 *    wakeup the verifier's wait for blocks once had (a round slept up to
 *    draft_timeout for a block already there);
 *  - an event from another thread while the waiter sleeps wakes it;
 *  - without an event the wait lasts until the deadline and says so.
 */
#include "check.h" /* tests/config */
#include "spin.h"

#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static _Atomic uint64_t events;

static struct timespec in_ms(long ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long ns = (long long)t.tv_nsec + (long long)ms * 1000000LL;
    t.tv_sec += (time_t)(ns / 1000000000LL);
    t.tv_nsec = (long)(ns % 1000000000LL);
    return t;
}

/* A signaller: bumps under mu, then signals (spin.h's pattern). */
static void signal_event(void)
{
    pthread_mutex_lock(&mu);
    tdm_spin_bump(&events);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void *late_signaller(void *arg)
{
    struct timespec d = {0, (long)(intptr_t)arg * 1000000L};
    nanosleep(&d, NULL);
    signal_event();
    return NULL;
}

static void run(int64_t poll_us)
{
    tdm_busy_poll_set(poll_us);
    /* An event between reading the counter and waiting, its signal gone. */
    pthread_mutex_lock(&mu);
    uint64_t seen = atomic_load(&events);
    pthread_mutex_unlock(&mu);
    signal_event();
    pthread_mutex_lock(&mu);
    int64_t t0 = tdm_spin_now_us();
    struct timespec until = in_ms(5000);
    bool moved = tdm_spin_wait(&mu, &cv, &events, seen, &until);
    int64_t took = tdm_spin_now_us() - t0;
    pthread_mutex_unlock(&mu);
    CHECK(moved && took < 1000000,
          "busy poll %lld us: an event signalled before the wait: %s after %lld us (deadline "
          "5 s)",
          (long long)poll_us, moved ? "seen" : "missed", (long long)took);

    /* An event from another thread during the wait. */
    pthread_t th;
    pthread_mutex_lock(&mu);
    seen = atomic_load(&events);
    CHECK(pthread_create(&th, NULL, late_signaller, (void *)(intptr_t)50) == 0, "thread");
    t0 = tdm_spin_now_us();
    until = in_ms(5000);
    while (atomic_load(&events) == seen && tdm_spin_now_us() - t0 < 5000000)
        moved = tdm_spin_wait(&mu, &cv, &events, seen, &until);
    took = tdm_spin_now_us() - t0;
    pthread_mutex_unlock(&mu);
    pthread_join(th, NULL);
    CHECK(moved && took < 2000000, "busy poll %lld us: a later event: %s after %lld us",
          (long long)poll_us, moved ? "seen" : "missed", (long long)took);

    /* No event: the deadline. */
    pthread_mutex_lock(&mu);
    seen = atomic_load(&events);
    t0 = tdm_spin_now_us();
    until = in_ms(30);
    moved = false;
    while (!moved && tdm_spin_now_us() - t0 < 30000) /* past spurious wake-ups */
        moved = tdm_spin_wait(&mu, &cv, &events, seen, &until);
    took = tdm_spin_now_us() - t0;
    pthread_mutex_unlock(&mu);
    CHECK(!moved && took >= 25000, "busy poll %lld us: no event, yet %s after %lld us",
          (long long)poll_us, moved ? "moved" : "returned", (long long)took);
    printf("busy poll %lld us: an event before the wait seen at once, a later one woke the "
           "waiter, none waited out the deadline\n",
           (long long)poll_us);
}

int main(void)
{
    run(0);
    if (!g_failures)
        run(2000);
    if (g_failures)
        return 1;
    printf("spin: all checks passed\n");
    return 0;
}
