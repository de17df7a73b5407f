/*
 * registration.c - register, heartbeat, re-register, deregister (see
 * registration.h).
 */
#include "registration.h"
#include "alloc.h"

#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REG_COMPONENT "registration"
#define REG_BACKOFF_MIN_MS 200
#define REG_BACKOFF_MAX_MS 5000
#define REG_CALL_TIMEOUT_MS 3000

struct tdm_reg {
    tdm_reg_options opt;
    tdm_rpc_channel *ch;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    bool registered;
    uint32_t interval_ms;
    tdm_reg_counters counters;
};

/* Sleeps up to ms or until stop; returns true when stopping. */
static bool wait_or_stop(tdm_reg *r, int64_t ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT)
            break;
    }
    bool stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    return stop;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static tdm_status do_register(tdm_reg *r, tdm_error *err)
{
    Tandem__V1__RegisterRequest req = TANDEM__V1__REGISTER_REQUEST__INIT;
    req.descriptor = (Tandem__V1__Descriptor *)r->opt.descriptor;
    ProtobufCMessage *resp = NULL;
    tdm_rpc_metadata md;
    tdm_rpc_call_options co = {.timeout_ms = REG_CALL_TIMEOUT_MS,
                               .metadata = &md,
                               .n_metadata = tdm_trust_metadata(r->opt.trust, &md)};
    tdm_status st = tdm_rpc_unary(r->ch, "/tandem.v1.Registry/RegisterReplica", &req.base,
                                  &tandem__v1__register_response__descriptor, &resp, &co, err);
    if (st != TDM_OK)
        return st;
    const Tandem__V1__RegisterResponse *rr = (const Tandem__V1__RegisterResponse *)resp;
    uint32_t interval = rr->heartbeat_interval_ms;
    if (interval < 50)
        interval = 50; /* a gateway asking for less would only burn CPU */
    tdm_log_info(REG_COMPONENT,
                 "registered with gateway %s as %s (heartbeat every %u ms, dropped after %u ms "
                 "of silence)",
                 r->opt.gateway, r->opt.descriptor->replica_id, interval, rr->ttl_ms);
    for (size_t i = 0; i < rr->n_refusals; i++)
        tdm_log_warn(REG_COMPONENT, "gateway refuses a pair: %s", rr->refusals[i]->message);
    pthread_mutex_lock(&r->mu);
    r->registered = true;
    r->interval_ms = interval;
    r->counters.registrations++;
    pthread_mutex_unlock(&r->mu);
    protobuf_c_message_free_unpacked(resp, NULL);
    return TDM_OK;
}

/* Returns TDM_OK with *known, or the transport error. */
static tdm_status do_heartbeat(tdm_reg *r, bool *known, tdm_error *err)
{
    Tandem__V1__HeartbeatRequest req = TANDEM__V1__HEARTBEAT_REQUEST__INIT;
    Tandem__V1__ReplicaLoad load = TANDEM__V1__REPLICA_LOAD__INIT;
    req.replica_id = r->opt.descriptor->replica_id;
    req.instance_id = r->opt.descriptor->instance_id;
    if (r->opt.load) {
        r->opt.load(r->opt.load_arg, &load);
        req.load = &load;
    }
    ProtobufCMessage *resp = NULL;
    tdm_rpc_metadata md;
    tdm_rpc_call_options co = {.timeout_ms = r->interval_ms > 1000 ? r->interval_ms : 1000,
                               .metadata = &md,
                               .n_metadata = tdm_trust_metadata(r->opt.trust, &md)};
    tdm_status st = tdm_rpc_unary(r->ch, "/tandem.v1.Registry/Heartbeat", &req.base,
                                  &tandem__v1__heartbeat_response__descriptor, &resp, &co, err);
    if (st != TDM_OK)
        return st;
    *known = ((const Tandem__V1__HeartbeatResponse *)resp)->known;
    protobuf_c_message_free_unpacked(resp, NULL);
    return TDM_OK;
}

static void *reg_main(void *arg)
{
    tdm_reg *r = arg;
    int64_t backoff = REG_BACKOFF_MIN_MS;
    bool warned_down = false, warned_hb = false;
    /* Heartbeats keep their cadence: each is due an interval after the
     * previous one started (or after the registration), whatever that one's
     * call took, and a first failure is tried again soon, so that a slow or
     * lost call does not make the gateway see the replica as gone (it waits
     * two intervals + 250 ms). */
    int64_t due = 0;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool stop = r->stop, registered = r->registered;
        uint32_t interval = r->interval_ms;
        pthread_mutex_unlock(&r->mu);
        if (stop)
            break;
        tdm_error err;
        if (!registered) {
            if (do_register(r, &err) == TDM_OK) {
                backoff = REG_BACKOFF_MIN_MS;
                warned_down = false;
                due = mono_ms() + interval;
                continue;
            }
            /* Once per outage, not once per retry. */
            if (!warned_down)
                tdm_log_warn(REG_COMPONENT, "cannot register with gateway %s: %s; retrying",
                             r->opt.gateway, err.msg);
            warned_down = true;
            if (wait_or_stop(r, backoff))
                break;
            backoff = backoff * 2 > REG_BACKOFF_MAX_MS ? REG_BACKOFF_MAX_MS : backoff * 2;
            continue;
        }
        const int64_t now = mono_ms();
        if (due > now && wait_or_stop(r, due - now))
            break;
        due = mono_ms() + interval;
        bool known = true;
        if (do_heartbeat(r, &known, &err) != TDM_OK) {
            /* The first failure of a run is tried again soon; the rest keep
             * the interval. */
            const int64_t retry = mono_ms() + (interval < 1000 ? interval / 4 : 250);
            if (!warned_hb && retry < due)
                due = retry;
            pthread_mutex_lock(&r->mu);
            r->counters.heartbeat_failures++;
            pthread_mutex_unlock(&r->mu);
            if (!warned_hb)
                tdm_log_warn(REG_COMPONENT, "heartbeat to gateway %s failed: %s; retrying",
                             r->opt.gateway, err.msg);
            warned_hb = true;
            continue;
        }
        if (warned_hb)
            tdm_log_info(REG_COMPONENT, "heartbeats to gateway %s get through again",
                         r->opt.gateway);
        warned_hb = false;
        pthread_mutex_lock(&r->mu);
        if (known) {
            r->counters.heartbeats++;
        } else {
            r->counters.forgotten++;
            r->registered = false;
        }
        pthread_mutex_unlock(&r->mu);
        if (!known)
            tdm_log_info(REG_COMPONENT,
                         "gateway %s does not know %s (restarted or dropped it); "
                         "registering again",
                         r->opt.gateway, r->opt.descriptor->replica_id);
    }
    return NULL;
}

tdm_status tdm_reg_start(const tdm_reg_options *opt, tdm_reg **out, tdm_error *err)
{
    *out = NULL;
    if (!opt->descriptor || !opt->descriptor->replica_id || !opt->descriptor->replica_id[0])
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "registration needs a descriptor with a replica id");
    tdm_reg *r = tdm_xcalloc(1, sizeof(*r));
    r->opt = *opt;
    r->interval_ms = 1000;
    tdm_rpc_channel_options co = {
        .target = opt->gateway, .tls = opt->tls, .max_message_bytes = opt->max_message_bytes};
    tdm_status st = tdm_rpc_channel_create(&co, &r->ch, err);
    if (st != TDM_OK) {
        free(r);
        return tdm_error_prefix(err, "gateway %s", opt->gateway);
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->thread, NULL, reg_main, r) != 0) {
        tdm_rpc_channel_destroy(r->ch);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                             "cannot start the registration thread");
    }
    *out = r;
    return TDM_OK;
}

void tdm_reg_stop(tdm_reg *r, const char *reason)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    if (r->registered) {
        Tandem__V1__DeregisterRequest req = TANDEM__V1__DEREGISTER_REQUEST__INIT;
        req.replica_id = r->opt.descriptor->replica_id;
        req.instance_id = r->opt.descriptor->instance_id;
        req.reason = (char *)(reason ? reason : "");
        ProtobufCMessage *resp = NULL;
        tdm_error err;
        tdm_rpc_metadata md;
        tdm_rpc_call_options co = {.timeout_ms = 1000,
                                   .metadata = &md,
                                   .n_metadata = tdm_trust_metadata(r->opt.trust, &md)};
        if (tdm_rpc_unary(r->ch, "/tandem.v1.Registry/DeregisterReplica", &req.base,
                          &tandem__v1__deregister_response__descriptor, &resp, &co,
                          &err) == TDM_OK) {
            tdm_log_info(REG_COMPONENT, "deregistered %s from gateway %s",
                         r->opt.descriptor->replica_id, r->opt.gateway);
            protobuf_c_message_free_unpacked(resp, NULL);
        } else {
            tdm_log_warn(REG_COMPONENT,
                         "could not deregister from gateway %s: %s (it drops us "
                         "after its replica_ttl)",
                         r->opt.gateway, err.msg);
        }
    }
    tdm_rpc_channel_destroy(r->ch);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

bool tdm_reg_is_registered(tdm_reg *r)
{
    pthread_mutex_lock(&r->mu);
    bool v = r->registered;
    pthread_mutex_unlock(&r->mu);
    return v;
}

tdm_reg_counters tdm_reg_get_counters(tdm_reg *r)
{
    pthread_mutex_lock(&r->mu);
    tdm_reg_counters c = r->counters;
    pthread_mutex_unlock(&r->mu);
    return c;
}
