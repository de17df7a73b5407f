/*
 * lane_test.c - the exchange lane (service/lane.h): a segment created by one
 * side and opened from its offer by the other carries messages both ways, in
 * order and to the byte, from empty ones to ones four times the pipe's size,
 * with both sides polling and with both asleep on their futex words
 * (busy-poll 0); a drafter's open refuses a name of another form, a missing
 * segment, another nonce and a pipe size out of range; a reader refuses a
 * corrupt frame, a frame over its limit and a peer count outside the pipe,
 * naming what is wrong; a close wakes a reader that waits; the name is gone
 * from /dev/shm once unlinked.
 */
#include "../config/check.h"
#include "lane.h"
#include "spin.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t peer_len(void)
{
    return TDM_SHM_HEADER + 4096 + 2 * (size_t)TDM_LANE_PIPE_BYTES;
}

static bool in_dev_shm(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* The body of segment `name` (after its header page), mapped read-write as
 * a peer maps it. */
static uint8_t *peer_map(const char *name)
{
    int fd = shm_open(name, O_RDWR, 0);
    void *m =
        fd < 0 ? MAP_FAILED : mmap(NULL, peer_len(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    CHECK(m != MAP_FAILED, "map %s", name);
    return m == MAP_FAILED ? NULL : (uint8_t *)m + TDM_SHM_HEADER;
}

static void peer_unmap(uint8_t *body)
{
    if (body)
        munmap(body - TDM_SHM_HEADER, peer_len());
}

/* A lane as the verifier creates it (*v, its offer *o) and the drafter's side
 * opened from the offer (*d); false (nothing left) when either fails. */
static bool lane_pair(tdm_lane **v, tdm_lane **d, Tandem__V1__LaneOffer *o)
{
    tdm_error err = {0};
    *v = *d = NULL;
    CHECK(tdm_lane_create(v, &err) == TDM_OK, "create: %s", err.msg);
    if (!*v)
        return false;
    tdm_lane_offer(*v, o);
    CHECK(tdm_lane_open(o, d, &err) == TDM_OK, "open: %s", err.msg);
    if (!*d) {
        tdm_lane_destroy(*v);
        return false;
    }
    return true;
}

/* Message i: its length and bytes, from i alone. */
static size_t msg_len(int i)
{
    static const size_t lens[] = {0,
                                  1,
                                  7,
                                  8,
                                  9,
                                  100,
                                  4096,
                                  65537,
                                  (size_t)TDM_LANE_PIPE_BYTES - 3,
                                  4 * (size_t)TDM_LANE_PIPE_BYTES + 5};
    return i < 10 ? lens[i] : (size_t)(i * 37 % 1500);
}

static void msg_fill(uint8_t *b, size_t n, int i, int dir)
{
    for (size_t j = 0; j < n; j++)
        b[j] = (uint8_t)(j * 131 + (size_t)i * 7 + (size_t)dir * 3);
}

#define N_MSGS 400

typedef struct side {
    tdm_lane *l;
    int dir; /* which way this side sends: 0 verifier to drafter, 1 back */
    int bad; /* messages received that differ from what was sent */
    tdm_status rc;
} side;

static void *sender(void *arg)
{
    side *s = arg;
    uint8_t *b = malloc(msg_len(9));
    for (int i = 0; i < N_MSGS && s->rc == TDM_OK; i++) {
        const size_t n = msg_len(i);
        msg_fill(b, n, i, s->dir);
        tdm_error err = {0};
        s->rc = tdm_lane_send(s->l, b, n, &err);
    }
    free(b);
    return NULL;
}

static void *receiver(void *arg)
{
    side *s = arg;
    uint8_t *want = malloc(msg_len(9));
    for (int i = 0; i < N_MSGS && s->rc == TDM_OK; i++) {
        uint8_t *got = NULL;
        size_t n = 0;
        tdm_error err = {0};
        s->rc = tdm_lane_recv(s->l, (size_t)1 << 30, &got, &n, &err);
        if (s->rc != TDM_OK)
            break;
        msg_fill(want, msg_len(i), i, s->dir);
        if (n != msg_len(i) || memcmp(got, want, n) != 0)
            s->bad++;
        free(got);
    }
    free(want);
    return NULL;
}

/* Both directions at once: a sender and a receiver thread on each side. */
static void test_both_ways(int64_t busy_poll_us)
{
    tdm_busy_poll_set(busy_poll_us);
    tdm_lane *v, *d;
    Tandem__V1__LaneOffer o;
    if (!lane_pair(&v, &d, &o))
        return;
    CHECK(strncmp(o.name, TDM_LANE_PREFIX, strlen(TDM_LANE_PREFIX)) == 0, "name %s", o.name);
    CHECK(in_dev_shm(o.name), "the segment is in /dev/shm");
    char name[64];
    snprintf(name, sizeof(name), "%s", o.name);
    tdm_lane_unlink(v);
    CHECK(!in_dev_shm(name), "unlinked: gone from /dev/shm, both still mapped");
    side vs = {v, 0, 0, TDM_OK}, dr = {d, 0, 0, TDM_OK}, ds = {d, 1, 0, TDM_OK},
         vr = {v, 1, 0, TDM_OK};
    pthread_t th[4];
    pthread_create(&th[0], NULL, sender, &vs);
    pthread_create(&th[1], NULL, receiver, &dr);
    pthread_create(&th[2], NULL, sender, &ds);
    pthread_create(&th[3], NULL, receiver, &vr);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    CHECK(vs.rc == TDM_OK && ds.rc == TDM_OK, "sends: %d %d", vs.rc, ds.rc);
    CHECK(dr.rc == TDM_OK && vr.rc == TDM_OK, "receives: %d %d", dr.rc, vr.rc);
    CHECK(dr.bad == 0 && vr.bad == 0, "busy poll %lld us: %d and %d messages differ",
          (long long)busy_poll_us, dr.bad, vr.bad);
    tdm_lane_destroy(d);
    tdm_lane_destroy(v);
}

static void test_open_checks(void)
{
    tdm_lane *v = NULL, *d = NULL;
    tdm_error err = {0};
    CHECK(tdm_lane_create(&v, &err) == TDM_OK, "create: %s", err.msg);
    if (!v)
        return;
    Tandem__V1__LaneOffer o;
    tdm_lane_offer(v, &o);
    uint8_t nonce[TDM_SHM_NONCE];
    memcpy(nonce, o.nonce.data, sizeof(nonce));
    o.nonce.data = nonce;
    nonce[3] ^= 1;
    CHECK(tdm_lane_open(&o, &d, &err) == TDM_ERR_PERMISSION_DENIED && !d, "another nonce");
    CHECK_HAS(err.msg, "nonce");
    nonce[3] ^= 1;
    o.nonce.len = 5;
    CHECK(tdm_lane_open(&o, &d, &err) == TDM_ERR_INVALID_ARGUMENT && !d, "nonce length");
    CHECK_HAS(err.msg, "LaneOffer.nonce");
    o.nonce.len = TDM_SHM_NONCE;
    o.pipe_bytes = 100;
    CHECK(tdm_lane_open(&o, &d, &err) == TDM_ERR_INVALID_ARGUMENT && !d, "pipe size");
    CHECK_HAS(err.msg, "LaneOffer.pipe_bytes");
    o.pipe_bytes = TDM_LANE_PIPE_BYTES * 2;
    CHECK(tdm_lane_open(&o, &d, &err) == TDM_ERR_INVALID_ARGUMENT && !d, "another size");
    CHECK_HAS(err.msg, "holds");
    o.pipe_bytes = TDM_LANE_PIPE_BYTES;
    char bad[64];
    snprintf(bad, sizeof(bad), "/tandem-feat-1-%032d", 0);
    o.name = bad;
    CHECK(tdm_lane_open(&o, &d, &err) == TDM_ERR_INVALID_ARGUMENT && !d, "a feature ring's name");
    CHECK_HAS(err.msg, "LaneOffer.name");
    snprintf(bad, sizeof(bad), "%s1-%032d", TDM_LANE_PREFIX, 0);
    CHECK(tdm_lane_open(&o, &d, &err) == TDM_ERR_NOT_FOUND && !d, "no such segment");
    CHECK_HAS(err.msg, "another host");
    tdm_lane_destroy(v);
}

typedef struct waiter {
    tdm_lane *l;
    tdm_status rc;
    _Atomic int started;
} waiter;

static void *wait_recv(void *arg)
{
    waiter *w = arg;
    atomic_store(&w->started, 1);
    uint8_t *b = NULL;
    size_t n = 0;
    tdm_error err = {0};
    w->rc = tdm_lane_recv(w->l, 1024, &b, &n, &err);
    free(b);
    return NULL;
}

/* What a reader refuses, and a close that ends a wait. The drafter's side
 * here writes the pipe's bytes and counts by hand, as a hostile peer
 * could. */
static void test_bad_peer(void)
{
    tdm_busy_poll_set(0);
    tdm_lane *v, *d;
    tdm_error err = {0};
    Tandem__V1__LaneOffer o;
    if (!lane_pair(&v, &d, &o))
        return;
    /* over the reader's limit */
    uint8_t big[2000] = {0};
    CHECK(tdm_lane_send(d, big, sizeof(big), &err) == TDM_OK, "send: %s", err.msg);
    uint8_t *b = NULL;
    size_t n = 0;
    CHECK(tdm_lane_recv(v, 1024, &b, &n, &err) == TDM_ERR_INVALID_ARGUMENT && !b, "over the limit");
    CHECK_HAS(err.msg, "2000 bytes");
    CHECK_HAS(err.msg, "max_message_bytes");
    tdm_lane_destroy(d);
    tdm_lane_destroy(v);

    /* a corrupt frame, then a count outside the pipe */
    if (!lane_pair(&v, &d, &o))
        return;
    uint8_t msg[5] = {1, 2, 3, 4, 5};
    CHECK(tdm_lane_send(d, msg, sizeof(msg), &err) == TDM_OK, "send: %s", err.msg);
    /* flip the check word of the frame the drafter side wrote (the d2v
     * pipe follows the counters' page and the v2d pipe) */
    uint8_t *body = peer_map(o.name);
    uint8_t *d2v = body + 4096 + TDM_LANE_PIPE_BYTES;
    d2v[4] ^= 0xff;
    CHECK(tdm_lane_recv(v, 1024, &b, &n, &err) == TDM_ERR_INVALID_ARGUMENT && !b, "corrupt frame");
    CHECK_HAS(err.msg, "corrupt frame");
    peer_unmap(body);
    tdm_lane_destroy(d);
    tdm_lane_destroy(v);

    if (!lane_pair(&v, &d, &o))
        return;
    body = peer_map(o.name);
    /* the d2v pipe's head: second counter block, first word */
    _Atomic uint64_t *head = (_Atomic uint64_t *)(body + 128);
    atomic_store(head, 3 * TDM_LANE_PIPE_BYTES);
    CHECK(tdm_lane_recv(v, 1024, &b, &n, &err) == TDM_ERR_INTERNAL && !b, "count out of the pipe");
    CHECK_HAS(err.msg, "not within the pipe");
    atomic_store(head, 0);
    peer_unmap(body);
    tdm_lane_destroy(d);

    /* a reader asleep (busy poll 0) wakes at close */
    waiter w = {v, TDM_OK, 0};
    pthread_t th;
    pthread_create(&th, NULL, wait_recv, &w);
    while (!atomic_load(&w.started))
        usleep(1000);
    usleep(20000);
    tdm_lane_close(v);
    pthread_join(th, NULL);
    CHECK(w.rc == TDM_ERR_UNAVAILABLE, "a closed lane ends the wait: %d", w.rc);
    CHECK(tdm_lane_send(v, msg, 1, &err) == TDM_ERR_UNAVAILABLE, "no sends once closed");
    tdm_lane_destroy(v);
}

static void test_transport_names(void)
{
    CHECK(tdm_lane_transport_parse("grpc") == TDM_LANE_TRANSPORT_GRPC, "grpc");
    CHECK(tdm_lane_transport_parse("shm") == TDM_LANE_TRANSPORT_SHM, "shm");
    CHECK(tdm_lane_transport_parse("auto") == TDM_LANE_TRANSPORT_AUTO, "auto");
}

int main(void)
{
    test_transport_names();
    test_open_checks();
    test_both_ways(50000);
    test_both_ways(0);
    test_bad_peer();
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
