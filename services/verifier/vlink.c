/*
 * vlink.c - the verifier's Draft streams (see vlink.h).
 */
#include "vlink.h"
#include "lane.h"
#include "spin.h"

#include "alloc.h"
#include "log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOG "verifier"

/* A message waiting for the writer, serialised. */
typedef struct vlink_msg {
    struct vlink_msg *next;
    uint64_t t_queued; /* ns (now_ns) */
    bool lane_switch;  /* the LaneSwitch: the writer's last message on the stream */
    size_t len;
    uint8_t data[];
} vlink_msg;

/* Messages a link may hold for a drafter that does not read them before the
 * link is broken (a drafter that stalled: its sequences time out meanwhile). */
#define VLINK_QUEUE_MAX 4096

/* How long an offered ring waits for the drafter's answer before the link
 * settles on grpc (a drafter that predates the offer ignores it). */
#define VLINK_OFFER_WAIT_S 10.0

/* A link's feature transport (vlink_feat_ring). */
enum { FEAT_NONE, FEAT_OFFERED, FEAT_SHM, FEAT_GRPC };

/* A link's exchange transport (lane.h). */
enum { LANE_OFFERED = 1, LANE_ON, LANE_GRPC };

struct vlink {
    vlinks *t;
    char address[256];
    tdm_rpc_channel *ch;
    tdm_rpc_stream *stream;
    /* The writer thread's queue (under wmu): the scheduler never waits on a
     * drafter's transport. */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    _Atomic uint64_t wgen; /* bumped with every signal of wcv (spin.h) */
    vlink_msg *qhead, *qtail;
    int queued;
    bool wstop;
    pthread_t writer;
    bool has_writer;
    /* under t->mu */
    int refs;      /* the table, the reader, each holder */
    bool broken;   /* out of the table; its sequences fall back to plain */
    char why[300]; /* why it broke */
    struct vlink *next;
    /* Feature transport: feat moves NONE -> OFFERED on the scheduler thread
     * (ring set before, published by the store), OFFERED -> SHM or GRPC on
     * the reader thread (the answer) or the scheduler's (no answer in time);
     * NONE -> GRPC when no ring is tried. fnote (under t->mu) says why grpc. */
    _Atomic int feat;
    tdm_feat_ring *ring; /* freed with the link */
    double offered_at;   /* CLOCK_MONOTONIC seconds */
    char fnote[300];
    /* Exchange transport: lane_state is LANE_OFFERED from the open (the
     * offer is the stream's first message) until the reader takes the
     * drafter's answer: LANE_ON (a lane reader thread reads the drafter's
     * pipe from then on, and the writer, after it wrote the LaneSwitch,
     * writes into the lane: lane_tx, the writer's alone) or LANE_GRPC;
     * LANE_GRPC at once when no lane is tried (the log says why). */
    _Atomic int lane_state;
    tdm_lane *lane; /* freed with the link, or (under t->mu) once refused */
    bool lane_tx;
    _Atomic bool lane_late; /* settled on grpc for want of an answer: a late one still counts */
    double lane_offered_at; /* CLOCK_MONOTONIC seconds */
    atomic_flag gpu_noted; /* vlink_note_once: the GPU it shares was logged */
};

struct vlinks {
    const tdm_rpc_tls *tls;
    const tdm_trust *trust;
    int64_t max_message_bytes;
    vlinks_callbacks cb;
    pthread_mutex_t mu;
    pthread_cond_t idle_cv; /* a reader exited */
    vlink *head;            /* live links */
    int readers;
    vlinks_feat feat; /* setting: a copy of the caller's */
    _Atomic uint64_t feat_shm, feat_grpc;
    vlinks_lane lane; /* setting: a copy of the caller's */
    _Atomic uint64_t lane_shm, lane_grpc;
    /* The verifier's parts of the exchange (vlinks_exchange_parts), ns. */
    _Atomic uint64_t queue_ns, write_ns, deliver_ns, writes, delivers;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

vlinks *vlinks_create(const tdm_rpc_tls *tls, const tdm_trust *trust, int64_t max_message_bytes,
                      const vlinks_feat *feat, const vlinks_lane *lane, const vlinks_callbacks *cb)
{
    vlinks *t = tdm_xcalloc(1, sizeof(*t));
    t->lane.transport = lane ? lane->transport : TDM_LANE_TRANSPORT_GRPC;
    t->lane.setting = tdm_xstrdup(lane && lane->setting ? lane->setting : "exchange_transport");
    t->feat.transport = feat ? feat->transport : TDM_FEAT_TRANSPORT_GRPC;
    t->feat.shm_bytes = feat ? feat->shm_bytes : 0;
    t->feat.setting = tdm_xstrdup(feat && feat->setting ? feat->setting : "feature_transport");
    t->tls = tls;
    t->trust = trust;
    t->max_message_bytes = max_message_bytes;
    t->cb = *cb;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->idle_cv, NULL);
    return t;
}

static void link_free(vlink *l)
{
    if (l->lane)
        tdm_lane_close(l->lane); /* a writer waiting for room in it returns */
    if (l->has_writer) {
        pthread_mutex_lock(&l->wmu);
        l->wstop = true;
        tdm_spin_bump(&l->wgen);
        pthread_cond_broadcast(&l->wcv);
        pthread_mutex_unlock(&l->wmu);
        pthread_join(l->writer, NULL);
    }
    for (vlink_msg *m = l->qhead; m;) {
        vlink_msg *n = m->next;
        free(m);
        m = n;
    }
    pthread_mutex_destroy(&l->wmu);
    pthread_cond_destroy(&l->wcv);
    if (l->stream)
        tdm_rpc_stream_destroy(l->stream);
    if (l->ch)
        tdm_rpc_channel_destroy(l->ch);
    tdm_feat_ring_destroy(l->ring);
    tdm_lane_destroy(l->lane);
    free(l);
}

void vlink_ref(vlink *l)
{
    pthread_mutex_lock(&l->t->mu);
    l->refs++;
    pthread_mutex_unlock(&l->t->mu);
}

void vlink_unref(vlink *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->t->mu);
    bool last = --l->refs == 0;
    pthread_mutex_unlock(&l->t->mu);
    if (last)
        link_free(l);
}

const char *vlink_address(const vlink *l)
{
    return l->address;
}

bool vlink_note_once(vlink *l)
{
    return !atomic_flag_test_and_set(&l->gpu_noted);
}

bool vlink_is_broken(vlink *l, char *why, size_t why_len)
{
    pthread_mutex_lock(&l->t->mu);
    bool b = l->broken;
    if (b && why)
        snprintf(why, why_len, "%s", l->why);
    pthread_mutex_unlock(&l->t->mu);
    return b;
}

void vlink_break(vlink *l, const char *why)
{
    vlinks *t = l->t;
    pthread_mutex_lock(&t->mu);
    if (l->broken) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    l->broken = true;
    snprintf(l->why, sizeof(l->why), "%s", why);
    bool in_table = false;
    for (vlink **pp = &t->head; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            in_table = true;
            break;
        }
    /* The table's reference: never the last, the caller holds one. */
    if (in_table)
        l->refs--;
    if (l->lane)
        tdm_lane_close(l->lane); /* under t->mu: a refused lane is freed under it */
    pthread_mutex_unlock(&t->mu);
    tdm_log_warn(LOG, "drafter %s: %s; its sequences continue without speculation", l->address,
                 why);
    tdm_rpc_stream_cancel(l->stream);
    t->cb.broken(t->cb.user, l, why);
}

/* Writer thread: writes the queued messages in order; a failed write breaks
 * the link. Holds no reference: link_free stops and joins it first. */
static void *link_writer(void *arg)
{
    vlink *l = arg;
    pthread_mutex_lock(&l->wmu);
    for (;;) {
        if (!l->qhead && !l->wstop) {
            /* Busy polling (spin.h): the next verdict leaves at once. */
            const uint64_t seen = atomic_load(&l->wgen);
            pthread_mutex_unlock(&l->wmu);
            tdm_spin_changed(&l->wgen, seen);
            pthread_mutex_lock(&l->wmu);
        }
        while (!l->qhead && !l->wstop)
            pthread_cond_wait(&l->wcv, &l->wmu);
        if (l->wstop)
            break;
        vlink_msg *m = l->qhead;
        l->qhead = m->next;
        if (!l->qhead)
            l->qtail = NULL;
        l->queued--;
        pthread_mutex_unlock(&l->wmu);
        tdm_error err = {0};
        const uint64_t t_take = now_ns();
        tdm_status rc = l->lane_tx ? tdm_lane_send(l->lane, m->data, m->len, &err)
                                   : tdm_rpc_stream_write_raw(l->stream, m->data, m->len, &err);
        if (rc == TDM_OK && m->lane_switch)
            l->lane_tx = true; /* the drafter reads its pipe after this message */
        atomic_fetch_add(&l->t->queue_ns, t_take - m->t_queued);
        atomic_fetch_add(&l->t->write_ns, now_ns() - t_take);
        atomic_fetch_add(&l->t->writes, 1);
        free(m);
        if (rc != TDM_OK) {
            char why[300];
            snprintf(why, sizeof(why), "write failed (%s: %s)", tdm_status_name(err.code), err.msg);
            vlink_break(l, why);
        }
        pthread_mutex_lock(&l->wmu);
    }
    pthread_mutex_unlock(&l->wmu);
    return NULL;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A shared-memory transport that a link cannot have (`cannot` says what
 * cannot go by it), for `why`: with its setting shm set explicitly
 * (`required`) the link ends with an error naming the setting (never a
 * quiet fallback); else it goes on over grpc, which the log says (`on`:
 * what is on grpc). */
static void shm_fallback(vlink *l, bool required, const char *setting, const char *key,
                         const char *cannot, const char *on, const char *why)
{
    if (required) {
        char msg[700];
        snprintf(msg, sizeof(msg),
                 "%s, but %s: %s (run the drafter on this host or in this pod with /dev/shm "
                 "shared, or set %s auto or grpc)",
                 setting, cannot, why, key);
        tdm_log_error(LOG, "drafter %s: %s", l->address, msg);
        vlink_break(l, msg);
        return;
    }
    tdm_log_info(LOG, "drafter %s: %s on grpc (%s: %s)", l->address, on, setting, why);
}

/* The link settled on grpc (l->feat is FEAT_GRPC now), for `why`; with
 * feature_transport shm set explicitly that ends the link instead (never a
 * quiet fallback). */
static void feat_settle_grpc(vlink *l, const char *why)
{
    vlinks *t = l->t;
    pthread_mutex_lock(&t->mu);
    snprintf(l->fnote, sizeof(l->fnote), "%s", why);
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_add(&t->feat_grpc, 1);
    if (l->ring)
        tdm_feat_ring_unlink(l->ring);
    shm_fallback(
        l, t->feat.transport == TDM_FEAT_TRANSPORT_SHM, t->feat.setting, "feature_transport",
        "the hidden states cannot go by shared memory to this drafter", "feature stream", why);
}

/* Takes what the reader handles itself: the drafter's shm_consumed (frees
 * ring space) and its answer to the offer (true: r is not for the
 * scheduler). */
static bool feat_take(vlink *l, const Tandem__V1__DraftResponse *r)
{
    const int st = atomic_load(&l->feat);
    if (r->shm_consumed && (st == FEAT_OFFERED || st == FEAT_SHM) &&
        !tdm_feat_ring_release(l->ring, r->shm_consumed))
        tdm_log_warn(LOG,
                     "drafter %s: shm_consumed %llu lies beyond the rows written to its feature "
                     "ring; ignored",
                     l->address, (unsigned long long)r->shm_consumed);
    if (r->kind_case != TANDEM__V1__DRAFT_RESPONSE__KIND_SHM_ANSWER)
        return false;
    const Tandem__V1__FeatureShmAnswer *a = r->shm_answer;
    if (st != FEAT_OFFERED) {
        tdm_log_warn(LOG, "drafter %s: a FeatureShmAnswer to no offer; ignored", l->address);
        return true;
    }
    int want = FEAT_OFFERED;
    if (!atomic_compare_exchange_strong(&l->feat, &want, a->accepted ? FEAT_SHM : FEAT_GRPC))
        return true; /* settled on grpc meanwhile (no answer in time) */
    if (!a->accepted) {
        char why[400];
        snprintf(why, sizeof(why), "the drafter did not take the shared-memory ring: %s",
                 a->message && a->message[0] ? a->message : "(no reason given)");
        feat_settle_grpc(l, why);
        /* Its memory goes now, not with the link: only this thread touches
         * the ring of a link settled on grpc (the scheduler's use needs
         * FEAT_SHM; the timeout path, which may race with this thread,
         * leaves it to link_free). */
        tdm_feat_ring_destroy(l->ring);
        l->ring = NULL;
        return true;
    }
    /* Both sides hold it mapped: the name goes, so nothing is left in
     * /dev/shm whichever process dies. */
    tdm_feat_ring_unlink(l->ring);
    atomic_fetch_add(&l->t->feat_shm, 1);
    tdm_log_info(LOG, "drafter %s: feature stream on shm (%s; a %llu-byte ring, handshake done)",
                 l->address, l->t->feat.setting, (unsigned long long)tdm_feat_ring_bytes(l->ring));
    return true;
}

tdm_feat_ring *vlink_feat_ring(vlink *l)
{
    vlinks *t = l->t;
    const int st = atomic_load(&l->feat);
    if (st == FEAT_SHM)
        return l->ring;
    if (st == FEAT_GRPC)
        return NULL;
    if (st == FEAT_OFFERED) {
        if (mono_s() - l->offered_at > VLINK_OFFER_WAIT_S) {
            int want = FEAT_OFFERED;
            if (atomic_compare_exchange_strong(&l->feat, &want, FEAT_GRPC))
                feat_settle_grpc(l, "the drafter did not answer the offer of a shared-memory "
                                    "ring (a drafter that predates it)");
        }
        return NULL;
    }
    if (t->feat.transport == TDM_FEAT_TRANSPORT_GRPC) {
        atomic_store(&l->feat, FEAT_GRPC);
        feat_settle_grpc(l, "the setting");
        return NULL;
    }
    tdm_error err = {0};
    if (tdm_feat_ring_create(t->feat.shm_bytes, &l->ring, &err) != TDM_OK) {
        char why[400];
        snprintf(why, sizeof(why), "no segment (%s)", err.msg);
        atomic_store(&l->feat, FEAT_GRPC);
        feat_settle_grpc(l, why);
        return NULL;
    }
    Tandem__V1__FeatureShmOffer o = TANDEM__V1__FEATURE_SHM_OFFER__INIT;
    o.name = (char *)tdm_feat_ring_name(l->ring);
    o.nonce.data = (uint8_t *)tdm_feat_ring_nonce(l->ring);
    o.nonce.len = TDM_FEAT_SHM_NONCE;
    o.ring_bytes = tdm_feat_ring_bytes(l->ring);
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_SHM_OFFER;
    m.shm_offer = &o;
    l->offered_at = mono_s();
    atomic_store(&l->feat, FEAT_OFFERED);
    tdm_log_info(LOG, "drafter %s: offering a %llu-byte shared-memory feature ring %s (%s)",
                 l->address, (unsigned long long)o.ring_bytes, o.name, t->feat.setting);
    vlink_send(l, &m);
    return NULL;
}

void vlink_feat_state(vlink *l, char *buf, size_t len)
{
    switch (atomic_load(&l->feat)) {
    case FEAT_SHM:
        snprintf(buf, len, "shm");
        break;
    case FEAT_OFFERED:
        snprintf(buf, len, "shm offered");
        break;
    case FEAT_GRPC:
        pthread_mutex_lock(&l->t->mu);
        snprintf(buf, len, "grpc (%s)", l->fnote);
        pthread_mutex_unlock(&l->t->mu);
        break;
    default:
        snprintf(buf, len, "none yet");
        break;
    }
}

void vlinks_feat_counts(vlinks *t, uint64_t *shm, uint64_t *grpc)
{
    *shm = atomic_load(&t->feat_shm);
    *grpc = atomic_load(&t->feat_grpc);
}

void vlinks_exchange_parts(vlinks *t, vlinks_parts *out)
{
    out->queue_us = (double)atomic_load(&t->queue_ns) * 1e-3;
    out->write_us = (double)atomic_load(&t->write_ns) * 1e-3;
    out->deliver_us = (double)atomic_load(&t->deliver_ns) * 1e-3;
    out->writes = atomic_load(&t->writes);
    out->delivers = atomic_load(&t->delivers);
}

/* ---- the exchange lane ------------------------------------------------------ */

/* The link's exchange settled on grpc (lane_state LANE_GRPC), for `why`;
 * with exchange_transport shm set explicitly that ends the link instead
 * (never a quiet fallback). */
static void lane_settle_grpc(vlink *l, const char *why)
{
    vlinks *t = l->t;
    atomic_store(&l->lane_state, LANE_GRPC);
    atomic_fetch_add(&t->lane_grpc, 1);
    if (l->lane)
        tdm_lane_unlink(l->lane);
    shm_fallback(l, t->lane.transport == TDM_LANE_TRANSPORT_SHM, t->lane.setting,
                 "exchange_transport", "this Draft stream's messages cannot go by shared memory",
                 "exchange", why);
}

static bool queue_msg(vlink *l, const Tandem__V1__DraftRequest *msg, bool lane_switch);
static void *lane_reader(void *arg);

/* Takes the drafter's answer to the lane's offer (true: r is not for the
 * scheduler). Accepted: the lane reader starts on the drafter's pipe (the
 * drafter writes nothing more on the stream) and the LaneSwitch is queued
 * behind whatever the writer has yet to write on the stream. */
static bool lane_take(vlink *l, const Tandem__V1__DraftResponse *r)
{
    if (r->kind_case != TANDEM__V1__DRAFT_RESPONSE__KIND_LANE_ANSWER)
        return false;
    vlinks *t = l->t;
    const Tandem__V1__LaneAnswer *a = r->lane_answer;
    int want = LANE_OFFERED;
    if (!atomic_compare_exchange_strong(&l->lane_state, &want, a->accepted ? LANE_ON : LANE_GRPC)) {
        /* An answer after the verifier stopped waiting (auto): the drafter
         * that took the lane writes into it from now on, so the lane is
         * taken even so. */
        want = LANE_GRPC;
        if (!(a->accepted && atomic_load(&l->lane_late) &&
              atomic_compare_exchange_strong(&l->lane_state, &want, LANE_ON))) {
            tdm_log_warn(LOG, "drafter %s: a LaneAnswer to no offer; ignored", l->address);
            return true;
        }
        atomic_fetch_sub(&t->lane_grpc, 1);
    }
    if (!a->accepted) {
        char why[400];
        snprintf(why, sizeof(why), "the drafter did not take the shared-memory lane: %s",
                 a->message && a->message[0] ? a->message : "(no reason given)");
        lane_settle_grpc(l, why);
        /* Its memory goes now: nothing but vlink_break (under t->mu) and
         * link_free touch a lane that was never taken. */
        pthread_mutex_lock(&t->mu);
        tdm_lane *gone = l->lane;
        l->lane = NULL;
        pthread_mutex_unlock(&t->mu);
        tdm_lane_destroy(gone);
        return true;
    }
    /* Both sides hold it mapped: the name goes, so nothing is left in
     * /dev/shm whichever process dies. */
    tdm_lane_unlink(l->lane);
    pthread_mutex_lock(&t->mu);
    l->refs++;
    t->readers++;
    pthread_mutex_unlock(&t->mu);
    pthread_t th;
    if (pthread_create(&th, NULL, lane_reader, l) != 0) {
        pthread_mutex_lock(&t->mu);
        l->refs--; /* never the last: this thread holds one */
        t->readers--;
        pthread_mutex_unlock(&t->mu);
        vlink_break(l, "cannot start the exchange lane's reader");
        return true;
    }
    pthread_detach(th);
    atomic_fetch_add(&t->lane_shm, 1);
    tdm_log_info(LOG, "drafter %s: exchange on shm (%s; two %llu-byte pipes, handshake done)",
                 l->address, t->lane.setting, (unsigned long long)TDM_LANE_PIPE_BYTES);
    Tandem__V1__LaneSwitch sw = TANDEM__V1__LANE_SWITCH__INIT;
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_LANE_SWITCH;
    m.lane_switch = &sw;
    queue_msg(l, &m, true);
    return true;
}

/* A drafter's message, from either reader: what the link takes itself, or
 * the scheduler's. */
static void take_response(vlink *l, Tandem__V1__DraftResponse *r)
{
    vlinks *t = l->t;
    if (feat_take(l, r) || lane_take(l, r)) {
        protobuf_c_message_free_unpacked(&r->base, NULL);
        return;
    }
    const uint64_t t_read = now_ns();
    t->cb.deliver(t->cb.user, l, r);
    atomic_fetch_add(&t->deliver_ns, now_ns() - t_read);
    atomic_fetch_add(&t->delivers, 1);
}

static void reader_exit(vlink *l)
{
    vlinks *t = l->t;
    vlink_unref(l);
    pthread_mutex_lock(&t->mu);
    t->readers--;
    pthread_cond_broadcast(&t->idle_cv);
    pthread_mutex_unlock(&t->mu);
}

/* Lane reader thread: the drafter's messages from its pipe, until the link
 * breaks (which closes the lane). */
static void *lane_reader(void *arg)
{
    vlink *l = arg;
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_error err = {0};
        tdm_status rc = tdm_lane_recv_msg(l->lane, l->t->max_message_bytes,
                                          &tandem__v1__draft_response__descriptor, &m, &err);
        if (rc != TDM_OK) {
            if (rc != TDM_ERR_UNAVAILABLE) {
                char why[400];
                snprintf(why, sizeof(why), "exchange lane: %s", err.msg);
                vlink_break(l, why);
            }
            break;
        }
        if (!m) {
            vlink_break(l, "the drafter sent a message on the exchange lane that does not decode "
                           "as a DraftResponse");
            break;
        }
        take_response(l, (Tandem__V1__DraftResponse *)m);
    }
    reader_exit(l);
    return NULL;
}

void vlinks_lane_counts(vlinks *t, uint64_t *shm, uint64_t *grpc)
{
    *shm = atomic_load(&t->lane_shm);
    *grpc = atomic_load(&t->lane_grpc);
}

/* Reader thread: hands every message to the scheduler until the stream ends. */
static void *link_reader(void *arg)
{
    vlink *l = arg;
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_error err = {0};
        tdm_status rc = tdm_rpc_stream_read(l->stream, &m, &err);
        if (rc != TDM_OK || !m) {
            if (m)
                protobuf_c_message_free_unpacked(m, NULL);
            char why[300];
            snprintf(why, sizeof(why), "Draft stream ended (%s%s%s)", tdm_status_name(rc),
                     err.msg[0] ? ": " : "", err.msg);
            vlink_break(l, why);
            break;
        }
        take_response(l, (Tandem__V1__DraftResponse *)m);
    }
    reader_exit(l);
    return NULL;
}

/* Before a new link is published: its lane's segment, where the setting
 * allows one (else *why says why not, for lane_settle_grpc once published);
 * false (err set) where exchange_transport shm cannot be had. */
static bool lane_prepare(vlink *l, char *why, size_t why_len, tdm_error *err)
{
    vlinks *t = l->t;
    why[0] = '\0';
    if (t->lane.transport == TDM_LANE_TRANSPORT_GRPC) {
        snprintf(why, why_len, "the setting");
        return true;
    }
    tdm_error lerr = {0};
    if (tdm_lane_create(&l->lane, &lerr) == TDM_OK)
        return true;
    if (t->lane.transport == TDM_LANE_TRANSPORT_SHM) {
        tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                      "%s, but no shared-memory lane can be made for drafter %s: %s",
                      t->lane.setting, l->address, lerr.msg);
        return false;
    }
    snprintf(why, why_len, "no segment (%s)", lerr.msg);
    return true;
}

/* The lane's offer, the stream's first message (under t->mu, before the
 * link is published). */
static void lane_offer_locked(vlink *l)
{
    if (!l->lane)
        return;
    Tandem__V1__LaneOffer o;
    tdm_lane_offer(l->lane, &o);
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_LANE_OFFER;
    m.lane_offer = &o;
    l->lane_offered_at = mono_s();
    atomic_store(&l->lane_state, LANE_OFFERED);
    queue_msg(l, &m, false);
}

static vlink *find_live_locked(vlinks *t, const char *address)
{
    for (vlink *l = t->head; l; l = l->next)
        if (strcmp(l->address, address) == 0)
            return l;
    return NULL;
}

vlink *vlinks_get(vlinks *t, const char *address, tdm_error *err)
{
    pthread_mutex_lock(&t->mu);
    vlink *l = find_live_locked(t, address);
    if (l) {
        l->refs++;
        pthread_mutex_unlock(&t->mu);
        return l;
    }
    pthread_mutex_unlock(&t->mu);

    /* Open without the lock: a channel reads TLS files and resolves names. */
    l = tdm_xcalloc(1, sizeof(*l));
    l->t = t;
    pthread_mutex_init(&l->wmu, NULL);
    pthread_cond_init(&l->wcv, NULL);
    snprintf(l->address, sizeof(l->address), "%s", address);
    tdm_rpc_channel_options co = {
        .target = address, .tls = t->tls, .max_message_bytes = t->max_message_bytes};
    tdm_rpc_metadata md;
    tdm_rpc_call_options so = {.metadata = &md, .n_metadata = tdm_trust_metadata(t->trust, &md)};
    if (tdm_rpc_channel_create(&co, &l->ch, err) != TDM_OK ||
        tdm_rpc_stream_open(l->ch, "/tandem.v1.Drafter/Draft", NULL,
                            &tandem__v1__draft_response__descriptor, &so, &l->stream,
                            err) != TDM_OK) {
        link_free(l);
        return NULL;
    }
    char lwhy[400];
    if (!lane_prepare(l, lwhy, sizeof(lwhy), err)) {
        tdm_rpc_stream_cancel(l->stream);
        link_free(l);
        return NULL;
    }
    pthread_mutex_lock(&t->mu);
    vlink *other = find_live_locked(t, address);
    if (other) {
        /* Another request opened one meanwhile: use it, drop ours. */
        other->refs++;
        pthread_mutex_unlock(&t->mu);
        tdm_rpc_stream_cancel(l->stream);
        link_free(l);
        return other;
    }
    l->refs = 3; /* table, caller, reader */
    pthread_t th;
    l->has_writer = pthread_create(&l->writer, NULL, link_writer, l) == 0;
    if (!l->has_writer || pthread_create(&th, NULL, link_reader, l) != 0) {
        pthread_mutex_unlock(&t->mu);
        link_free(l);
        tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "cannot start a Draft stream reader");
        return NULL;
    }
    pthread_detach(th);
    t->readers++;
    lane_offer_locked(l);
    l->next = t->head;
    t->head = l;
    pthread_mutex_unlock(&t->mu);
    tdm_log_info(LOG, "opened a Draft stream to drafter %s", address);
    if (l->lane)
        tdm_log_info(LOG, "drafter %s: offering a shared-memory exchange lane %s (%s)", address,
                     tdm_lane_name(l->lane), t->lane.setting);
    else
        lane_settle_grpc(l, lwhy);
    return l;
}

void vlinks_break_address(vlinks *t, const char *address, const char *why)
{
    pthread_mutex_lock(&t->mu);
    vlink *l = find_live_locked(t, address);
    if (l)
        l->refs++;
    pthread_mutex_unlock(&t->mu);
    if (!l)
        return;
    vlink_break(l, why);
    vlink_unref(l);
}

int vlinks_count(vlinks *t)
{
    pthread_mutex_lock(&t->mu);
    int n = 0;
    for (vlink *l = t->head; l; l = l->next)
        n++;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void vlinks_destroy(vlinks *t)
{
    if (!t)
        return;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        vlink *l = t->head;
        if (l)
            l->refs++;
        pthread_mutex_unlock(&t->mu);
        if (!l)
            break;
        vlink_break(l, "the verifier shut down");
        vlink_unref(l);
    }
    pthread_mutex_lock(&t->mu);
    while (t->readers > 0)
        pthread_cond_wait(&t->idle_cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->idle_cv);
    free((char *)t->feat.setting);
    free((char *)t->lane.setting);
    free(t);
}

/* Queues msg for the writer (lane_switch: the LaneSwitch, after which the
 * writer writes into the lane). */
static bool queue_msg(vlink *l, const Tandem__V1__DraftRequest *msg, bool lane_switch)
{
    size_t len = tandem__v1__draft_request__get_packed_size(msg);
    vlink_msg *m = tdm_xmalloc(sizeof(*m) + (len ? len : 1));
    m->next = NULL;
    m->lane_switch = lane_switch;
    m->len = tandem__v1__draft_request__pack(msg, m->data);
    pthread_mutex_lock(&l->wmu);
    bool full = l->queued >= VLINK_QUEUE_MAX;
    if (!full) {
        if (l->qtail)
            l->qtail->next = m;
        else
            l->qhead = m;
        l->qtail = m;
        l->queued++;
        m->t_queued = now_ns();
        tdm_spin_bump(&l->wgen);
        pthread_cond_signal(&l->wcv);
    }
    pthread_mutex_unlock(&l->wmu);
    if (full) {
        free(m);
        vlink_break(l, "the drafter does not read its Draft stream (4096 messages queued)");
        return false;
    }
    return true;
}

bool vlink_send(vlink *l, const Tandem__V1__DraftRequest *msg)
{
    if (vlink_is_broken(l, NULL, 0))
        return false;
    if (atomic_load(&l->lane_state) == LANE_OFFERED &&
        mono_s() - l->lane_offered_at > VLINK_OFFER_WAIT_S) {
        int want = LANE_OFFERED;
        atomic_store(&l->lane_late, l->t->lane.transport == TDM_LANE_TRANSPORT_AUTO);
        if (atomic_compare_exchange_strong(&l->lane_state, &want, LANE_GRPC))
            lane_settle_grpc(l, "the drafter did not answer the offer of a shared-memory lane in "
                                "10 s (a drafter that predates it)");
        if (vlink_is_broken(l, NULL, 0))
            return false;
    }
    return queue_msg(l, msg, false);
}

bool vlink_send_close(vlink *l, uint64_t sequence_id, const char *reason)
{
    Tandem__V1__SequenceClose c = TANDEM__V1__SEQUENCE_CLOSE__INIT;
    c.sequence_id = sequence_id;
    c.reason = (char *)reason;
    Tandem__V1__DraftRequest m = TANDEM__V1__DRAFT_REQUEST__INIT;
    m.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_CLOSE;
    m.close = &c;
    return vlink_send(l, &m);
}
