/*
 * metrics_unit.c - the metrics registry and its text format (service/metrics.h),
 * the names given to Describe counters, and the HTTP side-port server
 * (service/http.h) driven over a plain socket.
 *
 * Expected texts are written out by hand from the Prometheus exposition
 * format (version 0.0.4): HELP/TYPE lines, cumulative buckets ending in +Inf,
 * _sum and _count, escaped label values.
 */
#include "check.h" /* tests/config: CHECK */
#include "http.h"
#include "metrics.h"
#include "service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void test_registry(void)
{
    tdm_metrics *m = tdm_metrics_create();
    tdm_metric *c = tdm_metrics_counter(m, "t_requests_total", "Requests.", "code");
    tdm_metric *g = tdm_metrics_gauge(m, "t_running", "Running \\ now\nline two.", NULL);
    const double b[] = {0.1, 1};
    tdm_metric *h = tdm_metrics_histogram(m, "t_latency_seconds", "Latency.", NULL, b, 2);
    tdm_metric_add(c, "OK", 2);
    tdm_metric_add(c, "a\"b\\c\nd", 1);
    tdm_metric_add(c, "OK", -5); /* a counter never goes down */
    tdm_metric_set(g, NULL, 3);
    tdm_metric_add(g, NULL, -1.5);
    tdm_metric_observe(h, NULL, 0.05);
    tdm_metric_observe(h, NULL, 0.1); /* le is inclusive */
    tdm_metric_observe(h, NULL, 0.5);
    tdm_metric_observe(h, NULL, 7);
    CHECK(tdm_metric_value(c, "OK") == 2, "counter value %g", tdm_metric_value(c, "OK"));
    CHECK(tdm_metric_value(c, "none") == 0, "unseen label value");
    size_t len = 0;
    char *text = tdm_metrics_render(m, NULL, NULL, &len);
    const char *want = "# HELP t_requests_total Requests.\n"
                       "# TYPE t_requests_total counter\n"
                       "t_requests_total{code=\"OK\"} 2\n"
                       "t_requests_total{code=\"a\\\"b\\\\c\\nd\"} 1\n"
                       "# HELP t_running Running \\\\ now\\nline two.\n"
                       "# TYPE t_running gauge\n"
                       "t_running 1.5\n"
                       "# HELP t_latency_seconds Latency.\n"
                       "# TYPE t_latency_seconds histogram\n"
                       "t_latency_seconds_bucket{le=\"0.1\"} 2\n"
                       "t_latency_seconds_bucket{le=\"1\"} 3\n"
                       "t_latency_seconds_bucket{le=\"+Inf\"} 4\n"
                       "t_latency_seconds_sum 7.65\n"
                       "t_latency_seconds_count 4\n";
    CHECK(strcmp(text, want) == 0 && len == strlen(want), "render:\n%s\nwant:\n%s", text, want);
    free(text);
    tdm_metrics_destroy(m);

    /* An unlabelled family is there before its first update; a labelled one
     * has no sample until a label value is seen. */
    m = tdm_metrics_create();
    tdm_metrics_histogram(m, "t_empty_seconds", "E.", NULL, b, 2);
    tdm_metrics_counter(m, "t_by_total", "B.", "kind");
    text = tdm_metrics_render(m, NULL, NULL, NULL);
    CHECK(strstr(text, "t_empty_seconds_bucket{le=\"+Inf\"} 0\n") &&
              strstr(text, "t_empty_seconds_count 0\n") && !strstr(text, "t_by_total{"),
          "empty families:\n%s", text);
    free(text);
    tdm_metrics_destroy(m);
}

static void test_outcomes(void)
{
    tdm_metrics *m = tdm_metrics_create();
    tdm_metrics_outcomes o;
    tdm_metrics_outcomes_init(&o, m, "t_success_total", "S.", "t_errors_total", "E.");
    tdm_metrics_outcome(&o, TDM_OK, 3); /* FINISH_REASON_STOP */
    tdm_metrics_outcome(&o, TDM_OK, 1); /* FINISH_REASON_LENGTH */
    tdm_metrics_outcome(&o, TDM_OK, 1);
    tdm_metrics_outcome(&o, TDM_ERR_UNAVAILABLE, 0);
    CHECK(tdm_metric_value(o.success, "stop") == 1 && tdm_metric_value(o.success, "length") == 2,
          "finish reasons");
    CHECK(tdm_metric_value(o.errors, "UNAVAILABLE") == 1, "error code");
    tdm_metrics_destroy(m);
}

static void prelude_counters(void *arg, tdm_metrics_writer *w)
{
    const char *role = arg;
    tdm_service_counter c[] = {
        {"uptime_seconds", 12.5},         {"registrations", 3},       {"rounds", 10},
        {"round_step_us_total", 2500000}, {"round_step_p50_us", 200}, {"round_step_p99_us", 900},
        {"mean_accepted_per_round", 1.5}, {"some_new_counter", 7},
    };
    tdm_metrics_write_counters(w, role, c, sizeof(c) / sizeof(c[0]));
}

static void test_counter_names(void)
{
    tdm_metrics *m = tdm_metrics_create();
    char *v = tdm_metrics_render(m, prelude_counters, "verifier", NULL);
    const char *want_v[] = {
        "# TYPE tandem_process_uptime_seconds gauge\ntandem_process_uptime_seconds 12.5\n",
        "# TYPE tandem_registrations_total counter\ntandem_registrations_total 3\n",
        "# TYPE tandem_verifier_rounds_total counter\ntandem_verifier_rounds_total 10\n",
        "# TYPE tandem_verifier_round_phase_seconds summary\n"
        "tandem_verifier_round_phase_seconds{phase=\"step\",quantile=\"0.5\"} 0.0002\n"
        "tandem_verifier_round_phase_seconds{phase=\"step\",quantile=\"0.99\"} 0.0009\n"
        "tandem_verifier_round_phase_seconds_sum{phase=\"step\"} 2.5\n"
        "tandem_verifier_round_phase_seconds_count{phase=\"step\"} 10\n",
        "# HELP tandem_verifier_some_new_counter Describe counter some_new_counter.\n"
        "# TYPE tandem_verifier_some_new_counter gauge\ntandem_verifier_some_new_counter 7\n",
    };
    for (size_t i = 0; i < sizeof(want_v) / sizeof(want_v[0]); i++)
        CHECK(strstr(v, want_v[i]), "verifier counters lack:\n%s\nin:\n%s", want_v[i], v);
    CHECK(!strstr(v, "mean_accepted"), "a derived counter is not exported:\n%s", v);
    CHECK(!strstr(v, "phase=\"idle\""), "a phase without its quantiles is not invented:\n%s", v);
    free(v);
    /* The same counter name is the gateway's own family there. */
    char *g = tdm_metrics_render(m, prelude_counters, "gateway", NULL);
    CHECK(strstr(g, "tandem_gateway_registrations_total 3\n") &&
              !strstr(g, "tandem_registrations_total") && strstr(g, "tandem_gateway_rounds 10\n"),
          "gateway counters:\n%s", g);
    free(g);
    tdm_metrics_destroy(m);
}

/* ---- HTTP ------------------------------------------------------------------- */

static tdm_status handle_hello(const tdm_http_request *req, tdm_http_response *resp, tdm_error *err,
                               void *arg)
{
    (void)err;
    const char *who = tdm_http_request_query(req, "who");
    const char *hdr = tdm_http_request_header(req, "x-test");
    char buf[256];
    int n = snprintf(buf, sizeof(buf), "hello %s %s %s", who ? who : "-", hdr ? hdr : "-",
                     (const char *)arg);
    resp->body = strdup(buf);
    resp->body_len = (size_t)n;
    resp->content_type = "text/plain";
    return TDM_OK;
}

static tdm_status handle_echo(const tdm_http_request *req, tdm_http_response *resp, tdm_error *err,
                              void *arg)
{
    (void)arg;
    size_t len = 0;
    const char *body = tdm_http_request_body(req, &len);
    if (len == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "the body is empty");
    resp->body = malloc(len);
    memcpy(resp->body, body, len);
    resp->body_len = len;
    resp->status = 201;
    resp->content_type = "application/json";
    return TDM_OK;
}

/* Sends raw request text; returns the whole response (malloc'd). */
static char *http_raw(int port, const char *request)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return strdup("");
    }
    size_t n = strlen(request);
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, request + off, n - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(1, cap);
    ssize_t r;
    while (len + 1 < cap && (r = read(fd, out + len, cap - len - 1)) > 0)
        len += (size_t)r;
    close(fd);
    return out;
}

static void test_http(void)
{
    tdm_error err = {0};
    tdm_http_server *s = NULL;
    tdm_http_options o = {.listen = "127.0.0.1:0", .name = "unit", .max_body_bytes = 64};
    CHECK(tdm_http_server_create(&o, &s, &err) == TDM_OK, "create: %s", err.msg);
    CHECK(tdm_http_server_route(s, "GET", "/hello", handle_hello, "arg", &err) == TDM_OK,
          "route: %s", err.msg);
    CHECK(tdm_http_server_route(s, "POST", "/echo", handle_echo, NULL, &err) == TDM_OK, "route: %s",
          err.msg);
    CHECK(tdm_http_server_route(s, "GET", "/hello", handle_hello, NULL, &err) ==
                  TDM_ERR_ALREADY_EXISTS &&
              strstr(err.msg, "GET /hello added twice"),
          "duplicate route: %s", err.msg);
    CHECK(tdm_http_server_route(s, "GET", "nopath", handle_hello, NULL, &err) ==
              TDM_ERR_INVALID_ARGUMENT,
          "a path must start with /");
    CHECK(tdm_http_server_port(s) == 0, "no port before start");
    CHECK(tdm_http_server_start(s, &err) == TDM_OK, "start: %s", err.msg);
    int port = tdm_http_server_port(s);
    CHECK(port > 0, "bound port %d", port);
    CHECK(tdm_http_server_route(s, "GET", "/late", handle_hello, NULL, &err) ==
              TDM_ERR_FAILED_PRECONDITION,
          "no routes after start");

    char *r = http_raw(port, "GET /hello?who=me HTTP/1.1\r\nHost: x\r\nX-Test: yes\r\n"
                             "Connection: close\r\n\r\n");
    CHECK(strncmp(r, "HTTP/1.1 200", 12) == 0 && strstr(r, "\r\n\r\nhello me yes arg") &&
              strstr(r, "Content-Type: text/plain"),
          "GET /hello:\n%s", r);
    free(r);
    r = http_raw(port, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n"
                       "Connection: close\r\n\r\n{\"a\":1}");
    CHECK(strncmp(r, "HTTP/1.1 201", 12) == 0 && strstr(r, "\r\n\r\n{\"a\":1}"), "POST /echo:\n%s",
          r);
    free(r);
    r = http_raw(port, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                       "Connection: close\r\n\r\n");
    CHECK(strncmp(r, "HTTP/1.1 400", 12) == 0 && strstr(r, "the body is empty"),
          "a handler's error:\n%s", r);
    free(r);
    char big[512];
    snprintf(big, sizeof(big),
             "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\n"
             "%0100d",
             0);
    r = http_raw(port, big);
    CHECK(strncmp(r, "HTTP/1.1 413", 12) == 0 && strstr(r, "larger than 64 bytes"),
          "too large a body:\n%s", r);
    free(r);
    r = http_raw(port, "GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK(strncmp(r, "HTTP/1.1 404", 12) == 0 && strstr(r, "/nothing: no such path"), "404:\n%s",
          r);
    free(r);
    r = http_raw(port, "DELETE /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK(strncmp(r, "HTTP/1.1 405", 12) == 0 && strstr(r, "Allow: GET"), "405:\n%s", r);
    free(r);
    r = http_raw(port, "HEAD /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK(strncmp(r, "HTTP/1.1 200", 12) == 0 && !strstr(r, "hello me"), "HEAD:\n%s", r);
    free(r);

    /* A second server cannot take the same port, and says which. */
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    tdm_http_server *s2 = NULL;
    tdm_http_options o2 = {.listen = addr, .name = "second"};
    CHECK(tdm_http_server_create(&o2, &s2, &err) == TDM_OK, "create: %s", err.msg);
    CHECK(tdm_http_server_start(s2, &err) == TDM_ERR_UNAVAILABLE && strstr(err.msg, addr) &&
              strstr(err.msg, "second"),
          "busy port: %s", err.msg);
    tdm_http_server_destroy(s2);
    tdm_http_server_stop(s);
    CHECK(tdm_http_server_port(s) == 0, "no port after stop");
    tdm_http_server_destroy(s);

    tdm_http_options bad = {.listen = "no-port-here", .name = "bad"};
    CHECK(tdm_http_server_create(&bad, &s, &err) != TDM_OK && s == NULL &&
              strstr(err.msg, "bad: listen address"),
          "bad address: %s", err.msg);
    tdm_http_options unknown = {.listen = "no.such.host.invalid:80", .name = "unknown"};
    CHECK(tdm_http_server_create(&unknown, &s, &err) != TDM_OK && strstr(err.msg, "cannot resolve"),
          "unknown host: %s", err.msg);
}

int main(void)
{
    test_registry();
    test_outcomes();
    test_counter_names();
    test_http();
    if (g_failures) {
        printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
