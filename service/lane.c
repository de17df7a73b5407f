/*
 * lane.c - the exchange lane's shared-memory pipes (see lane.h).
 */
#include "lane.h"

#include "alloc.h"
#include "rpc.h"
#include "spin.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const char lane_magic[8] = {'T', 'D', 'M', 'L', 'A', 'N', 'E', '1'};

/* Bounds of an offered pipe's size. */
#define LANE_PIPE_MIN ((uint64_t)64 << 10)
#define LANE_PIPE_MAX ((uint64_t)256 << 20)

/* A pipe's counters: the writer's and the reader's on cache lines of their
 * own. */
typedef struct pipe_ctl {
    _Atomic uint64_t head;  /* bytes written (the writer's) */
    _Atomic uint32_t hseq;  /* bumped after head moves: the reader's futex word */
    _Atomic uint32_t rwait; /* the reader sleeps on hseq */
    char pad0[48];
    _Atomic uint64_t tail;  /* bytes read (the reader's) */
    _Atomic uint32_t tseq;  /* bumped after tail moves: the writer's futex word */
    _Atomic uint32_t wwait; /* the writer sleeps on tseq */
    char pad1[48];
} pipe_ctl;
_Static_assert(sizeof(pipe_ctl) == 128, "a pipe's counters take two cache lines");

#define LANE_CTL_BYTES 4096 /* the counters' page: verifier-to-drafter, then back */

struct tdm_lane {
    tdm_shm seg;
    pipe_ctl *out_ctl, *in_ctl;
    uint8_t *out, *in;
    uint64_t size;
    uint64_t head;      /* bytes written into out (this side's own count) */
    uint64_t tail;      /* bytes read from in */
    uint64_t published; /* tail as in_ctl->tail holds it */
    _Atomic bool closed;
};

tdm_lane_transport tdm_lane_transport_parse(const char *s)
{
    if (s && strcmp(s, "grpc") == 0)
        return TDM_LANE_TRANSPORT_GRPC;
    if (s && strcmp(s, "shm") == 0)
        return TDM_LANE_TRANSPORT_SHM;
    return TDM_LANE_TRANSPORT_AUTO;
}

static void lane_wire(tdm_lane *l, bool verifier)
{
    pipe_ctl *ctl = (pipe_ctl *)l->seg.body;
    uint8_t *v2d = l->seg.body + LANE_CTL_BYTES, *d2v = v2d + l->size;
    l->out_ctl = verifier ? &ctl[0] : &ctl[1];
    l->in_ctl = verifier ? &ctl[1] : &ctl[0];
    l->out = verifier ? v2d : d2v;
    l->in = verifier ? d2v : v2d;
}

tdm_status tdm_lane_create(tdm_lane **out, tdm_error *err)
{
    *out = NULL;
    tdm_lane *l = tdm_xcalloc(1, sizeof(*l));
    l->size = TDM_LANE_PIPE_BYTES;
    if (tdm_shm_create(TDM_LANE_PREFIX, lane_magic, LANE_CTL_BYTES + 2 * l->size, &l->seg, err) !=
        TDM_OK) {
        free(l);
        return err ? err->code : TDM_ERR_UNAVAILABLE;
    }
    lane_wire(l, true);
    *out = l;
    return TDM_OK;
}

tdm_status tdm_lane_open(const Tandem__V1__LaneOffer *offer, tdm_lane **out, tdm_error *err)
{
    *out = NULL;
    if (offer->pipe_bytes < LANE_PIPE_MIN || offer->pipe_bytes > LANE_PIPE_MAX)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "LaneOffer.pipe_bytes %llu is outside %llu..%llu",
                             (unsigned long long)offer->pipe_bytes,
                             (unsigned long long)LANE_PIPE_MIN, (unsigned long long)LANE_PIPE_MAX);
    tdm_lane *l = tdm_xcalloc(1, sizeof(*l));
    l->size = offer->pipe_bytes;
    tdm_status rc =
        tdm_shm_open("LaneOffer", TDM_LANE_PREFIX, lane_magic, offer->name, offer->nonce.data,
                     offer->nonce.len, LANE_CTL_BYTES + 2 * l->size, true, &l->seg, err);
    if (rc != TDM_OK) {
        free(l);
        return rc;
    }
    lane_wire(l, false);
    *out = l;
    return TDM_OK;
}

void tdm_lane_destroy(tdm_lane *l)
{
    if (!l)
        return;
    tdm_shm_close(&l->seg);
    free(l);
}

const char *tdm_lane_name(const tdm_lane *l)
{
    return l->seg.name;
}

void tdm_lane_offer(tdm_lane *l, Tandem__V1__LaneOffer *out)
{
    tandem__v1__lane_offer__init(out);
    out->name = l->seg.name;
    out->nonce.data = l->seg.nonce;
    out->nonce.len = TDM_SHM_NONCE;
    out->pipe_bytes = l->size;
}

void tdm_lane_unlink(tdm_lane *l)
{
    tdm_shm_unlink(&l->seg);
}

/* ---- waits ------------------------------------------------------------------ */

static void futex_wait(_Atomic uint32_t *word, uint32_t seen, long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static tdm_status closed_error(tdm_error *err)
{
    return tdm_error_set(err, TDM_ERR_UNAVAILABLE, "the exchange lane is closed");
}

/* Waits until the peer's count *peer differs from `seen` (or the lane
 * closes): polls for the busy-poll time, then sleeps on the futex word seq
 * with *sleeping set, which the peer reads after bumping seq. Every access
 * is sequentially consistent, so either the peer sees *sleeping or this
 * side sees its new count. */
static tdm_status wait_peer(tdm_lane *l, _Atomic uint64_t *peer, uint64_t seen,
                            _Atomic uint32_t *seq, _Atomic uint32_t *sleeping, tdm_error *err)
{
    const int64_t poll = tdm_busy_poll_us();
    int64_t t0 = -1;
    for (unsigned i = 0;; i++) {
        if (atomic_load(&l->closed))
            return closed_error(err);
        if (atomic_load(peer) != seen)
            return TDM_OK;
        if (poll > 0) {
            if (i % 64 != 0) {
                tdm_cpu_relax();
                continue;
            }
            const int64_t now = tdm_spin_now_us();
            if (t0 < 0)
                t0 = now;
            if (now - t0 < poll) {
                tdm_cpu_relax();
                continue;
            }
        }
        const uint32_t s = atomic_load(seq);
        atomic_store(sleeping, 1);
        if (atomic_load(peer) == seen && !atomic_load(&l->closed))
            futex_wait(seq, s, 100);
        atomic_store(sleeping, 0);
    }
}

/* Publishes this side's count and wakes a peer that sleeps on it. */
static void publish(_Atomic uint64_t *mine, uint64_t v, _Atomic uint32_t *seq,
                    _Atomic uint32_t *sleeping)
{
    atomic_store(mine, v);
    atomic_fetch_add(seq, 1);
    if (atomic_load(sleeping))
        futex_wake(seq);
}

void tdm_lane_close(tdm_lane *l)
{
    atomic_store(&l->closed, true);
    /* this side's own waiters: the reader's word and the writer's */
    futex_wake(&l->in_ctl->hseq);
    futex_wake(&l->out_ctl->tseq);
}

static tdm_status corrupt(tdm_error *err, const char *what, uint64_t peer, uint64_t mine)
{
    return tdm_error_set(err, TDM_ERR_INTERNAL,
                         "the exchange lane's peer left its %s count at %llu, against %llu here: "
                         "not within the pipe",
                         what, (unsigned long long)peer, (unsigned long long)mine);
}

/* ---- sending ---------------------------------------------------------------- */

/* Copies n bytes into the outgoing pipe, publishing what is written
 * whenever it must wait for room. */
static tdm_status put(tdm_lane *l, const uint8_t *src, size_t n, tdm_error *err)
{
    pipe_ctl *c = l->out_ctl;
    while (n > 0) {
        const uint64_t tail = atomic_load(&c->tail);
        const uint64_t used = l->head - tail;
        if (used > l->size)
            return corrupt(err, "read", tail, l->head);
        if (used == l->size) {
            publish(&c->head, l->head, &c->hseq, &c->rwait);
            tdm_status rc = wait_peer(l, &c->tail, tail, &c->tseq, &c->wwait, err);
            if (rc != TDM_OK)
                return rc;
            continue;
        }
        const uint64_t pos = l->head % l->size;
        uint64_t k = l->size - used;
        if (k > l->size - pos)
            k = l->size - pos;
        if (k > n)
            k = n;
        memcpy(l->out + pos, src, (size_t)k);
        l->head += k;
        src += k;
        n -= (size_t)k;
    }
    return TDM_OK;
}

tdm_status tdm_lane_send(tdm_lane *l, const uint8_t *data, size_t len, tdm_error *err)
{
    if (atomic_load(&l->closed))
        return closed_error(err);
    if (len > UINT32_MAX)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "a message of %zu bytes is too long for the exchange lane", len);
    const uint32_t n = (uint32_t)len, key = n ^ TDM_LANE_FRAME_KEY;
    const uint8_t hdr[8] = {(uint8_t)n,           (uint8_t)(n >> 8),   (uint8_t)(n >> 16),
                            (uint8_t)(n >> 24),   (uint8_t)key,        (uint8_t)(key >> 8),
                            (uint8_t)(key >> 16), (uint8_t)(key >> 24)};
    static const uint8_t zeros[8] = {0};
    tdm_status rc = put(l, hdr, sizeof(hdr), err);
    if (rc == TDM_OK)
        rc = put(l, data, len, err);
    if (rc == TDM_OK)
        rc = put(l, zeros, (8 - len % 8) % 8, err);
    if (rc == TDM_OK)
        publish(&l->out_ctl->head, l->head, &l->out_ctl->hseq, &l->out_ctl->rwait);
    return rc;
}

/* ---- receiving -------------------------------------------------------------- */

/* Takes n bytes from the incoming pipe (into dst, or dropped when dst is
 * NULL), publishing what is read whenever it must wait for more. */
static tdm_status get(tdm_lane *l, uint8_t *dst, size_t n, tdm_error *err)
{
    pipe_ctl *c = l->in_ctl;
    while (n > 0) {
        const uint64_t head = atomic_load(&c->head);
        const uint64_t avail = head - l->tail;
        if (avail > l->size)
            return corrupt(err, "written", head, l->tail);
        if (avail == 0) {
            if (l->published != l->tail) {
                l->published = l->tail;
                publish(&c->tail, l->tail, &c->tseq, &c->wwait);
            }
            tdm_status rc = wait_peer(l, &c->head, head, &c->hseq, &c->rwait, err);
            if (rc != TDM_OK)
                return rc;
            continue;
        }
        const uint64_t pos = l->tail % l->size;
        uint64_t k = avail;
        if (k > l->size - pos)
            k = l->size - pos;
        if (k > n)
            k = n;
        if (dst) {
            memcpy(dst, l->in + pos, (size_t)k);
            dst += k;
        }
        l->tail += k;
        n -= (size_t)k;
    }
    return TDM_OK;
}

tdm_status tdm_lane_recv(tdm_lane *l, size_t max_len, uint8_t **data, size_t *len, tdm_error *err)
{
    *data = NULL;
    *len = 0;
    uint8_t hdr[8];
    tdm_status rc = get(l, hdr, sizeof(hdr), err);
    if (rc != TDM_OK)
        return rc;
    const uint32_t n =
        (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
    const uint32_t key =
        (uint32_t)hdr[4] | (uint32_t)hdr[5] << 8 | (uint32_t)hdr[6] << 16 | (uint32_t)hdr[7] << 24;
    if ((n ^ TDM_LANE_FRAME_KEY) != key)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "a corrupt frame on the exchange lane (length %u, check %08x)", n,
                             key);
    if (n > max_len)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "a message of %u bytes on the exchange lane, over the limit of %zu "
                             "(max_message_bytes)",
                             n, max_len);
    uint8_t *buf = tdm_xmalloc(n ? n : 1);
    rc = get(l, buf, n, err);
    if (rc == TDM_OK)
        rc = get(l, NULL, (8 - n % 8) % 8, err);
    if (rc != TDM_OK) {
        free(buf);
        return rc;
    }
    l->published = l->tail;
    publish(&l->in_ctl->tail, l->tail, &l->in_ctl->tseq, &l->in_ctl->wwait);
    *data = buf;
    *len = n;
    return TDM_OK;
}

tdm_status tdm_lane_recv_msg(tdm_lane *l, int64_t max_len, const ProtobufCMessageDescriptor *desc,
                             ProtobufCMessage **msg, tdm_error *err)
{
    *msg = NULL;
    uint8_t *b = NULL;
    size_t n = 0;
    tdm_status rc = tdm_lane_recv(
        l, max_len > 0 ? (size_t)max_len : (size_t)TDM_RPC_DEFAULT_MAX_MESSAGE_BYTES, &b, &n, err);
    if (rc != TDM_OK)
        return rc;
    *msg = protobuf_c_message_unpack(desc, NULL, n, b);
    free(b);
    return TDM_OK;
}
