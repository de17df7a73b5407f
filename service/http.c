/*
 * http.c - the HTTP side-port server over libmicrohttpd (see http.h).
 */
#include "http.h"
#include "alloc.h"

#include "config.h"
#include "file.h"
#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define MAX_ROUTES 32

typedef struct http_route {
    char method[16];
    char path[256];
    tdm_http_handler handler;
    void *arg;
} http_route;

struct tdm_http_server {
    char name[128];
    char listen[300];
    struct sockaddr_storage addr; /* where to bind (port included) */
    bool v6, v6_any;              /* an IPv6 address; "::" (IPv4 too) */
    size_t max_body;
    unsigned threads;
    bool thread_per_connection, json_errors;
    char *tls_cert, *tls_key; /* PEM text; NULL: plaintext */
    http_route routes[MAX_ROUTES];
    size_t n_routes;
    struct MHD_Daemon *daemon;
    int port;
};

/* One request in progress: its body as it arrives. */
struct tdm_http_request {
    struct MHD_Connection *conn;
    const char *method, *path;
    char *body;
    size_t len, cap;
    bool too_big;
};

bool tdm_http_request_peer_closed(const tdm_http_request *req)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    char c;
    /* 0: an orderly shutdown; data (a pipelined request) is not a close. */
    ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

const char *tdm_http_request_path(const tdm_http_request *req)
{
    return req->path;
}

const char *tdm_http_request_header(const tdm_http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *tdm_http_request_query(const tdm_http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *tdm_http_request_body(const tdm_http_request *req, size_t *len)
{
    if (len)
        *len = req->len;
    return req->body ? req->body : "";
}

/* ---- create / routes ---------------------------------------------------------- */

static bool wildcard(const char *host)
{
    return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0 || strcmp(host, "::") == 0 ||
           host[0] == '\0';
}

/* host:port into a socket address: numeric addresses, wildcards and names
 * (resolved once, the first address wins). */
static tdm_status resolve(tdm_http_server *s, tdm_error *err)
{
    char host[256];
    int port = 0;
    if (tdm_cfg_parse_address(s->listen, host, sizeof(host), &port, err) != TDM_OK)
        return tdm_error_prefix(err, "%s: listen address", s->name);
    memset(&s->addr, 0, sizeof(s->addr));
    if (wildcard(host)) {
        /* "::" listens on every IPv6 and IPv4 address; the others on IPv4. */
        if (strcmp(host, "::") == 0) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&s->addr;
            a->sin6_family = AF_INET6;
            a->sin6_addr = in6addr_any;
            a->sin6_port = htons((uint16_t)port);
            s->v6 = s->v6_any = true;
        } else {
            struct sockaddr_in *a = (struct sockaddr_in *)&s->addr;
            a->sin_family = AF_INET;
            a->sin_addr.s_addr = htonl(INADDR_ANY);
            a->sin_port = htons((uint16_t)port);
        }
        return TDM_OK;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0 || !res)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: cannot resolve the host of listen address '%s': %s", s->name,
                             s->listen, gai_strerror(rc));
    memcpy(&s->addr, res->ai_addr, res->ai_addrlen);
    s->v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return TDM_OK;
}

tdm_status tdm_http_server_create(const tdm_http_options *o, tdm_http_server **out, tdm_error *err)
{
    *out = NULL;
    tdm_http_server *s = tdm_xcalloc(1, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s", o->name ? o->name : "http");
    snprintf(s->listen, sizeof(s->listen), "%s", o->listen ? o->listen : "");
    s->max_body = o->max_body_bytes ? o->max_body_bytes : (size_t)1 << 20;
    s->threads = o->threads ? o->threads : 2;
    s->thread_per_connection = o->thread_per_connection;
    s->json_errors = o->json_errors;
    tdm_status rc = resolve(s, err);
    bool tls = (o->tls_cert && o->tls_cert[0]) || (o->tls_key && o->tls_key[0]);
    if (rc == TDM_OK && tls && !(o->tls_cert && o->tls_cert[0] && o->tls_key && o->tls_key[0]))
        rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                           "%s: TLS needs both a certificate and a key", s->name);
    if (rc == TDM_OK && tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        rc = tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                           "%s: this libmicrohttpd was built without TLS", s->name);
    if (rc == TDM_OK && tls &&
        (rc = tdm_file_read(o->tls_cert, 1 << 20, &s->tls_cert, NULL, err)) != TDM_OK)
        tdm_error_prefix(err, "%s: certificate", s->name);
    if (rc == TDM_OK && tls &&
        (rc = tdm_file_read(o->tls_key, 1 << 20, &s->tls_key, NULL, err)) != TDM_OK)
        tdm_error_prefix(err, "%s: key", s->name);
    if (rc != TDM_OK) {
        tdm_http_server_destroy(s);
        return rc;
    }
    *out = s;
    return TDM_OK;
}

tdm_status tdm_http_server_route(tdm_http_server *s, const char *method, const char *path,
                                 tdm_http_handler handler, void *arg, tdm_error *err)
{
    if (s->daemon)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s: route %s %s added after the server started", s->name, method,
                             path);
    if (strlen(method) >= sizeof(s->routes[0].method) ||
        strlen(path) >= sizeof(s->routes[0].path) || path[0] != '/')
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: route %s %s: a method of at most 15 bytes and a path that "
                             "starts with / (at most 255 bytes)",
                             s->name, method, path);
    for (size_t i = 0; i < s->n_routes; i++)
        if (strcmp(s->routes[i].method, method) == 0 && strcmp(s->routes[i].path, path) == 0)
            return tdm_error_set(err, TDM_ERR_ALREADY_EXISTS, "%s: route %s %s added twice",
                                 s->name, method, path);
    if (s->n_routes == MAX_ROUTES)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "%s: more than %d routes", s->name,
                             MAX_ROUTES);
    http_route *r = &s->routes[s->n_routes++];
    snprintf(r->method, sizeof(r->method), "%s", method);
    snprintf(r->path, sizeof(r->path), "%s", path);
    r->handler = handler;
    r->arg = arg;
    return TDM_OK;
}

/* ---- serving ---------------------------------------------------------------- */

int tdm_http_status_of(tdm_status code)
{
    switch (code) {
    case TDM_ERR_INVALID_ARGUMENT:
    case TDM_ERR_OUT_OF_RANGE:
    case TDM_ERR_FAILED_PRECONDITION:
        return 400;
    case TDM_ERR_UNAUTHENTICATED:
        return 401;
    case TDM_ERR_PERMISSION_DENIED:
        return 403;
    case TDM_ERR_NOT_FOUND:
        return 404;
    case TDM_ERR_RESOURCE_EXHAUSTED:
        return 429;
    case TDM_ERR_UNIMPLEMENTED:
        return 501;
    case TDM_ERR_UNAVAILABLE:
        return 503;
    case TDM_ERR_DEADLINE_EXCEEDED:
        return 504;
    default:
        return 500;
    }
}

static enum MHD_Result send_body(struct MHD_Connection *conn, int status, const char *type,
                                 char *body, size_t len, const char *allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    if (type)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static const char *error_type(int status)
{
    switch (status) {
    case 400:
    case 404:
    case 405:
    case 413:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 429:
        return "rate_limit_error";
    default:
        return "server_error";
    }
}

char *tdm_http_json_error(int status, const char *param, const char *code, const char *msg,
                          size_t *len)
{
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    char *out = tdm_xstrdup(json ? json : "{}"); /* malloc'd, as the server frees it */
    cJSON_free(json);
    *len = strlen(out);
    return out;
}

static enum MHD_Result send_text(const tdm_http_server *s, struct MHD_Connection *conn, int status,
                                 const char *allow, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static enum MHD_Result send_text(const tdm_http_server *s, struct MHD_Connection *conn, int status,
                                 const char *allow, const char *fmt, ...)
{
    char buf[TDM_ERROR_MSG_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof(buf) - 2)
        n = (int)sizeof(buf) - 2;
    if (s->json_errors) {
        buf[n] = '\0';
        size_t len;
        char *body = tdm_http_json_error(status, NULL, NULL, buf, &len);
        return send_body(conn, status, "application/json", body, len, allow);
    }
    buf[n++] = '\n';
    buf[n] = '\0';
    return send_body(conn, status, "text/plain; charset=utf-8", tdm_xstrdup(buf), (size_t)n, allow);
}

/* A streamed body: MHD's content reader over the handler's reader. */
typedef struct http_stream {
    tdm_http_reader reader;
    void *arg;
    void (*free_fn)(void *arg);
} http_stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    http_stream *st = cls;
    ssize_t n = st->reader(st->arg, buf, max);
    if (n == 0)
        return MHD_CONTENT_READER_END_OF_STREAM;
    return n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : n;
}

static void stream_free(void *cls)
{
    http_stream *st = cls;
    st->free_fn(st->arg);
    free(st);
}

static enum MHD_Result send_stream(struct MHD_Connection *conn, const tdm_http_response *resp)
{
    http_stream *st = tdm_xcalloc(1, sizeof(*st));
    st->reader = resp->reader;
    st->arg = resp->reader_arg;
    st->free_fn = resp->reader_free;
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    if (resp->content_type)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, resp->content_type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret =
        MHD_queue_response(conn, (unsigned)(resp->status ? resp->status : 200), r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result dispatch(tdm_http_server *s, tdm_http_request *req)
{
    const http_route *match = NULL;
    char allow[128] = "";
    for (size_t i = 0; i < s->n_routes; i++) {
        const http_route *r = &s->routes[i];
        if (strcmp(r->path, req->path) != 0)
            continue;
        if (strcmp(r->method, req->method) == 0 ||
            (strcmp(req->method, "HEAD") == 0 && strcmp(r->method, "GET") == 0)) {
            match = r;
            break;
        }
        size_t n = strlen(allow);
        snprintf(allow + n, sizeof(allow) - n, "%s%s", n ? ", " : "", r->method);
    }
    if (!match && allow[0])
        return send_text(s, req->conn, 405, allow, "%s %s: method not allowed here (allowed: %s)",
                         req->method, req->path, allow);
    if (!match)
        return send_text(s, req->conn, 404, NULL, "%s: no such path on the %s port", req->path,
                         s->name);
    if (req->too_big)
        return send_text(s, req->conn, 413, NULL, "%s %s: the body is larger than %zu bytes",
                         req->method, req->path, s->max_body);
    tdm_http_response resp = {0};
    tdm_error err = {0};
    tdm_status rc = match->handler(req, &resp, &err, match->arg);
    if (rc != TDM_OK) {
        free(resp.body);
        return send_text(s, req->conn, tdm_http_status_of(rc), NULL, "%s", err.msg);
    }
    if (resp.reader) {
        free(resp.body);
        return send_stream(req->conn, &resp);
    }
    return send_body(req->conn, resp.status ? resp.status : 200, resp.content_type, resp.body,
                     resp.body ? resp.body_len : 0, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    tdm_http_server *s = cls;
    tdm_http_request *req = *con_cls;
    if (!req) {
        /* Headers are in; the body, if any, follows in later calls. */
        req = tdm_xcalloc(1, sizeof(*req));
        req->conn = conn;
        req->method = method;
        req->path = url;
        *con_cls = req;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (req->too_big || req->len + n > s->max_body) {
            req->too_big = true;
            return MHD_YES;
        }
        if (req->len + n + 1 > req->cap) {
            req->cap = (req->len + n + 1) * 2;
            req->body = tdm_xrealloc(req->body, req->cap);
        }
        memcpy(req->body + req->len, upload_data, n);
        req->len += n;
        req->body[req->len] = '\0';
        return MHD_YES;
    }
    return dispatch(s, req);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    tdm_http_request *req = *con_cls;
    if (req) {
        free(req->body);
        free(req);
    }
    *con_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap)
{
    const tdm_http_server *s = cls;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    tdm_log_warn(s->name, "%s", msg);
}

tdm_status tdm_http_server_start(tdm_http_server *s, tdm_error *err)
{
    if (s->daemon)
        return TDM_OK;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    bool pool = s->threads > 1 && !s->thread_per_connection;
    if (s->thread_per_connection)
        flags |= MHD_USE_THREAD_PER_CONNECTION;
    if (s->tls_cert)
        flags |= MHD_USE_TLS;
    if (s->v6)
        flags |= s->v6_any ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
    /* libmicrohttpd takes the port from the socket address; the one given as
     * an argument is ignored with MHD_OPTION_SOCK_ADDR. */
    /* One thread polls and serves; more make a pool. */
    struct MHD_OptionItem opts[8];
    size_t n = 0;
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, 30, NULL};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, 256, NULL};
    if (pool)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, s->threads, NULL};
    if (s->tls_cert) {
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert};
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key};
    }
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
                                 on_log, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&s->addr,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_ARRAY,
                                 opts, MHD_OPTION_END);
    if (!s->daemon)
        return tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                             "%s: cannot listen on %s (address in use, or not this host's?)",
                             s->name, s->listen);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? (int)info->port : 0;
    return TDM_OK;
}

int tdm_http_server_port(const tdm_http_server *s)
{
    return s && s->daemon ? s->port : 0;
}

void tdm_http_server_stop(tdm_http_server *s)
{
    if (s && s->daemon) {
        MHD_stop_daemon(s->daemon);
        s->daemon = NULL;
    }
}

void tdm_http_server_destroy(tdm_http_server *s)
{
    if (!s)
        return;
    tdm_http_server_stop(s);
    free(s->tls_cert);
    free(s->tls_key);
    free(s);
}
