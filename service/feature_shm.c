/*
 * feature_shm.c - the feature stream's shared-memory ring (see feature_shm.h).
 */
#include "feature_shm.h"

#include "alloc.h"
#include "feature_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char shm_magic[8] = {'T', 'D', 'M', 'F', 'E', 'A', 'T', '1'};

/* The segment's first bytes. */
typedef struct shm_header {
    char magic[8];
    uint64_t ring_bytes;
    uint8_t nonce[TDM_FEAT_SHM_NONCE];
} shm_header;

tdm_feat_transport tdm_feat_transport_parse(const char *s)
{
    if (s && strcmp(s, "grpc") == 0)
        return TDM_FEAT_TRANSPORT_GRPC;
    if (s && strcmp(s, "shm") == 0)
        return TDM_FEAT_TRANSPORT_SHM;
    return TDM_FEAT_TRANSPORT_AUTO;
}

const char *tdm_feat_transport_name(tdm_feat_transport t)
{
    switch (t) {
    case TDM_FEAT_TRANSPORT_GRPC:
        return "grpc";
    case TDM_FEAT_TRANSPORT_SHM:
        return "shm";
    default:
        return "auto";
    }
}

/* ---- verifier: the ring it writes ------------------------------------------ */

struct tdm_feat_ring {
    char name[64];
    bool linked;
    uint8_t nonce[TDM_FEAT_SHM_NONCE];
    void *map;
    size_t map_len;
    uint8_t *ring;
    uint64_t size;
    _Atomic uint64_t head; /* stream offset of the next reservation's end (writer) */
    _Atomic uint64_t tail; /* released up to here (reader of the drafter's answers) */
};

tdm_status tdm_feat_ring_create(uint64_t ring_bytes, tdm_feat_ring **out, tdm_error *err)
{
    *out = NULL;
    if (ring_bytes < TDM_FEAT_SHM_MIN || ring_bytes > TDM_FEAT_SHM_MAX)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "a feature ring of %llu bytes: it takes %llu to %llu",
                             (unsigned long long)ring_bytes, (unsigned long long)TDM_FEAT_SHM_MIN,
                             (unsigned long long)TDM_FEAT_SHM_MAX);
    uint8_t raw[16];
    tdm_feat_ring *r = tdm_xcalloc(1, sizeof(*r));
    if (RAND_bytes(raw, sizeof(raw)) != 1 || RAND_bytes(r->nonce, sizeof(r->nonce)) != 1) {
        free(r);
        return tdm_error_set(err, TDM_ERR_INTERNAL, "no random bytes for a shared-memory name");
    }
    int w = snprintf(r->name, sizeof(r->name), "%s%ld-", TDM_FEAT_SHM_PREFIX, (long)getpid());
    for (int i = 0; i < 16; i++)
        w += snprintf(r->name + w, sizeof(r->name) - (size_t)w, "%02x", raw[i]);
    r->map_len = (size_t)(TDM_FEAT_SHM_HEADER + ring_bytes);
    int fd = shm_open(r->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int e = errno;
        free(r);
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                             "cannot create a shared-memory segment in /dev/shm: %s", strerror(e));
    }
    r->linked = true;
    int e = 0;
    if (ftruncate(fd, (off_t)r->map_len) != 0)
        e = errno;
    else if ((e = posix_fallocate(fd, 0, (off_t)r->map_len)) != 0 && e != EOPNOTSUPP && e != EINVAL)
        ; /* e: the memory is not there (ENOSPC: /dev/shm is full) */
    else
        e = 0;
    if (e == 0) {
        /* Populated now: a round's copy into the ring takes no page faults. */
        r->map = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (r->map == MAP_FAILED) {
            e = errno;
            r->map = NULL;
        }
    }
    close(fd);
    if (e != 0) {
        tdm_feat_ring_destroy(r);
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                             "cannot reserve %zu bytes of shared memory in /dev/shm: %s",
                             (size_t)(TDM_FEAT_SHM_HEADER + ring_bytes), strerror(e));
    }
    shm_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, shm_magic, sizeof(h.magic));
    h.ring_bytes = ring_bytes;
    memcpy(h.nonce, r->nonce, sizeof(h.nonce));
    memcpy(r->map, &h, sizeof(h));
    r->ring = (uint8_t *)r->map + TDM_FEAT_SHM_HEADER;
    r->size = ring_bytes;
    *out = r;
    return TDM_OK;
}

void tdm_feat_ring_destroy(tdm_feat_ring *r)
{
    if (!r)
        return;
    tdm_feat_ring_unlink(r);
    if (r->map)
        munmap(r->map, r->map_len);
    free(r);
}

const char *tdm_feat_ring_name(const tdm_feat_ring *r)
{
    return r->name;
}

const uint8_t *tdm_feat_ring_nonce(const tdm_feat_ring *r)
{
    return r->nonce;
}

uint64_t tdm_feat_ring_bytes(const tdm_feat_ring *r)
{
    return r->size;
}

void tdm_feat_ring_unlink(tdm_feat_ring *r)
{
    if (r->linked) {
        shm_unlink(r->name);
        r->linked = false;
    }
}

uint8_t *tdm_feat_ring_reserve(tdm_feat_ring *r, uint64_t len, uint64_t *offset)
{
    if (len == 0 || len > r->size)
        return NULL;
    uint64_t head = atomic_load(&r->head), tail = atomic_load(&r->tail);
    if (head == tail && head % r->size != 0) {
        /* All read: start again at the ring's first bytes (still in the
         * caches, where the last rounds' rows were), skipping the rest of
         * this lap, which holds nothing. */
        const uint64_t lap = head + (r->size - head % r->size);
        if (atomic_compare_exchange_strong(&r->tail, &tail, lap)) {
            head = tail = lap;
            atomic_store(&r->head, lap);
        }
    }
    const uint64_t pos = head % r->size;
    const uint64_t start = pos + len > r->size ? head + (r->size - pos) : head;
    if (start + len - tail > r->size)
        return NULL;
    atomic_store(&r->head, start + len);
    *offset = start;
    return r->ring + start % r->size;
}

bool tdm_feat_ring_release(tdm_feat_ring *r, uint64_t consumed)
{
    if (consumed > atomic_load(&r->head))
        return false;
    uint64_t t = atomic_load(&r->tail);
    while (consumed > t && !atomic_compare_exchange_weak(&r->tail, &t, consumed))
        ;
    return true;
}

uint64_t tdm_feat_ring_used(tdm_feat_ring *r)
{
    return atomic_load(&r->head) - atomic_load(&r->tail);
}

bool tdm_feat_out_ring(const struct tdm_feat_out *b, tdm_feat_ring *r, Tandem__V1__Features *out,
                       Tandem__V1__FeatureShmRef *ref)
{
    const uint64_t len =
        (uint64_t)b->rows * (uint64_t)b->width * (uint64_t)tdm_feat_dtype_bytes(b->dtype);
    uint64_t off = 0;
    uint8_t *dst = b->rows > 0 ? tdm_feat_ring_reserve(r, len, &off) : NULL;
    if (!dst)
        return false;
    memcpy(dst, b->data, (size_t)len);
    tandem__v1__feature_shm_ref__init(ref);
    ref->offset = off;
    ref->length = len;
    tandem__v1__features__init(out);
    out->position = (uint32_t)b->position;
    out->rows = (uint32_t)b->rows;
    out->width = (uint32_t)b->width;
    out->dtype = b->dtype;
    out->shm = ref;
    return true;
}

/* ---- drafter: the view it reads -------------------------------------------- */

/* TDM_FEAT_SHM_PREFIX, a process id, '-', 32 lowercase hex digits. */
static bool name_ok(const char *name)
{
    const size_t np = strlen(TDM_FEAT_SHM_PREFIX);
    if (strncmp(name, TDM_FEAT_SHM_PREFIX, np) != 0)
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

tdm_status tdm_feat_map_open(const Tandem__V1__FeatureShmOffer *offer, tdm_feat_map *out,
                             tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    const char *name = offer->name ? offer->name : "";
    if (!name_ok(name))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "FeatureShmOffer.name '%.80s' is not %s, a process id, '-' and 32 hex "
                             "digits",
                             name, TDM_FEAT_SHM_PREFIX);
    if (offer->nonce.len != TDM_FEAT_SHM_NONCE)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "FeatureShmOffer.nonce has %zu bytes, not %d", offer->nonce.len,
                             TDM_FEAT_SHM_NONCE);
    if (offer->ring_bytes < TDM_FEAT_SHM_MIN || offer->ring_bytes > TDM_FEAT_SHM_MAX)
        return tdm_error_set(
            err, TDM_ERR_INVALID_ARGUMENT, "FeatureShmOffer.ring_bytes %llu is outside %llu..%llu",
            (unsigned long long)offer->ring_bytes, (unsigned long long)TDM_FEAT_SHM_MIN,
            (unsigned long long)TDM_FEAT_SHM_MAX);
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0) {
        int e = errno;
        return tdm_error_set(err, e == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_UNAVAILABLE,
                             "cannot open the verifier's shared-memory segment %s: %s (another "
                             "host, another /dev/shm, or another user)",
                             name, strerror(e));
    }
    struct stat sb;
    const size_t len = (size_t)(TDM_FEAT_SHM_HEADER + offer->ring_bytes);
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != (uint64_t)len) {
        close(fd);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "the shared-memory segment %s holds %lld bytes, the offer says %zu",
                             name, (long long)sb.st_size, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                             "cannot map the shared-memory segment %s: %s", name, strerror(e));
    shm_header h;
    memcpy(&h, map, sizeof(h));
    if (memcmp(h.magic, shm_magic, sizeof(h.magic)) != 0 || h.ring_bytes != offer->ring_bytes ||
        memcmp(h.nonce, offer->nonce.data, TDM_FEAT_SHM_NONCE) != 0) {
        munmap(map, len);
        return tdm_error_set(err, TDM_ERR_PERMISSION_DENIED,
                             "the shared-memory segment %s does not hold the offer's nonce (not "
                             "the verifier's segment)",
                             name);
    }
    out->map = map;
    out->map_len = len;
    out->ring = (const uint8_t *)map + TDM_FEAT_SHM_HEADER;
    out->ring_bytes = offer->ring_bytes;
    return TDM_OK;
}

void tdm_feat_map_close(tdm_feat_map *m)
{
    if (m->map)
        munmap(m->map, m->map_len);
    memset(m, 0, sizeof(*m));
}

tdm_status tdm_feat_shm_ref_check(uint64_t ring_bytes, uint64_t consumed,
                                  const Tandem__V1__Features *f, uint64_t expect_len,
                                  const char *what, uint64_t *pos, tdm_error *err)
{
    const Tandem__V1__FeatureShmRef *ref = f->shm;
    if (!ref)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s.shm is missing", what);
    if (ring_bytes == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.shm references a shared-memory ring, but this Draft stream has "
                             "none (no FeatureShmOffer was accepted)",
                             what);
    if (f->data.len != 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s has both inline data (%zu bytes) and a shared-memory reference",
                             what, f->data.len);
    if (ref->length != expect_len)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.shm.length %llu: %u rows of %u values take %llu bytes", what,
                             (unsigned long long)ref->length, f->rows, f->width,
                             (unsigned long long)expect_len);
    const uint64_t p = ref->offset % ring_bytes;
    if (ref->length > ring_bytes || p + ref->length > ring_bytes)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.shm (offset %llu, length %llu) runs past the end of the ring "
                             "(%llu bytes)",
                             what, (unsigned long long)ref->offset, (unsigned long long)ref->length,
                             (unsigned long long)ring_bytes);
    if (ref->offset < consumed)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.shm.offset %llu lies before what was read (%llu): references "
                             "go forward",
                             what, (unsigned long long)ref->offset, (unsigned long long)consumed);
    if (ref->offset - consumed >= ring_bytes)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.shm.offset %llu is a ring (%llu bytes) or more ahead of what "
                             "was read (%llu)",
                             what, (unsigned long long)ref->offset, (unsigned long long)ring_bytes,
                             (unsigned long long)consumed);
    *pos = p;
    return TDM_OK;
}
