/*
 * exchange_bench.c - the drafter<->verifier exchange's transport, alone, in
 * two processes, threaded as the services thread it, with every hand-off
 * timed on the host's one monotonic clock.
 *
 * The "verifier" (this process) has a scheduler thread that queues each
 * verdict for a writer thread and waits for the block, which a reader thread
 * delivers; the "drafter" (a child process, its own gRPC) has a reader
 * thread that queues each verdict for the stream's thread, which "drafts"
 * (polls the clock for --draft-us) and writes the block. Messages carry the
 * stamps, so each part of a round has a name:
 *
 *   queue    verdict queued -> the verifier's writer takes it
 *   vwrite   the verifier's gRPC write, start to completion
 *   there    the verifier's write starts -> the drafter's reader has it
 *   handoff  the drafter's reader -> its stream thread
 *   dwrite   the drafter's gRPC write, start to completion
 *   back     the drafter's write starts -> the verifier's reader has it
 *   deliver  the verifier's reader -> its scheduler
 *   exchange the round less the drafting, as the verifier counts it
 *
 *   bench_exchange_bench [--iters N] [--busy-us N] [--draft-us N]
 *                        [--verify-us N] [--payload N] [--workers N]
 *                        [--client std|raw] [--vserver N] [--transport grpc|lane]
 * --busy-us is both processes' busy-poll time (the services' busy_poll;
 * 0 = off); --verify-us is the scheduler's time between a block and the
 * next verdict (the verify step); --payload pads each message (bytes).
 * --transport lane carries the messages through the exchange lane's
 * shared-memory pipes (service/lane.h) instead of the gRPC stream, with the
 * same threads (the writers' "write" is then the copy into the pipe).
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "bench_util.h"
#include "lane.h"
#include "rpc.h"
#include "spin.h"

#define MSG_DESC (&grpc__health__v1__health_check_request__descriptor)

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void spin_for_us(int64_t us)
{
    const int64_t until = now_ns() + us * 1000;
    while (now_ns() < until)
        tdm_cpu_relax();
}

/* A one-slot mailbox between two threads, polled then slept on (spin.h). */
typedef struct mailbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t gen;
    ProtobufCMessage *msg;
    char text[512];
    int64_t stamp;
    bool full, ended;
} mailbox;

static void mb_init(mailbox *b)
{
    memset(b, 0, sizeof(*b));
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
}

static void mb_put(mailbox *b, const char *text, int64_t stamp, bool ended)
{
    pthread_mutex_lock(&b->mu);
    if (text)
        snprintf(b->text, sizeof(b->text), "%s", text);
    b->stamp = stamp;
    b->full = !ended;
    b->ended = ended;
    tdm_spin_bump(&b->gen);
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Waits for a message; false at the end. */
static bool mb_take(mailbox *b, char *text, size_t len, int64_t *stamp)
{
    pthread_mutex_lock(&b->mu);
    if (!b->full && !b->ended) {
        const uint64_t seen = atomic_load(&b->gen);
        pthread_mutex_unlock(&b->mu);
        tdm_spin_changed(&b->gen, seen);
        pthread_mutex_lock(&b->mu);
    }
    while (!b->full && !b->ended)
        pthread_cond_wait(&b->cv, &b->mu);
    bool ok = b->full;
    if (ok) {
        snprintf(text, len, "%s", b->text);
        *stamp = b->stamp;
        b->full = false;
    }
    pthread_mutex_unlock(&b->mu);
    return ok;
}

static int g_payload;
/* --transport lane: this process's side of the lane (NULL: gRPC). */
static tdm_lane *g_lane;

/* A message's text from the lane: false at its end. */
static bool lane_read(char *text, size_t len)
{
    uint8_t *b = NULL;
    size_t n = 0;
    tdm_error err = {0};
    if (tdm_lane_recv(g_lane, 4096, &b, &n, &err) != TDM_OK)
        return false;
    snprintf(text, len, "%.*s", (int)n, (const char *)b);
    free(b);
    return true;
}

static bool lane_write(const char *text)
{
    tdm_error err = {0};
    return tdm_lane_send(g_lane, (const uint8_t *)text, strlen(text), &err) == TDM_OK;
}

static void message_text(char *out, size_t len, const char *stamps)
{
    snprintf(out, len, "%s %*s", stamps, g_payload > 0 ? g_payload : 0, "");
}

/* ---- the drafter ------------------------------------------------------------ */

typedef struct dside {
    tdm_rpc_call *call;
    mailbox in;
    int64_t draft_us;
} dside;

static void *d_reader(void *arg)
{
    dside *d = arg;
    for (char text[1024]; g_lane;) {
        if (!lane_read(text, sizeof(text))) {
            mb_put(&d->in, NULL, 0, true);
            return NULL;
        }
        mb_put(&d->in, text, now_ns(), false);
    }
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_error err = {0};
        if (tdm_rpc_call_read(d->call, &m, &err) != TDM_OK || !m) {
            mb_put(&d->in, NULL, 0, true);
            return NULL;
        }
        const int64_t t = now_ns();
        mb_put(&d->in, ((Grpc__Health__V1__HealthCheckRequest *)m)->service, t, false);
        protobuf_c_message_free_unpacked(m, NULL);
    }
}

static tdm_status d_stream(tdm_rpc_call *call, tdm_error *err, void *user)
{
    dside d = {.call = call, .draft_us = *(int64_t *)user};
    mb_init(&d.in);
    pthread_t th;
    pthread_create(&th, NULL, d_reader, &d);
    int64_t last_write = 0;
    char text[512], out[1024], stamps[256];
    int64_t t_read;
    tdm_status rc = TDM_OK;
    while (mb_take(&d.in, text, sizeof(text), &t_read)) {
        const int64_t t_take = now_ns();
        spin_for_us(d.draft_us);
        const int64_t t_write = now_ns();
        long long i = atoll(text);
        snprintf(stamps, sizeof(stamps), "%lld %lld %lld %lld %lld", i, (long long)t_read,
                 (long long)t_take, (long long)t_write, (long long)last_write);
        message_text(out, sizeof(out), stamps);
        Grpc__Health__V1__HealthCheckRequest r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        r.service = out;
        if (g_lane ? !lane_write(out) : (rc = tdm_rpc_call_write(call, &r.base, err)) != TDM_OK)
            break;
        last_write = now_ns() - t_write;
    }
    pthread_join(th, NULL);
    return rc;
}

static int drafter_main(int fd, int64_t busy_us, int64_t draft_us, int workers,
                        const Tandem__V1__LaneOffer *offer)
{
    tdm_busy_poll_set(busy_us);
    tdm_error err;
    if (offer) {
        /* The lane: no server, the stream's threads on the pipes. */
        if (tdm_lane_open(offer, &g_lane, &err) != TDM_OK) {
            fprintf(stderr, "exchange_bench: drafter: %s\n", err.msg);
            return 1;
        }
        int ready = 0;
        if (write(fd, &ready, sizeof(ready)) != sizeof(ready))
            return 1;
        close(fd);
        d_stream(NULL, &err, &draft_us);
        tdm_lane_destroy(g_lane);
        return 0;
    }
    tdm_rpc_server *s = NULL;
    tdm_rpc_server_options so = {
        .listen = "127.0.0.1:0", .name = "drafter", .busy_poll = busy_us > 0, .workers = workers};
    if (tdm_rpc_server_create(&so, &s, &err) != TDM_OK ||
        tdm_rpc_server_add_bidi(s, "/bench.X/Draft", MSG_DESC, d_stream, &draft_us, &err) !=
            TDM_OK ||
        tdm_rpc_server_start(s, &err) != TDM_OK) {
        fprintf(stderr, "exchange_bench: drafter: %s\n", err.msg);
        return 1;
    }
    int port = tdm_rpc_server_port(s);
    if (write(fd, &port, sizeof(port)) != sizeof(port))
        return 1;
    close(fd);
    tdm_rpc_wait_for_signal();
    tdm_rpc_server_shutdown(s, 1000);
    tdm_rpc_server_destroy(s);
    return 0;
}

/* ---- the verifier ----------------------------------------------------------- */

typedef struct vside {
    tdm_rpc_stream *st;
    mailbox out, in;
    int64_t *write_ns, *take_ns; /* per round: the writer's write, its take */
    int iters;
} vside;

static void *v_writer(void *arg)
{
    vside *v = arg;
    char text[512], out[1024];
    int64_t t_q;
    for (int i = 0; i < v->iters; i++) {
        if (!mb_take(&v->out, text, sizeof(text), &t_q))
            return NULL;
        const int64_t t_take = now_ns();
        char stamps[128];
        snprintf(stamps, sizeof(stamps), "%d %lld", i, (long long)t_take);
        message_text(out, sizeof(out), stamps);
        Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        q.service = out;
        tdm_error err = {0};
        __atomic_store_n(&v->take_ns[i], t_take, __ATOMIC_RELEASE); /* before the reply */
        if (g_lane ? !lane_write(out) : tdm_rpc_stream_write(v->st, &q.base, &err) != TDM_OK) {
            fprintf(stderr, "exchange_bench: write: %s\n", err.msg);
            exit(1);
        }
        v->write_ns[i] = now_ns() - t_take;
    }
    return NULL;
}

static void *v_reader(void *arg)
{
    vside *v = arg;
    for (char text[1024]; g_lane;) {
        if (!lane_read(text, sizeof(text))) {
            mb_put(&v->in, NULL, 0, true);
            return NULL;
        }
        mb_put(&v->in, text, now_ns(), false);
    }
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_error err = {0};
        if (tdm_rpc_stream_read(v->st, &m, &err) != TDM_OK || !m) {
            mb_put(&v->in, NULL, 0, true);
            return NULL;
        }
        const int64_t t = now_ns();
        mb_put(&v->in, ((Grpc__Health__V1__HealthCheckRequest *)m)->service, t, false);
        protobuf_c_message_free_unpacked(m, NULL);
    }
}

/* Each thread of process `pid` with its voluntary context switches (how
 * often it went to sleep): a thread that sleeps once a round is in the
 * round's path. */
static void thread_sleeps(const char *who, pid_t pid)
{
    char path[96], line[256];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return;
    printf("  %s threads (voluntary / involuntary context switches):", who);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char f[160], name[64] = "?";
        long vol = -1, inv = -1;
        snprintf(f, sizeof(f), "%s/%s/status", path, e->d_name);
        FILE *fp = fopen(f, "r");
        if (!fp)
            continue;
        while (fgets(line, sizeof(line), fp)) {
            sscanf(line, "Name: %63s", name);
            sscanf(line, "voluntary_ctxt_switches: %ld", &vol);
            sscanf(line, "nonvoluntary_ctxt_switches: %ld", &inv);
        }
        fclose(fp);
        printf(" %s %ld/%ld;", name, vol, inv);
    }
    printf("\n");
    closedir(d);
}

/* The verifier's side on one thread that owns the call: it starts each write
 * and keeps a read posted, and is the only thread that polls the call's
 * completion queue (a "next" queue), so no two threads contend for it. */
typedef struct rawlink {
    grpc_channel *ch;
    grpc_completion_queue *cq;
    grpc_call *call;
    vside *v;
} rawlink;

static grpc_byte_buffer *raw_pack(const char *text)
{
    Grpc__Health__V1__HealthCheckRequest q = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    q.service = (char *)text;
    size_t n = grpc__health__v1__health_check_request__get_packed_size(&q);
    grpc_slice sl = grpc_slice_malloc(n);
    grpc__health__v1__health_check_request__pack(&q, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

static void raw_post(rawlink *r, int op_kind, grpc_byte_buffer **buf, void *tag)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = (grpc_op_type)op_kind;
    if (op_kind == GRPC_OP_RECV_MESSAGE)
        op.data.recv_message.recv_message = buf;
    else
        op.data.send_message.send_message = *buf;
    if (grpc_call_start_batch(r->call, &op, 1, tag, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "exchange_bench: raw: start_batch failed\n");
        exit(1);
    }
}

static void *raw_link(void *arg)
{
    rawlink *r = arg;
    vside *v = r->v;
    static int tag_read, tag_write;
    grpc_byte_buffer *rb = NULL, *wb = NULL;
    raw_post(r, GRPC_OP_RECV_MESSAGE, &rb, &tag_read);
    int wi = 0, reads = 0;
    bool writing = false;
    int64_t t_take = 0;
    char text[512], out[1024];
    while (reads < v->iters) {
        if (!writing && wi < v->iters) {
            pthread_mutex_lock(&v->out.mu);
            bool has = v->out.full;
            v->out.full = false;
            pthread_mutex_unlock(&v->out.mu);
            if (has) {
                t_take = now_ns();
                __atomic_store_n(&v->take_ns[wi], t_take, __ATOMIC_RELEASE);
                char stamps[128];
                snprintf(stamps, sizeof(stamps), "%d %lld", wi, (long long)t_take);
                message_text(out, sizeof(out), stamps);
                wb = raw_pack(out);
                raw_post(r, GRPC_OP_SEND_MESSAGE, &wb, &tag_write);
                writing = true;
            }
        }
        grpc_event ev = grpc_completion_queue_next(r->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &tag_write) {
            v->write_ns[wi] = now_ns() - t_take;
            grpc_byte_buffer_destroy(wb);
            wb = NULL;
            writing = false;
            wi++;
        } else if (ev.tag == &tag_read) {
            const int64_t t = now_ns();
            if (!ev.success || !rb) {
                mb_put(&v->in, NULL, 0, true);
                return NULL;
            }
            grpc_byte_buffer_reader rd;
            grpc_byte_buffer_reader_init(&rd, rb);
            grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
            grpc_byte_buffer_destroy(rb);
            rb = NULL;
            Grpc__Health__V1__HealthCheckRequest *m =
                grpc__health__v1__health_check_request__unpack(NULL, GRPC_SLICE_LENGTH(all),
                                                               GRPC_SLICE_START_PTR(all));
            grpc_slice_unref(all);
            snprintf(text, sizeof(text), "%s", m ? m->service : "");
            if (m)
                protobuf_c_message_free_unpacked(&m->base, NULL);
            reads++;
            if (reads < v->iters)
                raw_post(r, GRPC_OP_RECV_MESSAGE, &rb, &tag_read);
            mb_put(&v->in, text, t, false);
        }
    }
    return NULL;
}

static void raw_open(rawlink *r, const char *target)
{
    grpc_init();
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    r->ch = grpc_channel_create(target, cr, NULL);
    grpc_channel_credentials_release(cr);
    r->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice m = grpc_slice_from_static_string("/bench.X/Draft");
    r->call = grpc_channel_create_call(r->ch, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq, m, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    static grpc_metadata_array imd, tmd;
    static grpc_status_code code;
    static grpc_slice details;
    static int tag_status;
    grpc_metadata_array_init(&imd);
    grpc_metadata_array_init(&tmd);
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &imd;
    ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[2].data.recv_status_on_client.trailing_metadata = &tmd;
    ops[2].data.recv_status_on_client.status = &code;
    ops[2].data.recv_status_on_client.status_details = &details;
    if (grpc_call_start_batch(r->call, ops, 3, &tag_status, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "exchange_bench: raw: cannot start the call\n");
        exit(1);
    }
}

static void report(const char *what, double *us, int n)
{
    bench_sort(us, n);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += us[i];
    printf("  %-9s median %7.1f us   p99 %7.1f us   mean %7.1f us\n", what, us[n / 2],
           us[(int)(n * 0.99)], sum / n);
}

int main(int argc, char **argv)
{
    int iters = 2000;
    int64_t busy_us = 0, draft_us = 0, verify_us = 0;
    int workers = 0, vserver = 0;
    bool raw = false, lane = false;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--iters") == 0)
            iters = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--busy-us") == 0)
            busy_us = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--draft-us") == 0)
            draft_us = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--verify-us") == 0)
            verify_us = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--workers") == 0)
            workers = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--vserver") == 0)
            vserver = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--client") == 0)
            raw = strcmp(argv[i + 1], "raw") == 0;
        else if (strcmp(argv[i], "--payload") == 0)
            g_payload = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--transport") == 0)
            lane = strcmp(argv[i + 1], "lane") == 0;
        else {
            fprintf(stderr, "exchange_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (iters < 10 || g_payload < 0 || g_payload > 400) {
        fprintf(stderr, "exchange_bench: --iters >= 10, --payload 0..400\n");
        return 2;
    }
    /* The drafter is forked before this process starts gRPC: two processes,
     * two gRPC cores, as in the services. */
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    Tandem__V1__LaneOffer offer;
    if (lane) {
        tdm_error lerr;
        if (raw || vserver != 0 || tdm_lane_create(&g_lane, &lerr) != TDM_OK) {
            fprintf(stderr, "exchange_bench: --transport lane: %s\n",
                    raw || vserver ? "not with --client raw or --vserver" : lerr.msg);
            return 2;
        }
        tdm_lane_offer(g_lane, &offer);
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        g_lane = NULL; /* the child opens its side from the offer */
        _exit(drafter_main(fds[1], busy_us, draft_us, workers, lane ? &offer : NULL));
    }
    close(fds[1]);
    int port = 0;
    if (read(fds[0], &port, sizeof(port)) != sizeof(port)) {
        fprintf(stderr, "exchange_bench: the drafter did not start\n");
        return 1;
    }
    close(fds[0]);
    tdm_busy_poll_set(busy_us);
    /* --vserver N: this process also serves, as a verifier does (its Run
     * streams), with N idle workers that do not poll (-N: that poll while
     * this process's waits poll, as a verifier's do). */
    tdm_rpc_server *vs = NULL;
    if (vserver != 0) {
        tdm_error verr;
        tdm_rpc_server_options vo = {.listen = "127.0.0.1:0",
                                     .name = "verifier",
                                     .workers = vserver > 0 ? vserver : -vserver,
                                     .busy_poll_workers = vserver < 0};
        if (tdm_rpc_server_create(&vo, &vs, &verr) != TDM_OK ||
            tdm_rpc_server_add_bidi(vs, "/bench.X/Draft", MSG_DESC, d_stream, &draft_us, &verr) !=
                TDM_OK ||
            tdm_rpc_server_start(vs, &verr) != TDM_OK) {
            fprintf(stderr, "exchange_bench: verifier's server: %s\n", verr.msg);
            return 1;
        }
    }
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    tdm_error err;
    tdm_rpc_channel *ch = NULL;
    tdm_rpc_channel_options co = {.target = target};
    vside v = {.iters = iters + 100};
    mb_init(&v.out);
    mb_init(&v.in);
    v.write_ns = calloc((size_t)v.iters, sizeof(int64_t));
    v.take_ns = calloc((size_t)v.iters, sizeof(int64_t));
    rawlink rl = {.v = &v};
    pthread_t wt, rt;
    if (raw) {
        raw_open(&rl, target);
        pthread_create(&rt, NULL, raw_link, &rl);
    } else if (lane) {
        tdm_lane_unlink(g_lane);
        pthread_create(&wt, NULL, v_writer, &v);
        pthread_create(&rt, NULL, v_reader, &v);
    } else {
        if (tdm_rpc_channel_create(&co, &ch, &err) != TDM_OK ||
            tdm_rpc_stream_open(ch, "/bench.X/Draft", NULL, MSG_DESC, NULL, &v.st, &err) !=
                TDM_OK) {
            fprintf(stderr, "exchange_bench: %s\n", err.msg);
            kill(pid, SIGTERM);
            return 1;
        }
        pthread_create(&wt, NULL, v_writer, &v);
        pthread_create(&rt, NULL, v_reader, &v);
    }
    enum { NP = 9 };
    static const char *names[NP] = {"queue", "vwrite",  "there",    "handoff", "dwrite",
                                    "back",  "deliver", "exchange", "round"};
    double *part[NP];
    for (int p = 0; p < NP; p++)
        part[p] = calloc((size_t)iters, sizeof(double));
    int64_t *t_q = calloc((size_t)v.iters, sizeof(int64_t));
    int64_t *t_got = calloc((size_t)v.iters, sizeof(int64_t));
    int64_t(*ds)[4] = calloc((size_t)v.iters, sizeof(*ds)); /* read, take, write, last write */
    char text[512];
    for (int i = 0; i < v.iters; i++) {
        t_q[i] = now_ns();
        mb_put(&v.out, "", t_q[i], false);
        int64_t t_read;
        if (!mb_take(&v.in, text, sizeof(text), &t_read)) {
            fprintf(stderr, "exchange_bench: the stream ended\n");
            return 1;
        }
        t_got[i] = now_ns();
        long long j, a, b, c, d;
        if (sscanf(text, "%lld %lld %lld %lld %lld", &j, &a, &b, &c, &d) != 5 || j != i) {
            fprintf(stderr, "exchange_bench: round %d: a reply out of order\n", i);
            return 1;
        }
        ds[i][0] = a;
        ds[i][1] = b;
        ds[i][2] = c;
        if (i > 0)
            ds[i - 1][3] = d;
        ds[i][3] = 0; /* set by the next reply */
        if (i >= 100) {
            const int k = i - 100;
            const int64_t t_take = __atomic_load_n(&v.take_ns[i], __ATOMIC_ACQUIRE);
            part[0][k] = (double)(t_take - t_q[i]) / 1e3;
            part[2][k] = (double)(a - t_take) / 1e3;
            part[3][k] = (double)(b - a) / 1e3;
            part[5][k] = (double)(t_read - c) / 1e3;
            part[6][k] = (double)(t_got[i] - t_read) / 1e3;
            part[7][k] = (double)((t_got[i] - t_q[i]) - (c - a)) / 1e3;
            part[8][k] = (double)(t_got[i] - t_q[i]) / 1e3;
        }
        spin_for_us(verify_us);
    }
    printf("exchange: %d rounds, busy poll %lld us, draft %lld us, verify %lld us, payload %d, "
           "drafter workers %d (0: the server's default), verifier %s, its own server's workers %d "
           "(< 0: polling)\n",
           iters, (long long)busy_us, (long long)draft_us, (long long)verify_us, g_payload, workers,
           raw    ? "one thread owning the call"
           : lane ? "reader + writer threads on the exchange lane"
                  : "reader + writer threads",
           vserver);
    thread_sleeps("verifier", getpid());
    thread_sleeps("drafter", pid);
    if (raw) {
        pthread_join(rt, NULL);
        grpc_call_cancel(rl.call, NULL);
    } else if (lane) {
        pthread_join(wt, NULL);
    } else {
        tdm_rpc_stream_close_send(v.st, &err);
        pthread_join(wt, NULL);
    }
    for (int k = 0; k < iters; k++) {
        part[1][k] = (double)v.write_ns[k + 100] / 1e3;
        part[4][k] = (double)ds[k + 100 - 1][3] / 1e3;
    }
    ProtobufCMessage *m = NULL;
    while (!raw && !lane && tdm_rpc_stream_read(v.st, &m, &err) == TDM_OK && m) {
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
    }
    if (!raw && !lane)
        pthread_join(rt, NULL);
    for (int p = 0; p < NP; p++)
        report(names[p], part[p], iters);

    if (lane) {
        kill(pid, SIGKILL);
        tdm_lane_close(g_lane);
        pthread_join(rt, NULL);
        tdm_lane_destroy(g_lane);
    } else if (!raw) {
        tdm_rpc_stream_destroy(v.st);
        tdm_rpc_channel_destroy(ch);
    }
    if (vs) {
        tdm_rpc_server_shutdown(vs, 100);
        tdm_rpc_server_destroy(vs);
    }
    kill(pid, SIGTERM);
    int ws = 0;
    waitpid(pid, &ws, 0);
    return 0;
}
