/*
 * health.c - grpc.health.v1.Health over tdm_rpc: a small table of statuses
 * guarded by one mutex; Watch streams sleep on its condition variable and are
 * woken by every change, by drain, and by their own cancellation.
 */
#include "health.h"
#include "alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"

typedef struct health_entry {
    char *name;
    tdm_health_status status;
} health_entry;

struct tdm_health {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    health_entry *entries; /* (n) */
    size_t n;
    bool drained;
};

static health_entry *find(tdm_health *h, const char *name)
{
    for (size_t i = 0; i < h->n; i++)
        if (strcmp(h->entries[i].name, name) == 0)
            return &h->entries[i];
    return NULL;
}

tdm_health *tdm_health_create(void)
{
    tdm_health *h = tdm_xcalloc(1, sizeof(*h));
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    tdm_health_add_service(h, "", NULL);
    return h;
}

void tdm_health_destroy(tdm_health *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n; i++)
        free(h->entries[i].name);
    free(h->entries);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

tdm_status tdm_health_add_service(tdm_health *h, const char *service, tdm_error *err)
{
    if (!service)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "health: service name is NULL");
    pthread_mutex_lock(&h->mu);
    if (!find(h, service)) {
        health_entry *ne = tdm_xrealloc(h->entries, (h->n + 1) * sizeof(*ne));
        h->entries = ne;
        h->entries[h->n].name = tdm_xstrdup(service);
        h->entries[h->n].status = TDM_HEALTH_NOT_SERVING;
        h->n++;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return TDM_OK;
}

tdm_status tdm_health_set(tdm_health *h, const char *service, bool serving, tdm_error *err)
{
    pthread_mutex_lock(&h->mu);
    health_entry *e = find(h, service ? service : "");
    if (!e) {
        pthread_mutex_unlock(&h->mu);
        return tdm_error_set(err, TDM_ERR_NOT_FOUND, "health: unknown service '%s'",
                             service ? service : "");
    }
    if (!h->drained) {
        e->status = serving ? TDM_HEALTH_SERVING : TDM_HEALTH_NOT_SERVING;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return TDM_OK;
}

void tdm_health_set_all(tdm_health *h, bool serving)
{
    pthread_mutex_lock(&h->mu);
    if (!h->drained) {
        for (size_t i = 0; i < h->n; i++)
            h->entries[i].status = serving ? TDM_HEALTH_SERVING : TDM_HEALTH_NOT_SERVING;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
}

tdm_health_status tdm_health_get(tdm_health *h, const char *service)
{
    pthread_mutex_lock(&h->mu);
    health_entry *e = find(h, service ? service : "");
    tdm_health_status st = e ? e->status : TDM_HEALTH_SERVICE_UNKNOWN;
    pthread_mutex_unlock(&h->mu);
    return st;
}

void tdm_health_drain(tdm_health *h)
{
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < h->n; i++)
        h->entries[i].status = TDM_HEALTH_NOT_SERVING;
    h->drained = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* ---- the service ------------------------------------------------------------------ */

static tdm_status health_check(tdm_rpc_call *call, const ProtobufCMessage *req,
                               ProtobufCMessage **resp, tdm_error *err, void *user)
{
    tdm_health *h = user;
    const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
    tdm_health_status st = tdm_health_get(h, r->service);
    if (st == TDM_HEALTH_SERVICE_UNKNOWN)
        return tdm_error_set(err, TDM_ERR_NOT_FOUND, "health: unknown service '%s'", r->service);
    Grpc__Health__V1__HealthCheckResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    grpc__health__v1__health_check_response__init(out);
    out->status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)st;
    *resp = &out->base;
    return TDM_OK;
}

static void wake_watchers(void *arg)
{
    tdm_health *h = arg;
    pthread_mutex_lock(&h->mu);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static tdm_status health_watch(tdm_rpc_call *call, const ProtobufCMessage *req, tdm_error *err,
                               void *user)
{
    tdm_health *h = user;
    const Grpc__Health__V1__HealthCheckRequest *r = (const void *)req;
    tdm_rpc_call_set_cancel_notify(call, wake_watchers, h);
    int last = -1;
    tdm_status st = TDM_OK;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        health_entry *e = find(h, r->service);
        int now = e ? (int)e->status : TDM_HEALTH_SERVICE_UNKNOWN;
        bool drained = h->drained;
        if (now != last) {
            pthread_mutex_unlock(&h->mu);
            Grpc__Health__V1__HealthCheckResponse out = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
            out.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)now;
            st = tdm_rpc_call_write(call, &out.base, err);
            pthread_mutex_lock(&h->mu);
            if (st != TDM_OK)
                break;
            last = now;
            continue; /* re-read: it may have changed while writing */
        }
        if (drained)
            break;
        if (tdm_rpc_call_cancelled(call)) {
            st = tdm_error_set(err, TDM_ERR_CANCELLED, "health: watch cancelled");
            break;
        }
        /* Deadlines end the wait through the call's cancellation notice. */
        pthread_cond_wait(&h->cv, &h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    tdm_rpc_call_set_cancel_notify(call, NULL, NULL);
    return st;
}

static void drain_hook(void *arg)
{
    tdm_health_drain(arg);
}

tdm_status tdm_health_register(tdm_health *h, tdm_rpc_server *server, tdm_error *err)
{
    tdm_status st = tdm_rpc_server_add_unary(server, "/grpc.health.v1.Health/Check",
                                             &grpc__health__v1__health_check_request__descriptor,
                                             health_check, h, err);
    if (st != TDM_OK)
        return st;
    st = tdm_rpc_server_add_server_stream(server, "/grpc.health.v1.Health/Watch",
                                          &grpc__health__v1__health_check_request__descriptor,
                                          health_watch, h, err);
    if (st != TDM_OK)
        return st;
    tdm_rpc_server_on_shutdown(server, drain_hook, h);
    return TDM_OK;
}

tdm_status tdm_health_server_start(tdm_health *h, const char *listen, tdm_rpc_server **out,
                                   tdm_error *err)
{
    *out = NULL;
    tdm_rpc_server_options opt = {.listen = listen, .workers = 1, .name = "health",
                                  .max_message_bytes = 64 * 1024};
    tdm_rpc_server *s = NULL;
    tdm_status st = tdm_rpc_server_create(&opt, &s, err);
    if (st != TDM_OK)
        return tdm_error_prefix(err, "health_listen");
    if ((st = tdm_health_register(h, s, err)) != TDM_OK ||
        (st = tdm_rpc_server_start(s, err)) != TDM_OK) {
        tdm_rpc_server_destroy(s);
        return st;
    }
    *out = s;
    return TDM_OK;
}
