/*
 * service.c - the common life of a tandem service process (see service.h).
 */
#include "service.h"
#include "alloc.h"

#include "buildinfo.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "reflection.h"
#include "registration.h"
#include "request_check.h"
#include "service_config.h"
#include "spin.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_COUNTERS 160

struct tdm_service {
    tdm_cfg *cfg;
    const char *program;
    char *service_name;
    tdm_rpc_tls tls;
    bool use_tls;
    tdm_health *health;
    tdm_rpc_server *server;
    tdm_rpc_server *health_server;
    tdm_trust *trust;
    Tandem__V1__Descriptor *desc;
    pthread_mutex_t cb_mu; /* the callbacks below: set at setup, read by scrapes meanwhile */
    tdm_service_counters_fn counters; /* the role's own counters */
    void *counters_arg;
    tdm_service_counters_fn reg_counters; /* registration with the gateway */
    void *reg_counters_arg;
    tdm_service_load_fn load; /* the role's occupancy */
    void *load_arg;
    tdm_service_drain_fn drain; /* the role's drain (after deregistration); may be NULL */
    void *drain_arg;
    tdm_metrics *metrics;          /* the role's metric families */
    tdm_http_server *metrics_http; /* /metrics on metrics_listen; NULL when it is empty */
    /* Heartbeat payload, filled on the registration thread only. */
    Tandem__V1__Counter hb_counters[MAX_COUNTERS];
    Tandem__V1__Counter *hb_ptrs[MAX_COUNTERS];
    struct timespec started;
};

static const char *component(const tdm_service *s)
{
    return s->program;
}

static size_t collect_counters(tdm_service *s, tdm_service_counter c[MAX_COUNTERS]);

/* ---- metrics ---------------------------------------------------------------- */

static const char *role_name(const tdm_service *s)
{
    switch (s->desc->role) {
    case TANDEM__V1__ROLE__ROLE_GATEWAY:
        return "gateway";
    case TANDEM__V1__ROLE__ROLE_VERIFIER:
        return "verifier";
    case TANDEM__V1__ROLE__ROLE_DRAFTER:
        return "drafter";
    default:
        return "unknown";
    }
}

/* What every process exports before its role's families: what it is, and
 * its Describe counters. */
static void metrics_prelude(void *arg, tdm_metrics_writer *w)
{
    tdm_service *s = arg;
    const Tandem__V1__BuildInfo *b = s->desc->build;
    char protocol[32], archs[256] = "";
    snprintf(protocol, sizeof(protocol), "%u.%u", s->desc->protocol->major,
             s->desc->protocol->minor);
    for (size_t i = 0; i < b->n_gpu_archs; i++) {
        size_t n = strlen(archs);
        snprintf(archs + n, sizeof(archs) - n, "%s%s", i ? "," : "", b->gpu_archs[i]);
    }
    const tdm_metric_label labels[] = {
        {"role", role_name(s)},
        {"version", b->version},
        {"revision", b->git_revision},
        {"build_type", b->build_type},
        {"compiler", b->compiler},
        {"grpc_core", b->grpc_core},
        {"cuda_runtime", b->cuda_runtime},
        {"gpu_archs", archs},
        {"backend", b->backend},
        {"protocol", protocol},
        {"replica_id", s->desc->replica_id},
        {"model", s->desc->model_name},
    };
    tdm_metrics_write_family(w, "tandem_build_info", TDM_METRIC_GAUGE,
                             "What this process is: role, build, backend, protocol, replica and "
                             "model (always 1).");
    tdm_metrics_write_sample(w, "", labels, TDM_ARRAY_LEN(labels), 1);
    tdm_service_counter c[MAX_COUNTERS];
    size_t n = collect_counters(s, c);
    tdm_metrics_write_counters(w, role_name(s), c, n);
}

static tdm_status handle_metrics(const tdm_http_request *req, tdm_http_response *resp,
                                 tdm_error *err, void *arg)
{
    (void)req;
    (void)err;
    tdm_service *s = arg;
    resp->body = tdm_metrics_render(s->metrics, metrics_prelude, s, &resp->body_len);
    resp->content_type = TDM_METRICS_CONTENT_TYPE;
    return TDM_OK;
}

static tdm_status metrics_start(tdm_service *s, tdm_error *err)
{
    const char *ml = tdm_cfg_str(s->cfg, "metrics_listen");
    if (!ml[0])
        return TDM_OK;
    char name[160];
    snprintf(name, sizeof(name), "%s metrics", s->program);
    tdm_http_options o = {.listen = ml, .name = name, .max_body_bytes = 4096, .threads = 1};
    tdm_status st;
    if ((st = tdm_http_server_create(&o, &s->metrics_http, err)) != TDM_OK ||
        (st = tdm_http_server_route(s->metrics_http, "GET", "/metrics", handle_metrics, s, err)) !=
            TDM_OK ||
        (st = tdm_http_server_start(s->metrics_http, err)) != TDM_OK)
        return tdm_error_prefix(err, "%s metrics port %s", s->program, ml);
    return TDM_OK;
}

tdm_metrics *tdm_service_metrics(tdm_service *s)
{
    return s->metrics;
}

int tdm_service_metrics_port(const tdm_service *s)
{
    return tdm_http_server_port(s->metrics_http);
}

tdm_status tdm_service_create(tdm_cfg *cfg, const char *service_name, tdm_service **out,
                              tdm_error *err)
{
    *out = NULL;
    tdm_service *s = tdm_xcalloc(1, sizeof(*s));
    pthread_mutex_init(&s->cb_mu, NULL);
    clock_gettime(CLOCK_MONOTONIC, &s->started);
    s->cfg = cfg;
    s->program = tdm_cfg_schema_of(cfg)->program;
    s->service_name = tdm_xstrdup(service_name);
    const char *cert = tdm_cfg_str(cfg, "tls_cert"), *key = tdm_cfg_str(cfg, "tls_key"),
               *ca = tdm_cfg_str(cfg, "tls_ca");
    s->use_tls = cert[0] || ca[0];
    s->tls = (tdm_rpc_tls){
        .cert_path = cert[0] ? cert : NULL,
        .key_path = key[0] ? key : NULL,
        .ca_path = ca[0] ? ca : NULL,
        .require_client_cert = strcmp(tdm_cfg_str(cfg, "tls_client_auth"), "require") == 0,
    };
    tdm_cfg_log(cfg, component(s));

    s->health = tdm_health_create();
    /* Before the server: its worker count depends on it (rpc.h). */
    if (tdm_cfg_has(cfg, "busy_poll"))
        tdm_busy_poll_set(tdm_cfg_int(cfg, "busy_poll") * 1000); /* ms -> us */
    tdm_rpc_server_options so = {
        .listen = tdm_cfg_str(cfg, "listen"),
        .tls = s->use_tls && cert[0] ? &s->tls : NULL,
        .max_message_bytes = tdm_cfg_int(cfg, "max_message_size"),
        .name = s->program,
        /* A drafter's server carries the Draft streams: the exchange's far
         * side. A verifier's Run streams gain nothing from polling (a batch
         * of 32 of them spinning on their writes costs throughput), but its
         * worker must poll while its Draft streams' threads do, or the
         * blocks wait for that worker's wake-up (bench/RESULTS.md, "The
         * exchange's polls"). */
        .busy_poll = strcmp(service_name, "tandem.v1.Drafter") == 0,
        .busy_poll_workers = strcmp(service_name, "tandem.v1.Verifier") == 0,
    };
    tdm_status st = TDM_OK;
    if ((st = tdm_trust_create(cfg, s->tls.require_client_cert, &s->trust, err)) != TDM_OK ||
        (st = tdm_health_add_service(s->health, service_name, err)) != TDM_OK ||
        (st = tdm_rpc_server_create(&so, &s->server, err)) != TDM_OK ||
        (st = tdm_health_register(s->health, s->server, err)) != TDM_OK ||
        (st = tdm_reflection_register(s->server, err)) != TDM_OK) {
        tdm_error_prefix(err, "%s on %s", s->program, so.listen);
        tdm_service_destroy(s);
        return st;
    }
    /* A port-0 listen address binds a free port; peers must be told which. */
    int port = tdm_rpc_server_port(s->server);
    if (tdm_cfg_has(cfg, "advertise") && !tdm_cfg_is_explicit(cfg, "advertise")) {
        char host[256];
        int adv_port = 0;
        if (tdm_cfg_parse_address(tdm_cfg_str(cfg, "advertise"), host, sizeof(host), &adv_port,
                                  NULL) == TDM_OK &&
            adv_port == 0) {
            char addr[300], reason[600];
            snprintf(addr, sizeof(addr), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
            snprintf(reason, sizeof(reason), "%s; port 0 replaced by the bound port %d",
                     tdm_cfg_reason(cfg, "advertise"), port);
            tdm_cfg_set_resolved(cfg, "advertise", addr, reason, NULL);
        }
    }
    if ((st = tdm_svc_descriptor_build(cfg, &s->desc, err)) != TDM_OK) {
        tdm_service_destroy(s);
        return st;
    }
    /* The health port answers (NOT_SERVING) from here on, while the role's
     * setup loads its model, so that probes see "starting", not "down". */
    const char *hl = tdm_cfg_str(cfg, "health_listen");
    if ((st = tdm_health_server_start(s->health, hl, &s->health_server, err)) != TDM_OK) {
        tdm_error_prefix(err, "%s health port %s", s->program, hl);
        tdm_service_destroy(s);
        return st;
    }
    /* Metrics, like health, answer while the role loads its model. */
    s->metrics = tdm_metrics_create();
    if ((st = metrics_start(s, err)) != TDM_OK) {
        tdm_service_destroy(s);
        return st;
    }
    *out = s;
    return TDM_OK;
}

void tdm_service_destroy(tdm_service *s)
{
    if (!s)
        return;
    /* Scrapes read the role's counters: they end before anything else. */
    tdm_http_server_destroy(s->metrics_http);
    if (s->server)
        tdm_rpc_server_destroy(s->server);
    if (s->health_server)
        tdm_rpc_server_destroy(s->health_server);
    if (s->health)
        tdm_health_destroy(s->health);
    tdm_trust_destroy(s->trust);
    tdm_svc_descriptor_free(s->desc);
    tdm_metrics_destroy(s->metrics);
    tdm_cfg_destroy(s->cfg);
    pthread_mutex_destroy(&s->cb_mu);
    free(s->service_name);
    free(s);
}

tdm_rpc_server *tdm_service_server(tdm_service *s)
{
    return s->server;
}

const tdm_cfg *tdm_service_config(const tdm_service *s)
{
    return s->cfg;
}

void tdm_service_set_device(tdm_service *s, const char *uuid, bool mps)
{
    free(s->desc->device_uuid);
    s->desc->device_uuid = tdm_xstrdup(uuid ? uuid : "");
    s->desc->device_mps = uuid && uuid[0] && mps;
}

void tdm_service_set_draft_vocab(tdm_service *s, int n)
{
    s->desc->draft_vocab_size = n > 0 ? (uint32_t)n : 0;
}

void tdm_service_set_draft_costs(tdm_service *s, const int *sequences, const int *blocks,
                                 const double *ms, int n)
{
    Tandem__V1__Descriptor *d = s->desc;
    for (size_t i = 0; i < d->n_draft_pass_costs; i++)
        free(d->draft_pass_costs[i]);
    free(d->draft_pass_costs);
    d->draft_pass_costs = n > 0 ? tdm_xcalloc((size_t)n, sizeof(*d->draft_pass_costs)) : NULL;
    d->n_draft_pass_costs = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < n; i++) {
        Tandem__V1__DraftPassCost *c = tdm_xmalloc(sizeof(*c));
        tandem__v1__draft_pass_cost__init(c);
        c->sequences = (uint32_t)sequences[i];
        c->block = (uint32_t)blocks[i];
        c->millis = (float)ms[i];
        d->draft_pass_costs[i] = c;
    }
}

tdm_status tdm_service_set_resolved(tdm_service *s, const char *key, const char *value,
                                    const char *reason, tdm_error *err)
{
    tdm_status rc = tdm_cfg_set_resolved(s->cfg, key, value, reason, err);
    if (rc == TDM_OK && strcmp(key, "max_sequences") == 0)
        s->desc->max_sequences = (uint32_t)tdm_cfg_int(s->cfg, key);
    return rc;
}

const Tandem__V1__Descriptor *tdm_service_descriptor(const tdm_service *s)
{
    return s->desc;
}

const tdm_trust *tdm_service_trust(const tdm_service *s)
{
    return s->trust;
}

const tdm_rpc_tls *tdm_service_tls(const tdm_service *s)
{
    return s->use_tls ? &s->tls : NULL;
}

double tdm_service_uptime_s(const tdm_service *s)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - s->started.tv_sec) +
           (double)(now.tv_nsec - s->started.tv_nsec) / 1e9;
}

void tdm_service_set_load(tdm_service *s, tdm_service_load_fn fn, void *arg)
{
    s->load = fn;
    s->load_arg = arg;
}

void tdm_service_set_drain(tdm_service *s, tdm_service_drain_fn fn, void *arg)
{
    s->drain = fn;
    s->drain_arg = arg;
}

void tdm_service_set_counters(tdm_service *s, tdm_service_counters_fn fn, void *arg)
{
    pthread_mutex_lock(&s->cb_mu);
    s->counters = fn;
    s->counters_arg = arg;
    pthread_mutex_unlock(&s->cb_mu);
}

static void set_reg_counters(tdm_service *s, tdm_service_counters_fn fn, void *arg)
{
    pthread_mutex_lock(&s->cb_mu);
    s->reg_counters = fn;
    s->reg_counters_arg = arg;
    pthread_mutex_unlock(&s->cb_mu);
}

/* Every counter the process reports: uptime, registration, the role's. */
static size_t collect_counters(tdm_service *s, tdm_service_counter c[MAX_COUNTERS])
{
    pthread_mutex_lock(&s->cb_mu);
    tdm_service_counters_fn reg = s->reg_counters, role = s->counters;
    void *reg_arg = s->reg_counters_arg, *role_arg = s->counters_arg;
    pthread_mutex_unlock(&s->cb_mu);
    size_t k = 0;
    c[k++] = (tdm_service_counter){"uptime_seconds", tdm_service_uptime_s(s)};
    if (reg)
        k += reg(reg_arg, c + k, MAX_COUNTERS - k);
    if (role)
        k += role(role_arg, c + k, MAX_COUNTERS - k);
    return k > MAX_COUNTERS ? MAX_COUNTERS : k;
}

void tdm_service_counters_to_proto(tdm_service *s, tdm_rpc_call *call, Tandem__V1__Counter ***out,
                                   size_t *n)
{
    tdm_service_counter c[MAX_COUNTERS];
    size_t k = collect_counters(s, c);
    Tandem__V1__Counter **arr = tdm_rpc_call_alloc(call, k * sizeof(*arr));
    for (size_t i = 0; i < k; i++) {
        arr[i] = tdm_rpc_call_alloc(call, sizeof(**arr));
        tandem__v1__counter__init(arr[i]);
        arr[i]->name = (char *)c[i].name;
        arr[i]->value = c[i].value;
    }
    *out = arr;
    *n = k;
}

static void free_config_proto(void *arg)
{
    tdm_cfg_proto_clear(arg);
}

Tandem__V1__EffectiveConfig *tdm_service_config_to_proto(tdm_service *s, tdm_rpc_call *call)
{
    Tandem__V1__EffectiveConfig *ec = tdm_rpc_call_alloc(call, sizeof(*ec));
    tandem__v1__effective_config__init(ec);
    if (tdm_cfg_to_proto(s->cfg, ec, NULL) == TDM_OK)
        tdm_rpc_call_defer(call, free_config_proto, ec);
    return ec;
}

static tdm_status handle_describe(tdm_rpc_call *call, const ProtobufCMessage *req,
                                  ProtobufCMessage **resp, tdm_error *err, void *user)
{
    (void)req;
    (void)err;
    tdm_service *s = user;
    Tandem__V1__DescribeResponse *r = tdm_rpc_call_alloc(call, sizeof(*r));
    tandem__v1__describe_response__init(r);
    /* The descriptor lives as long as the service, which outlives its calls. */
    r->descriptor = s->desc;
    r->config = tdm_service_config_to_proto(s, call);
    tdm_service_counters_to_proto(s, call, &r->counters, &r->n_counters);
    *resp = &r->base;
    return TDM_OK;
}

tdm_status tdm_service_add_describe(tdm_service *s, const char *path, tdm_error *err)
{
    return tdm_rpc_server_add_unary(s->server, path, &tandem__v1__describe_request__descriptor,
                                    handle_describe, s, err);
}

tdm_status tdm_service_start(tdm_service *s, tdm_error *err)
{
    tdm_status st = tdm_rpc_server_start(s->server, err);
    if (st != TDM_OK)
        return tdm_error_prefix(err, "%s", s->program);
    tdm_health_set_all(s->health, true);
    char metrics[64] = "metrics off";
    if (s->metrics_http)
        snprintf(metrics, sizeof(metrics), "metrics port %d", tdm_service_metrics_port(s));
    tdm_log_info(
        component(s), "listening on %s (bound port %d, health port %d, %s), serving %s as %s",
        tdm_cfg_str(s->cfg, "listen"), tdm_rpc_server_port(s->server),
        tdm_rpc_server_port(s->health_server), metrics, s->service_name, s->desc->replica_id);
    return TDM_OK;
}

int tdm_service_wait_and_stop(tdm_service *s, void (*on_drain)(void *arg), void *arg)
{
    int sig = tdm_rpc_wait_for_signal();
    int grace = (int)tdm_cfg_int(s->cfg, "shutdown_grace");
    tdm_log_info(component(s), "signal %d: draining (NOT_SERVING), then stopping within %d ms", sig,
                 grace);
    const double t0 = tdm_service_uptime_s(s);
    tdm_health_drain(s->health);
    if (on_drain)
        on_drain(arg);
    tdm_rpc_server_shutdown(s->server, grace);
    if (s->health_server) {
        /* Health watchers end by themselves once they have sent NOT_SERVING:
         * give them what is left of the grace rather than cancelling that
         * last message in flight. */
        const int left = grace - (int)((tdm_service_uptime_s(s) - t0) * 1e3);
        tdm_rpc_server_shutdown(s->health_server, left > 0 ? left : 0);
    }
    return sig;
}

/* ---- drafters and verifiers ----------------------------------------------- */

typedef struct replica_ctx {
    pthread_mutex_t mu; /* Describe reads reg while draining stops it */
    tdm_reg *reg;
    tdm_service *svc;
} replica_ctx;

static size_t replica_counters(void *arg, tdm_service_counter *out, size_t max)
{
    replica_ctx *rc = arg;
    if (max < 5)
        return 0;
    pthread_mutex_lock(&rc->mu);
    if (!rc->reg) {
        pthread_mutex_unlock(&rc->mu);
        return 0;
    }
    tdm_reg_counters c = tdm_reg_get_counters(rc->reg);
    bool registered = tdm_reg_is_registered(rc->reg);
    pthread_mutex_unlock(&rc->mu);
    out[0] = (tdm_service_counter){"registered", registered ? 1 : 0};
    out[1] = (tdm_service_counter){"registrations", (double)c.registrations};
    out[2] = (tdm_service_counter){"heartbeats", (double)c.heartbeats};
    out[3] = (tdm_service_counter){"heartbeat_failures", (double)c.heartbeat_failures};
    out[4] = (tdm_service_counter){"forgotten_by_gateway", (double)c.forgotten};
    return 5;
}

/* Occupancy from the role, counters from Describe's sources. */
static void replica_load(void *arg, Tandem__V1__ReplicaLoad *out)
{
    tdm_service *s = arg;
    out->active_sequences = 0;
    out->free_slots = (uint32_t)tdm_cfg_int(s->cfg, "max_sequences");
    if (s->load)
        s->load(s->load_arg, &out->active_sequences, &out->free_slots);
    tdm_service_counter c[MAX_COUNTERS];
    size_t k = collect_counters(s, c);
    for (size_t i = 0; i < k; i++) {
        tandem__v1__counter__init(&s->hb_counters[i]);
        s->hb_counters[i].name = (char *)c[i].name;
        s->hb_counters[i].value = c[i].value;
        s->hb_ptrs[i] = &s->hb_counters[i];
    }
    out->n_counters = k;
    out->counters = s->hb_ptrs;
}

static void replica_drain(void *arg)
{
    replica_ctx *rc = arg;
    pthread_mutex_lock(&rc->mu);
    tdm_reg *reg = rc->reg;
    rc->reg = NULL;
    pthread_mutex_unlock(&rc->mu);
    /* Deregistered first, so that the gateway sends nothing new while the
     * role moves or finishes what it has. */
    tdm_reg_stop(reg, "shutting down");
    tdm_service *s = rc->svc;
    if (s->drain)
        s->drain(s->drain_arg, (int)tdm_cfg_int(s->cfg, "shutdown_grace"));
}

/* Replica.Drain: the gateway's way to send SIGTERM (tandem drain REPLICA). */
static tdm_status handle_drain(tdm_rpc_call *call, const ProtobufCMessage *req,
                               ProtobufCMessage **resp, tdm_error *err, void *user)
{
    tdm_service *s = user;
    const Tandem__V1__DrainRequest *dr = (const Tandem__V1__DrainRequest *)req;
    tdm_status rc = tdm_trust_check_internal(s->trust, call, "gateway", err);
    if (rc != TDM_OK)
        return rc;
    Tandem__V1__DrainResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__drain_response__init(out);
    uint32_t free_slots = 0;
    if (s->load)
        s->load(s->load_arg, &out->active_sequences, &free_slots);
    const bool printable = tdm_req_check_label("reason", dr->reason, 160, NULL) == TDM_OK;
    tdm_log_info(component(s), "told to drain by the gateway (%s), with %u sequences in flight",
                 !dr->reason[0] ? "no reason given"
                 : printable    ? dr->reason
                                : "an unprintable reason",
                 out->active_sequences);
    kill(getpid(), SIGTERM); /* tdm_service_wait_and_stop takes it from here */
    *resp = &out->base;
    return TDM_OK;
}

int tdm_service_replica_main(tdm_cfg *cfg, const char *service_name, const char *describe_path,
                             tdm_status (*setup)(tdm_service *s, void *arg, tdm_error *err),
                             void *arg)
{
    const char *program = tdm_cfg_schema_of(cfg)->program;
    tdm_rpc_signals_install();
    tdm_service *s = NULL;
    tdm_error err;
    replica_ctx rc = {.mu = PTHREAD_MUTEX_INITIALIZER, .reg = NULL};
    if (tdm_service_create(cfg, service_name, &s, &err) != TDM_OK) {
        tdm_log_error(program, "cannot start: %s", err.msg);
        return 1;
    }
    set_reg_counters(s, replica_counters, &rc);
    rc.svc = s;
    if (tdm_service_add_describe(s, describe_path, &err) != TDM_OK ||
        tdm_rpc_server_add_unary(s->server, "/tandem.v1.Replica/Drain",
                                 &tandem__v1__drain_request__descriptor, handle_drain, s,
                                 &err) != TDM_OK ||
        (setup && setup(s, arg, &err) != TDM_OK) || tdm_service_start(s, &err) != TDM_OK) {
        tdm_log_error(program, "cannot start: %s", err.msg);
        tdm_service_destroy(s);
        return 1;
    }
    const tdm_cfg *c = tdm_service_config(s);
    tdm_reg_options ro = {
        .gateway = tdm_cfg_str(c, "gateway"),
        .tls = tdm_service_tls(s),
        .max_message_bytes = tdm_cfg_int(c, "max_message_size"),
        .descriptor = tdm_service_descriptor(s),
        .trust = tdm_service_trust(s),
        .load = replica_load,
        .load_arg = s,
    };
    tdm_reg *reg = NULL;
    if (tdm_reg_start(&ro, &reg, &err) != TDM_OK) {
        tdm_log_error(program, "cannot start registration: %s", err.msg);
        tdm_rpc_server_shutdown(tdm_service_server(s), 0);
        tdm_service_destroy(s);
        return 1;
    }
    pthread_mutex_lock(&rc.mu);
    rc.reg = reg;
    pthread_mutex_unlock(&rc.mu);
    tdm_service_wait_and_stop(s, replica_drain, &rc);
    tdm_service_destroy(s);
    return 0;
}

size_t tdm_service_counters_copy(const tdm_service_counter *all, size_t n, tdm_service_counter *out,
                                 size_t max)
{
    if (n > max)
        n = max;
    memcpy(out, all, n * sizeof(*out));
    return n;
}
