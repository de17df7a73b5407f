/*
 * http.h - a small HTTP/1.1 server for the plaintext side ports of a service
 * (Prometheus /metrics today; the gateway's JSON API can be served the same
 * way), over GNU libmicrohttpd.
 *
 * This module owns one libmicrohttpd daemon bound to host:port (port 0 picks
 * a free one; tdm_http_server_port says which) and a table of routes: a
 * method and an exact path, each with a handler. A request whose path no
 * route has is answered 404; a path that has routes, but none for its method,
 * 405 with an Allow header. Request bodies are read whole (at most
 * max_body_bytes; more is answered 413) before the handler runs.
 *
 * Threading: handlers run on the daemon's threads (threads of them; several
 * may run at once) and must be thread-safe. Routes are added before
 * tdm_http_server_start; none may be added after.
 *
 * Ownership: tdm_http_server_create/tdm_http_server_destroy. A handler fills
 * a tdm_http_response whose body it allocated with malloc (or NULL); the
 * server frees it after sending. Everything in a tdm_http_request is borrowed
 * for the duration of the handler call.
 */
#ifndef TANDEM_SERVICE_HTTP_H
#define TANDEM_SERVICE_HTTP_H

#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct tdm_http_server tdm_http_server;
typedef struct tdm_http_request tdm_http_request;

typedef struct tdm_http_options {
    const char *listen;    /* "host:port" or "[v6]:port" (tdm_cfg_parse_address) */
    const char *name;      /* for logs and errors ("tandem-gateway metrics") */
    size_t max_body_bytes; /* largest request body accepted; 0: 1 MiB */
    unsigned threads;      /* handler threads; 0: 2 (ignored with thread_per_connection) */
    /* A thread per connection instead of a pool: handlers and stream readers
     * may block (a request that lasts as long as a generation) without
     * stalling other connections. */
    bool thread_per_connection;
    /* The server's own errors (404, 405, 413) as OpenAI-style JSON error
     * objects instead of plain text. */
    bool json_errors;
    /* Optional: HTTPS with this certificate chain and key (PEM files, read
     * at create). Both or neither. Client certificates are not asked for. */
    const char *tls_cert;
    const char *tls_key;
} tdm_http_options;

/* Produces a streamed body: copies up to max bytes into buf and returns how
 * many (it may block until there are some), 0 at the end of the body, or -1
 * to abort the response. */
typedef ssize_t (*tdm_http_reader)(void *arg, char *buf, size_t max);

typedef struct tdm_http_response {
    int status;               /* 200, 404, ...; 0 means 200 */
    const char *content_type; /* static string, e.g. "text/plain; version=0.0.4" */
    char *body;               /* malloc'd; freed by the server. NULL: empty */
    size_t body_len;
    /* Optional: a body streamed with chunked encoding instead of body (only
     * with thread_per_connection, since the reader blocks). reader_free(arg)
     * runs once when the response is done: sent whole, or the client went
     * away. Both are set together. */
    tdm_http_reader reader;
    void *reader_arg;
    void (*reader_free)(void *arg);
} tdm_http_response;

/* Serves one request. Returns TDM_OK with *resp filled, or an error in err
 * that the server answers with the status that fits the code (400 for
 * INVALID_ARGUMENT, 401/403, 404, 503 for UNAVAILABLE, else 500) and the
 * message as the body. */
typedef tdm_status (*tdm_http_handler)(const tdm_http_request *req, tdm_http_response *resp,
                                       tdm_error *err, void *arg);

/* What a handler may read of its request. */
const char *tdm_http_request_path(const tdm_http_request *req);   /* "/metrics" */
/* A header (case-insensitive name) or query argument; NULL when absent. */
const char *tdm_http_request_header(const tdm_http_request *req, const char *name);
const char *tdm_http_request_query(const tdm_http_request *req, const char *name);
const char *tdm_http_request_body(const tdm_http_request *req, size_t *len);
/* True when the client has closed the connection (it went away before the
 * response), as far as the socket tells without blocking; for a handler that
 * runs long. */
bool tdm_http_request_peer_closed(const tdm_http_request *req);

/* The HTTP status that fits a status code: 400 for INVALID_ARGUMENT,
 * OUT_OF_RANGE and FAILED_PRECONDITION, 401, 403, 404, 429 for
 * RESOURCE_EXHAUSTED, 501, 503 for UNAVAILABLE, 504, else 500. */
int tdm_http_status_of(tdm_status code);

/* An OpenAI-style error object, {"error": {"message", "type", "param",
 * "code"}}, for status (type from it: invalid_request_error, ...); param and
 * code may be NULL. Returns malloc'd JSON (caller frees), its length in *len. */
char *tdm_http_json_error(int status, const char *param, const char *code, const char *msg,
                          size_t *len);

/* Checks the options, parses the address and reads the TLS files; binds
 * nothing yet. */
tdm_status tdm_http_server_create(const tdm_http_options *o, tdm_http_server **out, tdm_error *err);
/* Destroys a server, stopping it first if it runs (handlers in progress end
 * first). NULL is a no-op. */
void tdm_http_server_destroy(tdm_http_server *s);

/* Adds a route: method ("GET", "POST", ...) and exact path. Before start
 * only; a duplicate method and path is an error. */
tdm_status tdm_http_server_route(tdm_http_server *s, const char *method, const char *path,
                                 tdm_http_handler handler, void *arg, tdm_error *err);

/* Binds and starts serving. */
tdm_status tdm_http_server_start(tdm_http_server *s, tdm_error *err);
/* The bound port (after start), or 0. */
int tdm_http_server_port(const tdm_http_server *s);
/* Stops accepting and serving; waits for handlers in progress. */
void tdm_http_server_stop(tdm_http_server *s);

#endif
