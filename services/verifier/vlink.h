/*
 * vlink.h - the verifier's Draft streams: one long-lived bidirectional stream
 * per drafter address, shared by every sequence that drafter serves.
 *
 * Owns: the table of links (address -> link), each link's channel and
 * stream, and one reader thread per link that hands every DraftResponse to
 * the scheduler's deliver callback. A link that fails (its stream ends, a
 * write fails, or it is broken on purpose) leaves the table at once, so the
 * next request to that address opens a fresh stream; the scheduler's broken
 * callback turns speculation off for the sequences that were on it.
 *
 * Locks: the table has its own mutex, never held while a channel is opened,
 * a message is written or a callback runs; links are reference counted (the
 * table, the reader, every sequence on it) and the last reference destroys
 * the stream and channel, which can wait for the call to end, so
 * vlink_unref must not be called under a lock the reader's callbacks take.
 * vlink_send only queues: each link has a writer thread that writes its
 * messages in order, so the scheduler never waits on a drafter's transport
 * (a stalled drafter costs its sequences their draft_timeout, nobody else
 * anything).
 */
#ifndef TANDEM_VERIFIER_VLINK_H
#define TANDEM_VERIFIER_VLINK_H

#include "rpc.h"
#include "status.h"
#include "trust.h"
#include "tandem/v1/drafter.pb-c.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct vlinks vlinks;
typedef struct vlink vlink;

typedef struct vlinks_callbacks {
    /* A message arrived on l; the callee owns msg (protobuf_c_message_free_unpacked). */
    void (*deliver)(void *user, vlink *l, Tandem__V1__DraftResponse *msg);
    /* l broke (why says how); called once, on the reader thread or on the thread
     * whose write failed, before l's sequences are told anything else. */
    void (*broken)(void *user, vlink *l, const char *why);
    void *user;
} vlinks_callbacks;

/* tls: for the Draft streams (NULL = plaintext); trust: the credential they
 * carry (NULL: none); both borrowed, outliving the table. */
vlinks *vlinks_create(const tdm_rpc_tls *tls, const tdm_trust *trust, int64_t max_message_bytes,
                      const vlinks_callbacks *cb);
/* Breaks every link and waits until every reader has exited (their broken
 * callbacks run first). The callbacks' user must still be alive. */
void vlinks_destroy(vlinks *t);

/* The live link to `address`, opened if there is none: a new reference for
 * the caller, or NULL with err set. Opens a channel (reading TLS files), so
 * call it with no lock held. */
vlink *vlinks_get(vlinks *t, const char *address, tdm_error *err);
/* Breaks the live link to `address`, if any (its drafter left the registry
 * or said it is draining). */
void vlinks_break_address(vlinks *t, const char *address, const char *why);
/* Draft streams open now. */
int vlinks_count(vlinks *t);

void vlink_ref(vlink *l);
void vlink_unref(vlink *l); /* NULL is fine; see the lock rule above */
const char *vlink_address(const vlink *l);
/* Whether the link broke; why (optional) gets the reason. */
bool vlink_is_broken(vlink *l, char *why, size_t why_len);
/* Marks l broken, cancels its stream and calls the broken callback (once). */
void vlink_break(vlink *l, const char *why);

/* Queues one message for the writer; false when the link is broken (or
 * breaks now because the drafter stopped reading). */
bool vlink_send(vlink *l, const Tandem__V1__DraftRequest *msg);
bool vlink_send_close(vlink *l, uint64_t sequence_id, const char *reason);

#endif
