/*
 * shm_segment.c - the shared-memory segments of colocated Draft streams (see
 * shm_segment.h).
 */
#include "shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The segment's first bytes. */
typedef struct shm_header {
    char magic[8];
    uint64_t body_bytes;
    uint8_t nonce[TDM_SHM_NONCE];
} shm_header;

tdm_status tdm_shm_create(const char *prefix, const char magic[8], uint64_t body_bytes,
                          tdm_shm *out, tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    uint8_t raw[16];
    if (RAND_bytes(raw, sizeof(raw)) != 1 || RAND_bytes(out->nonce, sizeof(out->nonce)) != 1)
        return tdm_error_set(err, TDM_ERR_INTERNAL, "no random bytes for a shared-memory name");
    int w = snprintf(out->name, sizeof(out->name), "%s%ld-", prefix, (long)getpid());
    for (int i = 0; i < 16; i++)
        w += snprintf(out->name + w, sizeof(out->name) - (size_t)w, "%02x", raw[i]);
    out->map_len = (size_t)(TDM_SHM_HEADER + body_bytes);
    int fd = shm_open(out->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int e = errno;
        memset(out, 0, sizeof(*out));
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                             "cannot create a shared-memory segment in /dev/shm: %s", strerror(e));
    }
    out->linked = true;
    int e = 0;
    if (ftruncate(fd, (off_t)out->map_len) != 0)
        e = errno;
    else if ((e = posix_fallocate(fd, 0, (off_t)out->map_len)) != 0 && e != EOPNOTSUPP &&
             e != EINVAL)
        ; /* e: the memory is not there (ENOSPC: /dev/shm is full) */
    else
        e = 0;
    if (e == 0) {
        /* Populated now: a round's copy into it takes no page faults. */
        out->map =
            mmap(NULL, out->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (out->map == MAP_FAILED) {
            e = errno;
            out->map = NULL;
        }
    }
    close(fd);
    if (e != 0) {
        const size_t len = out->map_len;
        tdm_shm_close(out);
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                             "cannot reserve %zu bytes of shared memory in /dev/shm: %s", len,
                             strerror(e));
    }
    shm_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, magic, sizeof(h.magic));
    h.body_bytes = body_bytes;
    memcpy(h.nonce, out->nonce, sizeof(h.nonce));
    memcpy(out->map, &h, sizeof(h));
    out->body = (uint8_t *)out->map + TDM_SHM_HEADER;
    out->body_bytes = body_bytes;
    return TDM_OK;
}

/* prefix, a process id, '-', 32 lowercase hex digits. */
static bool name_ok(const char *prefix, const char *name)
{
    const size_t np = strlen(prefix);
    if (strncmp(name, prefix, np) != 0)
        return false;
    const char *c = name + np;
    int digits = 0;
    for (; *c >= '0' && *c <= '9'; c++)
        digits++;
    if (digits < 1 || digits > 10 || *c++ != '-' || strlen(c) != 32)
        return false;
    for (; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return false;
    return true;
}

tdm_status tdm_shm_open(const char *what, const char *prefix, const char magic[8], const char *name,
                        const uint8_t *nonce, size_t nonce_len, uint64_t body_bytes, bool writable,
                        tdm_shm *out, tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    name = name ? name : "";
    if (!name_ok(prefix, name))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.name '%.80s' is not %s, a process id, '-' and 32 hex digits", what,
                             name, prefix);
    if (nonce_len != TDM_SHM_NONCE)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s.nonce has %zu bytes, not %d", what,
                             nonce_len, TDM_SHM_NONCE);
    int fd = shm_open(name, writable ? O_RDWR : O_RDONLY, 0);
    if (fd < 0) {
        int e = errno;
        return tdm_error_set(err, e == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_UNAVAILABLE,
                             "cannot open the verifier's shared-memory segment %s: %s (another "
                             "host, another /dev/shm, or another user)",
                             name, strerror(e));
    }
    struct stat sb;
    const size_t len = (size_t)(TDM_SHM_HEADER + body_bytes);
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != (uint64_t)len) {
        close(fd);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "the shared-memory segment %s holds %lld bytes, the offer says %zu",
                             name, (long long)sb.st_size, len);
    }
    void *map = mmap(NULL, len, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                     MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                             "cannot map the shared-memory segment %s: %s", name, strerror(e));
    shm_header h;
    memcpy(&h, map, sizeof(h));
    if (memcmp(h.magic, magic, sizeof(h.magic)) != 0 || h.body_bytes != body_bytes ||
        memcmp(h.nonce, nonce, TDM_SHM_NONCE) != 0) {
        munmap(map, len);
        return tdm_error_set(err, TDM_ERR_PERMISSION_DENIED,
                             "the shared-memory segment %s does not hold the offer's nonce (not "
                             "the verifier's segment)",
                             name);
    }
    snprintf(out->name, sizeof(out->name), "%s", name);
    memcpy(out->nonce, nonce, TDM_SHM_NONCE);
    out->map = map;
    out->map_len = len;
    out->body = (uint8_t *)map + TDM_SHM_HEADER;
    out->body_bytes = body_bytes;
    return TDM_OK;
}

void tdm_shm_unlink(tdm_shm *s)
{
    if (s->linked) {
        shm_unlink(s->name);
        s->linked = false;
    }
}

void tdm_shm_close(tdm_shm *s)
{
    tdm_shm_unlink(s);
    if (s->map)
        munmap(s->map, s->map_len);
    memset(s, 0, sizeof(*s));
}
