/*
 * rpc_internal.h - pieces shared by rpc.c, rpc_server.c and rpc_client.c.
 * Not part of the public API (tdm_rpc__ prefix).
 */
#ifndef TANDEM_COMMON_RPC_INTERNAL_H
#define TANDEM_COMMON_RPC_INTERNAL_H

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "rpc.h"

/* grpc_init with tandem's process-wide settings (pair with grpc_shutdown). */
void tdm_rpc__init(void);

/* Reads a whole file into a NUL-terminated malloc'ed string (caller frees). */
tdm_status tdm_rpc__read_file(const char *what, const char *path, char **out, tdm_error *err);

/* Serialises a message into a new byte buffer (caller destroys). */
grpc_byte_buffer *tdm_rpc__pack(const ProtobufCMessage *msg);
grpc_byte_buffer *tdm_rpc__pack_raw(const void *data, size_t len);

/* Decodes a byte buffer with tdm_rpc_unpack. NULL when the bytes are not a
 * valid `desc`; err (optional) then says why. */
ProtobufCMessage *tdm_rpc__unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *buf,
                                  tdm_error *err);

/* Copies a byte buffer's bytes into malloc'ed memory. */
void *tdm_rpc__buffer_bytes(grpc_byte_buffer *buf, size_t *len);

/* Channel/server arguments for the message size limits. `args` must have room
 * for 3 entries; `name_override` (may be NULL) adds the TLS target name. */
void tdm_rpc__size_args(grpc_arg *args, grpc_channel_args *out, int64_t max_bytes,
                        const char *name_override);

/* Absolute deadline for a timeout (infinite when timeout_ms <= 0). */
gpr_timespec tdm_rpc__deadline(int64_t timeout_ms);
/* The deadline of one poll of a completion queue that must not sleep (busy
 * polling, spin.h). Not gpr_now(): the core rounds a deadline up to the next
 * millisecond, so "now" lets epoll_wait sleep for up to 1 ms, and the poller
 * is then woken by the kernel when a message lands (tens to hundreds of
 * microseconds on an idle core). A deadline in the past polls once. */
gpr_timespec tdm_rpc__poll_once(void);

/* The i-th registered method path of a server, NULL past the end. */
const char *tdm_rpc__server_method(const tdm_rpc_server *server, size_t i);

/* The grpc_call of a server call (for deadline/cancel propagation). */
grpc_call *tdm_rpc__server_call_handle(tdm_rpc_call *call);

#endif
