/*
 * rpc.h - tandem's small C API over the gRPC C core (1.51) and protobuf-c.
 *
 * What it owns: gRPC servers (listening port, credentials, completion queues,
 * worker threads, the calls in flight) and client channels and calls. Services
 * see protobuf-c messages, tdm_status codes (equal to gRPC's) and tdm_error
 * messages; they never touch a grpc_call.
 *
 * Server threading. A server runs `workers` threads, each with its own
 * grpc_completion_queue (registered before start) and its own pre-posted
 * grpc_server_request_call()s, so a new call lands on one worker and every
 * completion of that call is processed on the same worker.
 *  - Unary handlers run on the worker thread that received the request: keep
 *    them short (they delay other calls' completions queued on that worker,
 *    and while one runs it can see its deadline pass but not a client's
 *    cancel, which that same worker would deliver).
 *  - Server-streaming and bidirectional handlers each run on a thread of their
 *    own, started for the call and joined by the server. They are written as
 *    plain blocking code (a Generate loop that lasts seconds, a Draft stream
 *    that lasts hours): tdm_rpc_call_write() / tdm_rpc_call_read() block until
 *    the operation completes, which also gives natural flow control. A thread
 *    per stream costs little at tandem's scale (streams are per client request
 *    and per drafter/verifier pair) and keeps handlers free of callbacks.
 *  - Writes may come from any thread (serialised inside), reads from any
 *    thread (serialised inside), and a read and a write may run concurrently.
 *    Every read/write on a call must have returned before its handler returns:
 *    the call is freed after the handler returns. A stream beyond
 *    max_streams is refused with RESOURCE_EXHAUSTED.
 *  - A client's cancel can look like a half-close to tdm_rpc_call_read for
 *    a moment; read waits up to 20 ms for the cancellation before reporting
 *    a half-close, and writes after a cancel return CANCELLED regardless.
 *
 * Client threading. Channels are shared and thread-safe; each call has a
 * private completion queue and blocks only its caller. A stream may be read
 * on one thread while another writes, and cancelled from any thread.
 *
 * Ownership. Request messages handed to handlers belong to the layer (freed
 * after the handler returns). A unary handler's response is packed right after
 * the handler returns; memory for it can come from tdm_rpc_call_alloc() (freed
 * with the call) or be released by a tdm_rpc_call_defer() cleanup. Messages
 * passed to write functions are packed before the function returns (the
 * caller keeps them). Messages returned by read / unary-call functions belong
 * to the caller: free them with protobuf_c_message_free_unpacked(msg, NULL).
 *
 * Errors. A handler's tdm_status and tdm_error message become the gRPC status
 * code and message. A request that does not decode (tdm_rpc_unpack) gets
 * INVALID_ARGUMENT naming the method, the message type and why; an unknown
 * method gets UNIMPLEMENTED.
 *
 * Shutdown. tdm_rpc_server_shutdown() stops accepting calls, lets in-flight
 * calls finish for grace_ms, then cancels the rest (handlers observe
 * tdm_rpc_call_cancelled()), joins all threads and frees everything.
 *
 * Name resolution uses the system resolver (GRPC_DNS_RESOLVER=native unless
 * the environment says otherwise). Health checking lives in health.h, server
 * reflection in reflection.h.
 */
#ifndef TANDEM_COMMON_RPC_H
#define TANDEM_COMMON_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Default for max_message_bytes on servers and channels (64 MiB). */
#define TDM_RPC_DEFAULT_MAX_MESSAGE_BYTES (64 * 1024 * 1024)

/* ---- credentials hook ---------------------------------------------------- */

/* TLS settings, all PEM file paths. Passing NULL (or a tdm_rpc_tls with no
 * cert and no CA) means plaintext. Server: cert+key required; ca is used to
 * verify client certificates; require_client_cert turns on mutual TLS.
 * Client: ca verifies the server (NULL = system roots); cert+key, when both
 * given, are presented as the client certificate; server_name overrides the
 * name checked against the server certificate (e.g. for "127.0.0.1:port"). */
typedef struct tdm_rpc_tls {
    const char *cert_path;
    const char *key_path;
    const char *ca_path;
    bool require_client_cert;
    const char *server_name;
} tdm_rpc_tls;

/* One metadata entry (lowercase key; "-bin" keys are not supported). */
typedef struct tdm_rpc_metadata {
    const char *key;
    const char *value;
} tdm_rpc_metadata;

/* ---- server --------------------------------------------------------------- */

typedef struct tdm_rpc_server tdm_rpc_server;
/* A server-side call, valid while its handler runs. */
typedef struct tdm_rpc_call tdm_rpc_call;

typedef struct tdm_rpc_server_options {
    const char *listen;        /* "host:port"; port 0 picks a free one */
    const tdm_rpc_tls *tls;    /* NULL = plaintext */
    int workers;               /* completion-queue threads; 0 = 2, or 1 when
                                  busy polling (two polling workers contend) */
    int max_streams;           /* streaming calls at once (one thread each);
                                  more get RESOURCE_EXHAUSTED; 0 = 1024 */
    int64_t max_message_bytes; /* send and receive limit; 0 = default */
    const char *name;          /* used in log lines; NULL = "rpc" */
    bool busy_poll;            /* workers and handlers poll for the process's busy-poll
                                  time (common/spin.h, set before the server is
                                  created) before they sleep */
    bool busy_poll_workers;    /* only the workers poll: gRPC polls a process's sockets
                                  from one thread at a time, and a worker asleep in
                                  that role makes another thread's polled call wait
                                  for its wake-up; they poll while any wait of the
                                  process polls (tdm_spin_last_poll_us) */
} tdm_rpc_server_options;

/* Unary: fill *resp (memory from tdm_rpc_call_alloc or static, or free it in a
 * tdm_rpc_call_defer cleanup) and return TDM_OK, or return an error status
 * with err set. Runs on a worker thread. */
typedef tdm_status (*tdm_rpc_unary_fn)(tdm_rpc_call *call, const ProtobufCMessage *req,
                                       ProtobufCMessage **resp, tdm_error *err, void *user);
/* Server-streaming: write responses with tdm_rpc_call_write, return the final
 * status. Runs on its own thread. */
typedef tdm_status (*tdm_rpc_server_stream_fn)(tdm_rpc_call *call, const ProtobufCMessage *req,
                                               tdm_error *err, void *user);
/* Bidirectional: read with tdm_rpc_call_read, write with tdm_rpc_call_write
 * (from any threads), return the final status. Runs on its own thread. */
typedef tdm_status (*tdm_rpc_bidi_fn)(tdm_rpc_call *call, tdm_error *err, void *user);

/* Creates the server and binds its port (not yet serving). *out is owned by
 * the caller: tdm_rpc_server_shutdown() then tdm_rpc_server_destroy(). */
tdm_status tdm_rpc_server_create(const tdm_rpc_server_options *opt, tdm_rpc_server **out,
                                 tdm_error *err);
/* The bound port (the picked one when listen asked for port 0). */
int tdm_rpc_server_port(const tdm_rpc_server *server);

/* Register a method by full path ("/tandem.v1.Gateway/GetStatus") before
 * tdm_rpc_server_start. req_desc decodes the request messages. `path` is
 * copied; `user` is passed to the handler as is. */
tdm_status tdm_rpc_server_add_unary(tdm_rpc_server *server, const char *path,
                                    const ProtobufCMessageDescriptor *req_desc,
                                    tdm_rpc_unary_fn fn, void *user, tdm_error *err);
tdm_status tdm_rpc_server_add_server_stream(tdm_rpc_server *server, const char *path,
                                            const ProtobufCMessageDescriptor *req_desc,
                                            tdm_rpc_server_stream_fn fn, void *user,
                                            tdm_error *err);
tdm_status tdm_rpc_server_add_bidi(tdm_rpc_server *server, const char *path,
                                   const ProtobufCMessageDescriptor *req_desc, tdm_rpc_bidi_fn fn,
                                   void *user, tdm_error *err);

/* Called at the start of tdm_rpc_server_shutdown (before it waits for calls),
 * e.g. to mark health NOT_SERVING and end endless streams. */
void tdm_rpc_server_on_shutdown(tdm_rpc_server *server, void (*fn)(void *arg), void *arg);

/* Starts the worker threads; calls are served from now on. */
tdm_status tdm_rpc_server_start(tdm_rpc_server *server, tdm_error *err);

/* Stops accepting calls, waits up to grace_ms for in-flight calls, cancels the
 * rest, waits for every handler to return and joins all threads. Safe to call
 * once; tdm_rpc_server_destroy calls it (grace 0) if it was not called. */
void tdm_rpc_server_shutdown(tdm_rpc_server *server, int grace_ms);
void tdm_rpc_server_destroy(tdm_rpc_server *server);

/* Installs SIGTERM/SIGINT handlers (process-wide) and blocks until one of
 * them arrives; returns the signal number. Typical main:
 *   tdm_rpc_server_start(s); tdm_rpc_wait_for_signal();
 *   tdm_rpc_server_shutdown(s, 5000); tdm_rpc_server_destroy(s); return 0; */
int tdm_rpc_wait_for_signal(void);
/* Installs the handlers without waiting (call early in main so that a signal
 * arriving before tdm_rpc_wait_for_signal is not lost). */
void tdm_rpc_signals_install(void);

/* ---- server-side call ------------------------------------------------------ */

const char *tdm_rpc_call_method(const tdm_rpc_call *call);
/* Value of request metadata `key` (lowercase), or NULL. Owned by the call. */
const char *tdm_rpc_call_metadata(const tdm_rpc_call *call, const char *key);
/* The peer's address as gRPC gives it ("ipv4:127.0.0.1:5000",
 * "ipv6:[::1]:5000", "unix:..."), owned by the call. */
const char *tdm_rpc_call_peer(const tdm_rpc_call *call);
/* Whether the peer connects from this host (loopback or a unix socket). */
bool tdm_rpc_call_peer_is_local(const tdm_rpc_call *call);
/* The values of one property of the peer's verified TLS identity, e.g.
 * "peer_uri" (URI SANs), "x509_subject", "x509_common_name"
 * (grpc_security_constants.h), each followed by '\n', in out (truncated to
 * len); returns how many there were. 0 on a plaintext call or an
 * unauthenticated peer. */
size_t tdm_rpc_call_peer_property(const tdm_rpc_call *call, const char *name, char *out,
                                  size_t len);
/* Milliseconds until the client's deadline (INT64_MAX when none; <= 0 when
 * passed). */
int64_t tdm_rpc_call_deadline_ms(const tdm_rpc_call *call);
/* True once the client cancelled, the deadline passed, or the server cancels
 * calls at the end of its shutdown grace. */
bool tdm_rpc_call_cancelled(const tdm_rpc_call *call);
/* Calls fn(arg) once when the call becomes cancelled (immediately if it is
 * already), from a gRPC worker thread: it must only signal (e.g. broadcast a
 * condition variable) and must not call this function. Replaces an earlier
 * notification; fn NULL clears it. When this returns, an earlier
 * notification is not running and will not run, so its arg may be freed. */
void tdm_rpc_call_set_cancel_notify(tdm_rpc_call *call, void (*fn)(void *arg), void *arg);

/* Ends a streaming call from the server's side with `code` and `msg`, from
 * any thread: the client sees that status, and the handler's pending and
 * later reads and writes fail, so it returns (its own status is then not
 * sent). For ending endless streams when a process drains. */
void tdm_rpc_call_abort(tdm_rpc_call *call, tdm_status code, const char *msg);

/* Sends one message (streaming handlers only); blocks until it is handed to
 * the transport. Returns CANCELLED / DEADLINE_EXCEEDED once the call ended. */
tdm_status tdm_rpc_call_write(tdm_rpc_call *call, const ProtobufCMessage *msg, tdm_error *err);
/* Receives one message (bidi handlers only). TDM_OK with *msg set (caller
 * frees), or TDM_OK with *msg NULL when the client half-closed; CANCELLED /
 * DEADLINE_EXCEEDED when the call ended; INVALID_ARGUMENT when the bytes do not
 * decode (naming method and type). */
tdm_status tdm_rpc_call_read(tdm_rpc_call *call, ProtobufCMessage **msg, tdm_error *err);

/* Memory that lives as long as the call (zeroed). Thread-safe. */
void *tdm_rpc_call_alloc(tdm_rpc_call *call, size_t size);
char *tdm_rpc_call_strdup(tdm_rpc_call *call, const char *s);
/* Runs fn(arg) when the call is freed (after the response was packed). */
void tdm_rpc_call_defer(tdm_rpc_call *call, void (*fn)(void *arg), void *arg);

/* ---- client --------------------------------------------------------------- */

typedef struct tdm_rpc_channel tdm_rpc_channel;

typedef struct tdm_rpc_channel_options {
    const char *target;        /* "host:port" */
    const tdm_rpc_tls *tls;    /* NULL = plaintext */
    int64_t max_message_bytes; /* send and receive limit; 0 = default */
} tdm_rpc_channel_options;

/* Per-call options; NULL means no deadline and no metadata. */
typedef struct tdm_rpc_call_options {
    int64_t timeout_ms; /* <= 0: no deadline */
    const tdm_rpc_metadata *metadata;
    size_t n_metadata;
    /* A server call this call is made on behalf of: its deadline and
     * cancellation propagate to this call (gateway -> verifier). */
    tdm_rpc_call *parent;
    /* Wait (until the deadline) for the server to become reachable instead
     * of failing at once with UNAVAILABLE (e.g. registering with a gateway
     * that is still starting). */
    bool wait_for_ready;
} tdm_rpc_call_options;

/* Channels connect lazily and are thread-safe: share one per target. */
tdm_status tdm_rpc_channel_create(const tdm_rpc_channel_options *opt, tdm_rpc_channel **out,
                                  tdm_error *err);
void tdm_rpc_channel_destroy(tdm_rpc_channel *ch);

/* Unary call. On TDM_OK *resp is set (caller frees with
 * protobuf_c_message_free_unpacked(*resp, NULL)); otherwise err carries the
 * server's (or the transport's) status and message. */
tdm_status tdm_rpc_unary(tdm_rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                         const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                         const tdm_rpc_call_options *opt, tdm_error *err);

/* Unary call with raw bytes both ways (tests, tools). *resp and *resp_len are
 * malloc'ed (caller frees) on TDM_OK. */
tdm_status tdm_rpc_unary_raw(tdm_rpc_channel *ch, const char *method, const void *req,
                             size_t req_len, void **resp, size_t *resp_len,
                             const tdm_rpc_call_options *opt, tdm_error *err);

/* A client-side streaming call (server-streaming or bidi). */
typedef struct tdm_rpc_stream tdm_rpc_stream;

/* Opens a call. With req != NULL it is a server-streaming call: req is sent
 * and the sending side closed. With req == NULL it is a bidi call: write,
 * then tdm_rpc_stream_close_send. resp_desc decodes the responses. */
tdm_status tdm_rpc_stream_open(tdm_rpc_channel *ch, const char *method,
                               const ProtobufCMessage *req,
                               const ProtobufCMessageDescriptor *resp_desc,
                               const tdm_rpc_call_options *opt, tdm_rpc_stream **out,
                               tdm_error *err);
/* Sends one message (one writer at a time; concurrent with reads). If the
 * call already ended, returns its final status (or FAILED_PRECONDITION when
 * the server finished with OK). */
tdm_status tdm_rpc_stream_write(tdm_rpc_stream *s, const ProtobufCMessage *msg, tdm_error *err);
/* Raw bytes variant (tests). */
tdm_status tdm_rpc_stream_write_raw(tdm_rpc_stream *s, const void *data, size_t len,
                                    tdm_error *err);
/* Half-closes the sending side. */
tdm_status tdm_rpc_stream_close_send(tdm_rpc_stream *s, tdm_error *err);
/* Receives one message: TDM_OK with *msg set (caller frees); at the end of
 * the stream *msg is NULL and the return value is the call's final status
 * (TDM_OK when the server finished with OK). */
tdm_status tdm_rpc_stream_read(tdm_rpc_stream *s, ProtobufCMessage **msg, tdm_error *err);
/* Cancels the call (thread-safe, any time): pending and later reads/writes
 * return CANCELLED. */
void tdm_rpc_stream_cancel(tdm_rpc_stream *s);
/* Cancels the call if it has not ended, waits for it and frees it. No read or
 * write may be running. */
void tdm_rpc_stream_destroy(tdm_rpc_stream *s);

/* ---- Messages -------------------------------------------------------------- */

/* Decodes len bytes as a `desc` the way every received message is decoded
 * (requests, responses, stream messages): NULL when they are not one, and
 * err (optional) says why, naming the message type. Beyond protobuf-c's own
 * checks it refuses:
 *  - a field number 0 spelt as a multi-byte varint, which protobuf-c keeps
 *    as an unknown field and writes back as bytes it then refuses: a message
 *    returned here packs to bytes that decode again (services copy what
 *    peers send by re-encoding it);
 *  - a string field holding U+0000, which a C string would cut short
 *    without a word (a prompt, a stop string, an id), naming the field.
 * Free the result with protobuf_c_message_free_unpacked(msg, NULL). */
ProtobufCMessage *tdm_rpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                 size_t len, tdm_error *err);

#endif
