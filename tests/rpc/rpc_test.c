/*
 * rpc_test.c - the gRPC layer over real loopback sockets: each call type,
 * concurrency, cancellation from both sides, deadlines, metadata, message
 * size limits, malformed requests, shutdown with calls in flight, health and
 * TLS, busy polling. One subcommand per ctest test: rpc_test <name>.
 *
 * Expected values come from the requests the tests make (texts, counts, the
 * gRPC status codes the spec prescribes), never from the layer's own output.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "echo_service.h"
#include "grpc/health/v1/health.pb-c.h"
#include "health.h"
#include "rpc.h"
#include "spin.h"

static int failures;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);          \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

#define CHECK_ST(got, want, err)                                                             \
    do {                                                                                     \
        tdm_status g_ = (got), w_ = (want);                                                  \
        if (g_ != w_) {                                                                      \
            fprintf(stderr, "%s:%d: status %s, expected %s (%s)\n", __FILE__, __LINE__,      \
                    tdm_status_name(g_), tdm_status_name(w_), (err)->msg);                   \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits up to ms for *v to reach at least want. */
static bool wait_atomic(atomic_int *v, int want, int ms)
{
    for (int t = 0; t < ms; t += 5) {
        if (atomic_load(v) >= want)
            return true;
        sleep_ms(5);
    }
    return atomic_load(v) >= want;
}

/* ---- fixture: an Echo server (+ health) and a channel to it ------------------------ */

typedef struct fixture {
    tdm_rpc_server *server;
    tdm_health *health;
    tdm_rpc_channel *ch;
    char target[64];
} fixture;

static void fixture_start(fixture *f, int64_t server_max, int64_t client_max, int workers)
{
    memset(f, 0, sizeof(*f));
    tdm_error err;
    tdm_rpc_server_options so = {.listen = "127.0.0.1:0", .workers = workers,
                                 .max_message_bytes = server_max, .name = "test"};
    TDM_ASSERT(tdm_rpc_server_create(&so, &f->server, &err) == TDM_OK);
    TDM_ASSERT(echo_register(f->server, &err) == TDM_OK);
    f->health = tdm_health_create();
    TDM_ASSERT(tdm_health_register(f->health, f->server, &err) == TDM_OK);
    TDM_ASSERT(tdm_rpc_server_start(f->server, &err) == TDM_OK);
    snprintf(f->target, sizeof(f->target), "127.0.0.1:%d", tdm_rpc_server_port(f->server));
    tdm_rpc_channel_options co = {.target = f->target, .max_message_bytes = client_max};
    TDM_ASSERT(tdm_rpc_channel_create(&co, &f->ch, &err) == TDM_OK);
}

static void fixture_stop(fixture *f)
{
    tdm_rpc_channel_destroy(f->ch);
    tdm_rpc_server_shutdown(f->server, 1000);
    tdm_rpc_server_destroy(f->server);
    tdm_health_destroy(f->health);
}

static tdm_status say(fixture *f, const Tandem__Test__EchoRequest *req,
                      Tandem__Test__EchoResponse **resp, const tdm_rpc_call_options *opt,
                      tdm_error *err)
{
    ProtobufCMessage *m = NULL;
    tdm_status st = tdm_rpc_unary(f->ch, ECHO_SAY, &req->base,
                                  &tandem__test__echo_response__descriptor, &m, opt, err);
    *resp = (Tandem__Test__EchoResponse *)m;
    return st;
}

static void free_msg(void *m)
{
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- unary ------------------------------------------------------------------------------ */

static void test_unary(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 2);
    tdm_error err;
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "hello tandem";
    Tandem__Test__EchoResponse *resp = NULL;
    tdm_rpc_metadata md[] = {{"x-test", "trace-42"}, {"x-other", "zzz"}};
    tdm_rpc_call_options opt = {.timeout_ms = 5000, .metadata = md, .n_metadata = 2};
    CHECK_ST(say(&f, &req, &resp, &opt, &err), TDM_OK, &err);
    CHECK(resp && strcmp(resp->text, "hello tandem") == 0);
    CHECK(resp && strcmp(resp->metadata, "trace-42") == 0);
    /* The handler saw a deadline at most 5 s away, and not long passed. The
     * wire's grpc-timeout may round a timeout up (to three digits of its
     * unit), so "at most" allows 1 %. */
    CHECK(resp && resp->deadline_ms > 3000 && resp->deadline_ms <= 5050);
    free_msg(resp);

    /* No deadline: the handler sees none. */
    CHECK_ST(say(&f, &req, &resp, NULL, &err), TDM_OK, &err);
    CHECK(resp && resp->deadline_ms == INT64_MAX && strcmp(resp->metadata, "") == 0);
    free_msg(resp);

    /* Handler errors map to the same code and message. */
    tdm_status codes[] = {TDM_ERR_INVALID_ARGUMENT, TDM_ERR_NOT_FOUND,
                          TDM_ERR_FAILED_PRECONDITION, TDM_ERR_UNAVAILABLE, TDM_ERR_INTERNAL,
                          TDM_ERR_RESOURCE_EXHAUSTED, TDM_ERR_PERMISSION_DENIED};
    for (size_t i = 0; i < TDM_ARRAY_LEN(codes); i++) {
        char msg[64];
        snprintf(msg, sizeof(msg), "rule %zu refused: tokenizer a != b", i);
        req.fail_code = (int32_t)codes[i];
        req.fail_message = msg;
        tdm_error_clear(&err);
        CHECK_ST(say(&f, &req, &resp, NULL, &err), codes[i], &err);
        CHECK(resp == NULL);
        CHECK(strcmp(err.msg, msg) == 0);
    }
    req.fail_code = 0;
    req.fail_message = "";

    /* Unknown methods get UNIMPLEMENTED naming the method. */
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_unary(f.ch, "/tandem.test.Echo/Nope", &req.base,
                           &tandem__test__echo_response__descriptor, &m, NULL, &err),
             TDM_ERR_UNIMPLEMENTED, &err);
    CHECK(strstr(err.msg, "/tandem.test.Echo/Nope") != NULL);
    CHECK_ST(tdm_rpc_unary(f.ch, "/other.Svc/Say", &req.base,
                           &tandem__test__echo_response__descriptor, &m, NULL, &err),
             TDM_ERR_UNIMPLEMENTED, &err);

    /* Bad metadata keys are refused before anything is sent. */
    tdm_rpc_metadata bad[] = {{"X-Upper Case", "v"}};
    tdm_rpc_call_options bopt = {.metadata = bad, .n_metadata = 1};
    CHECK_ST(say(&f, &req, &resp, &bopt, &err), TDM_ERR_INVALID_ARGUMENT, &err);
    CHECK(strstr(err.msg, "X-Upper Case") != NULL);
    fixture_stop(&f);
}

/* ---- server streaming ------------------------------------------------------------------- */

static void test_server_stream(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 2);
    tdm_error err;
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "tok";
    req.count = 50;
    tdm_rpc_stream *s = NULL;
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_REPEAT, &req.base,
                                 &tandem__test__echo_response__descriptor, NULL, &s, &err),
             TDM_OK, &err);
    int n = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_status st = tdm_rpc_stream_read(s, &m, &err);
        if (!m) {
            CHECK_ST(st, TDM_OK, &err);
            break;
        }
        Tandem__Test__EchoResponse *r = (void *)m;
        CHECK(r->index == n && strcmp(r->text, "tok") == 0);
        n++;
        free_msg(m);
    }
    CHECK(n == 50);
    /* Reading again after the end returns the same final status. */
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_OK, &err);
    CHECK(m == NULL);
    tdm_rpc_stream_destroy(s);

    /* An error after some messages: the client gets the messages, then the
     * handler's status (server-side end of a stream with an error). */
    req.count = 3;
    req.fail_code = TDM_ERR_ABORTED;
    req.fail_message = "verifier went away";
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_REPEAT, &req.base,
                                 &tandem__test__echo_response__descriptor, NULL, &s, &err),
             TDM_OK, &err);
    n = 0;
    tdm_status st;
    for (;;) {
        m = NULL;
        st = tdm_rpc_stream_read(s, &m, &err);
        if (!m)
            break;
        n++;
        free_msg(m);
    }
    CHECK(n == 3);
    CHECK_ST(st, TDM_ERR_ABORTED, &err);
    CHECK(strcmp(err.msg, "verifier went away") == 0);
    tdm_rpc_stream_destroy(s);
    fixture_stop(&f);
}

/* ---- bidi ------------------------------------------------------------------------------------ */

typedef struct writer_arg {
    tdm_rpc_stream *s;
    int n;
    int delay_ms;
    tdm_status st;
    bool close;
} writer_arg;

static void *bidi_writer(void *arg)
{
    writer_arg *w = arg;
    tdm_error err;
    char text[32];
    w->st = TDM_OK;
    for (int i = 0; i < w->n; i++) {
        Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
        snprintf(text, sizeof(text), "m%d", i);
        req.text = text;
        w->st = tdm_rpc_stream_write(w->s, &req.base, &err);
        if (w->st != TDM_OK)
            return NULL;
        if (w->delay_ms)
            sleep_ms(w->delay_ms);
    }
    if (w->close)
        w->st = tdm_rpc_stream_close_send(w->s, &err);
    return NULL;
}

static void test_bidi(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 2);
    tdm_error err;
    tdm_rpc_stream *s = NULL;
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_CHAT, NULL, &tandem__test__echo_response__descriptor,
                                 NULL, &s, &err),
             TDM_OK, &err);
    /* Writes on one thread while this one reads: both directions at once. */
    writer_arg w = {.s = s, .n = 200, .close = true};
    pthread_t t;
    pthread_create(&t, NULL, bidi_writer, &w);
    int n = 0;
    bool end_seen = false;
    tdm_status st;
    for (;;) {
        ProtobufCMessage *m = NULL;
        st = tdm_rpc_stream_read(s, &m, &err);
        if (!m)
            break;
        Tandem__Test__EchoResponse *r = (void *)m;
        char want[32];
        if (n < 200) {
            snprintf(want, sizeof(want), "m%d", n);
            CHECK(strcmp(r->text, want) == 0 && r->index == n);
        } else {
            /* After the half-close the server says "end" and finishes. */
            CHECK(n == 200 && strcmp(r->text, "end") == 0);
            end_seen = true;
        }
        n++;
        free_msg(m);
    }
    pthread_join(t, NULL);
    CHECK_ST(w.st, TDM_OK, &err);
    CHECK_ST(st, TDM_OK, &err);
    CHECK(n == 201 && end_seen);
    /* Writing after the half-close is refused locally. */
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    CHECK_ST(tdm_rpc_stream_write(s, &req.base, &err), TDM_ERR_FAILED_PRECONDITION, &err);
    tdm_rpc_stream_destroy(s);

    /* The server ends the stream with an error while the client still
     * writes: the client's reads and writes both report it. */
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_CHAT, NULL, &tandem__test__echo_response__descriptor,
                                 NULL, &s, &err),
             TDM_OK, &err);
    req.text = "a";
    CHECK_ST(tdm_rpc_stream_write(s, &req.base, &err), TDM_OK, &err);
    req.fail_code = TDM_ERR_FAILED_PRECONDITION;
    req.fail_message = "drafter block 8 > verifier max 4";
    CHECK_ST(tdm_rpc_stream_write(s, &req.base, &err), TDM_OK, &err);
    ProtobufCMessage *m = NULL;
    st = tdm_rpc_stream_read(s, &m, &err);
    if (m) { /* the echo of "a" may arrive before the status */
        free_msg(m);
        m = NULL;
        st = tdm_rpc_stream_read(s, &m, &err);
    }
    CHECK(m == NULL);
    CHECK_ST(st, TDM_ERR_FAILED_PRECONDITION, &err);
    CHECK(strcmp(err.msg, "drafter block 8 > verifier max 4") == 0);
    req.fail_code = 0;
    CHECK_ST(tdm_rpc_stream_write(s, &req.base, &err), TDM_ERR_FAILED_PRECONDITION, &err);
    tdm_rpc_stream_destroy(s);
    fixture_stop(&f);
}

/* ---- concurrency: blocking streams do not stall unary calls ------------------------------ */

typedef struct unary_arg {
    fixture *f;
    int id;
    int ok;
} unary_arg;

static void *unary_loop(void *arg)
{
    unary_arg *a = arg;
    char text[32];
    for (int i = 0; i < 40; i++) {
        tdm_error err;
        snprintf(text, sizeof(text), "t%d-%d", a->id, i);
        Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
        req.text = text;
        Tandem__Test__EchoResponse *resp = NULL;
        tdm_rpc_call_options opt = {.timeout_ms = 10000};
        if (say(a->f, &req, &resp, &opt, &err) == TDM_OK && strcmp(resp->text, text) == 0)
            a->ok++;
        free_msg(resp);
    }
    return NULL;
}

static void test_concurrent(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 2);
    tdm_error err;
    /* 20 streams that stay open (one message every 20 ms, until cancelled):
     * more blocking handlers than worker threads. */
    enum { NSTREAMS = 20, NTHREADS = 8 };
    tdm_rpc_stream *streams[NSTREAMS];
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "slow";
    req.count = -1;
    req.delay_ms = 20;
    for (int i = 0; i < NSTREAMS; i++)
        CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_REPEAT, &req.base,
                                     &tandem__test__echo_response__descriptor, NULL, &streams[i],
                                     &err),
                 TDM_OK, &err);
    for (int i = 0; i < NSTREAMS; i++) {
        ProtobufCMessage *m = NULL;
        CHECK_ST(tdm_rpc_stream_read(streams[i], &m, &err), TDM_OK, &err);
        CHECK(m != NULL);
        free_msg(m);
    }
    CHECK(atomic_load(&echo_streams_running) == NSTREAMS);
    /* Meanwhile many unary calls from several threads all succeed, fast. */
    double t0 = now_s();
    pthread_t th[NTHREADS];
    unary_arg args[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        args[i] = (unary_arg){.f = &f, .id = i};
        pthread_create(&th[i], NULL, unary_loop, &args[i]);
    }
    int ok = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
        ok += args[i].ok;
    }
    double dt = now_s() - t0;
    CHECK(ok == NTHREADS * 40);
    fprintf(stderr, "concurrent: %d unary calls in %.2f s beside %d open streams\n", ok, dt,
            NSTREAMS);
    CHECK(dt < 20.0);
    int seen = atomic_load(&echo_cancel_seen);
    for (int i = 0; i < NSTREAMS; i++)
        tdm_rpc_stream_destroy(streams[i]); /* cancels */
    CHECK(wait_atomic(&echo_cancel_seen, seen + NSTREAMS, 5000));
    fixture_stop(&f);
}

/* ---- cancellation --------------------------------------------------------------------------- */

typedef struct cancel_arg {
    tdm_rpc_stream *s;
    int after_ms;
} cancel_arg;

static void *cancel_later(void *arg)
{
    cancel_arg *c = arg;
    sleep_ms(c->after_ms);
    tdm_rpc_stream_cancel(c->s);
    return NULL;
}

static void test_cancel_client(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 2);
    tdm_error err;
    /* Server-streaming: cancel from another thread while this one reads. */
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "x";
    req.count = -1;
    req.delay_ms = 10;
    tdm_rpc_stream *s = NULL;
    int seen = atomic_load(&echo_cancel_seen);
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_REPEAT, &req.base,
                                 &tandem__test__echo_response__descriptor, NULL, &s, &err),
             TDM_OK, &err);
    cancel_arg ca = {.s = s, .after_ms = 150};
    pthread_t t;
    pthread_create(&t, NULL, cancel_later, &ca);
    int n = 0;
    tdm_status st;
    for (;;) {
        ProtobufCMessage *m = NULL;
        st = tdm_rpc_stream_read(s, &m, &err);
        if (!m)
            break;
        n++;
        free_msg(m);
    }
    pthread_join(t, NULL);
    CHECK(n > 0);
    CHECK_ST(st, TDM_ERR_CANCELLED, &err);
    CHECK(wait_atomic(&echo_cancel_seen, seen + 1, 5000)); /* the handler noticed */
    tdm_rpc_stream_destroy(s);

    /* Bidi: cancel while a writer thread writes slowly and we read. */
    seen = atomic_load(&echo_cancel_seen);
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_CHAT, NULL, &tandem__test__echo_response__descriptor,
                                 NULL, &s, &err),
             TDM_OK, &err);
    writer_arg w = {.s = s, .n = 100000, .delay_ms = 5, .close = true};
    pthread_t wt;
    pthread_create(&wt, NULL, bidi_writer, &w);
    ca.s = s;
    pthread_create(&t, NULL, cancel_later, &ca);
    n = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        st = tdm_rpc_stream_read(s, &m, &err);
        if (!m)
            break;
        n++;
        free_msg(m);
    }
    pthread_join(t, NULL);
    pthread_join(wt, NULL);
    CHECK(n > 0);
    CHECK_ST(st, TDM_ERR_CANCELLED, &err);
    CHECK_ST(w.st, TDM_ERR_CANCELLED, &err); /* the writer saw it too */
    CHECK(wait_atomic(&echo_cancel_seen, seen + 1, 5000));
    tdm_rpc_stream_destroy(s);

    /* Destroying an open stream cancels it. */
    seen = atomic_load(&echo_cancel_seen);
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_REPEAT, &req.base,
                                 &tandem__test__echo_response__descriptor, NULL, &s, &err),
             TDM_OK, &err);
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_OK, &err);
    free_msg(m);
    tdm_rpc_stream_destroy(s);
    CHECK(wait_atomic(&echo_cancel_seen, seen + 1, 5000));
    fixture_stop(&f);
}

/* ---- deadlines ------------------------------------------------------------------------------- */

static void test_deadline(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 2);
    tdm_error err;
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "late";
    req.delay_ms = 3000;
    Tandem__Test__EchoResponse *resp = NULL;
    tdm_rpc_call_options opt = {.timeout_ms = 1000};
    int seen = atomic_load(&echo_cancel_seen);
    double t0 = now_s();
    CHECK_ST(say(&f, &req, &resp, &opt, &err), TDM_ERR_DEADLINE_EXCEEDED, &err);
    double dt = now_s() - t0;
    CHECK(dt >= 0.9 && dt < 6.0);
    CHECK(wait_atomic(&echo_cancel_seen, seen + 1, 5000)); /* handler saw it */

    /* Streaming: messages flow until the deadline, then DEADLINE_EXCEEDED. */
    req.count = -1;
    req.delay_ms = 10;
    opt.timeout_ms = 1000;
    seen = atomic_load(&echo_cancel_seen);
    tdm_rpc_stream *s = NULL;
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_REPEAT, &req.base,
                                 &tandem__test__echo_response__descriptor, &opt, &s, &err),
             TDM_OK, &err);
    int n = 0;
    tdm_status st;
    t0 = now_s();
    for (;;) {
        ProtobufCMessage *m = NULL;
        st = tdm_rpc_stream_read(s, &m, &err);
        if (!m)
            break;
        n++;
        free_msg(m);
    }
    dt = now_s() - t0;
    CHECK(n > 0);
    CHECK_ST(st, TDM_ERR_DEADLINE_EXCEEDED, &err);
    CHECK(dt < 6.0);
    CHECK(wait_atomic(&echo_cancel_seen, seen + 1, 5000));
    tdm_rpc_stream_destroy(s);

    /* Bidi: a deadline with nothing sent ends the server's read. */
    seen = atomic_load(&echo_cancel_seen);
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_CHAT, NULL, &tandem__test__echo_response__descriptor,
                                 &opt, &s, &err),
             TDM_OK, &err);
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_ERR_DEADLINE_EXCEEDED, &err);
    CHECK(m == NULL);
    CHECK(wait_atomic(&echo_cancel_seen, seen + 1, 5000));
    tdm_rpc_stream_destroy(s);
    fixture_stop(&f);
}

/* ---- message size limits ------------------------------------------------------------------ */

static void test_size_limit(void)
{
    fixture f;
    /* Server accepts 1 MiB, client 4 MiB. */
    fixture_start(&f, 1 << 20, 4 << 20, 1);
    tdm_error err;
    size_t big = (size_t)2 << 20;
    uint8_t *payload = malloc(big);
    for (size_t i = 0; i < big; i++)
        payload[i] = (uint8_t)(i * 7);
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "big";
    req.payload.data = payload;
    req.payload.len = big;
    Tandem__Test__EchoResponse *resp = NULL;
    CHECK_ST(say(&f, &req, &resp, NULL, &err), TDM_ERR_RESOURCE_EXHAUSTED, &err);
    fprintf(stderr, "oversize request: %s\n", err.msg);
    /* Just under the limit works and round-trips the bytes. */
    req.payload.len = (1 << 20) - 1024;
    CHECK_ST(say(&f, &req, &resp, NULL, &err), TDM_OK, &err);
    CHECK(resp && resp->payload.len == req.payload.len &&
          memcmp(resp->payload.data, payload, req.payload.len) == 0);
    free_msg(resp);

    /* The client's limit holds too: a channel accepting 64 KiB refuses a
     * 512 KiB response. */
    tdm_rpc_channel *small = NULL;
    tdm_rpc_channel_options co = {.target = f.target, .max_message_bytes = 64 << 10};
    CHECK_ST(tdm_rpc_channel_create(&co, &small, &err), TDM_OK, &err);
    Tandem__Test__EchoRequest sreq = TANDEM__TEST__ECHO_REQUEST__INIT;
    sreq.text = "resp";
    sreq.count = 1;
    sreq.payload.data = payload;
    sreq.payload.len = 60 << 10; /* request fits... */
    tdm_rpc_stream *s = NULL;
    CHECK_ST(tdm_rpc_stream_open(small, ECHO_REPEAT, &sreq.base,
                                 &tandem__test__echo_response__descriptor, NULL, &s, &err),
             TDM_OK, &err);
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_OK, &err); /* ...and so does the echo */
    free_msg(m);
    tdm_rpc_stream_destroy(s);
    ProtobufCMessage *um = NULL;
    req.payload.len = 512 << 10;
    CHECK_ST(tdm_rpc_unary(small, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor,
                           &um, NULL, &err),
             TDM_ERR_RESOURCE_EXHAUSTED, &err);
    fprintf(stderr, "oversize (client send limit): %s\n", err.msg);
    tdm_rpc_channel_destroy(small);

    /* The server still serves afterwards. */
    req.payload.len = 10;
    CHECK_ST(say(&f, &req, &resp, NULL, &err), TDM_OK, &err);
    free_msg(resp);
    free(payload);
    fixture_stop(&f);
}

/* ---- malformed requests ----------------------------------------------------------------- */

static void test_malformed(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 2);
    tdm_error err;
    /* Bytes that are not a protobuf message: a length-delimited field running
     * past the end, an over-long varint, and a reserved wire type. */
    static const uint8_t g1[] = {0x0a, 0x7f, 'a'};
    static const uint8_t g2[] = {0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                 0xff};
    static const uint8_t g3[] = {0x0f, 0x01, 0x02};
    const struct {
        const uint8_t *p;
        size_t n;
    } garbage[] = {{g1, sizeof(g1)}, {g2, sizeof(g2)}, {g3, sizeof(g3)}};
    const struct {
        const char *path;
        const char *type;
    } unary_like[] = {{ECHO_SAY, "tandem.test.EchoRequest"},
                      {ECHO_REPEAT, "tandem.test.EchoRequest"},
                      {"/grpc.health.v1.Health/Check", "grpc.health.v1.HealthCheckRequest"},
                      {"/grpc.health.v1.Health/Watch", "grpc.health.v1.HealthCheckRequest"}};
    for (size_t i = 0; i < TDM_ARRAY_LEN(unary_like); i++) {
        for (size_t g = 0; g < TDM_ARRAY_LEN(garbage); g++) {
            void *out = NULL;
            size_t out_len = 0;
            tdm_error_clear(&err);
            tdm_status st = tdm_rpc_unary_raw(f.ch, unary_like[i].path, garbage[g].p,
                                              garbage[g].n, &out, &out_len, NULL, &err);
            CHECK_ST(st, TDM_ERR_INVALID_ARGUMENT, &err);
            CHECK(strstr(err.msg, unary_like[i].path) && strstr(err.msg, unary_like[i].type));
            free(out);
        }
    }
    fprintf(stderr, "malformed: %s\n", err.msg);
    /* Bidi: the handler's read reports the bad message; it ends the call. */
    for (size_t g = 0; g < TDM_ARRAY_LEN(garbage); g++) {
        tdm_rpc_stream *s = NULL;
        CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_CHAT, NULL,
                                     &tandem__test__echo_response__descriptor, NULL, &s, &err),
                 TDM_OK, &err);
        CHECK_ST(tdm_rpc_stream_write_raw(s, garbage[g].p, garbage[g].n, &err), TDM_OK, &err);
        ProtobufCMessage *m = NULL;
        CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_ERR_INVALID_ARGUMENT, &err);
        CHECK(strstr(err.msg, ECHO_CHAT) && strstr(err.msg, "tandem.test.EchoRequest"));
        tdm_rpc_stream_destroy(s);
    }
    /* Random bytes (a fixed seed): each either decodes or gets
     * INVALID_ARGUMENT; never anything else, and the server survives. */
    srand(12345);
    int decoded = 0, refused = 0;
    for (int i = 0; i < 300; i++) {
        uint8_t buf[64];
        size_t n = (size_t)(rand() % (int)sizeof(buf));
        for (size_t k = 0; k < n; k++)
            buf[k] = (uint8_t)rand();
        void *o = NULL;
        size_t ol = 0;
        tdm_status st = tdm_rpc_unary_raw(f.ch, ECHO_SAY, buf, n, &o, &ol, NULL, &err);
        if (st != TDM_OK && st != TDM_ERR_INVALID_ARGUMENT)
            fprintf(stderr, "random request %d (%zu bytes): status %d: %s\n", i, n, (int)st,
                    err.msg);
        CHECK(st == TDM_OK || st == TDM_ERR_INVALID_ARGUMENT);
        decoded += st == TDM_OK;
        refused += st == TDM_ERR_INVALID_ARGUMENT;
        free(o);
    }
    fprintf(stderr, "random requests: %d decoded, %d refused\n", decoded, refused);
    CHECK(refused > 0);
    /* An empty message is a valid proto3 message (all defaults). */
    void *out = NULL;
    size_t out_len = 0;
    CHECK_ST(tdm_rpc_unary_raw(f.ch, ECHO_SAY, "", 0, &out, &out_len, NULL, &err), TDM_OK, &err);
    free(out);
    /* And the server still answers valid calls. */
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "still here";
    Tandem__Test__EchoResponse *resp = NULL;
    CHECK_ST(say(&f, &req, &resp, NULL, &err), TDM_OK, &err);
    CHECK(resp && strcmp(resp->text, "still here") == 0);
    free_msg(resp);
    fixture_stop(&f);
}

/* ---- shutdown with calls in flight ---------------------------------------------------------- */

typedef struct drain_arg {
    tdm_rpc_channel *ch;
    int count;
    int delay_ms;
    int got;
    tdm_status st;
    tdm_error err;
} drain_arg;

static void *drain_reader(void *arg)
{
    drain_arg *d = arg;
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "d";
    req.count = d->count;
    req.delay_ms = d->delay_ms;
    tdm_rpc_stream *s = NULL;
    d->st = tdm_rpc_stream_open(d->ch, ECHO_REPEAT, &req.base,
                                &tandem__test__echo_response__descriptor, NULL, &s, &d->err);
    if (d->st != TDM_OK)
        return NULL;
    for (;;) {
        ProtobufCMessage *m = NULL;
        d->st = tdm_rpc_stream_read(s, &m, &d->err);
        if (!m)
            break;
        d->got++;
        free_msg(m);
    }
    tdm_rpc_stream_destroy(s);
    return NULL;
}

static void test_shutdown(void)
{
    /* Calls that end within the grace finish normally; endless ones are
     * cancelled when it runs out; shutdown returns soon after. */
    fixture f;
    fixture_start(&f, 0, 0, 2);
    drain_arg finite = {.ch = f.ch, .count = 10, .delay_ms = 40};
    drain_arg endless[3];
    pthread_t tf, te[3];
    pthread_create(&tf, NULL, drain_reader, &finite);
    for (int i = 0; i < 3; i++) {
        endless[i] = (drain_arg){.ch = f.ch, .count = -1, .delay_ms = 10};
        pthread_create(&te[i], NULL, drain_reader, &endless[i]);
    }
    CHECK(wait_atomic(&echo_streams_running, 4, 5000));
    sleep_ms(50);
    double t0 = now_s();
    tdm_rpc_server_shutdown(f.server, 1500);
    double dt = now_s() - t0;
    fprintf(stderr, "shutdown with 4 streams in flight took %.2f s (grace 1.5 s)\n", dt);
    CHECK(dt >= 1.0 && dt < 8.0);
    pthread_join(tf, NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(te[i], NULL);
    CHECK_ST(finite.st, TDM_OK, &finite.err);
    CHECK(finite.got == 10);
    for (int i = 0; i < 3; i++) {
        CHECK(endless[i].got > 0);
        CHECK(endless[i].st == TDM_ERR_CANCELLED || endless[i].st == TDM_ERR_UNAVAILABLE);
    }
    CHECK(atomic_load(&echo_streams_running) == 0);
    /* New calls are refused once the server stopped. */
    tdm_error err;
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    Tandem__Test__EchoResponse *resp = NULL;
    tdm_rpc_call_options opt = {.timeout_ms = 2000};
    CHECK_ST(say(&f, &req, &resp, &opt, &err), TDM_ERR_UNAVAILABLE, &err);
    fixture_stop(&f);

    /* With only short calls in flight, shutdown does not wait out the grace. */
    fixture_start(&f, 0, 0, 2);
    drain_arg quick = {.ch = f.ch, .count = 3, .delay_ms = 30};
    pthread_create(&tf, NULL, drain_reader, &quick);
    CHECK(wait_atomic(&echo_streams_running, 1, 5000));
    t0 = now_s();
    tdm_rpc_server_shutdown(f.server, 10000);
    dt = now_s() - t0;
    pthread_join(tf, NULL);
    CHECK_ST(quick.st, TDM_OK, &quick.err);
    CHECK(quick.got == 3);
    CHECK(dt < 6.0);
    fixture_stop(&f);

    /* A server created and destroyed without ever starting. */
    tdm_rpc_server *s = NULL;
    tdm_rpc_server_options so = {.listen = "127.0.0.1:0"};
    CHECK_ST(tdm_rpc_server_create(&so, &s, &err), TDM_OK, &err);
    tdm_rpc_server_destroy(s);

    /* A bad listen address is an error naming it. */
    so.listen = "not-an-address:99999";
    CHECK(tdm_rpc_server_create(&so, &s, &err) != TDM_OK);
    CHECK(strstr(err.msg, "not-an-address:99999") != NULL);
}

/* ---- health --------------------------------------------------------------------------------- */

static tdm_status check(tdm_rpc_channel *ch, const char *service, int *status, tdm_error *err)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    ProtobufCMessage *m = NULL;
    tdm_rpc_call_options opt = {.timeout_ms = 5000};
    tdm_status st = tdm_rpc_unary(ch, "/grpc.health.v1.Health/Check", &req.base,
                                  &grpc__health__v1__health_check_response__descriptor, &m, &opt,
                                  err);
    *status = -1;
    if (st == TDM_OK)
        *status = ((Grpc__Health__V1__HealthCheckResponse *)m)->status;
    free_msg(m);
    return st;
}

static int watch_next(tdm_rpc_stream *s, tdm_status *st, tdm_error *err)
{
    ProtobufCMessage *m = NULL;
    *st = tdm_rpc_stream_read(s, &m, err);
    int v = m ? (int)((Grpc__Health__V1__HealthCheckResponse *)m)->status : -1;
    free_msg(m);
    return v;
}

static tdm_rpc_stream *watch(tdm_rpc_channel *ch, const char *service)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    tdm_rpc_stream *s = NULL;
    tdm_error err;
    TDM_ASSERT(tdm_rpc_stream_open(ch, "/grpc.health.v1.Health/Watch", &req.base,
                                   &grpc__health__v1__health_check_response__descriptor, NULL, &s,
                                   &err) == TDM_OK);
    return s;
}

enum { SERVING = 1, NOT_SERVING = 2, SERVICE_UNKNOWN = 3 };

static void test_health(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 2);
    tdm_error err;
    CHECK_ST(tdm_health_add_service(f.health, "tandem.v1.Gateway", &err), TDM_OK, &err);
    tdm_rpc_server *hs = NULL;
    CHECK_ST(tdm_health_server_start(f.health, "127.0.0.1:0", &hs, &err), TDM_OK, &err);
    char htarget[64];
    snprintf(htarget, sizeof(htarget), "127.0.0.1:%d", tdm_rpc_server_port(hs));
    CHECK(tdm_rpc_server_port(hs) != tdm_rpc_server_port(f.server));
    tdm_rpc_channel *hch = NULL;
    tdm_rpc_channel_options co = {.target = htarget};
    CHECK_ST(tdm_rpc_channel_create(&co, &hch, &err), TDM_OK, &err);

    int v;
    /* NOT_SERVING until ready, on both ports. */
    CHECK_ST(check(f.ch, "", &v, &err), TDM_OK, &err);
    CHECK(v == NOT_SERVING);
    CHECK_ST(check(hch, "tandem.v1.Gateway", &v, &err), TDM_OK, &err);
    CHECK(v == NOT_SERVING);
    CHECK_ST(check(f.ch, "no.such.Service", &v, &err), TDM_ERR_NOT_FOUND, &err);
    CHECK(strstr(err.msg, "no.such.Service") != NULL);
    CHECK_ST(check(hch, "no.such.Service", &v, &err), TDM_ERR_NOT_FOUND, &err);
    CHECK_ST(tdm_health_set(f.health, "no.such.Service", true, &err), TDM_ERR_NOT_FOUND, &err);

    /* Watches: current status at once, then each change. */
    tdm_rpc_stream *w_all = watch(f.ch, "");
    tdm_rpc_stream *w_gw = watch(hch, "tandem.v1.Gateway");
    tdm_rpc_stream *w_unknown = watch(f.ch, "no.such.Service");
    tdm_status st;
    CHECK(watch_next(w_all, &st, &err) == NOT_SERVING);
    CHECK(watch_next(w_gw, &st, &err) == NOT_SERVING);
    CHECK(watch_next(w_unknown, &st, &err) == SERVICE_UNKNOWN);

    CHECK_ST(tdm_health_set(f.health, "tandem.v1.Gateway", true, &err), TDM_OK, &err);
    CHECK(watch_next(w_gw, &st, &err) == SERVING);
    CHECK_ST(check(f.ch, "tandem.v1.Gateway", &v, &err), TDM_OK, &err);
    CHECK(v == SERVING);
    CHECK_ST(check(f.ch, "", &v, &err), TDM_OK, &err);
    CHECK(v == NOT_SERVING); /* only the one service changed */
    tdm_health_set_all(f.health, true);
    CHECK(watch_next(w_all, &st, &err) == SERVING);
    CHECK_ST(check(hch, "", &v, &err), TDM_OK, &err);
    CHECK(v == SERVING);
    tdm_health_set_all(f.health, false);
    CHECK(watch_next(w_all, &st, &err) == NOT_SERVING);
    CHECK(watch_next(w_gw, &st, &err) == NOT_SERVING);
    tdm_health_set_all(f.health, true);
    CHECK(watch_next(w_all, &st, &err) == SERVING);
    CHECK(watch_next(w_gw, &st, &err) == SERVING);

    /* A service registered later becomes known to a watcher of its name. */
    tdm_health_add_service(f.health, "no.such.Service", NULL);
    CHECK(watch_next(w_unknown, &st, &err) == NOT_SERVING);

    /* The health port serves nothing but Health. */
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_unary(hch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           NULL, &err),
             TDM_ERR_UNIMPLEMENTED, &err);

    /* A cancelled watch ends (its handler returns). */
    tdm_rpc_stream_cancel(w_unknown);
    CHECK(watch_next(w_unknown, &st, &err) == -1);
    CHECK_ST(st, TDM_ERR_CANCELLED, &err);
    tdm_rpc_stream_destroy(w_unknown);

    /* Shutdown of the main server drains: watchers get NOT_SERVING and their
     * streams end; the health port keeps answering NOT_SERVING. */
    double t0 = now_s();
    tdm_rpc_server_shutdown(f.server, 5000);
    CHECK(now_s() - t0 < 3.0); /* watches do not hold shutdown for the grace */
    CHECK(watch_next(w_all, &st, &err) == NOT_SERVING);
    CHECK(watch_next(w_all, &st, &err) == -1);
    CHECK(st == TDM_OK || st == TDM_ERR_UNAVAILABLE || st == TDM_ERR_CANCELLED);
    CHECK(watch_next(w_gw, &st, &err) == NOT_SERVING);
    CHECK(watch_next(w_gw, &st, &err) == -1);
    CHECK_ST(st, TDM_OK, &err);
    CHECK_ST(check(hch, "", &v, &err), TDM_OK, &err);
    CHECK(v == NOT_SERVING);
    tdm_health_set_all(f.health, true); /* ignored once drained */
    CHECK_ST(check(hch, "tandem.v1.Gateway", &v, &err), TDM_OK, &err);
    CHECK(v == NOT_SERVING);
    tdm_rpc_stream_destroy(w_all);
    tdm_rpc_stream_destroy(w_gw);
    tdm_rpc_channel_destroy(hch);
    tdm_rpc_server_shutdown(hs, 1000);
    tdm_rpc_server_destroy(hs);
    fixture_stop(&f);
}

/* ---- TLS ----------------------------------------------------------------------------------- */

static int run_cmd(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    return rc;
}

static void test_tls(void)
{
    char dir[] = "/tmp/tandem-rpc-tls-XXXXXX";
    TDM_ASSERT(mkdtemp(dir));
    char cmd[2048], cert[256], key[256], ccert[256], ckey[256];
    snprintf(cert, sizeof(cert), "%s/server.pem", dir);
    snprintf(key, sizeof(key), "%s/server.key", dir);
    snprintf(ccert, sizeof(ccert), "%s/client.pem", dir);
    snprintf(ckey, sizeof(ckey), "%s/client.key", dir);
    const char *gen = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                      "-nodes -days 1 -keyout %s -out %s -subj /CN=%s "
                      "-addext subjectAltName=%s 2>/dev/null";
    snprintf(cmd, sizeof(cmd), gen, key, cert, "localhost", "DNS:localhost,IP:127.0.0.1");
    if (run_cmd(cmd) != 0) {
        failures++;
        return;
    }
    snprintf(cmd, sizeof(cmd), gen, ckey, ccert, "tandem-client", "DNS:tandem-client");
    if (run_cmd(cmd) != 0) {
        failures++;
        return;
    }
    tdm_error err;
    /* Server with TLS, client certificates verified against the client's
     * self-signed cert. */
    tdm_rpc_tls stls = {.cert_path = cert, .key_path = key, .ca_path = ccert,
                        .require_client_cert = true};
    tdm_rpc_server *s = NULL;
    tdm_rpc_server_options so = {.listen = "127.0.0.1:0", .tls = &stls, .name = "tls"};
    CHECK_ST(tdm_rpc_server_create(&so, &s, &err), TDM_OK, &err);
    CHECK_ST(echo_register(s, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_server_start(s, &err), TDM_OK, &err);
    char target[64];
    snprintf(target, sizeof(target), "localhost:%d", tdm_rpc_server_port(s));
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "secret";
    tdm_rpc_call_options opt = {.timeout_ms = 3000};

    /* mTLS round trip. */
    tdm_rpc_tls ctls = {.ca_path = cert, .cert_path = ccert, .key_path = ckey};
    tdm_rpc_channel *ch = NULL;
    tdm_rpc_channel_options co = {.target = target, .tls = &ctls};
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           &opt, &err),
             TDM_OK, &err);
    CHECK(m && strcmp(((Tandem__Test__EchoResponse *)m)->text, "secret") == 0);
    free_msg(m);
    m = NULL;
    tdm_rpc_channel_destroy(ch);

    /* Name override: connect by IP, verify the name "localhost". */
    snprintf(target, sizeof(target), "127.0.0.1:%d", tdm_rpc_server_port(s));
    ctls.server_name = "localhost";
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           &opt, &err),
             TDM_OK, &err);
    free_msg(m);
    m = NULL;
    tdm_rpc_channel_destroy(ch);
    snprintf(target, sizeof(target), "localhost:%d", tdm_rpc_server_port(s));
    ctls.server_name = NULL;

    /* Without a client certificate the server refuses. */
    tdm_rpc_tls nocert = {.ca_path = cert};
    co.tls = &nocert;
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           &opt, &err),
             TDM_ERR_UNAVAILABLE, &err);
    tdm_rpc_channel_destroy(ch);

    /* A client that trusts another CA refuses the server. */
    tdm_rpc_tls wrong_ca = {.ca_path = ccert, .cert_path = ccert, .key_path = ckey};
    co.tls = &wrong_ca;
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           &opt, &err),
             TDM_ERR_UNAVAILABLE, &err);
    tdm_rpc_channel_destroy(ch);

    /* A plaintext client cannot talk to the TLS port. */
    co.tls = NULL;
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           &opt, &err),
             TDM_ERR_UNAVAILABLE, &err);
    tdm_rpc_channel_destroy(ch);
    tdm_rpc_server_shutdown(s, 1000);
    tdm_rpc_server_destroy(s);

    /* Server-only TLS (no client certificates): a client with just the CA. */
    tdm_rpc_tls stls1 = {.cert_path = cert, .key_path = key};
    so.tls = &stls1;
    CHECK_ST(tdm_rpc_server_create(&so, &s, &err), TDM_OK, &err);
    CHECK_ST(echo_register(s, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_server_start(s, &err), TDM_OK, &err);
    snprintf(target, sizeof(target), "localhost:%d", tdm_rpc_server_port(s));
    co.tls = &nocert;
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           &opt, &err),
             TDM_OK, &err);
    free_msg(m);
    tdm_rpc_channel_destroy(ch);
    tdm_rpc_server_shutdown(s, 1000);
    tdm_rpc_server_destroy(s);

    /* Configuration errors name the file or setting. */
    tdm_rpc_tls missing = {.cert_path = "/nonexistent/cert.pem", .key_path = key};
    so.tls = &missing;
    CHECK(tdm_rpc_server_create(&so, &s, &err) == TDM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.msg, "/nonexistent/cert.pem") != NULL);
    tdm_rpc_tls nokey = {.cert_path = cert};
    so.tls = &nokey;
    CHECK(tdm_rpc_server_create(&so, &s, &err) == TDM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.msg, "key") != NULL);
    tdm_rpc_tls mtls_noca = {.cert_path = cert, .key_path = key, .require_client_cert = true};
    so.tls = &mtls_noca;
    CHECK(tdm_rpc_server_create(&so, &s, &err) == TDM_ERR_INVALID_ARGUMENT);
    co.tls = &missing;
    CHECK(tdm_rpc_channel_create(&co, &ch, &err) == TDM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.msg, "/nonexistent/cert.pem") != NULL);

    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    run_cmd(cmd);
}

/* ---- propagation of deadline and cancellation (gateway -> verifier) ------------------------ */

/* On server A, relays to server B (user = channel to B) as a child call. */
static tdm_status relay_say(tdm_rpc_call *call, const ProtobufCMessage *req,
                            ProtobufCMessage **resp, tdm_error *err, void *user)
{
    tdm_rpc_call_options opt = {.parent = call}; /* no own deadline: the parent's applies */
    ProtobufCMessage *m = NULL;
    tdm_status st = tdm_rpc_unary(user, ECHO_SAY, req, &tandem__test__echo_response__descriptor,
                                  &m, &opt, err);
    if (st != TDM_OK)
        return st;
    tdm_rpc_call_defer(call, free_msg, m);
    *resp = m;
    return TDM_OK;
}

/* Counts B's messages without forwarding any: only propagation can tell B
 * that the client went away. */
static tdm_status relay_count(tdm_rpc_call *call, const ProtobufCMessage *req, tdm_error *err,
                              void *user)
{
    tdm_rpc_call_options opt = {.parent = call};
    tdm_rpc_stream *s = NULL;
    tdm_status st = tdm_rpc_stream_open(user, ECHO_REPEAT, req,
                                        &tandem__test__echo_response__descriptor, &opt, &s, err);
    if (st != TDM_OK)
        return st;
    int n = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        st = tdm_rpc_stream_read(s, &m, err);
        if (!m)
            break;
        n++;
        free_msg(m);
    }
    tdm_rpc_stream_destroy(s);
    if (st != TDM_OK)
        return st;
    Tandem__Test__EchoResponse out = TANDEM__TEST__ECHO_RESPONSE__INIT;
    out.text = "counted";
    out.index = n;
    return tdm_rpc_call_write(call, &out.base, err);
}

static void test_propagation(void)
{
    fixture b;
    fixture_start(&b, 0, 0, 2);
    tdm_error err;
    tdm_rpc_server *a = NULL;
    tdm_rpc_server_options so = {.listen = "127.0.0.1:0", .name = "relay"};
    CHECK_ST(tdm_rpc_server_create(&so, &a, &err), TDM_OK, &err);
    const ProtobufCMessageDescriptor *d = &tandem__test__echo_request__descriptor;
    CHECK_ST(tdm_rpc_server_add_unary(a, "/tandem.test.Relay/Say", d, relay_say, b.ch, &err),
             TDM_OK, &err);
    CHECK_ST(tdm_rpc_server_add_server_stream(a, "/tandem.test.Relay/Count", d, relay_count, b.ch,
                                              &err),
             TDM_OK, &err);
    CHECK_ST(tdm_rpc_server_start(a, &err), TDM_OK, &err);
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", tdm_rpc_server_port(a));
    tdm_rpc_channel *ch = NULL;
    tdm_rpc_channel_options co = {.target = target};
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);

    /* The client's 2 s deadline reaches B through A. */
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "via A";
    tdm_rpc_call_options opt = {.timeout_ms = 2000};
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_unary(ch, "/tandem.test.Relay/Say", &req.base,
                           &tandem__test__echo_response__descriptor, &m, &opt, &err),
             TDM_OK, &err);
    Tandem__Test__EchoResponse *r = (void *)m;
    CHECK(r && strcmp(r->text, "via A") == 0);
    /* B saw a deadline, and not a later one than the client's (how much of it
     * is left depends on the machine's load), but for the grpc-timeout
     * header's rounding up, up to 1 % at each of the two hops. */
    CHECK(r && r->deadline_ms > 0 && r->deadline_ms <= 2040);
    free_msg(m);
    m = NULL;
    /* B's error comes back through A unchanged. */
    req.fail_code = TDM_ERR_OUT_OF_RANGE;
    req.fail_message = "position 9 past the end";
    CHECK_ST(tdm_rpc_unary(ch, "/tandem.test.Relay/Say", &req.base,
                           &tandem__test__echo_response__descriptor, &m, &opt, &err),
             TDM_ERR_OUT_OF_RANGE, &err);
    CHECK(strcmp(err.msg, "position 9 past the end") == 0);
    req.fail_code = 0;

    /* A deadline expiring while B works: both the client and B see it. */
    int seen = atomic_load(&echo_cancel_seen);
    req.delay_ms = 3000;
    opt.timeout_ms = 1000;
    CHECK_ST(tdm_rpc_unary(ch, "/tandem.test.Relay/Say", &req.base,
                           &tandem__test__echo_response__descriptor, &m, &opt, &err),
             TDM_ERR_DEADLINE_EXCEEDED, &err);
    CHECK(wait_atomic(&echo_cancel_seen, seen + 1, 5000));

    /* Client cancellation of A's stream cancels B's stream. */
    seen = atomic_load(&echo_cancel_seen);
    req.count = -1;
    req.delay_ms = 10;
    tdm_rpc_stream *s = NULL;
    CHECK_ST(tdm_rpc_stream_open(ch, "/tandem.test.Relay/Count", &req.base,
                                 &tandem__test__echo_response__descriptor, NULL, &s, &err),
             TDM_OK, &err);
    CHECK(wait_atomic(&echo_streams_running, 1, 5000));
    sleep_ms(100);
    tdm_rpc_stream_cancel(s);
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_ERR_CANCELLED, &err);
    CHECK(wait_atomic(&echo_cancel_seen, seen + 1, 5000));
    tdm_rpc_stream_destroy(s);
    /* A finite stream through A completes with B's count. */
    req.count = 7;
    req.delay_ms = 0;
    CHECK_ST(tdm_rpc_stream_open(ch, "/tandem.test.Relay/Count", &req.base,
                                 &tandem__test__echo_response__descriptor, NULL, &s, &err),
             TDM_OK, &err);
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_OK, &err);
    CHECK(m && ((Tandem__Test__EchoResponse *)m)->index == 7);
    free_msg(m);
    m = NULL;
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_OK, &err);
    CHECK(m == NULL);
    tdm_rpc_stream_destroy(s);

    tdm_rpc_channel_destroy(ch);
    tdm_rpc_server_shutdown(a, 1000);
    tdm_rpc_server_destroy(a);
    fixture_stop(&b);
}

static void test_max_streams(void)
{
    tdm_error err;
    tdm_rpc_server *s = NULL;
    tdm_rpc_server_options so = {.listen = "127.0.0.1:0", .max_streams = 2};
    CHECK_ST(tdm_rpc_server_create(&so, &s, &err), TDM_OK, &err);
    CHECK_ST(echo_register(s, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_server_start(s, &err), TDM_OK, &err);
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", tdm_rpc_server_port(s));
    tdm_rpc_channel *ch = NULL;
    tdm_rpc_channel_options co = {.target = target};
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.count = -1;
    req.delay_ms = 10;
    tdm_rpc_stream *st[3];
    ProtobufCMessage *m = NULL;
    for (int i = 0; i < 2; i++) {
        CHECK_ST(tdm_rpc_stream_open(ch, ECHO_REPEAT, &req.base,
                                     &tandem__test__echo_response__descriptor, NULL, &st[i], &err),
                 TDM_OK, &err);
        CHECK_ST(tdm_rpc_stream_read(st[i], &m, &err), TDM_OK, &err);
        free_msg(m);
        m = NULL;
    }
    CHECK_ST(tdm_rpc_stream_open(ch, ECHO_CHAT, NULL, &tandem__test__echo_response__descriptor,
                                 NULL, &st[2], &err),
             TDM_OK, &err);
    CHECK_ST(tdm_rpc_stream_read(st[2], &m, &err), TDM_ERR_RESOURCE_EXHAUSTED, &err);
    CHECK(strstr(err.msg, "max_streams 2") != NULL);
    tdm_rpc_stream_destroy(st[2]);
    /* Unary calls are not streams: still served. */
    Tandem__Test__EchoRequest sreq = TANDEM__TEST__ECHO_REQUEST__INIT;
    sreq.text = "u";
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &sreq.base, &tandem__test__echo_response__descriptor, &m,
                           NULL, &err),
             TDM_OK, &err);
    free_msg(m);
    m = NULL;
    /* A slot frees when a stream ends. */
    tdm_rpc_stream_destroy(st[0]);
    bool ok = false;
    for (int tries = 0; tries < 100 && !ok; tries++) {
        CHECK_ST(tdm_rpc_stream_open(ch, ECHO_REPEAT, &req.base,
                                     &tandem__test__echo_response__descriptor, NULL, &st[0], &err),
                 TDM_OK, &err);
        ok = tdm_rpc_stream_read(st[0], &m, &err) == TDM_OK;
        free_msg(m);
        m = NULL;
        if (!ok) {
            tdm_rpc_stream_destroy(st[0]);
            sleep_ms(20);
        }
    }
    CHECK(ok);
    tdm_rpc_stream_destroy(st[0]);
    tdm_rpc_stream_destroy(st[1]);
    tdm_rpc_channel_destroy(ch);
    tdm_rpc_server_shutdown(s, 1000);
    tdm_rpc_server_destroy(s);
}

/* ---- wait_for_ready ------------------------------------------------------------------------- */

typedef struct later_server {
    char listen[64];
    tdm_rpc_server *s;
} later_server;

static void *start_later(void *arg)
{
    later_server *l = arg;
    sleep_ms(300);
    tdm_error err;
    tdm_rpc_server_options so = {.listen = l->listen};
    if (tdm_rpc_server_create(&so, &l->s, &err) != TDM_OK || echo_register(l->s, &err) != TDM_OK ||
        tdm_rpc_server_start(l->s, &err) != TDM_OK)
        fprintf(stderr, "start_later: %s\n", err.msg);
    return NULL;
}

static void test_wait_for_ready(void)
{
    /* Find a free port, then leave it free. */
    tdm_error err;
    tdm_rpc_server *s = NULL;
    tdm_rpc_server_options so = {.listen = "127.0.0.1:0"};
    CHECK_ST(tdm_rpc_server_create(&so, &s, &err), TDM_OK, &err);
    int port = tdm_rpc_server_port(s);
    tdm_rpc_server_destroy(s);
    later_server l = {.s = NULL};
    snprintf(l.listen, sizeof(l.listen), "127.0.0.1:%d", port);
    tdm_rpc_channel *ch = NULL;
    tdm_rpc_channel_options co = {.target = l.listen};
    CHECK_ST(tdm_rpc_channel_create(&co, &ch, &err), TDM_OK, &err);
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "early";
    ProtobufCMessage *m = NULL;
    /* Nobody listens: UNAVAILABLE at once by default... */
    tdm_rpc_call_options opt = {.timeout_ms = 5000};
    double t0 = now_s();
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           &opt, &err),
             TDM_ERR_UNAVAILABLE, &err);
    CHECK(now_s() - t0 < 4.0);
    /* ...while wait_for_ready waits for the server that starts later. */
    pthread_t t;
    pthread_create(&t, NULL, start_later, &l);
    opt.wait_for_ready = true;
    opt.timeout_ms = 10000;
    CHECK_ST(tdm_rpc_unary(ch, ECHO_SAY, &req.base, &tandem__test__echo_response__descriptor, &m,
                           &opt, &err),
             TDM_OK, &err);
    CHECK(m && strcmp(((Tandem__Test__EchoResponse *)m)->text, "early") == 0);
    free_msg(m);
    pthread_join(t, NULL);
    tdm_rpc_channel_destroy(ch);
    if (l.s)
        tdm_rpc_server_destroy(l.s);
}

/* ---- busy polling ---------------------------------------------------------------------- */

/* How often this thread went to sleep so far. */
static long thread_sleeps(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_nvcsw;
}

/* With busy polling on, a client's wait for a stream's next message polls
 * without sleeping: gRPC rounds a poll's deadline up to the next
 * millisecond, so a poll "until now" would let epoll_wait sleep up to 1 ms
 * each time, and a wait of 30 ms would sleep some 30 times. */
static void test_busy_poll(void)
{
    fixture f;
    fixture_start(&f, 0, 0, 1);
    tdm_busy_poll_set(2000000); /* 2 s: the whole wait polls */
    tdm_error err;
    tdm_rpc_stream *s = NULL;
    CHECK_ST(tdm_rpc_stream_open(f.ch, ECHO_CHAT, NULL, &tandem__test__echo_response__descriptor,
                                 NULL, &s, &err),
             TDM_OK, &err);
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "warm";
    req.delay_ms = 0;
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_stream_write(s, &req.base, &err), TDM_OK, &err);
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_OK, &err);
    free_msg(m);
    m = NULL;
    req.text = "late";
    req.delay_ms = 30; /* the server waits before it answers */
    /* Timed from before the write: the server's pause starts once it has the
     * message, which may be before this thread, descheduled, returns from the
     * write. */
    const double t0 = now_s();
    CHECK_ST(tdm_rpc_stream_write(s, &req.base, &err), TDM_OK, &err);
    const long before = thread_sleeps();
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_OK, &err);
    const double waited = now_s() - t0;
    const long slept = thread_sleeps() - before;
    CHECK(m && strcmp(((Tandem__Test__EchoResponse *)m)->text, "late") == 0);
    free_msg(m);
    /* The wait lasted (the server's pause), and this thread stayed awake
     * through it: a few sleeps on locks that gRPC's own threads hold are
     * allowed, not one per millisecond. */
    CHECK(waited >= 0.025);
    if (slept > 5)
        fprintf(stderr, "busy_poll: the read slept %ld times in %.1f ms\n", slept, waited * 1e3);
    CHECK(slept <= 5);
    tdm_busy_poll_set(0);
    CHECK_ST(tdm_rpc_stream_close_send(s, &err), TDM_OK, &err);
    tdm_rpc_stream_destroy(s);
    fixture_stop(&f);
}

/* CPU time (clock ticks) of this process's thread named `name`; -1 when
 * there is none. */
static long thread_ticks(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    long ticks = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && ticks < 0) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], comm[64] = "", stat[1024];
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (!fgets(comm, sizeof(comm), f))
            comm[0] = 0;
        fclose(f);
        comm[strcspn(comm, "\n")] = 0;
        if (strcmp(comm, name) != 0)
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
        f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(stat, 1, sizeof(stat) - 1, f);
        fclose(f);
        stat[n] = 0;
        /* after "(comm) ": state is field 3, utime 14, stime 15 */
        const char *p = strrchr(stat, ')');
        unsigned long ut = 0, st = 0;
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
            ticks = (long)(ut + st);
    }
    closedir(d);
    return ticks;
}

/* The CPU time a server's worker spends while a client's read on this
 * thread polls (busy polling 100 ms), its own calls quiet for longer. */
static long worker_ticks_during_wait(bool poll_workers)
{
    tdm_error err;
    tdm_rpc_server *srv = NULL;
    tdm_rpc_server_options so = {
        .listen = "127.0.0.1:0", .name = "test", .busy_poll_workers = poll_workers};
    TDM_ASSERT(tdm_rpc_server_create(&so, &srv, &err) == TDM_OK);
    TDM_ASSERT(echo_register(srv, &err) == TDM_OK);
    TDM_ASSERT(tdm_rpc_server_start(srv, &err) == TDM_OK);
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", tdm_rpc_server_port(srv));
    tdm_rpc_channel *ch = NULL;
    tdm_rpc_channel_options co = {.target = target};
    TDM_ASSERT(tdm_rpc_channel_create(&co, &ch, &err) == TDM_OK);
    tdm_rpc_stream *s = NULL;
    CHECK_ST(tdm_rpc_stream_open(ch, ECHO_CHAT, NULL, &tandem__test__echo_response__descriptor,
                                 NULL, &s, &err),
             TDM_OK, &err);
    Tandem__Test__EchoRequest req = TANDEM__TEST__ECHO_REQUEST__INIT;
    req.text = "late";
    req.delay_ms = 400;
    CHECK_ST(tdm_rpc_stream_write(s, &req.base, &err), TDM_OK, &err);
    sleep_ms(150); /* the worker's last event is older than the busy-poll time */
    const long before = thread_ticks("rpc-worker");
    ProtobufCMessage *m = NULL;
    CHECK_ST(tdm_rpc_stream_read(s, &m, &err), TDM_OK, &err);
    const long after = thread_ticks("rpc-worker");
    free_msg(m);
    CHECK_ST(tdm_rpc_stream_close_send(s, &err), TDM_OK, &err);
    tdm_rpc_stream_destroy(s);
    tdm_rpc_channel_destroy(ch);
    tdm_rpc_server_shutdown(srv, 1000);
    tdm_rpc_server_destroy(srv);
    CHECK(before >= 0 && after >= before);
    return after - before;
}

/* A server whose workers poll while the process's waits poll (a
 * verifier's, busy_poll_workers) keeps its one worker polling while a
 * client's read of this process polls, though the worker's own calls are
 * quiet: asleep in epoll, it would hold gRPC's one poller role of the
 * process and the read's message would wait for its wake-up. A server
 * without it lets its worker sleep. */
static void test_busy_poll_workers(void)
{
    tdm_busy_poll_set(100000); /* before the servers: one worker each */
    const long hz = sysconf(_SC_CLK_TCK);
    const long polling = worker_ticks_during_wait(true);
    const long sleeping = worker_ticks_during_wait(false);
    tdm_busy_poll_set(0);
    fprintf(stderr, "busy_poll_workers: worker CPU while a read polls 100 ms: %ld ticks polling, "
                    "%ld asleep (%ld ticks/s)\n",
            polling, sleeping, hz);
    CHECK(polling >= hz * 100 / 1000 / 4); /* a quarter of the polled wait, on a busy host */
    CHECK(sleeping <= 2);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"unary", test_unary},
        {"server_stream", test_server_stream},
        {"bidi", test_bidi},
        {"concurrent", test_concurrent},
        {"cancel_client", test_cancel_client},
        {"deadline", test_deadline},
        {"size_limit", test_size_limit},
        {"malformed", test_malformed},
        {"shutdown", test_shutdown},
        {"health", test_health},
        {"tls", test_tls},
        {"propagation", test_propagation},
        {"max_streams", test_max_streams},
        {"wait_for_ready", test_wait_for_ready},
        {"busy_poll", test_busy_poll},  {"busy_poll_workers", test_busy_poll_workers},
    };
    if (argc != 2) {
        fprintf(stderr, "usage: rpc_test NAME\n");
        return 2;
    }
    for (size_t i = 0; i < TDM_ARRAY_LEN(tests); i++) {
        if (strcmp(argv[1], tests[i].name) == 0) {
            tests[i].fn();
            if (failures)
                fprintf(stderr, "rpc_test %s: %d check(s) failed\n", argv[1], failures);
            return failures ? 1 : 0;
        }
    }
    fprintf(stderr, "rpc_test: unknown test '%s'\n", argv[1]);
    return 2;
}
