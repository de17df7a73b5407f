/*
 * feature_shm.h - the colocated transport of the feature stream: a POSIX
 * shared-memory segment per Draft stream holding a ring of encoded
 * hidden-state rows (drafter.proto, FeatureShmOffer).
 *
 * Owns: the verifier's ring (tdm_feat_ring: it creates the segment, writes
 * rows into it and reuses the space the drafter says it has read) and the
 * drafter's read-only view of it (tdm_feat_map), with the checks of what a
 * peer sends: an offer's name, nonce and size, and a Features message's
 * FeatureShmRef.
 *
 * The segment (shm_segment.h): named TDM_FEAT_SHM_PREFIX, the verifier's
 * process id, '-', 128 random bits; one page of header (magic "TDMFEAT1",
 * the ring's size, the 32-byte nonce), then the ring. A message's rows lie contiguous in the
 * ring (a reservation that would wrap skips to the ring's start, and one
 * made when everything was read starts there too, where the caches still
 * hold the ring); offsets are stream offsets (bytes reserved since
 * creation, skips included), the ring position being offset modulo the
 * ring's size.
 *
 * Threads: tdm_feat_ring_reserve from one thread (the one that sends the
 * messages, in the order it reserves), tdm_feat_ring_release from any
 * other. A tdm_feat_map is its stream's handler thread's alone.
 *
 * Ownership: tdm_feat_ring_create / tdm_feat_ring_destroy (which unlinks
 * the name if tdm_feat_ring_unlink has not); tdm_feat_map_open /
 * tdm_feat_map_close.
 */
#ifndef TANDEM_SERVICE_FEATURE_SHM_H
#define TANDEM_SERVICE_FEATURE_SHM_H

#include "shm_segment.h"
#include "status.h"
#include "tandem/v1/drafter.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TDM_FEAT_SHM_NONCE TDM_SHM_NONCE
#define TDM_FEAT_SHM_HEADER TDM_SHM_HEADER
#define TDM_FEAT_SHM_PREFIX "/tandem-feat-"
/* Bounds of a ring's size (feature_shm_size). */
#define TDM_FEAT_SHM_MIN ((uint64_t)64 << 10)
#define TDM_FEAT_SHM_MAX ((uint64_t)1 << 36)

/* The values of feature_transport. */
typedef enum {
    TDM_FEAT_TRANSPORT_AUTO = 0, /* shm when the handshake proves colocation, else grpc */
    TDM_FEAT_TRANSPORT_GRPC,     /* rows in the Draft stream's messages */
    TDM_FEAT_TRANSPORT_SHM,      /* shared memory, or no feature stream at all */
} tdm_feat_transport;

#define TDM_FEAT_TRANSPORTS "auto|grpc|shm"
tdm_feat_transport tdm_feat_transport_parse(const char *s); /* unknown: AUTO */
const char *tdm_feat_transport_name(tdm_feat_transport t);

/* ---- verifier: the ring it writes ------------------------------------------ */

typedef struct tdm_feat_ring tdm_feat_ring;

/* A new segment of ring_bytes (TDM_FEAT_SHM_MIN..MAX) plus the header, its
 * memory reserved at once (posix_fallocate: a full /dev/shm fails here, not
 * with a SIGBUS at a later write), named with 128 random bits, mode 0600,
 * its header written with a fresh nonce. UNAVAILABLE naming /dev/shm and the
 * system's error when it cannot be made. */
tdm_status tdm_feat_ring_create(uint64_t ring_bytes, tdm_feat_ring **out, tdm_error *err);
/* Unmaps the segment; unlinks its name unless done. NULL: nothing. */
void tdm_feat_ring_destroy(tdm_feat_ring *r);
const char *tdm_feat_ring_name(const tdm_feat_ring *r);
const uint8_t *tdm_feat_ring_nonce(const tdm_feat_ring *r); /* TDM_FEAT_SHM_NONCE bytes */
uint64_t tdm_feat_ring_bytes(const tdm_feat_ring *r);
/* Removes the name from /dev/shm (the mappings stay); idempotent. */
void tdm_feat_ring_unlink(tdm_feat_ring *r);
/* Room for len bytes, contiguous in the ring: where to write them, and
 * their stream offset in *offset. NULL when the ring's free space (what the
 * drafter has not released) cannot hold them now: the caller sends the rows
 * inline. Never blocks. */
uint8_t *tdm_feat_ring_reserve(tdm_feat_ring *r, uint64_t len, uint64_t *offset);
/* The drafter has read everything below stream offset `consumed`: that
 * space may be reused. False (nothing changes) when consumed lies beyond
 * what was reserved; an older offset than the last one is ignored. */
bool tdm_feat_ring_release(tdm_feat_ring *r, uint64_t consumed);
/* Bytes reserved and not yet released (for tests and counters). */
uint64_t tdm_feat_ring_used(tdm_feat_ring *r);

struct tdm_feat_out; /* feature_stream.h */

/* Puts the rows b holds into the ring: *out then references them (out->shm
 * = ref, no inline data), position, rows, width and dtype as
 * tdm_feat_out_messages would set them. False when the ring lacks the room
 * (nothing reserved): the caller sends them inline. */
bool tdm_feat_out_ring(const struct tdm_feat_out *b, tdm_feat_ring *r, Tandem__V1__Features *out,
                       Tandem__V1__FeatureShmRef *ref);

/* ---- drafter: the view it reads -------------------------------------------- */

typedef struct tdm_feat_map {
    void *map; /* the whole segment, read-only; NULL: none */
    size_t map_len;
    const uint8_t *ring; /* map + TDM_FEAT_SHM_HEADER */
    uint64_t ring_bytes;
    uint64_t consumed; /* stream offset read up to (the end of the last reference read) */
} tdm_feat_map;

/* Maps the segment an offer names and checks it: the name has the tandem
 * form (above), the segment's
 * size is the offer's ring size plus the header, the header's magic and
 * nonce are the offer's. The name is not unlinked (the verifier does it).
 * On error *out is empty and err says which check failed (NOT_FOUND: no
 * such segment on this host, as from another host). */
tdm_status tdm_feat_map_open(const Tandem__V1__FeatureShmOffer *offer, tdm_feat_map *out,
                             tdm_error *err);
void tdm_feat_map_close(tdm_feat_map *m);

/* Checks a Features message's ring reference against a ring of ring_bytes
 * read up to `consumed`: it must lie within the ring without wrapping, not
 * before what was read, less than a ring ahead of it, and hold exactly
 * `expect_len` bytes (rows x width x the dtype's size), with no inline data
 * beside it. Returns TDM_OK with the ring position in *pos, or
 * INVALID_ARGUMENT naming the field at fault (`what` names the message). */
tdm_status tdm_feat_shm_ref_check(uint64_t ring_bytes, uint64_t consumed,
                                  const Tandem__V1__Features *f, uint64_t expect_len,
                                  const char *what, uint64_t *pos, tdm_error *err);

#endif
