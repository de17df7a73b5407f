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
 *
 * Colocated feature stream (drafter.proto, feature_shm.h): with
 * feature_transport auto or shm, the first sequence with hidden states on a
 * link creates a shared-memory ring and offers it to the drafter; the reader
 * thread takes the drafter's answer (then unlinks the segment's name: both
 * sides hold it mapped) and the shm_consumed of every response (the ring's
 * space the drafter has read). The ring is freed with the link.
 *
 * Exchange lane (drafter.proto, lane.h): with exchange_transport auto or
 * shm, a link's first message offers a shared-memory lane. The reader takes
 * the drafter's answer: accepted, a lane reader thread reads the drafter's
 * pipe from then on (the drafter writes nothing more on the stream), and
 * the writer, after writing LaneSwitch last on the stream, writes every
 * later message into the lane; refused (another host) or unanswered for
 * 10 s, the messages stay on the stream. The stream stays open either way:
 * its end breaks the link, and a broken link closes its lane.
 */
#ifndef TANDEM_VERIFIER_VLINK_H
#define TANDEM_VERIFIER_VLINK_H

#include "feature_shm.h"
#include "lane.h"
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

/* How the links carry hidden-state rows (feature_transport). */
typedef struct vlinks_feat {
    tdm_feat_transport transport;
    uint64_t shm_bytes;  /* the ring's size (feature_shm_size) */
    const char *setting; /* feature_transport with its source, for messages (copied) */
} vlinks_feat;

/* How the links carry their messages (exchange_transport). */
typedef struct vlinks_lane {
    tdm_lane_transport transport;
    const char *setting; /* exchange_transport with its source, for messages (copied) */
} vlinks_lane;

/* tls: for the Draft streams (NULL = plaintext); trust: the credential they
 * carry (NULL: none); both borrowed, outliving the table. feat, lane: NULL
 * is grpc. */
vlinks *vlinks_create(const tdm_rpc_tls *tls, const tdm_trust *trust, int64_t max_message_bytes,
                      const vlinks_feat *feat, const vlinks_lane *lane, const vlinks_callbacks *cb);
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
/* Draft streams whose feature transport was settled: on shm (the drafter
 * accepted the ring) and on grpc (feature_transport grpc, no segment, the
 * drafter refused or did not answer), since the start. */
void vlinks_feat_counts(vlinks *t, uint64_t *shm, uint64_t *grpc);
/* Draft streams whose exchange settled on the lane (shm) and on the stream
 * (grpc: the setting, no segment, the drafter refused or did not answer),
 * since the start. */
void vlinks_lane_counts(vlinks *t, uint64_t *shm, uint64_t *grpc);

/* Where the verifier's side of the exchange goes, summed over every message
 * since the start: a message's wait in its link's queue until the writer
 * takes it (queue), the writer's gRPC write of it (write), and a drafter's
 * message from its read to the scheduler's having it (deliver). */
typedef struct vlinks_parts {
    double queue_us, write_us, deliver_us;
    uint64_t writes, delivers;
} vlinks_parts;
void vlinks_exchange_parts(vlinks *t, vlinks_parts *out);

void vlink_ref(vlink *l);
void vlink_unref(vlink *l); /* NULL is fine; see the lock rule above */
const char *vlink_address(const vlink *l);
/* Whether the link broke; why (optional) gets the reason. */
bool vlink_is_broken(vlink *l, char *why, size_t why_len);
/* true the first time it is called on l, false after: for what is logged
 * once per link (the GPU its drafter shares with this verifier). */
bool vlink_note_once(vlink *l);
/* Marks l broken, cancels its stream and calls the broken callback (once). */
void vlink_break(vlink *l, const char *why);

/* Queues one message for the writer; false when the link is broken (or
 * breaks now because the drafter stopped reading). */
bool vlink_send(vlink *l, const Tandem__V1__DraftRequest *msg);
bool vlink_send_close(vlink *l, uint64_t sequence_id, const char *reason);

/* The ring to put hidden-state rows in, or NULL: they go inline. Call it
 * from the thread that sends l's messages (the scheduler's), before the
 * message that carries the rows. Its first call on a link (feature_transport
 * auto or shm) creates the segment and queues the offer; rows go inline
 * until the drafter accepts. With shm set explicitly, a segment that cannot
 * be made, or a drafter that refuses it, breaks the link with an error
 * naming the setting (its sequences go on without speculation). */
tdm_feat_ring *vlink_feat_ring(vlink *l);
/* The link's feature transport for logs and status: "shm", "grpc",
 * "grpc (why)", "shm offered". */
void vlink_feat_state(vlink *l, char *buf, size_t len);

#endif
