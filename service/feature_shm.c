/*
 * feature_shm.c - the feature stream's shared-memory ring (see feature_shm.h).
 */
#include "feature_shm.h"

#include "alloc.h"
#include "feature_stream.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const char shm_magic[8] = {'T', 'D', 'M', 'F', 'E', 'A', 'T', '1'};

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
    tdm_shm seg;
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
    tdm_feat_ring *r = tdm_xcalloc(1, sizeof(*r));
    if (tdm_shm_create(TDM_FEAT_SHM_PREFIX, shm_magic, ring_bytes, &r->seg, err) != TDM_OK) {
        free(r);
        return err ? err->code : TDM_ERR_UNAVAILABLE;
    }
    r->ring = r->seg.body;
    r->size = ring_bytes;
    *out = r;
    return TDM_OK;
}

void tdm_feat_ring_destroy(tdm_feat_ring *r)
{
    if (!r)
        return;
    tdm_shm_close(&r->seg);
    free(r);
}

const char *tdm_feat_ring_name(const tdm_feat_ring *r)
{
    return r->seg.name;
}

const uint8_t *tdm_feat_ring_nonce(const tdm_feat_ring *r)
{
    return r->seg.nonce;
}

uint64_t tdm_feat_ring_bytes(const tdm_feat_ring *r)
{
    return r->size;
}

void tdm_feat_ring_unlink(tdm_feat_ring *r)
{
    tdm_shm_unlink(&r->seg);
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

tdm_status tdm_feat_map_open(const Tandem__V1__FeatureShmOffer *offer, tdm_feat_map *out,
                             tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    if (offer->ring_bytes < TDM_FEAT_SHM_MIN || offer->ring_bytes > TDM_FEAT_SHM_MAX)
        return tdm_error_set(
            err, TDM_ERR_INVALID_ARGUMENT, "FeatureShmOffer.ring_bytes %llu is outside %llu..%llu",
            (unsigned long long)offer->ring_bytes, (unsigned long long)TDM_FEAT_SHM_MIN,
            (unsigned long long)TDM_FEAT_SHM_MAX);
    tdm_shm seg;
    tdm_status rc =
        tdm_shm_open("FeatureShmOffer", TDM_FEAT_SHM_PREFIX, shm_magic, offer->name,
                     offer->nonce.data, offer->nonce.len, offer->ring_bytes, false, &seg, err);
    if (rc != TDM_OK)
        return rc;
    out->map = seg.map;
    out->map_len = seg.map_len;
    out->ring = seg.body;
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
