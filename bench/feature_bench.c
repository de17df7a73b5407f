/*
 * feature_bench.c - the feature stream's two transports side by side: the
 * time a verifier spends putting a message's hidden-state rows out, the
 * time until a drafter has them as fp32, and the bytes on the wire, for
 * grpc (rows inline in the Draft stream's message) and shm (rows in the
 * shared-memory ring, the message carrying a reference).
 *
 * Both sides run the services' own code (service/feature_stream.c,
 * service/feature_shm.c): the verifier encodes fp32 rows (tdm_feat_out_append),
 * then either packs them into a Verdict (grpc) or copies them into the ring
 * and packs a Verdict with the reference (shm), and writes the packed message
 * to a Unix socket; a drafter thread reads it, unpacks it, decodes the rows
 * (tdm_feat_in_append_shm) and answers with the ring offset read up to, which
 * the verifier releases, as its reader thread does with shm_consumed. The
 * messages go over a real Draft-shaped gRPC stream on loopback (the rpc
 * layer's tdm_rpc_stream_write_raw, as vlink's writer); "put" is the
 * verifier's part up to the write's return, "e2e" until the drafter's answer
 * came back (both transports pay the same answer). One process: the
 * drafter's stream handler is a thread of the same process, as the ring is
 * shared memory either way.
 *
 * usage: bench_feature_bench [--hidden 2560] [--rows 4] [--rounds 2000]
 *                            [--prompt 2000] [--prompt-rounds 20] [--f32]
 */
#include "bench_util.h"
#include "feature_shm.h"
#include "feature_stream.h"

#include "rpc.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The drafter's side of one run: the ring mapped as the drafter maps it
 * (nothing mapped: grpc), and its own time. */
typedef struct side {
    int width;
    tdm_feat_map map;
    double decode_s; /* unpack is the rpc layer's; this is the rows' decode */
} side;

static side g_side;

/* The drafter: each Verdict's rows decoded to fp32 (from the message or
 * the ring), answered with a DraftResponse carrying shm_consumed. */
static tdm_status drafter_stream(tdm_rpc_call *call, tdm_error *err, void *user)
{
    side *d = user;
    tdm_feat_in in;
    tdm_feat_in_init(&in, d->width);
    tdm_status st = TDM_OK;
    for (;;) {
        ProtobufCMessage *m = NULL;
        if ((st = tdm_rpc_call_read(call, &m, err)) != TDM_OK || !m)
            break;
        const double t0 = bench_now();
        Tandem__V1__DraftRequest *q = (Tandem__V1__DraftRequest *)m;
        tdm_error e = {0};
        if (!q->verdict || !q->verdict->hidden ||
            tdm_feat_in_append_shm(&in, q->verdict->hidden, &d->map, "Verdict.hidden", &e) !=
                TDM_OK) {
            fprintf(stderr, "drafter: bad message: %s\n", e.msg);
            exit(1);
        }
        tdm_feat_in_clear(&in);
        d->decode_s += bench_now() - t0;
        protobuf_c_message_free_unpacked(m, NULL);
        Tandem__V1__DraftResponse r = TANDEM__V1__DRAFT_RESPONSE__INIT;
        r.shm_consumed = d->map.consumed;
        if ((st = tdm_rpc_call_write(call, &r.base, err)) != TDM_OK)
            break;
    }
    tdm_feat_in_free(&in);
    return st;
}

typedef struct result {
    double put_us, e2e_us, drafter_us, wire_bytes;
} result;

/* `rounds` messages of `rows` rows each over one transport (shm: a ring of
 * ring_bytes per run, as each Draft stream gets its own). */
static result run(tdm_rpc_channel *ch, int width, int rows, int rounds,
                  Tandem__V1__FeatureDtype dtype, bool shm, uint64_t ring_bytes)
{
    tdm_error err = {0};
    tdm_feat_ring *ring = NULL;
    g_side = (side){.width = width};
    if (shm) {
        uint8_t nonce[TDM_FEAT_SHM_NONCE];
        if (tdm_feat_ring_create(ring_bytes, &ring, &err) != TDM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
        memcpy(nonce, tdm_feat_ring_nonce(ring), sizeof(nonce));
        Tandem__V1__FeatureShmOffer offer = TANDEM__V1__FEATURE_SHM_OFFER__INIT;
        offer.name = (char *)tdm_feat_ring_name(ring);
        offer.nonce.data = nonce;
        offer.nonce.len = sizeof(nonce);
        offer.ring_bytes = ring_bytes;
        if (tdm_feat_map_open(&offer, &g_side.map, &err) != TDM_OK) {
            fprintf(stderr, "map: %s\n", err.msg);
            exit(1);
        }
        tdm_feat_ring_unlink(ring);
    }
    tdm_rpc_stream *st = NULL;
    if (tdm_rpc_stream_open(ch, "/tandem.v1.Drafter/Draft", NULL,
                            &tandem__v1__draft_response__descriptor, NULL, &st, &err) != TDM_OK) {
        fprintf(stderr, "stream: %s\n", err.msg);
        exit(1);
    }
    float *src = malloc((size_t)rows * (size_t)width * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * (size_t)width; i++)
        src[i] = bench_urand() * 4.0f;
    tdm_feat_out out;
    tdm_feat_out_init(&out, width, dtype, 0);
    double *put = malloc((size_t)rounds * sizeof(double));
    double *e2e = malloc((size_t)rounds * sizeof(double));
    uint8_t *msg = NULL;
    size_t msg_cap = 0;
    double wire = 0;
    for (int r = 0; r < rounds; r++) {
        /* Put out: encode, then into the ring or the message, then packed
         * and handed to the stream (the verifier's writer thread's part). */
        const double t0 = bench_now();
        tdm_feat_out_append(&out, src, rows);
        Tandem__V1__Features f;
        Tandem__V1__FeatureShmRef ref;
        if (!ring || !tdm_feat_out_ring(&out, ring, &f, &ref)) {
            if (ring) {
                fprintf(stderr, "the ring is full: a bigger ring, or fewer rows\n");
                exit(1);
            }
            tdm_feat_out_messages(&out, SIZE_MAX, &f, 1);
        }
        Tandem__V1__Verdict v = TANDEM__V1__VERDICT__INIT;
        v.sequence_id = 1;
        v.round = (uint32_t)r;
        v.hidden = &f;
        Tandem__V1__DraftRequest dr = TANDEM__V1__DRAFT_REQUEST__INIT;
        dr.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_VERDICT;
        dr.verdict = &v;
        const size_t len = tandem__v1__draft_request__get_packed_size(&dr);
        if (len > msg_cap) {
            free(msg);
            msg_cap = len;
            msg = malloc(msg_cap);
        }
        tandem__v1__draft_request__pack(&dr, msg);
        const double t1 = bench_now();
        if (tdm_rpc_stream_write_raw(st, msg, len, &err) != TDM_OK) {
            fprintf(stderr, "write: %s\n", err.msg);
            exit(1);
        }
        put[r] = (bench_now() - t0) * 1e6;
        (void)t1;
        tdm_feat_out_sent(&out);
        ProtobufCMessage *m = NULL;
        if (tdm_rpc_stream_read(st, &m, &err) != TDM_OK || !m) {
            fprintf(stderr, "read: %s\n", err.msg);
            exit(1);
        }
        if (ring)
            tdm_feat_ring_release(ring, ((Tandem__V1__DraftResponse *)m)->shm_consumed);
        protobuf_c_message_free_unpacked(m, NULL);
        e2e[r] = (bench_now() - t0) * 1e6;
        wire += (double)len;
    }
    tdm_rpc_stream_close_send(st, &err);
    ProtobufCMessage *m = NULL;
    while (tdm_rpc_stream_read(st, &m, &err) == TDM_OK && m) {
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
    }
    tdm_rpc_stream_destroy(st);
    bench_sort(put, rounds);
    bench_sort(e2e, rounds);
    result res = {.put_us = put[rounds / 2],
                  .e2e_us = e2e[rounds / 2],
                  .drafter_us = g_side.decode_s * 1e6 / rounds,
                  .wire_bytes = wire / rounds};
    tdm_feat_map_close(&g_side.map);
    tdm_feat_ring_destroy(ring);
    tdm_feat_out_free(&out);
    free(put);
    free(e2e);
    free(msg);
    free(src);
    return res;
}

static void report(const char *what, result g, result s)
{
    printf("%-22s | %9.0f B | %7.0f B | %9.1f us | %8.1f us | %9.1f us | %8.1f us | %9.1f us | "
           "%8.1f us\n",
           what, g.wire_bytes, s.wire_bytes, g.put_us, s.put_us, g.drafter_us, s.drafter_us,
           g.e2e_us, s.e2e_us);
}

int main(int argc, char **argv)
{
    int hidden = 2560, rows = 4, rounds = 2000, prompt = 2000, prompt_rounds = 20;
    Tandem__V1__FeatureDtype dtype = TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--f32") == 0)
            dtype = TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32;
        else if (i + 1 < argc && strcmp(argv[i], "--hidden") == 0)
            hidden = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--rows") == 0)
            rows = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--prompt") == 0)
            prompt = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--prompt-rounds") == 0)
            prompt_rounds = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--hidden N] [--rows N] [--rounds N] [--prompt N] "
                    "[--prompt-rounds N] [--f32]\n",
                    argv[0]);
            return 2;
        }
    }
    if (hidden < 1 || rows < 1 || rounds < 1 || prompt < 1 || prompt_rounds < 1)
        return 2;
    const uint64_t need = (uint64_t)prompt * (uint64_t)hidden * tdm_feat_dtype_bytes(dtype);
    uint64_t ring_bytes = (uint64_t)32 << 20; /* feature_shm_size's default */
    while (ring_bytes < need)
        ring_bytes *= 2;
    const int64_t max_msg = (int64_t)(need + (1 << 20)) * 2;
    tdm_error err = {0};
    tdm_rpc_server *srv = NULL;
    tdm_rpc_server_options so = {
        .listen = "127.0.0.1:0", .name = "bench", .max_message_bytes = max_msg};
    if (tdm_rpc_server_create(&so, &srv, &err) != TDM_OK ||
        tdm_rpc_server_add_bidi(srv, "/tandem.v1.Drafter/Draft",
                                &tandem__v1__draft_request__descriptor, drafter_stream, &g_side,
                                &err) != TDM_OK ||
        tdm_rpc_server_start(srv, &err) != TDM_OK) {
        fprintf(stderr, "server: %s\n", err.msg);
        return 1;
    }
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", tdm_rpc_server_port(srv));
    tdm_rpc_channel *ch = NULL;
    tdm_rpc_channel_options co = {.target = target, .max_message_bytes = max_msg};
    if (tdm_rpc_channel_create(&co, &ch, &err) != TDM_OK) {
        fprintf(stderr, "channel: %s\n", err.msg);
        return 1;
    }
    printf("hidden %d, %s, ring %llu MiB, gRPC over loopback; medians over the rounds "
           "(drafter: mean)\n",
           hidden, tdm_feat_dtype_name(dtype), (unsigned long long)(ring_bytes >> 20));
    printf("%-22s | %11s | %9s | %12s | %11s | %12s | %11s | %12s | %11s\n", "message", "wire grpc",
           "wire shm", "put grpc", "put shm", "drafter grpc", "drafter shm", "e2e grpc", "e2e shm");
    char what[64];
    /* A warm-up stream connects the channel. */
    run(ch, hidden, rows, 50, dtype, false, ring_bytes);
    snprintf(what, sizeof(what), "%d rows (a round)", rows);
    result g = run(ch, hidden, rows, rounds, dtype, false, ring_bytes);
    result s = run(ch, hidden, rows, rounds, dtype, true, ring_bytes);
    report(what, g, s);
    snprintf(what, sizeof(what), "%d rows (a prompt)", prompt);
    g = run(ch, hidden, prompt, prompt_rounds, dtype, false, ring_bytes);
    s = run(ch, hidden, prompt, prompt_rounds, dtype, true, ring_bytes);
    report(what, g, s);
    tdm_rpc_channel_destroy(ch);
    tdm_rpc_server_shutdown(srv, 1000);
    tdm_rpc_server_destroy(srv);
    return 0;
}
