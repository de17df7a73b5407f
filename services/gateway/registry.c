/*
 * registry.c - replicas, heartbeats, TTL and the pairs the rules allow (see
 * registry.h).
 */
#include "defs.h"
#include "alloc.h"
#include "registry.h"

#include "compat.h"
#include "log.h"
#include "request_check.h"
#include "service_config.h"
#include "tandem/v1/registry.pb-c.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMPONENT "registry"
#define MAX_REFUSALS 8
/* Prefix affinity: remembered prefixes (one per slot, the newest wins a
 * slot) and the most blocks of a prompt looked at. */
#define AFFINITY_SLOTS 4096
#define AFFINITY_MAX_BLOCKS 64

typedef struct gw_replica {
    Tandem__V1__Descriptor *desc; /* unpacked copy, owned */
    uint8_t *packed;              /* the same descriptor serialised: copies for responses */
    size_t packed_len;
    uint32_t active_sequences, free_slots;
    double tokens_per_second;
    uint8_t *packed_load; /* the last heartbeat's ReplicaLoad (counters included) */
    size_t packed_load_len;
    int64_t last_seen_ms;
    uint32_t inflight; /* requests this gateway has sent it and not seen end */
    bool suspect;      /* a request could not reach it since it last heartbeat */
} gw_replica;

/* The verifier instance that last served a prompt prefix (a chained hash of
 * its cache blocks, as the verifiers' caches key them). */
typedef struct affinity_slot {
    uint64_t key;
    char replica_id[128];
    char instance_id[72]; /* a restarted verifier has an empty cache */
} affinity_slot;

struct gw_registry {
    const tdm_trust *trust; /* who may register */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t reaper;
    bool stop;
    gw_replica *items; /* (n) */
    size_t n, cap;
    int64_t heartbeat_ms, ttl_ms;
    uint64_t registrations, reregistrations, heartbeats, unknown_heartbeats, deregistrations,
        dropped, rejected;
    int affinity_slack;      /* < 0: no prefix affinity */
    affinity_slot *affinity; /* [AFFINITY_SLOTS] */
    uint64_t affinity_picks, affinity_passed;
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void replica_free(gw_replica *r)
{
    free(r->packed_load);
    if (r->desc)
        tandem__v1__descriptor__free_unpacked(r->desc, NULL);
    free(r->packed);
}

static ssize_t find(const gw_registry *r, const char *id)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->items[i].desc->replica_id, id) == 0)
            return (ssize_t)i;
    return -1;
}

static void remove_at(gw_registry *r, size_t i)
{
    replica_free(&r->items[i]);
    r->items[i] = r->items[--r->n];
}

/* ---- reaper --------------------------------------------------------------- */

static void expire_locked(gw_registry *r)
{
    int64_t now = now_ms();
    for (size_t i = 0; i < r->n;) {
        int64_t age = now - r->items[i].last_seen_ms;
        if (age > r->ttl_ms) {
            char name[512];
            tdm_compat_service_name(r->items[i].desc, name, sizeof(name));
            tdm_log_warn(COMPONENT,
                         "%s %s dropped: no heartbeat for %lld ms (replica_ttl %lld ms); its "
                         "pairs are gone",
                         tdm_role_name(r->items[i].desc->role), name, (long long)age,
                         (long long)r->ttl_ms);
            r->dropped++;
            remove_at(r, i);
        } else {
            i++;
        }
    }
}

static void *reaper_main(void *arg)
{
    gw_registry *r = arg;
    int64_t tick = r->ttl_ms / 4 < 250 ? r->ttl_ms / 4 : 250;
    if (tick < 10)
        tick = 10;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += tick * 1000000L;
        while (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &until);
        if (!r->stop)
            expire_locked(r);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

gw_registry *gw_registry_create(const tdm_trust *trust, int64_t heartbeat_ms, int64_t ttl_ms,
                                int affinity_slack)
{
    gw_registry *r = tdm_xcalloc(1, sizeof(*r));
    r->trust = trust;
    r->affinity_slack = affinity_slack;
    r->affinity = tdm_xcalloc(AFFINITY_SLOTS, sizeof(*r->affinity));
    r->heartbeat_ms = heartbeat_ms;
    r->ttl_ms = ttl_ms;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->reaper, NULL, reaper_main, r) != 0)
        TDM_ASSERT(!"cannot start the registry's reaper thread");
    return r;
}

void gw_registry_destroy(gw_registry *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->reaper, NULL);
    for (size_t i = 0; i < r->n; i++)
        replica_free(&r->items[i]);
    free(r->items);
    free(r->affinity);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* ---- rules over the registry ---------------------------------------------- */

/* Applies the rules between a and b in the right orientation; returns the
 * number of refusals (written up to max). */
static size_t check(const Tandem__V1__Descriptor *a, const Tandem__V1__Descriptor *b,
                    tdm_compat_refusal *out, size_t max)
{
    if (a->role == b->role)
        return tdm_compat_check_replicas(a, b, out, max);
    if (a->role == TANDEM__V1__ROLE__ROLE_VERIFIER)
        return tdm_compat_check_pair(a, b, out, max);
    return tdm_compat_check_pair(b, a, out, max);
}

static void log_pairs_locked(gw_registry *r, size_t idx)
{
    const Tandem__V1__Descriptor *d = r->items[idx].desc;
    tdm_compat_refusal ref[MAX_REFUSALS];
    for (size_t i = 0; i < r->n; i++) {
        if (i == idx)
            continue;
        const Tandem__V1__Descriptor *o = r->items[i].desc;
        size_t k = check(d, o, ref, MAX_REFUSALS);
        if (k == 0 && d->role != o->role) {
            const Tandem__V1__Descriptor *v = d->role == TANDEM__V1__ROLE__ROLE_VERIFIER ? d : o;
            const Tandem__V1__Descriptor *dr = v == d ? o : d;
            tdm_log_info(COMPONENT, "pair formed: verifier %s + drafter %s", v->replica_id,
                         dr->replica_id);
        }
        for (size_t j = 0; j < k && j < MAX_REFUSALS; j++)
            tdm_log_warn(COMPONENT, "%s refused: %s", d->role == o->role ? "replica pair" : "pair",
                         ref[j].message);
    }
}

/* ---- RPC handlers --------------------------------------------------------- */

static void free_register_response(void *arg)
{
    Tandem__V1__RegisterResponse *resp = arg;
    for (size_t i = 0; i < resp->n_refusals; i++) {
        tdm_compat_refusal_proto_clear(resp->refusals[i]);
        free(resp->refusals[i]);
    }
    free(resp->refusals);
}

static tdm_status handle_register(tdm_rpc_call *call, const ProtobufCMessage *req,
                                  ProtobufCMessage **resp, tdm_error *err, void *user)
{
    gw_registry *r = user;
    const Tandem__V1__RegisterRequest *rq = (const Tandem__V1__RegisterRequest *)req;
    tdm_status st = tdm_req_check_descriptor(rq->descriptor, err);
    if (st == TDM_OK)
        st = tdm_trust_check_internal(r->trust, call, tdm_role_name(rq->descriptor->role), err);
    if (st != TDM_OK) {
        pthread_mutex_lock(&r->mu);
        r->rejected++;
        pthread_mutex_unlock(&r->mu);
        return st;
    }
    /* Keep our own serialised copy: responses get fresh unpacked copies. */
    size_t len = tandem__v1__descriptor__get_packed_size(rq->descriptor);
    uint8_t *packed = tdm_xmalloc(len ? len : 1);
    tandem__v1__descriptor__pack(rq->descriptor, packed);
    Tandem__V1__Descriptor *copy = tandem__v1__descriptor__unpack(NULL, len, packed);
    if (!copy) {
        /* Received messages re-encode (tdm_rpc_unpack); a peer's bytes are
         * still refused, not asserted on. */
        free(packed);
        pthread_mutex_lock(&r->mu);
        r->rejected++;
        pthread_mutex_unlock(&r->mu);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "RegisterRequest.descriptor does not survive re-encoding");
    }

    Tandem__V1__RegisterResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__register_response__init(out);
    out->replica_id = tdm_rpc_call_strdup(call, copy->replica_id);

    pthread_mutex_lock(&r->mu);
    out->heartbeat_interval_ms = (uint32_t)r->heartbeat_ms;
    out->ttl_ms = (uint32_t)r->ttl_ms;
    ssize_t idx = find(r, copy->replica_id);
    bool changed = true;
    if (idx >= 0) {
        gw_replica *old = &r->items[idx];
        /* A live replica is replaced only by itself or by a restart at its own
         * address: anyone else claiming its id is refused. */
        bool same_instance = strcmp(old->desc->instance_id, copy->instance_id) == 0;
        bool live = now_ms() - old->last_seen_ms <= r->ttl_ms;
        if (!same_instance && live && strcmp(old->desc->address, copy->address) != 0) {
            r->rejected++;
            char held[512];
            tdm_compat_service_name(old->desc, held, sizeof(held));
            st = tdm_error_set(err, TDM_ERR_ALREADY_EXISTS,
                               "replica id %s is held by the live replica %s (instance %.12s, "
                               "heard from %lld ms ago); a registration from %s cannot replace "
                               "it: give this replica its own replica_id",
                               copy->replica_id, held, old->desc->instance_id,
                               (long long)(now_ms() - old->last_seen_ms), copy->address);
            tdm_log_warn(COMPONENT, "%s", err->msg);
            pthread_mutex_unlock(&r->mu);
            tandem__v1__descriptor__free_unpacked(copy, NULL);
            free(packed);
            return st;
        }
        changed = old->packed_len != len || memcmp(old->packed, packed, len) != 0;
        if (!same_instance)
            tdm_log_info(COMPONENT, "replica %s at %s restarted (instance %.12s, was %.12s)",
                         copy->replica_id, copy->address, copy->instance_id,
                         old->desc->instance_id);
        replica_free(old);
        r->reregistrations++;
    } else {
        if (r->n == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 8;
            r->items = tdm_xrealloc(r->items, r->cap * sizeof(*r->items));
        }
        idx = (ssize_t)r->n++;
        r->registrations++;
    }
    gw_replica *rep = &r->items[idx];
    memset(rep, 0, sizeof(*rep));
    rep->desc = copy;
    rep->packed = packed;
    rep->packed_len = len;
    rep->last_seen_ms = now_ms();
    if (changed) {
        char name[512];
        tdm_compat_service_name(copy, name, sizeof(name));
        tdm_log_info(
            COMPONENT, "%s %s registered (model %s, protocol %u.%u)", tdm_role_name(copy->role),
            name, copy->model_name[0] ? copy->model_name : "none",
            copy->protocol ? copy->protocol->major : 0, copy->protocol ? copy->protocol->minor : 0);
        log_pairs_locked(r, (size_t)idx);
    }
    /* Every pair this replica cannot form, for its own log. */
    tdm_compat_refusal ref[MAX_REFUSALS];
    size_t cap = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (i == (size_t)idx)
            continue;
        size_t k = check(copy, r->items[i].desc, ref, MAX_REFUSALS);
        if (k > MAX_REFUSALS)
            k = MAX_REFUSALS;
        for (size_t j = 0; j < k; j++) {
            if (out->n_refusals == cap) {
                cap = cap ? cap * 2 : 8;
                out->refusals = tdm_xrealloc(out->refusals, cap * sizeof(*out->refusals));
            }
            Tandem__V1__Refusal *p = tdm_xmalloc(sizeof(*p));
            tandem__v1__refusal__init(p);
            tdm_compat_refusal_to_proto(&ref[j], p);
            out->refusals[out->n_refusals++] = p;
        }
    }
    pthread_mutex_unlock(&r->mu);
    tdm_rpc_call_defer(call, free_register_response, out);
    *resp = &out->base;
    return TDM_OK;
}

static tdm_status handle_heartbeat(tdm_rpc_call *call, const ProtobufCMessage *req,
                                   ProtobufCMessage **resp, tdm_error *err, void *user)
{
    gw_registry *r = user;
    const Tandem__V1__HeartbeatRequest *rq = (const Tandem__V1__HeartbeatRequest *)req;
    Tandem__V1__HeartbeatResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__heartbeat_response__init(out);
    pthread_mutex_lock(&r->mu);
    ssize_t idx = find(r, rq->replica_id);
    const char *role = idx >= 0 ? tdm_role_name(r->items[idx].desc->role) : NULL;
    pthread_mutex_unlock(&r->mu);
    /* Only a replica of the role registered under that id keeps it alive;
     * an unknown id changes nothing and is told so (known = false). */
    tdm_status st = role ? tdm_trust_check_internal(r->trust, call, role, err) : TDM_OK;
    if (st != TDM_OK)
        return st;
    pthread_mutex_lock(&r->mu);
    idx = find(r, rq->replica_id);
    if (idx >= 0 && strcmp(r->items[idx].desc->instance_id, rq->instance_id) != 0)
        idx = -1; /* another instance holds the id now: this one must register again */
    if (idx >= 0) {
        gw_replica *rep = &r->items[idx];
        rep->last_seen_ms = now_ms();
        rep->suspect = false;
        if (rq->load) {
            rep->active_sequences = rq->load->active_sequences;
            rep->free_slots = rq->load->free_slots;
            rep->tokens_per_second = rq->load->tokens_per_second;
            size_t len = tandem__v1__replica_load__get_packed_size(rq->load);
            uint8_t *buf = malloc(len ? len : 1);
            if (buf) {
                tandem__v1__replica_load__pack(rq->load, buf);
                free(rep->packed_load);
                rep->packed_load = buf;
                rep->packed_load_len = len;
            }
        }
        r->heartbeats++;
        out->known = 1;
    } else {
        r->unknown_heartbeats++;
    }
    pthread_mutex_unlock(&r->mu);
    *resp = &out->base;
    return TDM_OK;
}

static tdm_status handle_deregister(tdm_rpc_call *call, const ProtobufCMessage *req,
                                    ProtobufCMessage **resp, tdm_error *err, void *user)
{
    gw_registry *r = user;
    const Tandem__V1__DeregisterRequest *rq = (const Tandem__V1__DeregisterRequest *)req;
    pthread_mutex_lock(&r->mu);
    ssize_t idx = find(r, rq->replica_id);
    char role[16] = "";
    if (idx >= 0)
        snprintf(role, sizeof(role), "%s", tdm_role_name(r->items[idx].desc->role));
    pthread_mutex_unlock(&r->mu);
    if (idx < 0) {
        Tandem__V1__DeregisterResponse *none = tdm_rpc_call_alloc(call, sizeof(*none));
        tandem__v1__deregister_response__init(none);
        *resp = &none->base;
        return TDM_OK; /* nothing to remove: a repeated deregistration */
    }
    tdm_status st = tdm_trust_check_internal(r->trust, call, role, err);
    if (st != TDM_OK)
        return st;
    pthread_mutex_lock(&r->mu);
    idx = find(r, rq->replica_id);
    if (idx >= 0 && strcmp(r->items[idx].desc->instance_id, rq->instance_id) != 0) {
        st = tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                           "replica id %s is registered by instance %.12s, not %.12s: only the "
                           "registered instance may deregister it",
                           rq->replica_id, r->items[idx].desc->instance_id, rq->instance_id);
        pthread_mutex_unlock(&r->mu);
        return st;
    }
    if (idx >= 0) {
        char name[512];
        tdm_compat_service_name(r->items[idx].desc, name, sizeof(name));
        tdm_log_info(COMPONENT, "%s %s deregistered: %s",
                     tdm_role_name(r->items[idx].desc->role), name,
                     rq->reason[0] ? rq->reason : "no reason given");
        remove_at(r, (size_t)idx);
        r->deregistrations++;
    }
    pthread_mutex_unlock(&r->mu);
    Tandem__V1__DeregisterResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__deregister_response__init(out);
    *resp = &out->base;
    return TDM_OK;
}

tdm_status gw_registry_add_methods(gw_registry *r, tdm_rpc_server *server, tdm_error *err)
{
    tdm_status st;
    if ((st = tdm_rpc_server_add_unary(server, "/tandem.v1.Registry/RegisterReplica",
                                       &tandem__v1__register_request__descriptor, handle_register,
                                       r, err)) != TDM_OK ||
        (st = tdm_rpc_server_add_unary(server, "/tandem.v1.Registry/Heartbeat",
                                       &tandem__v1__heartbeat_request__descriptor, handle_heartbeat,
                                       r, err)) != TDM_OK ||
        (st = tdm_rpc_server_add_unary(server, "/tandem.v1.Registry/DeregisterReplica",
                                       &tandem__v1__deregister_request__descriptor,
                                       handle_deregister, r, err)) != TDM_OK)
        return st;
    return TDM_OK;
}

/* ---- status --------------------------------------------------------------- */

static Tandem__V1__Refusal **refusals_proto(const tdm_compat_refusal *ref, size_t k)
{
    Tandem__V1__Refusal **arr = tdm_xcalloc(k ? k : 1, sizeof(*arr));
    for (size_t j = 0; j < k; j++) {
        arr[j] = tdm_xmalloc(sizeof(**arr));
        tandem__v1__refusal__init(arr[j]);
        tdm_compat_refusal_to_proto(&ref[j], arr[j]);
    }
    return arr;
}

/* Empties a string field of an unpacked message (protobuf-c frees
 * neither NULL nor the empty default). */
static void blank(char **field)
{
    if (*field != protobuf_c_empty_string)
        free(*field);
    *field = (char *)protobuf_c_empty_string;
}

/* What a refusal says to a caller who is not an operator: its rule only. */
static void redact_refusals(Tandem__V1__Refusal **arr, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(arr[i]->message);
        arr[i]->message = tdm_xstrdup("");
        free(arr[i]->a_replica);
        arr[i]->a_replica = tdm_xstrdup("");
        free(arr[i]->b_replica);
        arr[i]->b_replica = tdm_xstrdup("");
    }
}

void gw_registry_status(gw_registry *r, Tandem__V1__StatusResponse *out, bool details)
{
    pthread_mutex_lock(&r->mu);
    int64_t now = now_ms();
    out->n_replicas = 0;
    out->replicas = tdm_xcalloc(r->n ? r->n : 1, sizeof(*out->replicas));
    size_t n_pairs = 0, n_same = 0;
    for (size_t i = 0; i < r->n; i++) {
        for (size_t j = 0; j < r->n; j++) {
            if (r->items[i].desc->role == TANDEM__V1__ROLE__ROLE_VERIFIER &&
                r->items[j].desc->role == TANDEM__V1__ROLE__ROLE_DRAFTER)
                n_pairs++;
        }
    }
    out->pairs = tdm_xcalloc(n_pairs ? n_pairs : 1, sizeof(*out->pairs));
    out->n_pairs = 0;
    out->n_replica_refusals = 0;
    out->replica_refusals = NULL;
    for (size_t i = 0; i < r->n; i++) {
        const gw_replica *rep = &r->items[i];
        Tandem__V1__ReplicaStatus *rs = malloc(sizeof(*rs));
        /* The last heartbeat's load as sent; none before the first. */
        Tandem__V1__ReplicaLoad *load =
            rep->packed_load
                ? tandem__v1__replica_load__unpack(NULL, rep->packed_load_len, rep->packed_load)
                : NULL;
        TDM_ASSERT(rs && (load || !rep->packed_load));
        tandem__v1__replica_status__init(rs);
        rs->descriptor = tandem__v1__descriptor__unpack(NULL, rep->packed_len, rep->packed);
        TDM_ASSERT(rs->descriptor != NULL);
        if (!details) {
            blank(&rs->descriptor->address);
            blank(&rs->descriptor->instance_id);
        }
        rs->heartbeat_age_ms = (double)(now - rep->last_seen_ms);
        rs->requests_in_flight = rep->inflight;
        rs->load = load;
        out->replicas[out->n_replicas++] = rs;
    }
    tdm_compat_refusal ref[MAX_REFUSALS];
    for (size_t i = 0; i < r->n; i++) {
        const Tandem__V1__Descriptor *a = r->items[i].desc;
        for (size_t j = 0; j < r->n; j++) {
            const Tandem__V1__Descriptor *b = r->items[j].desc;
            if (a->role == TANDEM__V1__ROLE__ROLE_VERIFIER &&
                b->role == TANDEM__V1__ROLE__ROLE_DRAFTER) {
                size_t k = tdm_compat_check_pair(a, b, ref, MAX_REFUSALS);
                if (k > MAX_REFUSALS)
                    k = MAX_REFUSALS;
                Tandem__V1__PairStatus *p = tdm_xmalloc(sizeof(*p));
                tandem__v1__pair_status__init(p);
                p->verifier = tdm_xstrdup(a->replica_id);
                p->drafter = tdm_xstrdup(b->replica_id);
                p->compatible = k == 0;
                p->n_refusals = k;
                p->refusals = refusals_proto(ref, k);
                if (!details)
                    redact_refusals(p->refusals, k);
                out->pairs[out->n_pairs++] = p;
            } else if (j > i && a->role == b->role) {
                size_t k = tdm_compat_check_replicas(a, b, ref, MAX_REFUSALS);
                if (k > MAX_REFUSALS)
                    k = MAX_REFUSALS;
                if (k == 0)
                    continue;
                Tandem__V1__Refusal **arr = refusals_proto(ref, k);
                if (!details)
                    redact_refusals(arr, k);
                out->replica_refusals = tdm_xrealloc(out->replica_refusals,
                                                     (n_same + k) * sizeof(*out->replica_refusals));
                memcpy(out->replica_refusals + n_same, arr, k * sizeof(*arr));
                free(arr);
                n_same += k;
                out->n_replica_refusals = n_same;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
}

static void free_refusals(Tandem__V1__Refusal **arr, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        tdm_compat_refusal_proto_clear(arr[i]);
        free(arr[i]);
    }
    free(arr);
}

void gw_registry_status_clear(Tandem__V1__StatusResponse *out)
{
    for (size_t i = 0; i < out->n_replicas; i++) {
        tandem__v1__descriptor__free_unpacked(out->replicas[i]->descriptor, NULL);
        if (out->replicas[i]->load)
            tandem__v1__replica_load__free_unpacked(out->replicas[i]->load, NULL);
        free(out->replicas[i]);
    }
    free(out->replicas);
    for (size_t i = 0; i < out->n_pairs; i++) {
        free(out->pairs[i]->verifier);
        free(out->pairs[i]->drafter);
        free_refusals(out->pairs[i]->refusals, out->pairs[i]->n_refusals);
        free(out->pairs[i]);
    }
    free(out->pairs);
    free_refusals(out->replica_refusals, out->n_replica_refusals);
    out->replicas = NULL;
    out->pairs = NULL;
    out->replica_refusals = NULL;
    out->n_replicas = out->n_pairs = out->n_replica_refusals = 0;
}

size_t gw_registry_counters(gw_registry *r, tdm_service_counter *out, size_t max)
{
    if (max < 9)
        return 0;
    pthread_mutex_lock(&r->mu);
    size_t verifiers = 0, drafters = 0;
    for (size_t i = 0; i < r->n; i++)
        r->items[i].desc->role == TANDEM__V1__ROLE__ROLE_VERIFIER ? verifiers++ : drafters++;
    out[0] = (tdm_service_counter){"verifiers", (double)verifiers};
    out[1] = (tdm_service_counter){"drafters", (double)drafters};
    out[2] = (tdm_service_counter){"registrations", (double)r->registrations};
    out[3] = (tdm_service_counter){"reregistrations", (double)r->reregistrations};
    out[4] = (tdm_service_counter){"heartbeats", (double)r->heartbeats};
    out[5] = (tdm_service_counter){"unknown_heartbeats", (double)r->unknown_heartbeats};
    out[6] = (tdm_service_counter){"deregistrations", (double)r->deregistrations};
    out[7] = (tdm_service_counter){"replicas_dropped", (double)r->dropped};
    out[8] = (tdm_service_counter){"registrations_rejected", (double)r->rejected};
    size_t n = 9;
    if (max >= 11) {
        out[n++] = (tdm_service_counter){"prefix_affinity_picks", (double)r->affinity_picks};
        out[n++] = (tdm_service_counter){"prefix_affinity_passed", (double)r->affinity_passed};
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---- picking replicas for a request ------------------------------------------ */

static uint32_t load_of(const gw_replica *rep)
{
    return rep->active_sequences > rep->inflight ? rep->active_sequences : rep->inflight;
}

/* Whether a heard from recently: a replica that missed two heartbeats may be
 * gone; it is picked only when no replica that kept up is left. */
static bool fresh(const gw_registry *r, const gw_replica *a, int64_t now)
{
    return now - a->last_seen_ms <= 2 * r->heartbeat_ms + 250;
}

/* Whether a is a better pick than b: one no request failed to reach over a
 * suspect, then fresh over stale, then the lighter load. (A replica that
 * died and one that merely missed heartbeats are both stale; only the dead
 * one turned a request away.) */
static bool better(const gw_registry *r, const gw_replica *a, const gw_replica *b, int64_t now)
{
    if (a->suspect != b->suspect)
        return !a->suspect;
    bool fa = fresh(r, a, now), fb = fresh(r, b, now);
    if (fa != fb)
        return fa;
    return load_of(a) < load_of(b);
}

/* The chained keys of a prompt's cache blocks of `block` tokens, as many as
 * a verifier's prefix cache could hold for it (all of the prompt but its
 * last token): keys[i] covers blocks 0..i. Returns how many. FNV-1a over the
 * previous key and the block's ids. */
static int block_keys(const int32_t *prompt, size_t n, uint32_t block, uint64_t *keys)
{
    if (block == 0 || n < 2)
        return 0;
    size_t nb = (n - 1) / block;
    if (nb > AFFINITY_MAX_BLOCKS)
        nb = AFFINITY_MAX_BLOCKS;
    uint64_t h = 0xcbf29ce484222325ull ^ block;
    for (size_t b = 0; b < nb; b++) {
        for (uint32_t i = 0; i < block; i++) {
            const uint32_t t = (uint32_t)prompt[b * block + i];
            for (int k = 0; k < 4; k++) {
                h ^= (t >> (8 * k)) & 0xff;
                h *= 0x100000001b3ull;
            }
        }
        keys[b] = h;
    }
    return (int)nb;
}

static affinity_slot *slot_of(gw_registry *r, uint64_t key)
{
    return &r->affinity[(key ^ (key >> 29)) % AFFINITY_SLOTS];
}

/* How many of the prompt's first tokens verifier v served last (0: none). */
static uint32_t affinity_tokens(gw_registry *r, const gw_replica *v, const int32_t *prompt,
                                size_t n)
{
    const Tandem__V1__Descriptor *d = v->desc;
    uint64_t keys[AFFINITY_MAX_BLOCKS];
    if (!d->prefix_cache)
        return 0;
    for (int b = block_keys(prompt, n, d->prefix_cache_block, keys) - 1; b >= 0; b--) {
        const affinity_slot *sl = slot_of(r, keys[b]);
        if (sl->key == keys[b] && strcmp(sl->replica_id, d->replica_id) == 0 &&
            strcmp(sl->instance_id, d->instance_id) == 0)
            return (uint32_t)(b + 1) * d->prefix_cache_block;
    }
    return 0;
}

/* Remembers that verifier v serves the prompt's blocks. */
static void affinity_remember(gw_registry *r, const gw_replica *v, const int32_t *prompt, size_t n)
{
    const Tandem__V1__Descriptor *d = v->desc;
    uint64_t keys[AFFINITY_MAX_BLOCKS];
    if (!d->prefix_cache)
        return;
    const int nb = block_keys(prompt, n, d->prefix_cache_block, keys);
    for (int b = 0; b < nb; b++) {
        affinity_slot *sl = slot_of(r, keys[b]);
        sl->key = keys[b];
        snprintf(sl->replica_id, sizeof(sl->replica_id), "%s", d->replica_id);
        snprintf(sl->instance_id, sizeof(sl->instance_id), "%s", d->instance_id);
    }
}

/* Prefix affinity: the verifier that served the most of the prompt's blocks
 * last, when load allows it (see gw_registry_pick); else `best`. */
static ssize_t affinity_pick(gw_registry *r, ssize_t best, const Tandem__V1__Descriptor *gateway,
                             const int32_t *prompt, size_t n, int64_t now, uint32_t *tokens,
                             gw_pick *out)
{
    *tokens = 0;
    if (r->affinity_slack < 0 || !prompt || n == 0)
        return best;
    ssize_t holder = -1;
    uint32_t most = 0;
    for (size_t i = 0; i < r->n; i++) {
        const Tandem__V1__Descriptor *d = r->items[i].desc;
        tdm_compat_refusal gref;
        if (d->role != TANDEM__V1__ROLE__ROLE_VERIFIER ||
            tdm_compat_check_gateway(gateway, d, &gref, 1) > 0)
            continue;
        const uint32_t t = affinity_tokens(r, &r->items[i], prompt, n);
        if (t > most || (t > 0 && t == most && better(r, &r->items[i], &r->items[holder], now))) {
            most = t;
            holder = (ssize_t)i;
        }
    }
    if (holder < 0 || holder == best) {
        *tokens = most;
        r->affinity_picks += holder >= 0;
        return best;
    }
    const gw_replica *h = &r->items[holder], *b = &r->items[best];
    const bool room = h->desc->max_sequences == 0 || load_of(h) < h->desc->max_sequences;
    if (fresh(r, h, now) && room && load_of(h) <= load_of(b) + (uint32_t)r->affinity_slack) {
        *tokens = most;
        r->affinity_picks++;
        return holder;
    }
    r->affinity_passed++; /* the holder is busy: the least loaded takes it */
    tdm_log_debug(COMPONENT,
                  "prefix affinity: %s holds %u of the prompt's tokens but is passed for %s: %s "
                  "(last heartbeat %lld ms ago, load %u of max_sequences %u, %s's load %u)",
                  h->desc->replica_id, most, b->desc->replica_id,
                  !fresh(r, h, now) ? "not heard from lately"
                  : !room           ? "it is full"
                                    : "it is busier than prefix_affinity_slack allows",
                  (long long)(now - h->last_seen_ms), load_of(h), h->desc->max_sequences,
                  b->desc->replica_id, load_of(b));
    /* ... and may fetch the prefix from the holder: same model and layout,
     * blocks of one size. */
    tdm_compat_refusal ref;
    if (fresh(r, h, now) && b->desc->prefix_cache_block > 0 &&
        b->desc->prefix_cache_block == h->desc->prefix_cache_block &&
        tdm_compat_check_replicas(h->desc, b->desc, &ref, 1) == 0) {
        snprintf(out->source_id, sizeof(out->source_id), "%s", h->desc->replica_id);
        snprintf(out->source_addr, sizeof(out->source_addr), "%s", h->desc->address);
        out->source_tokens = most;
    }
    return best;
}

/* Fills out's verifier fields from v and counts the pick (under mu). */
static void take_verifier_locked(gw_replica *v, gw_pick *out)
{
    snprintf(out->verifier_id, sizeof(out->verifier_id), "%s", v->desc->replica_id);
    snprintf(out->verifier_addr, sizeof(out->verifier_addr), "%s", v->desc->address);
    snprintf(out->verifier_instance, sizeof(out->verifier_instance), "%s", v->desc->instance_id);
    snprintf(out->verifier_fingerprint, sizeof(out->verifier_fingerprint), "%s",
             v->desc->model_fingerprint);
    out->snapshot_layout = v->desc->snapshot_layout_version;
    out->max_draft = v->desc->max_draft_tokens;
    out->max_context = v->desc->max_context;
    v->inflight++;
}

/* The least loaded drafter the rules pair with verifier v, into out (under
 * mu); none, with the reasons in out->no_drafter, when none pairs. */
static void take_drafter_locked(gw_registry *r, const gw_replica *v, gw_pick *out, int64_t now)
{
    ssize_t bd = -1;
    size_t drafters = 0;
    tdm_compat_refusal ref[MAX_REFUSALS];
    for (size_t i = 0; i < r->n; i++) {
        const Tandem__V1__Descriptor *d = r->items[i].desc;
        if (d->role != TANDEM__V1__ROLE__ROLE_DRAFTER)
            continue;
        drafters++;
        size_t k = tdm_compat_check_pair(v->desc, d, ref, MAX_REFUSALS);
        if (k > 0) {
            size_t used = strlen(out->no_drafter);
            snprintf(out->no_drafter + used, sizeof(out->no_drafter) - used, "%s%s",
                     used ? "; " : "", ref[0].message);
            continue;
        }
        if (bd < 0 || better(r, &r->items[i], &r->items[bd], now))
            bd = (ssize_t)i;
    }
    if (bd >= 0) {
        gw_replica *dr = &r->items[bd];
        snprintf(out->drafter_id, sizeof(out->drafter_id), "%s", dr->desc->replica_id);
        snprintf(out->drafter_addr, sizeof(out->drafter_addr), "%s", dr->desc->address);
        snprintf(out->drafter_device, sizeof(out->drafter_device), "%s", dr->desc->device_uuid);
        out->drafter_mps = dr->desc->device_mps;
        out->drafter_scores =
            dr->desc->drafter_kind == TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MODEL &&
            dr->desc->protocol && (dr->desc->protocol->major > 1 || dr->desc->protocol->minor >= 3);
        snprintf(out->drafter_host, sizeof(out->drafter_host), "%s", dr->desc->host_id);
        snprintf(out->drafter_cpus, sizeof(out->drafter_cpus), "%s", dr->desc->cpus);
        /* Registration checked their number (tdm_req_check_descriptor). */
        out->n_drafter_costs = dr->desc->n_draft_pass_costs;
        for (size_t c = 0; c < out->n_drafter_costs; c++)
            out->drafter_costs[c] = *dr->desc->draft_pass_costs[c];
        out->block_size = dr->desc->draft_block_size;
        /* Registration checked it (tdm_req_check_descriptor). */
        tdm_feat_request_from_proto(dr->desc->features_needed, "features_needed", &out->features,
                                    NULL);
        out->no_drafter[0] = 0;
        dr->inflight++;
    } else if (drafters == 0) {
        snprintf(out->no_drafter, sizeof(out->no_drafter), "no drafter is registered");
    }
}

/* A verifier (and a drafter) for a request: a new one (from NULL; with its
 * prompt, prefix affinity applies) or one leaving the verifier of `from`. */
static tdm_status pick(gw_registry *r, bool want_drafter, const Tandem__V1__Descriptor *gateway,
                       const gw_pick *from, const int32_t *prompt, size_t n_prompt, gw_pick *out,
                       tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    int64_t now = now_ms();
    /* The verifier the request leaves, as the same-role rules read it (it
     * may have deregistered already: a draining one does so first). */
    Tandem__V1__Descriptor was = TANDEM__V1__DESCRIPTOR__INIT;
    if (from) {
        was.role = TANDEM__V1__ROLE__ROLE_VERIFIER;
        was.replica_id = (char *)from->verifier_id;
        was.address = (char *)from->verifier_addr;
        was.model_fingerprint = (char *)from->verifier_fingerprint;
        was.snapshot_layout_version = from->snapshot_layout;
    }
    pthread_mutex_lock(&r->mu);
    ssize_t best = -1;
    size_t verifiers = 0;
    char refused[2100] = "";
    for (size_t i = 0; i < r->n; i++) {
        const Tandem__V1__Descriptor *d = r->items[i].desc;
        if (d->role != TANDEM__V1__ROLE__ROLE_VERIFIER)
            continue;
        if (from && strcmp(d->replica_id, from->verifier_id) == 0)
            continue;
        verifiers++;
        if (from && r->items[i].suspect) {
            /* a moving request has tokens streamed: no second try elsewhere */
            snprintf(refused, sizeof(refused),
                     "verifier %s could not be reached by a request since its last heartbeat",
                     d->replica_id);
            continue;
        }
        tdm_compat_refusal gref;
        if (tdm_compat_check_gateway(gateway, d, &gref, 1) > 0 ||
            (from && tdm_compat_check_replicas(&was, d, &gref, 1) > 0)) {
            snprintf(refused, sizeof(refused), "%s", gref.message);
            continue;
        }
        if (best < 0 || better(r, &r->items[i], &r->items[best], now))
            best = (ssize_t)i;
    }
    if (best < 0) {
        pthread_mutex_unlock(&r->mu);
        if (verifiers == 0)
            return tdm_error_set(err, TDM_ERR_UNAVAILABLE, "no %sverifier is registered",
                                 from ? "other " : "");
        return tdm_error_set(err, from ? TDM_ERR_UNAVAILABLE : TDM_ERR_FAILED_PRECONDITION,
                             "no usable verifier: %s", refused);
    }
    best = affinity_pick(r, best, gateway, prompt, n_prompt, now, &out->affinity_tokens, out);
    gw_replica *v = &r->items[best];
    if (prompt && n_prompt > 0 && r->affinity_slack >= 0)
        affinity_remember(r, v, prompt, n_prompt);
    take_verifier_locked(v, out);
    if (want_drafter)
        take_drafter_locked(r, v, out, now);
    pthread_mutex_unlock(&r->mu);
    return TDM_OK;
}

tdm_status gw_registry_pick(gw_registry *r, bool want_drafter,
                            const Tandem__V1__Descriptor *gateway, const int32_t *prompt,
                            size_t n_prompt, gw_pick *out, tdm_error *err)
{
    return pick(r, want_drafter, gateway, NULL, prompt, n_prompt, out, err);
}

tdm_status gw_registry_pick_peer(gw_registry *r, bool want_drafter,
                                 const Tandem__V1__Descriptor *gateway, const gw_pick *from,
                                 gw_pick *out, tdm_error *err)
{
    return pick(r, want_drafter, gateway, from, NULL, 0, out, err);
}

bool gw_registry_address(gw_registry *r, const char *replica_id, char *address, size_t len,
                         Tandem__V1__Role *role)
{
    pthread_mutex_lock(&r->mu);
    ssize_t i = find(r, replica_id);
    if (i >= 0) {
        snprintf(address, len, "%s", r->items[i].desc->address);
        *role = r->items[i].desc->role;
    }
    pthread_mutex_unlock(&r->mu);
    return i >= 0;
}

void gw_registry_unpick(gw_registry *r, const gw_pick *p)
{
    pthread_mutex_lock(&r->mu);
    const char *ids[2] = {p->verifier_id, p->drafter_id};
    for (int j = 0; j < 2; j++) {
        if (!ids[j][0])
            continue;
        ssize_t i = find(r, ids[j]);
        if (i >= 0 && r->items[i].inflight > 0)
            r->items[i].inflight--;
    }
    pthread_mutex_unlock(&r->mu);
}

void gw_registry_suspect(gw_registry *r, const char *replica_id, const char *instance_id)
{
    pthread_mutex_lock(&r->mu);
    ssize_t i = find(r, replica_id);
    if (i >= 0 && strcmp(r->items[i].desc->instance_id, instance_id) == 0) {
        int64_t stale = now_ms() - 2 * r->heartbeat_ms - 251;
        if (r->items[i].last_seen_ms > stale)
            r->items[i].last_seen_ms = stale;
        r->items[i].suspect = true;
    }
    pthread_mutex_unlock(&r->mu);
}

void gw_model_info_fill(gw_registry *r, const char *verifier_id, tdm_rpc_call *call,
                        Tandem__V1__ModelInfo *out)
{
    pthread_mutex_lock(&r->mu);
    ssize_t vi = find(r, verifier_id);
    if (vi >= 0) {
        const Tandem__V1__Descriptor *v = r->items[vi].desc;
        out->model_name = tdm_rpc_call_strdup(call, v->model_name);
        out->model_fingerprint = tdm_rpc_call_strdup(call, v->model_fingerprint);
        out->drafters = tdm_rpc_call_alloc(call, (r->n + 1) * sizeof(char *));
        tdm_compat_refusal ref[MAX_REFUSALS];
        for (size_t i = 0; i < r->n; i++) {
            const Tandem__V1__Descriptor *d = r->items[i].desc;
            if (d->role == TANDEM__V1__ROLE__ROLE_DRAFTER &&
                tdm_compat_check_pair(v, d, ref, MAX_REFUSALS) == 0)
                out->drafters[out->n_drafters++] =
                    tdm_rpc_call_strdup(call, d->model_name[0] ? d->model_name : d->replica_id);
        }
    }
    pthread_mutex_unlock(&r->mu);
}
