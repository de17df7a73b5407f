/*
 * rpc_client.c - the client half of the gRPC layer: channels, unary calls and
 * streaming calls, all blocking.
 *
 * Every call owns a pluck completion queue, so a thread waits for exactly the
 * tag it started and different threads can wait on one call at once (a
 * reader, a writer, and whoever collects the final status: at most 3 of the 6
 * pluckers the core allows).
 */
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_internal.h"
#include "alloc.h"
#include "spin.h"

struct tdm_rpc_channel {
    grpc_channel *ch;
    char *target;
};

static grpc_channel_credentials *channel_credentials(const tdm_rpc_tls *tls, tdm_error *err)
{
    if (!tls || (!tls->cert_path && !tls->key_path && !tls->ca_path && !tls->server_name))
        return grpc_insecure_credentials_create();
    if ((tls->cert_path == NULL) != (tls->key_path == NULL)) {
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                      "tls: a client certificate needs both cert and key");
        return NULL;
    }
    char *cert = NULL, *key = NULL, *ca = NULL;
    grpc_channel_credentials *creds = NULL;
    if ((tls->cert_path && tdm_rpc__read_file("tls cert", tls->cert_path, &cert, err) != TDM_OK) ||
        (tls->key_path && tdm_rpc__read_file("tls key", tls->key_path, &key, err) != TDM_OK) ||
        (tls->ca_path && tdm_rpc__read_file("tls ca", tls->ca_path, &ca, err) != TDM_OK))
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    creds = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (!creds)
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "tls: cannot create channel credentials");
out:
    free(cert);
    free(key);
    free(ca);
    return creds;
}

tdm_status tdm_rpc_channel_create(const tdm_rpc_channel_options *opt, tdm_rpc_channel **out,
                                  tdm_error *err)
{
    *out = NULL;
    if (!opt || !opt->target || !opt->target[0])
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "rpc channel: no target address");
    grpc_channel_credentials *creds = channel_credentials(opt->tls, err);
    if (!creds)
        return err ? err->code : TDM_ERR_INVALID_ARGUMENT;
    tdm_rpc__init();
    grpc_arg args[3];
    grpc_channel_args cargs;
    tdm_rpc__size_args(args, &cargs, opt->max_message_bytes,
                       opt->tls ? opt->tls->server_name : NULL);
    grpc_channel *ch = grpc_channel_create(opt->target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    if (!ch) {
        grpc_shutdown();
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "rpc channel: bad target '%s'",
                             opt->target);
    }
    tdm_rpc_channel *c = tdm_xcalloc(1, sizeof(*c));
    c->ch = ch;
    c->target = strdup(opt->target);
    *out = c;
    return TDM_OK;
}

void tdm_rpc_channel_destroy(tdm_rpc_channel *c)
{
    if (!c)
        return;
    grpc_channel_destroy(c->ch);
    free(c->target);
    free(c);
    grpc_shutdown();
}

/* ---- shared call plumbing ---------------------------------------------------------- */

typedef struct send_md {
    grpc_metadata *md; /* (n) */
    size_t n;
} send_md;

static void md_free(send_md *m)
{
    for (size_t i = 0; i < m->n; i++) {
        grpc_slice_unref(m->md[i].key);
        grpc_slice_unref(m->md[i].value);
    }
    free(m->md);
    m->md = NULL;
    m->n = 0;
}

static tdm_status md_build(const tdm_rpc_call_options *opt, send_md *out, tdm_error *err)
{
    out->md = NULL;
    out->n = 0;
    if (!opt || opt->n_metadata == 0)
        return TDM_OK;
    out->md = tdm_xcalloc(opt->n_metadata, sizeof(*out->md));
    for (size_t i = 0; i < opt->n_metadata; i++) {
        const tdm_rpc_metadata *m = &opt->metadata[i];
        grpc_slice k = grpc_slice_from_copied_string(m->key ? m->key : "");
        if (!m->key || !grpc_header_key_is_legal(k) ||
            (strlen(m->key) > 4 && strcmp(m->key + strlen(m->key) - 4, "-bin") == 0)) {
            grpc_slice_unref(k);
            md_free(out);
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "rpc: metadata key '%s' is not a lowercase ASCII header name",
                                 m->key ? m->key : "(null)");
        }
        grpc_slice v = grpc_slice_from_copied_string(m->value ? m->value : "");
        if (!grpc_header_nonbin_value_is_legal(v)) {
            grpc_slice_unref(k);
            grpc_slice_unref(v);
            md_free(out);
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "rpc: metadata value for '%s' has non-printable characters",
                                 m->key);
        }
        out->md[out->n].key = k;
        out->md[out->n].value = v;
        out->n++;
    }
    return TDM_OK;
}

static grpc_call *call_create(tdm_rpc_channel *ch, const char *method, grpc_completion_queue *cq,
                              const tdm_rpc_call_options *opt)
{
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *parent = opt && opt->parent ? tdm_rpc__server_call_handle(opt->parent) : NULL;
    grpc_call *call =
        grpc_channel_create_call(ch->ch, parent, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                 tdm_rpc__deadline(opt ? opt->timeout_ms : 0), NULL);
    grpc_slice_unref(m);
    return call;
}

static uint32_t md_flags(const tdm_rpc_call_options *opt)
{
    return opt && opt->wait_for_ready ? GRPC_INITIAL_METADATA_WAIT_FOR_READY |
                                            GRPC_INITIAL_METADATA_WAIT_FOR_READY_EXPLICITLY_SET
                                      : 0;
}

static void cq_drain_destroy(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

/* Waits for tag; with busy polling on (spin.h) the queue is polled without
 * sleeping for up to the busy-poll time first. */
static grpc_event pluck(grpc_completion_queue *cq, void *tag)
{
    const int64_t busy = tdm_busy_poll_us();
    if (busy > 0) {
        const int64_t t0 = tdm_spin_now_us();
        tdm_spin_note_poll(t0);
        do {
            grpc_event ev = grpc_completion_queue_pluck(cq, tag, tdm_rpc__poll_once(), NULL);
            if (ev.type != GRPC_QUEUE_TIMEOUT)
                return ev;
        } while (tdm_spin_now_us() - t0 < busy);
    }
    return grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
}

/* Converts a received status into a tdm_status and message. */
static tdm_status status_set(tdm_error *err, const char *method, grpc_status_code code,
                             grpc_slice details)
{
    if (code == GRPC_STATUS_OK)
        return TDM_OK;
    tdm_status st = (int)code > 0 && (int)code <= TDM_ERR_UNAUTHENTICATED ? (tdm_status)code
                                                                     : TDM_ERR_UNKNOWN;
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n == 0)
        return tdm_error_set(err, st, "%s: %s", method, tdm_status_name(st));
    return tdm_error_set(err, st, "%.*s", (int)(n < 900 ? n : 900),
                         (const char *)GRPC_SLICE_START_PTR(details));
}

/* ---- unary ------------------------------------------------------------------------ */

static tdm_status unary_bytes(tdm_rpc_channel *ch, const char *method, grpc_byte_buffer *req,
                              grpc_byte_buffer **resp, const tdm_rpc_call_options *opt,
                              tdm_error *err)
{
    *resp = NULL;
    send_md md;
    tdm_status st = md_build(opt, &md, err);
    if (st != TDM_OK)
        return st;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_call *call = call_create(ch, method, cq, opt);
    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].flags = md_flags(opt);
    ops[0].data.send_initial_metadata.count = md.n;
    ops[0].data.send_initial_metadata.metadata = md.md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = resp;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, &code, NULL);
    if (e == GRPC_CALL_OK) {
        pluck(cq, &code);
        st = status_set(err, method, code, details);
        if (st == TDM_OK && !*resp)
            st = tdm_error_set(err, TDM_ERR_INTERNAL, "%s: server sent no response message",
                               method);
    } else {
        st = tdm_error_set(err, TDM_ERR_INTERNAL, "%s: cannot start call (%d)", method, (int)e);
    }
    if (st != TDM_OK && *resp) {
        grpc_byte_buffer_destroy(*resp);
        *resp = NULL;
    }
    gpr_free((void *)error_string);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_call_unref(call);
    cq_drain_destroy(cq);
    md_free(&md);
    return st;
}

tdm_status tdm_rpc_unary(tdm_rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                         const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                         const tdm_rpc_call_options *opt, tdm_error *err)
{
    *resp = NULL;
    grpc_byte_buffer *rb = NULL;
    grpc_byte_buffer *qb = tdm_rpc__pack(req);
    tdm_status st = unary_bytes(ch, method, qb, &rb, opt, err);
    grpc_byte_buffer_destroy(qb);
    if (st != TDM_OK)
        return st;
    tdm_error uerr;
    *resp = tdm_rpc__unpack(resp_desc, rb, &uerr);
    grpc_byte_buffer_destroy(rb);
    if (!*resp)
        return tdm_error_set(err, TDM_ERR_INTERNAL, "%s: response %s", method, uerr.msg);
    return TDM_OK;
}

tdm_status tdm_rpc_unary_raw(tdm_rpc_channel *ch, const char *method, const void *req,
                             size_t req_len, void **resp, size_t *resp_len,
                             const tdm_rpc_call_options *opt, tdm_error *err)
{
    *resp = NULL;
    *resp_len = 0;
    grpc_byte_buffer *rb = NULL;
    grpc_byte_buffer *qb = tdm_rpc__pack_raw(req, req_len);
    tdm_status st = unary_bytes(ch, method, qb, &rb, opt, err);
    grpc_byte_buffer_destroy(qb);
    if (st != TDM_OK)
        return st;
    *resp = tdm_rpc__buffer_bytes(rb, resp_len);
    grpc_byte_buffer_destroy(rb);
    return TDM_OK;
}

/* ---- streams -------------------------------------------------------------------------- */

struct tdm_rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    const ProtobufCMessageDescriptor *desc;
    char *method;
    send_md md;

    pthread_mutex_t batch_mu;  /* grpc_call_start_batch calls */
    pthread_mutex_t read_mu;   /* one reader */
    pthread_mutex_t write_mu;  /* one writer */
    pthread_mutex_t status_mu; /* one collector of the final status */

    /* The long-lived batch, completed when the call ends. */
    int tag_status, tag_read, tag_write;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code code;
    grpc_slice details;
    const char *error_string;
    bool status_started;
    bool have_status;
    tdm_error final; /* the final status, once have_status */
    bool send_closed;
};

static tdm_status stream_batch(tdm_rpc_stream *s, const grpc_op *ops, size_t n, void *tag)
{
    pthread_mutex_lock(&s->batch_mu);
    grpc_call_error e = grpc_call_start_batch(s->call, ops, n, tag, NULL);
    pthread_mutex_unlock(&s->batch_mu);
    return e == GRPC_CALL_OK ? TDM_OK : TDM_ERR_INTERNAL;
}

/* Waits for the call's final status (once; later calls return the copy). */
static tdm_status stream_status(tdm_rpc_stream *s, tdm_error *err)
{
    pthread_mutex_lock(&s->status_mu);
    if (!s->have_status) {
        tdm_error_clear(&s->final);
        if (s->status_started) {
            pluck(s->cq, &s->tag_status);
            status_set(&s->final, s->method, s->code, s->details);
        } else {
            tdm_error_set(&s->final, TDM_ERR_INTERNAL, "%s: call did not start", s->method);
        }
        s->have_status = true;
    }
    tdm_error f = s->final;
    pthread_mutex_unlock(&s->status_mu);
    if (err && f.code != TDM_OK)
        *err = f;
    return f.code;
}

tdm_status tdm_rpc_stream_open(tdm_rpc_channel *ch, const char *method,
                               const ProtobufCMessage *req,
                               const ProtobufCMessageDescriptor *resp_desc,
                               const tdm_rpc_call_options *opt, tdm_rpc_stream **out,
                               tdm_error *err)
{
    *out = NULL;
    tdm_rpc_stream *s = tdm_xcalloc(1, sizeof(*s));
    tdm_status st = md_build(opt, &s->md, err);
    if (st != TDM_OK) {
        free(s);
        return st;
    }
    s->method = strdup(method);
    s->desc = resp_desc;
    pthread_mutex_init(&s->batch_mu, NULL);
    pthread_mutex_init(&s->read_mu, NULL);
    pthread_mutex_init(&s->write_mu, NULL);
    pthread_mutex_init(&s->status_mu, NULL);
    grpc_metadata_array_init(&s->initial_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->details = grpc_empty_slice();
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    s->call = call_create(ch, method, s->cq, opt);

    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].flags = md_flags(opt);
    ops[0].data.send_initial_metadata.count = s->md.n;
    ops[0].data.send_initial_metadata.metadata = s->md.md;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
    ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[2].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    ops[2].data.recv_status_on_client.status = &s->code;
    ops[2].data.recv_status_on_client.status_details = &s->details;
    ops[2].data.recv_status_on_client.error_string = &s->error_string;
    s->status_started = stream_batch(s, ops, 3, &s->tag_status) == TDM_OK;
    if (!s->status_started) {
        tdm_rpc_stream_destroy(s);
        return tdm_error_set(err, TDM_ERR_INTERNAL, "%s: cannot start call", method);
    }
    *out = s;
    if (req) {
        grpc_byte_buffer *bb = tdm_rpc__pack(req);
        grpc_op w[2];
        memset(w, 0, sizeof(w));
        w[0].op = GRPC_OP_SEND_MESSAGE;
        w[0].data.send_message.send_message = bb;
        w[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        pthread_mutex_lock(&s->write_mu);
        if (stream_batch(s, w, 2, &s->tag_write) == TDM_OK)
            pluck(s->cq, &s->tag_write);
        s->send_closed = true;
        pthread_mutex_unlock(&s->write_mu);
        grpc_byte_buffer_destroy(bb);
        /* A failed send shows up as the final status on the first read. */
    }
    return TDM_OK;
}

static tdm_status stream_write_buffer(tdm_rpc_stream *s, grpc_byte_buffer *bb, tdm_error *err)
{
    pthread_mutex_lock(&s->write_mu);
    if (s->send_closed) {
        pthread_mutex_unlock(&s->write_mu);
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s: write after the sending side was closed", s->method);
    }
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    bool ok = false;
    if (stream_batch(s, &op, 1, &s->tag_write) == TDM_OK)
        ok = pluck(s->cq, &s->tag_write).success != 0;
    pthread_mutex_unlock(&s->write_mu);
    if (ok)
        return TDM_OK;
    tdm_status st = stream_status(s, err);
    if (st == TDM_OK)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s: write after the server finished the call", s->method);
    return st;
}

tdm_status tdm_rpc_stream_write(tdm_rpc_stream *s, const ProtobufCMessage *msg, tdm_error *err)
{
    grpc_byte_buffer *bb = tdm_rpc__pack(msg);
    tdm_status st = stream_write_buffer(s, bb, err);
    grpc_byte_buffer_destroy(bb);
    return st;
}

tdm_status tdm_rpc_stream_write_raw(tdm_rpc_stream *s, const void *data, size_t len,
                                    tdm_error *err)
{
    grpc_byte_buffer *bb = tdm_rpc__pack_raw(data, len);
    tdm_status st = stream_write_buffer(s, bb, err);
    grpc_byte_buffer_destroy(bb);
    return st;
}

tdm_status tdm_rpc_stream_close_send(tdm_rpc_stream *s, tdm_error *err)
{
    pthread_mutex_lock(&s->write_mu);
    if (s->send_closed) {
        pthread_mutex_unlock(&s->write_mu);
        return TDM_OK;
    }
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    bool ok = false;
    if (stream_batch(s, &op, 1, &s->tag_write) == TDM_OK)
        ok = pluck(s->cq, &s->tag_write).success != 0;
    s->send_closed = true;
    pthread_mutex_unlock(&s->write_mu);
    if (ok)
        return TDM_OK;
    tdm_status st = stream_status(s, err);
    return st == TDM_OK ? TDM_OK : st;
}

tdm_status tdm_rpc_stream_read(tdm_rpc_stream *s, ProtobufCMessage **msg, tdm_error *err)
{
    *msg = NULL;
    pthread_mutex_lock(&s->read_mu);
    pthread_mutex_lock(&s->status_mu);
    bool ended = s->have_status;
    pthread_mutex_unlock(&s->status_mu);
    grpc_byte_buffer *buf = NULL;
    bool ok = false;
    if (!ended) {
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &buf;
        if (stream_batch(s, &op, 1, &s->tag_read) == TDM_OK)
            ok = pluck(s->cq, &s->tag_read).success != 0;
    }
    pthread_mutex_unlock(&s->read_mu);
    if (!ok || !buf) {
        if (buf)
            grpc_byte_buffer_destroy(buf);
        return stream_status(s, err);
    }
    tdm_error uerr;
    *msg = tdm_rpc__unpack(s->desc, buf, &uerr);
    grpc_byte_buffer_destroy(buf);
    if (!*msg) {
        grpc_call_cancel_with_status(s->call, GRPC_STATUS_INTERNAL, "response does not decode",
                                     NULL);
        return tdm_error_set(err, TDM_ERR_INTERNAL, "%s: response %s", s->method, uerr.msg);
    }
    return TDM_OK;
}

void tdm_rpc_stream_cancel(tdm_rpc_stream *s)
{
    grpc_call_cancel(s->call, NULL);
}

void tdm_rpc_stream_destroy(tdm_rpc_stream *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->status_mu);
    bool done = s->have_status;
    pthread_mutex_unlock(&s->status_mu);
    if (!done) {
        grpc_call_cancel(s->call, NULL);
        stream_status(s, NULL);
    }
    gpr_free((void *)s->error_string);
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    grpc_call_unref(s->call);
    cq_drain_destroy(s->cq);
    md_free(&s->md);
    pthread_mutex_destroy(&s->batch_mu);
    pthread_mutex_destroy(&s->read_mu);
    pthread_mutex_destroy(&s->write_mu);
    pthread_mutex_destroy(&s->status_mu);
    free(s->method);
    free(s);
}
