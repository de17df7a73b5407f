/*
 * lane.h - the exchange lane: a Draft stream's messages between a verifier
 * and a colocated drafter through two shared-memory pipes, one each way,
 * instead of gRPC (drafter.proto, LaneOffer; exchange_transport).
 *
 * A round's verdict and block cross the lane as a copy into the segment and
 * a poll that sees it: no socket, no gRPC completion queue, no thread of
 * gRPC's in between. The segment (shm_segment.h) is named TDM_LANE_PREFIX,
 * the verifier's process id, '-', 128 random bits; after its header page
 * come the two pipes' counters (a page), then the verifier-to-drafter pipe,
 * then the drafter-to-verifier pipe, TDM_LANE_PIPE_BYTES each.
 *
 * A pipe is a byte stream: the writer's count of bytes written (head) and
 * the reader's count of bytes read (tail), each side keeping its own count
 * in its own memory and only publishing it (a peer that scribbles on the
 * counters cannot make a side read or write outside the pipe: what it reads
 * of the peer's count is checked). A message is framed as its length, the
 * length xor TDM_LANE_FRAME_KEY (both 32 bits, little-endian), its bytes and
 * padding to 8; one longer than the pipe streams through it in pieces.
 *
 * Waits: a side that finds nothing to read (or no room) polls the peer's
 * count for the process's busy-poll time (spin.h), then sleeps on a futex
 * word in the segment that the peer bumps (and wakes) after moving its
 * count; it also wakes every 100 ms and when tdm_lane_close is called.
 *
 * Threads: one sender and one receiver per side; tdm_lane_close from any
 * thread (senders and receivers then return UNAVAILABLE).
 */
#ifndef TANDEM_SERVICE_LANE_H
#define TANDEM_SERVICE_LANE_H

#include "shm_segment.h"
#include "status.h"
#include "tandem/v1/drafter.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TDM_LANE_PREFIX "/tandem-lane-"
#define TDM_LANE_PIPE_BYTES ((uint64_t)1 << 20)
#define TDM_LANE_FRAME_KEY 0x314e4c54u

/* The values of exchange_transport. */
typedef enum {
    TDM_LANE_TRANSPORT_AUTO = 0, /* the lane when the handshake proves colocation, else grpc */
    TDM_LANE_TRANSPORT_GRPC,     /* every message on the Draft stream */
    TDM_LANE_TRANSPORT_SHM,      /* the lane, or no speculation on that stream */
} tdm_lane_transport;

#define TDM_LANE_TRANSPORTS "auto|grpc|shm"
tdm_lane_transport tdm_lane_transport_parse(const char *s); /* unknown: AUTO */

typedef struct tdm_lane tdm_lane;

/* The verifier's side: a new segment (UNAVAILABLE naming /dev/shm when it
 * cannot be made). */
tdm_status tdm_lane_create(tdm_lane **out, tdm_error *err);
/* The drafter's side: maps the segment an offer names, read-write, after
 * the checks of tdm_shm_open (name, nonce, size, magic); NOT_FOUND: no such
 * segment on this host. */
tdm_status tdm_lane_open(const Tandem__V1__LaneOffer *offer, tdm_lane **out, tdm_error *err);
/* Unmaps; NULL is fine. No sender or receiver may still be in the lane. */
void tdm_lane_destroy(tdm_lane *l);

/* The segment's name. */
const char *tdm_lane_name(const tdm_lane *l);
/* The offer of a created lane (pointers into l). */
void tdm_lane_offer(tdm_lane *l, Tandem__V1__LaneOffer *out);
/* Removes the name from /dev/shm (both sides hold it mapped); idempotent. */
void tdm_lane_unlink(tdm_lane *l);

/* Writes one message (len bytes) into this side's outgoing pipe, waiting
 * for room as the peer reads. UNAVAILABLE once closed; INTERNAL when the
 * peer's count is out of the pipe (a corrupt or hostile peer). */
tdm_status tdm_lane_send(tdm_lane *l, const uint8_t *data, size_t len, tdm_error *err);
/* Reads the next message of the incoming pipe into *data (malloc'd, the
 * caller frees; *len its bytes), waiting for it. UNAVAILABLE once closed;
 * INVALID_ARGUMENT for a frame that is corrupt or longer than max_len, and
 * INTERNAL when the peer's count is out of the pipe: the lane cannot be read
 * any further then. */
tdm_status tdm_lane_recv(tdm_lane *l, size_t max_len, uint8_t **data, size_t *len, tdm_error *err);
/* The next message, decoded as `desc` (a DraftRequest or a DraftResponse):
 * tdm_lane_recv's statuses, with max_len <= 0 the gRPC layer's default
 * limit; TDM_OK with *msg NULL when its bytes do not decode (the lane goes
 * on: the frames are intact). */
tdm_status tdm_lane_recv_msg(tdm_lane *l, int64_t max_len, const ProtobufCMessageDescriptor *desc,
                             ProtobufCMessage **msg, tdm_error *err);
/* Ends this side's use: waits in progress and to come return UNAVAILABLE. */
void tdm_lane_close(tdm_lane *l);

#endif
