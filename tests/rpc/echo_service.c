/*
 * echo_service.c - tandem.test.Echo handlers: Say (unary), Repeat
 * (server-streaming) and Chat (bidi, with reads and writes on two threads).
 */
#include "echo_service.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

atomic_int echo_cancel_seen;
atomic_int echo_streams_running;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Sleeps ms in small steps; false when the call was cancelled meanwhile. */
static bool pause_ms(tdm_rpc_call *call, int ms)
{
    for (int t = 0; t < ms; t += 5) {
        if (tdm_rpc_call_cancelled(call))
            return false;
        sleep_ms(5);
    }
    return !tdm_rpc_call_cancelled(call);
}

static tdm_status cancelled(tdm_rpc_call *call, tdm_error *err)
{
    atomic_fetch_add(&echo_cancel_seen, 1);
    if (tdm_rpc_call_deadline_ms(call) <= 0)
        return tdm_error_set(err, TDM_ERR_DEADLINE_EXCEEDED, "echo: deadline passed");
    return tdm_error_set(err, TDM_ERR_CANCELLED, "echo: cancelled");
}

static tdm_status say(tdm_rpc_call *call, const ProtobufCMessage *req, ProtobufCMessage **resp,
                      tdm_error *err, void *user)
{
    (void)user;
    const Tandem__Test__EchoRequest *r = (const void *)req;
    if (r->delay_ms > 0 && !pause_ms(call, r->delay_ms))
        return cancelled(call, err);
    if (r->fail_code)
        return tdm_error_set(err, (tdm_status)r->fail_code, "%s", r->fail_message);
    Tandem__Test__EchoResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__test__echo_response__init(out);
    out->text = tdm_rpc_call_strdup(call, r->text);
    const char *md = tdm_rpc_call_metadata(call, "x-test");
    out->metadata = md ? (char *)md : "";
    out->deadline_ms = tdm_rpc_call_deadline_ms(call);
    out->payload = r->payload; /* the request outlives the packing */
    *resp = &out->base;
    return TDM_OK;
}

static tdm_status repeat(tdm_rpc_call *call, const ProtobufCMessage *req, tdm_error *err,
                         void *user)
{
    (void)user;
    const Tandem__Test__EchoRequest *r = (const void *)req;
    atomic_fetch_add(&echo_streams_running, 1);
    tdm_status st = TDM_OK;
    for (int i = 0; r->count < 0 || i < r->count; i++) {
        if (r->delay_ms > 0 && !pause_ms(call, r->delay_ms)) {
            st = cancelled(call, err);
            goto out;
        }
        Tandem__Test__EchoResponse m = TANDEM__TEST__ECHO_RESPONSE__INIT;
        m.text = r->text;
        m.index = i;
        m.payload = r->payload;
        st = tdm_rpc_call_write(call, &m.base, err);
        if (st != TDM_OK) {
            atomic_fetch_add(&echo_cancel_seen, 1);
            goto out;
        }
    }
    if (r->fail_code)
        st = tdm_error_set(err, (tdm_status)r->fail_code, "%s", r->fail_message);
out:
    atomic_fetch_sub(&echo_streams_running, 1);
    return st;
}

/* Chat: the handler thread reads; a writer thread answers from a queue. */
typedef struct chat_item {
    struct chat_item *next;
    Tandem__Test__EchoRequest *req; /* NULL: half-close seen, say "end" */
    int index;
} chat_item;

typedef struct chat {
    tdm_rpc_call *call;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    chat_item *head, *tail;
    bool stop;
    tdm_status write_status;
    tdm_error write_err;
} chat;

static void *chat_writer(void *arg)
{
    chat *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->head && !c->stop)
            pthread_cond_wait(&c->cv, &c->mu);
        chat_item *it = c->head;
        if (!it) {
            pthread_mutex_unlock(&c->mu);
            return NULL;
        }
        c->head = it->next;
        if (!c->head)
            c->tail = NULL;
        pthread_mutex_unlock(&c->mu);
        Tandem__Test__EchoResponse m = TANDEM__TEST__ECHO_RESPONSE__INIT;
        bool last = it->req == NULL;
        if (!last && it->req->delay_ms > 0)
            pause_ms(c->call, it->req->delay_ms);
        m.text = last ? "end" : it->req->text;
        m.index = it->index;
        tdm_status st = TDM_OK;
        if (c->write_status == TDM_OK)
            st = tdm_rpc_call_write(c->call, &m.base, &c->write_err);
        if (it->req)
            protobuf_c_message_free_unpacked(&it->req->base, NULL);
        free(it);
        if (st != TDM_OK)
            c->write_status = st; /* keep draining the queue to free it */
        if (last)
            return NULL;
    }
}

static void chat_push(chat *c, Tandem__Test__EchoRequest *req, int index)
{
    chat_item *it = calloc(1, sizeof(*it));
    it->req = req;
    it->index = index;
    pthread_mutex_lock(&c->mu);
    if (c->tail)
        c->tail->next = it;
    else
        c->head = it;
    c->tail = it;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static tdm_status chat_run(tdm_rpc_call *call, tdm_error *err, void *user)
{
    (void)user;
    atomic_fetch_add(&echo_streams_running, 1);
    chat c = {.call = call, .write_status = TDM_OK};
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    pthread_t w;
    pthread_create(&w, NULL, chat_writer, &c);
    tdm_status st = TDM_OK;
    for (int i = 0;; i++) {
        ProtobufCMessage *msg = NULL;
        st = tdm_rpc_call_read(call, &msg, err);
        if (st != TDM_OK) {
            if (st == TDM_ERR_CANCELLED || st == TDM_ERR_DEADLINE_EXCEEDED)
                atomic_fetch_add(&echo_cancel_seen, 1);
            break;
        }
        Tandem__Test__EchoRequest *r = (void *)msg;
        if (!r) {
            chat_push(&c, NULL, i);
            break;
        }
        if (r->fail_code) {
            st = tdm_error_set(err, (tdm_status)r->fail_code, "%s", r->fail_message);
            protobuf_c_message_free_unpacked(msg, NULL);
            break;
        }
        chat_push(&c, r, i);
    }
    pthread_mutex_lock(&c.mu);
    c.stop = true;
    pthread_cond_broadcast(&c.cv);
    pthread_mutex_unlock(&c.mu);
    pthread_join(w, NULL);
    for (chat_item *it = c.head; it;) {
        chat_item *next = it->next;
        if (it->req)
            protobuf_c_message_free_unpacked(&it->req->base, NULL);
        free(it);
        it = next;
    }
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    if (st == TDM_OK && c.write_status != TDM_OK) {
        *err = c.write_err;
        st = c.write_status;
        if (st == TDM_ERR_CANCELLED || st == TDM_ERR_DEADLINE_EXCEEDED)
            atomic_fetch_add(&echo_cancel_seen, 1);
    }
    atomic_fetch_sub(&echo_streams_running, 1);
    return st;
}

tdm_status echo_register(tdm_rpc_server *s, tdm_error *err)
{
    const ProtobufCMessageDescriptor *d = &tandem__test__echo_request__descriptor;
    tdm_status st;
    if ((st = tdm_rpc_server_add_unary(s, ECHO_SAY, d, say, NULL, err)) != TDM_OK ||
        (st = tdm_rpc_server_add_server_stream(s, ECHO_REPEAT, d, repeat, NULL, err)) != TDM_OK ||
        (st = tdm_rpc_server_add_bidi(s, ECHO_CHAT, d, chat_run, NULL, err)) != TDM_OK)
        return st;
    return TDM_OK;
}
