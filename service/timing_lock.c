/*
 * timing_lock.c - one process of a host at a time times its steps (see
 * timing_lock.h).
 */
#include "timing_lock.h"

#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void lock_path(const char *device_uuid, char *out, size_t len)
{
    /* The UUID as a file name: letters, digits and '-' kept, the rest '_'. */
    char key[64] = "cpu";
    if (device_uuid && device_uuid[0]) {
        size_t i = 0;
        for (; device_uuid[i] && i + 1 < sizeof(key); i++) {
            const unsigned char c = (unsigned char)device_uuid[i];
            key[i] = (char)(isalnum(c) || c == '-' ? c : '_');
        }
        key[i] = 0;
    }
    snprintf(out, len, "/dev/shm/tandem-timing-%s.lock", key);
}

int tdm_timing_lock_acquire(const char *device_uuid, int wait_ms, const char *component)
{
    char path[128];
    lock_path(device_uuid, path, sizeof(path));
    /* /dev/shm is everyone's: never through a link, only a plain file. */
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        tdm_log_debug(component, "timing without the host's timing lock: %s: %s", path,
                      fd < 0 ? strerror(errno) : "not a plain file");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (st.st_uid == geteuid())
        (void)fchmod(fd, 0666); /* replicas of other users on the host take it too */
    const double t0 = mono_ms();
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            break;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            tdm_log_debug(component, "timing without the host's timing lock: flock %s: %s", path,
                          strerror(errno));
            close(fd);
            return -1;
        }
        if (mono_ms() - t0 >= wait_ms) {
            tdm_log_warn(component,
                         "another process has held %s for %d ms; timing beside it (the times "
                         "may include its work)",
                         path, wait_ms);
            close(fd);
            return -1;
        }
        usleep(10000);
    }
    const double waited = mono_ms() - t0;
    if (waited >= 20)
        tdm_log_info(component,
                     "waited %.0f ms for another process on this %s to finish timing (%s)", waited,
                     device_uuid && device_uuid[0] ? "GPU" : "host", path);
    return fd;
}

void tdm_timing_lock_release(int fd)
{
    if (fd < 0)
        return;
    (void)flock(fd, LOCK_UN);
    close(fd);
}
