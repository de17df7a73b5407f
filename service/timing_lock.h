/*
 * timing_lock.h - one process of a host at a time times its steps.
 *
 * A verifier times its steps and a drafter its draft passes before they serve
 * (the adaptive rule and the run-ahead rule start from those times). Two
 * replicas started together on one machine, as a colocated pair is, would
 * otherwise time on the same cores (or GPU) at once and each measure the
 * other's work as its own: on two CPU cores a demo verifier's one-sequence
 * step read 4.5 ms beside a drafter timing its passes, 0.7-1.7 ms alone.
 * So each holds a lock file in /dev/shm while it times: one per GPU (by its
 * UUID) on the cuda backend, one per host on the cpu backend. Processes that
 * share no /dev/shm (pods apart) do not see each other's lock, and need not.
 */
#ifndef TANDEM_SERVICE_TIMING_LOCK_H
#define TANDEM_SERVICE_TIMING_LOCK_H

/* How long a replica waits for another to finish timing. */
#define TDM_TIMING_LOCK_WAIT_MS 15000

/* Takes the lock for `device_uuid` ("" or NULL: the host's CPUs), the file
 * /dev/shm/tandem-timing-<UUID>.lock (characters other than letters, digits
 * and '-' as '_') or /dev/shm/tandem-timing-cpu.lock, waiting at
 * most wait_ms for another process to finish timing. Returns the lock's file
 * descriptor (release with tdm_timing_lock_release), or -1 when it cannot be
 * had: no /dev/shm, or still held after wait_ms (a stuck holder delays a
 * start by wait_ms at most). Logs under `component` when it waited (info) or
 * gave up (warn). */
int tdm_timing_lock_acquire(const char *device_uuid, int wait_ms, const char *component);
void tdm_timing_lock_release(int fd); /* -1 is fine */

#endif
