/*
 * move.h - moving a running request's state from one verifier to another:
 * ExportSnapshot with detach on the verifier it leaves, piped chunk by chunk
 * into ImportSnapshot on the one it goes to (the gateway never holds the
 * whole snapshot). The request's Run on the first verifier then ends with
 * ABORTED, after every token up to the snapshot's position, and a Run with
 * the returned snapshot_id continues it on the second.
 *
 * Threading: called from a Generate handler's thread; blocks for the
 * transfer. Channels and options are borrowed.
 */
#ifndef TANDEM_GATEWAY_MOVE_H
#define TANDEM_GATEWAY_MOVE_H

#include "rpc.h"
#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_move_result {
    bool detached;         /* the first verifier let go of the request (a chunk came) */
    char snapshot_id[128]; /* on success: what the second verifier keeps it under */
    uint32_t generated;    /* tokens the request had generated at the snapshot */
    uint64_t bytes;        /* payload bytes moved */
    uint32_t chunks;
} gw_move_result;

/* Moves request_id's state from `from` to `to`. On failure `out->detached`
 * says whether the request still runs on `from` (false: nothing happened
 * there; true: its state is lost and it must be rebuilt from its tokens). */
tdm_status gw_move_snapshot(tdm_rpc_channel *from, tdm_rpc_channel *to,
                            const tdm_rpc_call_options *co, const char *request_id,
                            gw_move_result *out, tdm_error *err);

#endif
