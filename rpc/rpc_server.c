/*
 * rpc_server.c - the server half of the gRPC layer (see rpc.h for the
 * threading model).
 *
 * Every completion-queue tag is an rpc_op whose done() runs on the worker
 * thread that polls the queue. A call's state lives in one tdm_rpc_call,
 * reference-counted by its outstanding async operations and its handler
 * thread; the last reference frees it. Blocking operations of streaming
 * handlers start a batch and sleep on the call's condition variable until the
 * worker reports the completion.
 */
#include <errno.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "alloc.h"
#include "rpc_internal.h"
#include "spin.h"

#include <grpc/grpc_security.h>

#define REQUESTS_PER_WORKER 8
#define DEFAULT_WORKERS 2
#define DEFAULT_MAX_STREAMS 1024

#define CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

typedef struct rpc_op {
    void (*done)(struct rpc_op *op, bool ok);
} rpc_op;

typedef enum method_kind { KIND_UNARY, KIND_SERVER_STREAM, KIND_BIDI } method_kind;

typedef struct rpc_method {
    char *path;
    method_kind kind;
    const ProtobufCMessageDescriptor *desc;
    tdm_rpc_unary_fn unary;
    tdm_rpc_server_stream_fn server_stream;
    tdm_rpc_bidi_fn bidi;
    void *user;
} rpc_method;

typedef struct rpc_worker {
    tdm_rpc_server *server;
    grpc_completion_queue *cq;
    pthread_t thread;
    bool running;
} rpc_worker;

/* One pre-posted grpc_server_request_call. */
typedef struct rpc_request {
    rpc_op op;
    rpc_worker *worker;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
} rpc_request;

typedef struct rpc_hook {
    void (*fn)(void *arg);
    void *arg;
} rpc_hook;

struct tdm_rpc_server {
    char *name;
    grpc_server *srv;
    int port;
    rpc_worker *workers; /* (n_workers) */
    int n_workers;
    int max_streams;
    bool busy_poll;         /* options.busy_poll */
    bool busy_poll_workers; /* options.busy_poll or busy_poll_workers */
    rpc_method *methods; /* (n_methods) */
    size_t n_methods;
    rpc_hook *hooks; /* (n_hooks) */
    size_t n_hooks;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    int live_calls;       /* tdm_rpc_call objects not yet freed */
    int live_threads;     /* handler threads not yet finished */
    pthread_t *finished;  /* (n_finished) handler threads to join */
    size_t n_finished, cap_finished;
    bool started;
    bool shutting_down;
    bool force_cancelled; /* grace ran out */
    bool shutdown_done;   /* grpc_server_shutdown_and_notify's tag arrived */
    bool stopped;         /* tdm_rpc_server_shutdown completed */
    time_t warn_second;   /* rate limit of warnings about bad input */
    int warn_dropped;
    rpc_op shutdown_op;
};

typedef struct arena_block {
    struct arena_block *next;
    max_align_t data[];
} arena_block;

typedef struct defer_entry {
    struct defer_entry *next;
    void (*fn)(void *arg);
    void *arg;
} defer_entry;

struct tdm_rpc_call {
    tdm_rpc_server *server;
    rpc_worker *worker;
    const rpc_method *method; /* NULL for an unknown method */
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    char *path; /* NUL-terminated copy of details.method */

    pthread_mutex_t mu; /* guards the fields below and batch starts */
    pthread_cond_t cv;
    int refs;
    bool closed;            /* RECV_CLOSE_ON_SERVER completed */
    atomic_bool cancelled;  /* ... with cancelled=1 */
    int close_cancelled;    /* written by the core */
    void (*notify_fn)(void *arg);
    void *notify_arg;
    int notifying; /* cancel notifications running now (under mu) */

    rpc_op close_op;
    rpc_op recv_op;
    grpc_byte_buffer *recv_buf;
    bool recv_done, recv_ok;
    pthread_mutex_t read_mu; /* one reader at a time */

    rpc_op send_op;
    bool send_done, send_ok;
    pthread_mutex_t write_mu; /* one writer at a time */

    rpc_op status_op;
    bool status_started;
    grpc_slice status_details;

    ProtobufCMessage *req; /* decoded request (unary, server-streaming) */

    pthread_mutex_t arena_mu;
    arena_block *arena;
    defer_entry *defers;
};

static struct timespec abs_time_ms(int64_t ms);
static void warn_limited(tdm_rpc_server *s, const char *msg);

static const char *comp(const tdm_rpc_server *s)
{
    return s->name;
}

/* ---- call lifetime ---------------------------------------------------------- */

static void call_free(tdm_rpc_call *c)
{
    for (defer_entry *d = c->defers; d;) {
        defer_entry *next = d->next;
        d->fn(d->arg);
        free(d);
        d = next;
    }
    if (c->req)
        protobuf_c_message_free_unpacked(c->req, NULL);
    if (c->recv_buf)
        grpc_byte_buffer_destroy(c->recv_buf);
    if (c->call)
        grpc_call_unref(c->call);
    grpc_slice_unref(c->status_details);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    for (arena_block *b = c->arena; b;) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(c->path);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->read_mu);
    pthread_mutex_destroy(&c->write_mu);
    pthread_mutex_destroy(&c->arena_mu);
    tdm_rpc_server *s = c->server;
    free(c);
    pthread_mutex_lock(&s->mu);
    s->live_calls--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void call_ref(tdm_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
}

static void call_unref(tdm_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left == 0)
        call_free(c);
}

/* Starts a batch whose completion holds a reference on the call. */
static bool call_start(tdm_rpc_call *c, const grpc_op *ops, size_t n, rpc_op *tag)
{
    pthread_mutex_lock(&c->mu);
    c->refs++;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK)
        c->refs--;
    pthread_mutex_unlock(&c->mu);
    if (e != GRPC_CALL_OK) {
        tdm_log_error(comp(c->server), "%s: grpc_call_start_batch failed (%d)", c->path, (int)e);
        return false;
    }
    return true;
}

static void on_status_sent(rpc_op *op, bool ok)
{
    (void)ok;
    call_unref(CONTAINER_OF(op, tdm_rpc_call, status_op));
}

/* Sends the final status, optionally with one last message (unary). Waits for
 * an in-flight write first: only one SEND_MESSAGE may be outstanding and the
 * status must come after it. */
static void call_send_status(tdm_rpc_call *c, tdm_status code, const char *msg,
                             grpc_byte_buffer *resp)
{
    pthread_mutex_lock(&c->write_mu);
    pthread_mutex_lock(&c->mu);
    bool already = c->status_started;
    c->status_started = true;
    pthread_mutex_unlock(&c->mu);
    if (already) {
        pthread_mutex_unlock(&c->write_mu);
        if (resp)
            grpc_byte_buffer_destroy(resp);
        return;
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    if (resp) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = resp;
        n++;
    }
    grpc_slice_unref(c->status_details);
    c->status_details = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n].data.send_status_from_server.status_details = code == TDM_OK ? NULL : &c->status_details;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    n++;
    call_start(c, ops, n, &c->status_op);
    pthread_mutex_unlock(&c->write_mu);
    if (resp)
        grpc_byte_buffer_destroy(resp); /* the batch holds its own reference */
}

static void on_close(rpc_op *op, bool ok)
{
    (void)ok;
    tdm_rpc_call *c = CONTAINER_OF(op, tdm_rpc_call, close_op);
    pthread_mutex_lock(&c->mu);
    c->closed = true;
    if (c->close_cancelled)
        atomic_store(&c->cancelled, true);
    void (*fn)(void *) = c->close_cancelled ? c->notify_fn : NULL;
    void *arg = c->notify_arg;
    if (fn)
        c->notifying++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (fn) {
        fn(arg);
        /* tdm_rpc_call_set_cancel_notify waits for this: once it returns,
         * the handler may free what arg points to. */
        pthread_mutex_lock(&c->mu);
        c->notifying--;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    call_unref(c);
}

/* ---- handler threads ----------------------------------------------------------- */

static void status_from_handler(tdm_rpc_call *c, tdm_status st, tdm_error *err)
{
    if (st == TDM_OK) {
        call_send_status(c, TDM_OK, NULL, NULL);
        return;
    }
    if ((int)st < 0 || (int)st > TDM_ERR_UNAUTHENTICATED)
        st = TDM_ERR_UNKNOWN;
    const char *msg = err->msg[0] ? err->msg : tdm_status_name(st);
    call_send_status(c, st, msg, NULL);
}

static void *handler_thread(void *arg)
{
    tdm_rpc_call *c = arg;
    tdm_rpc_server *s = c->server;
    tdm_error err;
    tdm_error_clear(&err);
    tdm_status st;
    if (c->method->kind == KIND_BIDI)
        st = c->method->bidi(c, &err, c->method->user);
    else
        st = c->method->server_stream(c, c->req, &err, c->method->user);
    status_from_handler(c, st, &err);
    pthread_mutex_lock(&c->mu);
    c->notify_fn = NULL;
    pthread_mutex_unlock(&c->mu);
    pthread_t self = pthread_self();
    call_unref(c);

    pthread_mutex_lock(&s->mu);
    if (s->n_finished == s->cap_finished) {
        size_t cap = s->cap_finished ? s->cap_finished * 2 : 16;
        pthread_t *nf = tdm_xrealloc(s->finished, cap * sizeof(*nf));
        s->finished = nf;
        s->cap_finished = cap;
    }
    s->finished[s->n_finished++] = self;
    s->live_threads--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Joins handler threads that have finished (they are at most returning). */
static void join_finished(tdm_rpc_server *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->n_finished;
    pthread_t *list = s->finished;
    s->finished = NULL;
    s->n_finished = s->cap_finished = 0;
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++)
        pthread_join(list[i], NULL);
    free(list);
}

static void spawn_handler(tdm_rpc_call *c)
{
    tdm_rpc_server *s = c->server;
    join_finished(s);
    pthread_mutex_lock(&s->mu);
    bool full = s->live_threads >= s->max_streams;
    if (!full)
        s->live_threads++;
    pthread_mutex_unlock(&s->mu);
    if (full) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s: too many concurrent streams (max_streams %d)", c->path,
                 s->max_streams);
        tdm_log_warn(comp(s), "%s", msg);
        call_send_status(c, TDM_ERR_RESOURCE_EXHAUSTED, msg, NULL);
        return;
    }
    call_ref(c); /* the thread's reference */
    pthread_t t;
    int rc = pthread_create(&t, NULL, handler_thread, c);
    if (rc != 0) {
        pthread_mutex_lock(&s->mu);
        s->live_threads--;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        call_send_status(c, TDM_ERR_RESOURCE_EXHAUSTED, "cannot start a thread for the call",
                         NULL);
        call_unref(c);
    }
}

/* ---- request arrival --------------------------------------------------------------- */

static void run_unary(tdm_rpc_call *c)
{
    tdm_error err;
    tdm_error_clear(&err);
    ProtobufCMessage *resp = NULL;
    tdm_status st = c->method->unary(c, c->req, &resp, &err, c->method->user);
    if (st != TDM_OK) {
        status_from_handler(c, st, &err);
        return;
    }
    if (!resp) {
        call_send_status(c, TDM_ERR_INTERNAL, "handler returned no response", NULL);
        return;
    }
    call_send_status(c, TDM_OK, NULL, tdm_rpc__pack(resp));
}

static void on_request_message(rpc_op *op, bool ok)
{
    tdm_rpc_call *c = CONTAINER_OF(op, tdm_rpc_call, recv_op);
    grpc_byte_buffer *buf = c->recv_buf;
    c->recv_buf = NULL;
    char msg[512];
    if (!ok || !buf) {
        if (buf)
            grpc_byte_buffer_destroy(buf);
        snprintf(msg, sizeof(msg), "%s: no request message (%s expected)", c->path,
                 c->method->desc->name);
        call_send_status(c, ok ? TDM_ERR_INVALID_ARGUMENT : TDM_ERR_CANCELLED, msg, NULL);
        call_unref(c);
        return;
    }
    tdm_error uerr;
    c->req = tdm_rpc__unpack(c->method->desc, buf, &uerr);
    grpc_byte_buffer_destroy(buf);
    if (!c->req) {
        snprintf(msg, sizeof(msg), "%s: request %s", c->path, uerr.msg);
        warn_limited(c->server, msg);
        call_send_status(c, TDM_ERR_INVALID_ARGUMENT, msg, NULL);
        call_unref(c);
        return;
    }
    if (c->method->kind == KIND_UNARY)
        run_unary(c);
    else
        spawn_handler(c);
    call_unref(c);
}

static void post_request(rpc_worker *w);

/* Bad input from clients is logged at most once a second per server, so a
 * misbehaving client cannot flood the log; the client gets every error. */
static void warn_limited(tdm_rpc_server *s, const char *msg)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&s->mu);
    bool log = now.tv_sec != s->warn_second;
    int dropped = s->warn_dropped;
    if (log) {
        s->warn_second = now.tv_sec;
        s->warn_dropped = 0;
    } else {
        s->warn_dropped++;
    }
    pthread_mutex_unlock(&s->mu);
    if (log && dropped)
        tdm_log_warn(comp(s), "%s (and %d similar in the last second)", msg, dropped);
    else if (log)
        tdm_log_warn(comp(s), "%s", msg);
}
static void on_sync_send(rpc_op *op, bool ok);
static void on_sync_recv(rpc_op *op, bool ok);
static void on_shutdown_done(rpc_op *op, bool ok);

static const rpc_method *find_method(const tdm_rpc_server *s, const char *path)
{
    for (size_t i = 0; i < s->n_methods; i++)
        if (strcmp(s->methods[i].path, path) == 0)
            return &s->methods[i];
    return NULL;
}

static void on_new_call(rpc_op *op, bool ok)
{
    rpc_request *r = CONTAINER_OF(op, rpc_request, op);
    rpc_worker *w = r->worker;
    tdm_rpc_server *s = w->server;
    if (!ok) {
        /* The server is shutting down: the request was never matched. */
        grpc_call_details_destroy(&r->details);
        grpc_metadata_array_destroy(&r->md);
        free(r);
        return;
    }
    post_request(w);

    tdm_rpc_call *c = tdm_xcalloc(1, sizeof(*c));
    c->server = s;
    c->worker = w;
    c->call = r->call;
    c->details = r->details;
    c->md = r->md;
    free(r);
    size_t plen = GRPC_SLICE_LENGTH(c->details.method);
    c->path = tdm_xmalloc(plen + 1);
    memcpy(c->path, GRPC_SLICE_START_PTR(c->details.method), plen);
    c->path[plen] = '\0';
    c->status_details = grpc_empty_slice();
    c->refs = 1; /* released at the end of this function */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_init(&c->read_mu, NULL);
    pthread_mutex_init(&c->write_mu, NULL);
    pthread_mutex_init(&c->arena_mu, NULL);
    atomic_init(&c->cancelled, false);
    /* Tags' callbacks are set once, before any batch: the worker reads them
     * when completions arrive. */
    c->close_op.done = on_close;
    c->status_op.done = on_status_sent;
    c->send_op.done = on_sync_send;
    pthread_mutex_lock(&s->mu);
    s->live_calls++;
    pthread_mutex_unlock(&s->mu);

    /* Initial metadata and close notification go first and together (gRFC
     * L104: RECV_CLOSE_ON_SERVER must not share a batch with the status). */
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[1].data.recv_close_on_server.cancelled = &c->close_cancelled;
    call_start(c, ops, 2, &c->close_op);

    c->method = find_method(s, c->path);
    c->recv_op.done = c->method && c->method->kind == KIND_BIDI ? on_sync_recv : on_request_message;
    if (!c->method) {
        char msg[512];
        snprintf(msg, sizeof(msg), "unknown method %s", c->path);
        call_send_status(c, TDM_ERR_UNIMPLEMENTED, msg, NULL);
    } else if (c->method->kind == KIND_BIDI) {
        spawn_handler(c);
    } else {
        grpc_op rop;
        memset(&rop, 0, sizeof(rop));
        rop.op = GRPC_OP_RECV_MESSAGE;
        rop.data.recv_message.recv_message = &c->recv_buf;
        call_start(c, &rop, 1, &c->recv_op);
    }
    call_unref(c);
}

static void post_request(rpc_worker *w)
{
    tdm_rpc_server *s = w->server;
    pthread_mutex_lock(&s->mu);
    bool stop = s->shutting_down;
    pthread_mutex_unlock(&s->mu);
    if (stop)
        return;
    rpc_request *r = tdm_xcalloc(1, sizeof(*r));
    r->op.done = on_new_call;
    r->worker = w;
    grpc_call_details_init(&r->details);
    grpc_metadata_array_init(&r->md);
    grpc_call_error e =
        grpc_server_request_call(s->srv, &r->call, &r->details, &r->md, w->cq, w->cq, &r->op);
    if (e != GRPC_CALL_OK) {
        grpc_call_details_destroy(&r->details);
        grpc_metadata_array_destroy(&r->md);
        free(r);
    }
}

static void *worker_main(void *arg)
{
    rpc_worker *w = arg;
    pthread_setname_np(pthread_self(), "rpc-worker"); /* top -H, /proc/<pid>/task */
    int64_t last = 0; /* when the last event came (us) */
    for (;;) {
        /* Busy polling (spin.h): for a while after an event, or after a
         * wait of this process started polling, the queue is polled without
         * sleeping, so the next message is seen at once, and gRPC's one
         * poller of the process is never a worker asleep in epoll while
         * another thread polls for its own call's messages. */
        const int64_t busy = w->server->busy_poll_workers ? tdm_busy_poll_us() : 0;
        const int64_t polled = tdm_spin_last_poll_us();
        const int64_t recent = last > polled ? last : polled;
        const bool hot = busy > 0 && tdm_spin_now_us() - recent < busy;
        /* Not hot, it sleeps; with busy polling set, for 5 ms at a time, so
         * that a wait of the process that starts polling finds it polling
         * soon (a wait cannot wake it). */
        gpr_timespec until = gpr_inf_future(GPR_CLOCK_REALTIME);
        if (hot)
            until = tdm_rpc__poll_once();
        else if (busy > 0)
            until =
                gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(5, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(w->cq, until, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
            continue;
        if (busy > 0)
            last = tdm_spin_now_us();
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            rpc_op *op = ev.tag;
            op->done(op, ev.success != 0);
        }
    }
    return NULL;
}

/* ---- server object --------------------------------------------------------------- */

static grpc_server_credentials *server_credentials(const tdm_rpc_tls *tls, tdm_error *err)
{
    if (!tls || (!tls->cert_path && !tls->key_path && !tls->ca_path))
        return grpc_insecure_server_credentials_create();
    if (!tls->cert_path || !tls->key_path) {
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                      "tls: a server needs both a certificate (cert) and a key (key)");
        return NULL;
    }
    if (tls->require_client_cert && !tls->ca_path) {
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                      "tls: require_client_cert needs a CA file to verify client certificates");
        return NULL;
    }
    char *cert = NULL, *key = NULL, *ca = NULL;
    grpc_server_credentials *creds = NULL;
    if (tdm_rpc__read_file("tls cert", tls->cert_path, &cert, err) != TDM_OK ||
        tdm_rpc__read_file("tls key", tls->key_path, &key, err) != TDM_OK ||
        (tls->ca_path && tdm_rpc__read_file("tls ca", tls->ca_path, &ca, err) != TDM_OK))
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    grpc_ssl_client_certificate_request_type req =
        tls->require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
        : ca                     ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
    creds = grpc_ssl_server_credentials_create_ex(ca, &pair, 1, req, NULL);
    if (!creds)
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "tls: cannot create server credentials "
                                                     "from cert '%s' and key '%s'",
                      tls->cert_path, tls->key_path);
out:
    free(cert);
    free(key);
    free(ca);
    return creds;
}

tdm_status tdm_rpc_server_create(const tdm_rpc_server_options *opt, tdm_rpc_server **out,
                                 tdm_error *err)
{
    *out = NULL;
    if (!opt || !opt->listen || !opt->listen[0])
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "rpc server: no listen address");
    grpc_server_credentials *creds = server_credentials(opt->tls, err);
    if (!creds)
        return err ? err->code : TDM_ERR_INVALID_ARGUMENT;

    tdm_rpc__init();
    tdm_rpc_server *s = tdm_xcalloc(1, sizeof(*s));
    s->name = strdup(opt->name ? opt->name : "rpc");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->shutdown_op.done = on_shutdown_done;
    grpc_arg args[3];
    grpc_channel_args cargs;
    tdm_rpc__size_args(args, &cargs, opt->max_message_bytes, NULL);
    /* gRPC binds with SO_REUSEPORT by default: a second server given a port
     * another one already serves would share it, and each would receive
     * some of the other's calls. A port in use is an error instead. */
    args[cargs.num_args].type = GRPC_ARG_INTEGER;
    args[cargs.num_args].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
    args[cargs.num_args].value.integer = 0;
    cargs.num_args++;
    s->srv = grpc_server_create(&cargs, NULL);
    /* Polling workers of one process contend for gRPC's one poller and make
     * each other's messages wait: one polls. */
    s->n_workers = opt->workers > 0 ? opt->workers
                   : (opt->busy_poll || opt->busy_poll_workers) && tdm_busy_poll_us() > 0
                       ? 1
                       : DEFAULT_WORKERS;
    s->max_streams = opt->max_streams > 0 ? opt->max_streams : DEFAULT_MAX_STREAMS;
    s->busy_poll = opt->busy_poll;
    s->busy_poll_workers = opt->busy_poll || opt->busy_poll_workers;
    s->workers = tdm_xcalloc((size_t)s->n_workers, sizeof(*s->workers));
    for (int i = 0; i < s->n_workers; i++) {
        s->workers[i].server = s;
        s->workers[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->srv, s->workers[i].cq, NULL);
    }
    s->port = grpc_server_add_http2_port(s->srv, opt->listen, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0) {
        tdm_error_set(err, TDM_ERR_UNAVAILABLE, "%s: cannot listen on '%s' (address invalid or in use)",
                      s->name, opt->listen);
        tdm_rpc_server_destroy(s);
        return TDM_ERR_UNAVAILABLE;
    }
    *out = s;
    return TDM_OK;
}

int tdm_rpc_server_port(const tdm_rpc_server *server)
{
    return server->port;
}

static tdm_status add_method(tdm_rpc_server *s, const char *path,
                             const ProtobufCMessageDescriptor *desc, rpc_method m, tdm_error *err)
{
    if (!path || path[0] != '/' || !strchr(path + 1, '/'))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "rpc: method path '%s' is not of the form /package.Service/Method",
                             path ? path : "(null)");
    if (!desc)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "rpc: method %s has no request type",
                             path);
    if (s->started)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "rpc: method %s added after the server started", path);
    if (find_method(s, path))
        return tdm_error_set(err, TDM_ERR_ALREADY_EXISTS, "rpc: method %s registered twice", path);
    rpc_method *nm = tdm_xrealloc(s->methods, (s->n_methods + 1) * sizeof(*nm));
    s->methods = nm;
    m.path = strdup(path);
    m.desc = desc;
    s->methods[s->n_methods++] = m;
    return TDM_OK;
}

tdm_status tdm_rpc_server_add_unary(tdm_rpc_server *server, const char *path,
                                    const ProtobufCMessageDescriptor *req_desc,
                                    tdm_rpc_unary_fn fn, void *user, tdm_error *err)
{
    rpc_method m = {.kind = KIND_UNARY, .unary = fn, .user = user};
    return add_method(server, path, req_desc, m, err);
}

tdm_status tdm_rpc_server_add_server_stream(tdm_rpc_server *server, const char *path,
                                            const ProtobufCMessageDescriptor *req_desc,
                                            tdm_rpc_server_stream_fn fn, void *user,
                                            tdm_error *err)
{
    rpc_method m = {.kind = KIND_SERVER_STREAM, .server_stream = fn, .user = user};
    return add_method(server, path, req_desc, m, err);
}

tdm_status tdm_rpc_server_add_bidi(tdm_rpc_server *server, const char *path,
                                   const ProtobufCMessageDescriptor *req_desc, tdm_rpc_bidi_fn fn,
                                   void *user, tdm_error *err)
{
    rpc_method m = {.kind = KIND_BIDI, .bidi = fn, .user = user};
    return add_method(server, path, req_desc, m, err);
}

void tdm_rpc_server_on_shutdown(tdm_rpc_server *server, void (*fn)(void *arg), void *arg)
{
    rpc_hook *nh = tdm_xrealloc(server->hooks, (server->n_hooks + 1) * sizeof(*nh));
    server->hooks = nh;
    server->hooks[server->n_hooks++] = (rpc_hook){fn, arg};
}

tdm_status tdm_rpc_server_start(tdm_rpc_server *s, tdm_error *err)
{
    if (s->started || s->shutting_down)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "%s: server started twice", s->name);
    grpc_server_start(s->srv);
    s->started = true;
    for (int i = 0; i < s->n_workers; i++) {
        rpc_worker *w = &s->workers[i];
        for (int k = 0; k < REQUESTS_PER_WORKER; k++)
            post_request(w);
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
            TDM_ASSERT(!"cannot start an rpc worker thread");
        w->running = true;
    }
    tdm_log_info(comp(s), "serving on port %d (%d workers, %zu methods)", s->port, s->n_workers,
                 s->n_methods);
    return TDM_OK;
}

static void on_shutdown_done(rpc_op *op, bool ok)
{
    (void)ok;
    tdm_rpc_server *s = CONTAINER_OF(op, tdm_rpc_server, shutdown_op);
    pthread_mutex_lock(&s->mu);
    s->shutdown_done = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static struct timespec abs_time_ms(int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

void tdm_rpc_server_shutdown(tdm_rpc_server *s, int grace_ms)
{
    pthread_mutex_lock(&s->mu);
    if (s->shutting_down) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->shutting_down = true;
    pthread_mutex_unlock(&s->mu);
    tdm_log_info(comp(s), "shutting down (grace %d ms)", grace_ms);
    for (size_t i = 0; i < s->n_hooks; i++)
        s->hooks[i].fn(s->hooks[i].arg);

    grpc_server_shutdown_and_notify(s->srv, s->workers[0].cq, &s->shutdown_op);
    if (!s->started) {
        /* No workers: drive the queue here until the shutdown tag arrives. */
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(s->workers[0].cq,
                                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type != GRPC_OP_COMPLETE)
                break;
            ((rpc_op *)ev.tag)->done(ev.tag, ev.success != 0);
            if (ev.tag == &s->shutdown_op)
                break;
        }
    }

    struct timespec until = abs_time_ms(grace_ms > 0 ? grace_ms : 0);
    pthread_mutex_lock(&s->mu);
    while (!(s->shutdown_done && s->live_calls == 0 && s->live_threads == 0)) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT)
            break;
    }
    bool clean = s->shutdown_done && s->live_calls == 0 && s->live_threads == 0;
    if (!clean) {
        s->force_cancelled = true;
        int calls = s->live_calls;
        pthread_mutex_unlock(&s->mu);
        tdm_log_warn(comp(s), "grace period over: cancelling %d call(s) still in flight", calls);
        grpc_server_cancel_all_calls(s->srv);
        pthread_mutex_lock(&s->mu);
        int waited_s = 0;
        while (!(s->shutdown_done && s->live_calls == 0 && s->live_threads == 0)) {
            struct timespec t = abs_time_ms(5000);
            if (pthread_cond_timedwait(&s->cv, &s->mu, &t) == ETIMEDOUT) {
                waited_s += 5;
                tdm_log_warn(comp(s),
                             "still waiting for %d call(s) / %d handler thread(s) after "
                             "cancellation (%d s): a handler ignores tdm_rpc_call_cancelled",
                             s->live_calls, s->live_threads, waited_s);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    join_finished(s);

    for (int i = 0; i < s->n_workers; i++)
        grpc_completion_queue_shutdown(s->workers[i].cq);
    for (int i = 0; i < s->n_workers; i++) {
        rpc_worker *w = &s->workers[i];
        if (w->running) {
            pthread_join(w->thread, NULL);
            w->running = false;
        } else {
            while (grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                       .type != GRPC_QUEUE_SHUTDOWN) {
            }
        }
    }
    pthread_mutex_lock(&s->mu);
    s->stopped = true;
    pthread_mutex_unlock(&s->mu);
    tdm_log_info(comp(s), "stopped");
}

void tdm_rpc_server_destroy(tdm_rpc_server *s)
{
    if (!s)
        return;
    if (!s->stopped)
        tdm_rpc_server_shutdown(s, 0);
    grpc_server_destroy(s->srv);
    for (int i = 0; i < s->n_workers; i++)
        grpc_completion_queue_destroy(s->workers[i].cq);
    free(s->workers);
    for (size_t i = 0; i < s->n_methods; i++)
        free(s->methods[i].path);
    free(s->methods);
    free(s->hooks);
    free(s->finished);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->name);
    free(s);
    grpc_shutdown();
}

/* ---- server-side call API ----------------------------------------------------------- */

const char *tdm_rpc__server_method(const tdm_rpc_server *server, size_t i)
{
    return i < server->n_methods ? server->methods[i].path : NULL;
}

grpc_call *tdm_rpc__server_call_handle(tdm_rpc_call *call)
{
    return call->call;
}

const char *tdm_rpc_call_method(const tdm_rpc_call *call)
{
    return call->path;
}

const char *tdm_rpc_call_metadata(const tdm_rpc_call *call, const char *key)
{
    tdm_rpc_call *c = (tdm_rpc_call *)call;
    for (size_t i = 0; i < c->md.count; i++) {
        if (grpc_slice_str_cmp(c->md.metadata[i].key, key) == 0) {
            grpc_slice v = c->md.metadata[i].value;
            size_t n = GRPC_SLICE_LENGTH(v);
            char *out = tdm_rpc_call_alloc(c, n + 1);
            memcpy(out, GRPC_SLICE_START_PTR(v), n);
            return out;
        }
    }
    return NULL;
}

void tdm_rpc_call_abort(tdm_rpc_call *call, tdm_status code, const char *msg)
{
    grpc_call_cancel_with_status(call->call, (grpc_status_code)code, msg, NULL);
}

const char *tdm_rpc_call_peer(const tdm_rpc_call *call)
{
    tdm_rpc_call *c = (tdm_rpc_call *)call;
    char *p = grpc_call_get_peer(c->call);
    char *out = tdm_rpc_call_strdup(c, p ? p : "");
    gpr_free(p);
    return out;
}

bool tdm_rpc_call_peer_is_local(const tdm_rpc_call *call)
{
    const char *p = tdm_rpc_call_peer(call);
    return strncmp(p, "ipv4:127.", 9) == 0 || strncmp(p, "ipv6:[::1]:", 11) == 0 ||
           strncmp(p, "ipv6:%5B::1%5D:", 15) == 0 || strncmp(p, "unix:", 5) == 0;
}

size_t tdm_rpc_call_peer_property(const tdm_rpc_call *call, const char *name, char *out,
                                  size_t len)
{
    if (len)
        out[0] = '\0';
    grpc_auth_context *ctx = grpc_call_auth_context(call->call);
    if (!ctx)
        return 0;
    size_t n = 0, used = 0;
    if (grpc_auth_context_peer_is_authenticated(ctx)) {
        grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, name);
        for (const grpc_auth_property *p; (p = grpc_auth_property_iterator_next(&it));) {
            n++;
            if (used + p->value_length + 2 <= len) {
                memcpy(out + used, p->value, p->value_length);
                used += p->value_length;
                out[used++] = '\n';
                out[used] = '\0';
            }
        }
    }
    grpc_auth_context_release(ctx);
    return n;
}

int64_t tdm_rpc_call_deadline_ms(const tdm_rpc_call *call)
{
    gpr_timespec d = call->details.deadline;
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0)
        return INT64_MAX;
    d = gpr_convert_clock_type(d, GPR_CLOCK_MONOTONIC);
    gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
    return (int64_t)left.tv_sec * 1000 + left.tv_nsec / 1000000;
}

bool tdm_rpc_call_cancelled(const tdm_rpc_call *call)
{
    if (atomic_load(&call->cancelled))
        return true;
    return tdm_rpc_call_deadline_ms(call) <= 0;
}

void tdm_rpc_call_set_cancel_notify(tdm_rpc_call *c, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&c->mu);
    /* A notification already running keeps its arg alive until it returns. */
    while (c->notifying > 0)
        pthread_cond_wait(&c->cv, &c->mu);
    c->notify_fn = fn;
    c->notify_arg = arg;
    bool now = fn && atomic_load(&c->cancelled);
    pthread_mutex_unlock(&c->mu);
    if (now)
        fn(arg);
}

/* Code for an operation that failed because the call ended. */
static tdm_status ended_status(tdm_rpc_call *c, tdm_error *err, const char *what)
{
    if (tdm_rpc_call_deadline_ms(c) <= 0)
        return tdm_error_set(err, TDM_ERR_DEADLINE_EXCEEDED, "%s: deadline exceeded (%s)", c->path,
                             what);
    return tdm_error_set(err, TDM_ERR_CANCELLED, "%s: call cancelled (%s)", c->path, what);
}

static void on_sync_send(rpc_op *op, bool ok)
{
    tdm_rpc_call *c = CONTAINER_OF(op, tdm_rpc_call, send_op);
    pthread_mutex_lock(&c->mu);
    c->send_ok = ok;
    __atomic_store_n(&c->send_done, true, __ATOMIC_RELEASE); /* polled (spin.h) */
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void on_sync_recv(rpc_op *op, bool ok)
{
    tdm_rpc_call *c = CONTAINER_OF(op, tdm_rpc_call, recv_op);
    pthread_mutex_lock(&c->mu);
    c->recv_ok = ok;
    __atomic_store_n(&c->recv_done, true, __ATOMIC_RELEASE); /* polled (spin.h) */
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

tdm_status tdm_rpc_call_write(tdm_rpc_call *c, const ProtobufCMessage *msg, tdm_error *err)
{
    if (!c->method || c->method->kind == KIND_UNARY)
        return tdm_error_set(err, TDM_ERR_INTERNAL, "%s: write on a unary call", c->path);
    pthread_mutex_lock(&c->write_mu);
    pthread_mutex_lock(&c->mu);
    bool over = c->status_started || atomic_load(&c->cancelled);
    pthread_mutex_unlock(&c->mu);
    if (over) {
        pthread_mutex_unlock(&c->write_mu);
        return ended_status(c, err, "write");
    }
    grpc_byte_buffer *bb = tdm_rpc__pack(msg);
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    pthread_mutex_lock(&c->mu);
    c->send_done = false;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->send_op, NULL);
    if (e == GRPC_CALL_OK && !c->send_done && c->server->busy_poll) {
        pthread_mutex_unlock(&c->mu);
        tdm_spin_flag(&c->send_done);
        pthread_mutex_lock(&c->mu);
    }
    while (e == GRPC_CALL_OK && !c->send_done)
        pthread_cond_wait(&c->cv, &c->mu);
    bool ok = e == GRPC_CALL_OK && c->send_ok;
    pthread_mutex_unlock(&c->mu);
    grpc_byte_buffer_destroy(bb);
    pthread_mutex_unlock(&c->write_mu);
    if (!ok)
        return ended_status(c, err, "write");
    return TDM_OK;
}

tdm_status tdm_rpc_call_read(tdm_rpc_call *c, ProtobufCMessage **msg, tdm_error *err)
{
    *msg = NULL;
    if (!c->method || c->method->kind != KIND_BIDI)
        return tdm_error_set(err, TDM_ERR_INTERNAL, "%s: read on a call that is not bidi",
                             c->path);
    pthread_mutex_lock(&c->read_mu);
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    pthread_mutex_lock(&c->mu);
    c->recv_done = false;
    c->recv_buf = NULL;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->recv_op, NULL);
    if (e == GRPC_CALL_OK && !c->recv_done && c->server->busy_poll) {
        pthread_mutex_unlock(&c->mu);
        tdm_spin_flag(&c->recv_done);
        pthread_mutex_lock(&c->mu);
    }
    while (e == GRPC_CALL_OK && !c->recv_done)
        pthread_cond_wait(&c->cv, &c->mu);
    bool ok = e == GRPC_CALL_OK && c->recv_ok;
    grpc_byte_buffer *buf = c->recv_buf;
    c->recv_buf = NULL;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->read_mu);
    if (!ok) {
        if (buf)
            grpc_byte_buffer_destroy(buf);
        return ended_status(c, err, "read");
    }
    if (!buf) {
        /* A cancelled call also ends the read stream with "no message"; the
         * cancellation itself (RECV_CLOSE_ON_SERVER) is processed right
         * after on the worker. Give it a moment so that a handler does not
         * take a client's cancel for a half-close. */
        if (tdm_rpc_call_deadline_ms(c) <= 0)
            return ended_status(c, err, "read");
        struct timespec until = abs_time_ms(20);
        pthread_mutex_lock(&c->mu);
        while (!c->closed)
            if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT)
                break;
        pthread_mutex_unlock(&c->mu);
        if (atomic_load(&c->cancelled))
            return ended_status(c, err, "read");
        return TDM_OK; /* half-close */
    }
    tdm_error uerr;
    *msg = tdm_rpc__unpack(c->method->desc, buf, &uerr);
    grpc_byte_buffer_destroy(buf);
    if (!*msg)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: message %s", c->path, uerr.msg);
    return TDM_OK;
}

void *tdm_rpc_call_alloc(tdm_rpc_call *c, size_t size)
{
    arena_block *b = tdm_xcalloc(1, sizeof(*b) + size + 1);
    pthread_mutex_lock(&c->arena_mu);
    b->next = c->arena;
    c->arena = b;
    pthread_mutex_unlock(&c->arena_mu);
    return b->data;
}

char *tdm_rpc_call_strdup(tdm_rpc_call *c, const char *s)
{
    size_t n = strlen(s);
    char *out = tdm_rpc_call_alloc(c, n + 1);
    memcpy(out, s, n);
    return out;
}

void tdm_rpc_call_defer(tdm_rpc_call *c, void (*fn)(void *arg), void *arg)
{
    defer_entry *d = tdm_xmalloc(sizeof(*d));
    d->fn = fn;
    d->arg = arg;
    pthread_mutex_lock(&c->arena_mu);
    d->next = c->defers;
    c->defers = d;
    pthread_mutex_unlock(&c->arena_mu);
}
