/*
 * rpc_bench.c - overhead of the gRPC layer over loopback: unary round trips,
 * bidi ping-pong (the shape of a drafter<->verifier round), server-stream
 * throughput and concurrent unary calls. Small messages, so the numbers are
 * the layer's and the transport's cost, not serialisation of big payloads.
 *   bench_rpc_bench [--iters N]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "bench_util.h"
#include "rpc.h"

#define REQ_DESC (&grpc__health__v1__health_check_request__descriptor)
#define RESP_DESC (&grpc__health__v1__health_check_response__descriptor)

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void report(const char *what, double *us, int n)
{
    bench_sort(us, n);
    printf("%-28s n=%-6d median %7.1f us   p99 %7.1f us\n", what, n, us[n / 2],
           us[(int)(n * 0.99)]);
}

static tdm_status ping(tdm_rpc_call *call, const ProtobufCMessage *req, ProtobufCMessage **resp,
                       tdm_error *err, void *user)
{
    (void)req;
    (void)err;
    (void)user;
    Grpc__Health__V1__HealthCheckResponse *r = tdm_rpc_call_alloc(call, sizeof(*r));
    grpc__health__v1__health_check_response__init(r);
    r->status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    *resp = &r->base;
    return TDM_OK;
}

static tdm_status pingpong(tdm_rpc_call *call, tdm_error *err, void *user)
{
    (void)user;
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_status st = tdm_rpc_call_read(call, &m, err);
        if (st != TDM_OK || !m)
            return st;
        protobuf_c_message_free_unpacked(m, NULL);
        if ((st = tdm_rpc_call_write(call, &r.base, err)) != TDM_OK)
            return st;
    }
}

static tdm_status flood(tdm_rpc_call *call, const ProtobufCMessage *req, tdm_error *err, void *user)
{
    const Grpc__Health__V1__HealthCheckRequest *q = (const void *)req;
    (void)user;
    int n = atoi(q->service);
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    for (int i = 0; i < n; i++) {
        tdm_status st = tdm_rpc_call_write(call, &r.base, err);
        if (st != TDM_OK)
            return st;
    }
    return TDM_OK;
}

typedef struct worker {
    tdm_rpc_channel *ch;
    int n;
    int ok;
} worker;

static void *unary_worker(void *arg)
{
    worker *w = arg;
    Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    for (int i = 0; i < w->n; i++) {
        ProtobufCMessage *m = NULL;
        tdm_error err;
        if (tdm_rpc_unary(w->ch, "/bench.B/Ping", &q.base, RESP_DESC, &m, NULL, &err) == TDM_OK)
            w->ok++;
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int iters = 2000;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
    tdm_error err;
    tdm_rpc_server *s = NULL;
    tdm_rpc_server_options so = {.listen = "127.0.0.1:0", .name = "bench"};
    if (tdm_rpc_server_create(&so, &s, &err) != TDM_OK ||
        tdm_rpc_server_add_unary(s, "/bench.B/Ping", REQ_DESC, ping, NULL, &err) != TDM_OK ||
        tdm_rpc_server_add_bidi(s, "/bench.B/PingPong", REQ_DESC, pingpong, NULL, &err) != TDM_OK ||
        tdm_rpc_server_add_server_stream(s, "/bench.B/Flood", REQ_DESC, flood, NULL, &err) !=
            TDM_OK ||
        tdm_rpc_server_start(s, &err) != TDM_OK) {
        fprintf(stderr, "rpc_bench: %s\n", err.msg);
        return 1;
    }
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", tdm_rpc_server_port(s));
    tdm_rpc_channel *ch = NULL;
    tdm_rpc_channel_options co = {.target = target};
    if (tdm_rpc_channel_create(&co, &ch, &err) != TDM_OK) {
        fprintf(stderr, "rpc_bench: %s\n", err.msg);
        return 1;
    }
    double *us = calloc((size_t)iters, sizeof(*us));
    Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;

    /* Unary round trips (after a warm-up that connects). */
    for (int i = 0; i < 100 + iters; i++) {
        ProtobufCMessage *m = NULL;
        double t0 = now_us();
        if (tdm_rpc_unary(ch, "/bench.B/Ping", &q.base, RESP_DESC, &m, NULL, &err) != TDM_OK) {
            fprintf(stderr, "rpc_bench: unary: %s\n", err.msg);
            return 1;
        }
        if (i >= 100)
            us[i - 100] = now_us() - t0;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    report("unary round trip", us, iters);

    /* Bidi ping-pong on one stream. */
    tdm_rpc_stream *st = NULL;
    if (tdm_rpc_stream_open(ch, "/bench.B/PingPong", NULL, RESP_DESC, NULL, &st, &err) != TDM_OK)
        return 1;
    for (int i = 0; i < 100 + iters; i++) {
        ProtobufCMessage *m = NULL;
        double t0 = now_us();
        if (tdm_rpc_stream_write(st, &q.base, &err) != TDM_OK ||
            tdm_rpc_stream_read(st, &m, &err) != TDM_OK || !m) {
            fprintf(stderr, "rpc_bench: pingpong: %s\n", err.msg);
            return 1;
        }
        if (i >= 100)
            us[i - 100] = now_us() - t0;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    tdm_rpc_stream_close_send(st, &err);
    tdm_rpc_stream_destroy(st);
    report("bidi ping-pong round", us, iters);

    /* Server-stream throughput. */
    int n = iters * 25;
    char count[32];
    snprintf(count, sizeof(count), "%d", n);
    q.service = count;
    double t0 = now_us();
    if (tdm_rpc_stream_open(ch, "/bench.B/Flood", &q.base, RESP_DESC, NULL, &st, &err) != TDM_OK)
        return 1;
    int got = 0;
    for (;;) {
        ProtobufCMessage *m = NULL;
        if (tdm_rpc_stream_read(st, &m, &err) != TDM_OK || !m)
            break;
        got++;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    double dt = now_us() - t0;
    tdm_rpc_stream_destroy(st);
    printf("%-28s n=%-6d %9.0f messages/s\n", "server-stream throughput", got, got / (dt * 1e-6));
    q.service = "";

    /* Concurrent unary calls from 8 threads on one channel. */
    enum { NT = 8 };
    pthread_t th[NT];
    worker w[NT];
    t0 = now_us();
    for (int i = 0; i < NT; i++) {
        w[i] = (worker){.ch = ch, .n = iters / 2};
        pthread_create(&th[i], NULL, unary_worker, &w[i]);
    }
    int ok = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        ok += w[i].ok;
    }
    dt = now_us() - t0;
    printf("%-28s n=%-6d %9.0f calls/s\n", "unary, 8 client threads", ok, ok / (dt * 1e-6));

    free(us);
    tdm_rpc_channel_destroy(ch);
    tdm_rpc_server_shutdown(s, 1000);
    tdm_rpc_server_destroy(s);
    return got == n && ok == NT * (iters / 2) ? 0 : 1;
}
