/*
 * vlink.c - the verifier's Draft streams (see vlink.h).
 */
#include "vlink.h"
#include "spin.h"

#include "alloc.h"
#include "log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LOG "verifier"

/* A message waiting for the writer, serialised. */
typedef struct vlink_msg {
    struct vlink_msg *next;
    size_t len;
    uint8_t data[];
} vlink_msg;

/* Messages a link may hold for a drafter that does not read them before the
 * link is broken (a drafter that stalled: its sequences time out meanwhile). */
#define VLINK_QUEUE_MAX 4096

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
};

vlinks *vlinks_create(const tdm_rpc_tls *tls, const tdm_trust *trust, int64_t max_message_bytes,
                      const vlinks_callbacks *cb)
{
    vlinks *t = tdm_xcalloc(1, sizeof(*t));
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
        tdm_status rc = tdm_rpc_stream_write_raw(l->stream, m->data, m->len, &err);
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

/* Reader thread: hands every message to the scheduler until the stream ends. */
static void *link_reader(void *arg)
{
    vlink *l = arg;
    vlinks *t = l->t;
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
        t->cb.deliver(t->cb.user, l, (Tandem__V1__DraftResponse *)m);
    }
    vlink_unref(l);
    pthread_mutex_lock(&t->mu);
    t->readers--;
    pthread_cond_broadcast(&t->idle_cv);
    pthread_mutex_unlock(&t->mu);
    return NULL;
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
    l->next = t->head;
    t->head = l;
    pthread_mutex_unlock(&t->mu);
    tdm_log_info(LOG, "opened a Draft stream to drafter %s", address);
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
    free(t);
}

bool vlink_send(vlink *l, const Tandem__V1__DraftRequest *msg)
{
    if (vlink_is_broken(l, NULL, 0))
        return false;
    size_t len = tandem__v1__draft_request__get_packed_size(msg);
    vlink_msg *m = tdm_xmalloc(sizeof(*m) + (len ? len : 1));
    m->next = NULL;
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
