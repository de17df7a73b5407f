/*
 * shm_segment.h - the POSIX shared-memory segments a verifier offers a
 * colocated drafter (the feature ring, feature_shm.h; the exchange lane,
 * lane.h): created by the verifier, proved by a nonce, mapped by the drafter.
 *
 * A segment is named prefix, the creator's process id, '-', 128 random bits
 * in hex ("/tandem-feat-4242-0f3c..."): unguessable, and an operator can
 * tell whose it is. It is mode 0600 (same user only), its memory reserved
 * at creation (a full /dev/shm fails there, not with a SIGBUS later) and
 * populated. Its first page is a header: an 8-byte magic naming the kind,
 * the size of what follows, and a 32-byte random nonce that the offer
 * carries too, so that the opener knows the segment is the offerer's.
 *
 * Ownership: tdm_shm_create / tdm_shm_open fill a tdm_shm; tdm_shm_close
 * unmaps it (and unlinks the name where it is still linked).
 */
#ifndef TANDEM_SERVICE_SHM_SEGMENT_H
#define TANDEM_SERVICE_SHM_SEGMENT_H

#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TDM_SHM_NONCE 32
#define TDM_SHM_HEADER 4096

typedef struct tdm_shm {
    char name[64];
    bool linked; /* the name is still in /dev/shm (the creator's to unlink) */
    uint8_t nonce[TDM_SHM_NONCE];
    void *map; /* the whole segment; NULL: none */
    size_t map_len;
    uint8_t *body; /* map + TDM_SHM_HEADER */
    uint64_t body_bytes;
} tdm_shm;

/* A new segment of body_bytes after the header, named with `prefix`, its
 * header written (magic: 8 bytes) with a fresh nonce. UNAVAILABLE naming
 * /dev/shm and the system's error when it cannot be made. */
tdm_status tdm_shm_create(const char *prefix, const char magic[8], uint64_t body_bytes,
                          tdm_shm *out, tdm_error *err);

/* Opens and maps the segment an offer names (`what` names the offer's
 * message in errors, e.g. "FeatureShmOffer"), checking that the name has the
 * form above, that the nonce has TDM_SHM_NONCE bytes, that the segment holds
 * the header plus body_bytes, and that the header's magic, size and nonce
 * are the offer's. writable: mapped read-write, else read-only. The name is
 * not unlinked (the creator does it). NOT_FOUND: no such segment on this
 * host (as from another host). */
tdm_status tdm_shm_open(const char *what, const char *prefix, const char magic[8], const char *name,
                        const uint8_t *nonce, size_t nonce_len, uint64_t body_bytes, bool writable,
                        tdm_shm *out, tdm_error *err);

/* Removes the name from /dev/shm (the mappings stay); idempotent. */
void tdm_shm_unlink(tdm_shm *s);
/* Unmaps (and unlinks, where linked); leaves *s empty. */
void tdm_shm_close(tdm_shm *s);

#endif
