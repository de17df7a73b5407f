/*
 * test_snapshot.c - state snapshots (engine/snapshot.h): a sequence exported
 * at its committed position and imported into a fresh sequence continues
 * with the same bits as the original, under every pair of strategies
 * (extra_buffer, no_buffer, replay, taken under one and imported under
 * another), directly and through the chunked wire format; and every
 * corrupt snapshot (layout version, fingerprint, tensor name / dtype /
 * shape, offsets, sizes, CRC32C, SHA-256, missing, repeated or
 * out-of-order chunks, a truncated stream, extra bytes) is refused with
 * the right code and a message naming the field and both values, leaving
 * the importer's other sequences as they were.
 */
#include "snapshot.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXK 4
#define FP "fp-test-model"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static int rnd(int n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

static const tdm_state_strategy kinds[3] = {TDM_STATE_EXTRA_BUFFER, TDM_STATE_NO_BUFFER,
                                            TDM_STATE_REPLAY};

/* The same random work on a and b (either may be NULL): decodes, and
 * verify blocks with a random acceptance, their logits compared bit for bit.
 * The random draws depend on the seed only. */
static void run_same(tdm_model *m, tracked *a, tracked *b, int rounds, uint64_t seed,
                     const char *what)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    float *la = malloc((size_t)(MAXK + 1) * V * 4), *lb = malloc((size_t)(MAXK + 1) * V * 4);
    tdm_error err;
    uint64_t saved = rng;
    rng = seed;
    for (int r = 0; r < rounds; r++) {
        int32_t blk[MAXK + 1];
        int nt = 1 + rnd(MAXK + 1), acc = rnd(nt);
        for (int i = 0; i < nt; i++)
            blk[i] = rnd(V);
        tracked *both[2] = {a, b};
        float *ls[2] = {la, lb};
        for (int j = 0; j < 2; j++) {
            tracked *t = both[j];
            if (!t)
                continue;
            if (r % 3 == 0) {
                CHECK(tdm_seq_decode(&t->s, 1, blk, ls[j], &err) == TDM_OK, "%s", err.msg);
                t->toks[t->n++] = blk[0];
            } else {
                tracked_verify(t, blk, nt, acc, ls[j]);
            }
        }
        if (a && b) {
            size_t rows = r % 3 == 0 ? 1 : (size_t)nt;
            CHECK(memcmp(la, lb, rows * V * 4) == 0, "%s: round %d: logits differ", what, r);
            CHECK(tdm_seq_length(a->s) == tdm_seq_length(b->s), "%s: lengths differ", what);
        }
    }
    rng = saved;
    free(la);
    free(lb);
}

static tracked *export_import(tdm_model *m, tracked *src, tdm_state_strategy dst, tracked *out)
{
    tdm_snap_layout l;
    uint8_t *payload;
    tdm_error err;
    CHECK(tdm_seq_snapshot(src->s, FP, src->toks, src->n, &l, &payload, &err) == TDM_OK, "%s",
          err.msg);
    CHECK(l.committed == (uint32_t)src->n, "committed %u != %d", l.committed, src->n);
    memset(out, 0, sizeof(*out));
    tdm_seq_params p = {dst, MAXK, 0};
    CHECK(tdm_seq_from_snapshot(m, &p, FP, &l, payload, &out->s, &err) == TDM_OK, "%s", err.msg);
    memcpy(out->toks, l.tokens, l.committed * sizeof(int32_t));
    out->n = (int)l.committed;
    tdm_snap_layout_free(&l);
    free(payload);
    return out;
}

/* Every strategy into every strategy: the continuation is the original's. */
static void round_trips(tdm_model *m, const char *name)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    tdm_error err;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            tracked src, dst;
            tracked_make(m, kinds[a], MAXK, &src);
            int32_t prompt[40];
            int plen = 5 + rnd(30);
            for (int i = 0; i < plen; i++)
                prompt[i] = rnd(V);
            CHECK(tdm_seq_prefill(src.s, prompt, plen, NULL, &err) == TDM_OK, "%s", err.msg);
            memcpy(src.toks, prompt, (size_t)plen * 4);
            src.n = plen;
            run_same(m, &src, NULL, 5, 0x1234 + (uint64_t)a, "warm-up");
            /* A pending verify cannot be snapshotted. */
            int32_t t = 1;
            const int32_t *tp = &t;
            int one = 1;
            tdm_snap_layout l;
            uint8_t *pl;
            CHECK(tdm_seq_verify(&src.s, 1, &tp, &one, NULL, &err) == TDM_OK, "%s", err.msg);
            CHECK(tdm_seq_snapshot(src.s, FP, src.toks, src.n, &l, &pl, &err) ==
                          TDM_ERR_FAILED_PRECONDITION &&
                      strstr(err.msg, "uncommitted"),
                  "snapshot with a pending verify: %s", err.msg);
            CHECK(tdm_seq_commit(src.s, 0, &err) == TDM_OK, "%s", err.msg);
            src.toks[src.n++] = t;
            export_import(m, &src, kinds[b], &dst);
            char what[128];
            snprintf(what, sizeof(what), "%s: %s -> %s", name, tdm_state_strategy_name(kinds[a]),
                     tdm_state_strategy_name(kinds[b]));
            run_same(m, &src, &dst, 12, 0x9999 + (uint64_t)(a * 3 + b), what);
            tdm_seq_destroy(src.s);
            tdm_seq_destroy(dst.s);
        }
    printf("%-10s round trips: every strategy into every strategy, continuation identical\n", name);
}

/* ---- the wire -------------------------------------------------------------- */

/* A snapshot as the chunks an exporter sends (chunk_bytes of payload each). */
typedef struct wire {
    tdm_snap_layout l;
    uint8_t *payload;
    Tandem__V1__SnapshotLayout pl;
    Tandem__V1__SnapshotTensor *pt;
    Tandem__V1__SnapshotTensor **pp;
    uint64_t (*shapes)[3];
    Tandem__V1__SnapshotChunk *c;
    uint32_t n;
} wire;

static void wire_make(const tracked *t, uint32_t chunk_bytes, wire *w)
{
    tdm_error err;
    memset(w, 0, sizeof(*w));
    CHECK(tdm_seq_snapshot(t->s, FP, t->toks, t->n, &w->l, &w->payload, &err) == TDM_OK, "%s",
          err.msg);
    size_t nt = w->l.n_tensors;
    w->pt = calloc(nt, sizeof(*w->pt));
    w->pp = calloc(nt, sizeof(*w->pp));
    w->shapes = calloc(nt, sizeof(*w->shapes));
    tdm_snap_layout_to_proto(&w->l, &w->pl, w->pt, w->pp, w->shapes);
    w->n = tdm_snap_chunk_count(w->l.total_bytes, chunk_bytes);
    w->c = calloc(w->n, sizeof(*w->c));
    for (uint32_t i = 0; i < w->n; i++) {
        Tandem__V1__SnapshotChunk *c = &w->c[i];
        tandem__v1__snapshot_chunk__init(c);
        c->snapshot_id = "snap-1";
        c->index = i;
        c->last = i == w->n - 1;
        if (i == 0) {
            c->layout = &w->pl;
            continue;
        }
        uint64_t off = (uint64_t)(i - 1) * chunk_bytes, left = w->l.total_bytes - off;
        c->offset = off;
        c->data.data = w->payload + off;
        c->data.len = left < chunk_bytes ? (size_t)left : chunk_bytes;
        c->crc32c = tdm_crc32c(0, c->data.data, c->data.len);
    }
}

static void wire_free(wire *w)
{
    tdm_snap_layout_free(&w->l);
    free(w->payload);
    free(w->pt);
    free(w->pp);
    free(w->shapes);
    free(w->c);
}

/* Feeds chunks (indexes into w->c, -1 ends the list) and finishes:
 * returns the first refusal's code (TDM_OK: all taken) with its message,
 * and on success the imported sequence in *out (when out is given). */
static tdm_status feed(tdm_model *m, const wire *w, const int *order,
                       const Tandem__V1__SnapshotChunk *replace, int replace_at, tdm_error *err,
                       tracked *out)
{
    const tdm_model_config *cfg = tdm_model_get_config(m);
    tdm_snap_asm *a = tdm_snap_asm_create(cfg, FP, (uint32_t)cfg->max_position_embeddings);
    tdm_status rc = TDM_OK;
    for (int i = 0; order[i] >= 0 && rc == TDM_OK; i++) {
        const Tandem__V1__SnapshotChunk *c = order[i] == replace_at ? replace : &w->c[order[i]];
        rc = tdm_snap_asm_add(a, c, err);
    }
    tdm_snap_layout l;
    uint8_t *payload = NULL;
    if (rc == TDM_OK)
        rc = tdm_snap_asm_finish(a, &l, &payload, err);
    if (rc == TDM_OK) {
        CHECK(strcmp(tdm_snap_asm_id(a), "snap-1") == 0, "snapshot id %s", tdm_snap_asm_id(a));
        if (out) {
            memset(out, 0, sizeof(*out));
            tdm_seq_params p = {TDM_STATE_REPLAY, MAXK, 0};
            rc = tdm_seq_from_snapshot(m, &p, FP, &l, payload, &out->s, err);
            memcpy(out->toks, l.tokens, l.committed * sizeof(int32_t));
            out->n = (int)l.committed;
        }
        tdm_snap_layout_free(&l);
        free(payload);
    }
    tdm_snap_asm_destroy(a);
    return rc;
}

static void all_order(const wire *w, int *order)
{
    for (uint32_t i = 0; i < w->n; i++)
        order[i] = (int)i;
    order[w->n] = -1;
}

/* One corrupt case: the code and every fragment of the message. */
static void expect(tdm_status got, const tdm_error *err, tdm_status want, const char *case_name,
                   const char *f1, const char *f2, const char *f3)
{
    CHECK(got == want, "%s: got %s (%s), want %s", case_name, tdm_status_name(got),
          got ? err->msg : "", tdm_status_name(want));
    const char *fr[3] = {f1, f2, f3};
    for (int i = 0; i < 3; i++)
        CHECK(!fr[i] || strstr(err->msg, fr[i]), "%s: message lacks \"%s\": %s", case_name, fr[i],
              err->msg);
    printf("  refused %-26s %s: %s\n", case_name, tdm_status_name(got), err->msg);
}

static void wire_cases(tdm_model *m, const char *name)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    tdm_error err;
    tracked src, bystander, twin;
    tracked_make(m, TDM_STATE_EXTRA_BUFFER, MAXK, &src);
    tracked_make(m, TDM_STATE_NO_BUFFER, MAXK, &bystander);
    tracked_make(m, TDM_STATE_NO_BUFFER, MAXK, &twin);
    int32_t prompt[24];
    for (int i = 0; i < 24; i++)
        prompt[i] = rnd(V);
    CHECK(tdm_seq_prefill(src.s, prompt, 24, NULL, &err) == TDM_OK, "%s", err.msg);
    memcpy(src.toks, prompt, sizeof(prompt));
    src.n = 24;
    CHECK(tdm_seq_prefill(bystander.s, prompt, 10, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(twin.s, prompt, 10, NULL, &err) == TDM_OK, "%s", err.msg);
    run_same(m, &src, NULL, 4, 77, "warm-up");

    /* Small chunks: many of them. */
    wire w;
    const uint32_t CB = 1000;
    wire_make(&src, CB, &w);
    CHECK(w.n > 5, "only %u chunks", w.n);
    int *order = calloc(w.n + 2, sizeof(int));
    all_order(&w, order);
    tracked dst;
    CHECK(feed(m, &w, order, NULL, -1, &err, &dst) == TDM_OK, "%s", err.msg);
    run_same(m, &src, &dst, 9, 4242, "through the wire");
    tdm_seq_destroy(dst.s);

    tdm_status rc;
    char v1[32], v2[32];
    /* The layout. */
    Tandem__V1__SnapshotLayout bad = w.pl;
    Tandem__V1__SnapshotChunk c0 = w.c[0];
    c0.layout = &bad;
    bad.layout_version = TDM_SNAPSHOT_LAYOUT_VERSION + 1;
    snprintf(v1, sizeof(v1), "version %u", TDM_SNAPSHOT_LAYOUT_VERSION + 1);
    snprintf(v2, sizeof(v2), "version %u", TDM_SNAPSHOT_LAYOUT_VERSION);
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_FAILED_PRECONDITION, "layout version", "layout_version", v1, v2);
    bad = w.pl;
    bad.model_fingerprint = "another-model";
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_FAILED_PRECONDITION, "model fingerprint", "model_fingerprint",
           "another-model", FP);

    Tandem__V1__SnapshotTensor t1 = *w.pl.tensors[1];
    Tandem__V1__SnapshotTensor *tp[64];
    memcpy(tp, w.pl.tensors, w.pl.n_tensors * sizeof(tp[0]));
    tp[1] = &t1;
    bad = w.pl;
    bad.tensors = tp;
    uint64_t shape[3] = {t1.shape[0], t1.shape[1] + 1, t1.n_shape > 2 ? t1.shape[2] : 0};
    t1.shape = shape;
    snprintf(v1, sizeof(v1), "%llu, %llu", (unsigned long long)shape[0],
             (unsigned long long)shape[1]);
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "tensor shape", "shape", w.pl.tensors[1]->name, v1);
    t1 = *w.pl.tensors[1];
    t1.dtype = TANDEM__V1__SNAPSHOT_DTYPE__SNAPSHOT_DTYPE_BF16;
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "tensor dtype", "dtype", "has 2", "has 1");
    t1 = *w.pl.tensors[1];
    t1.name = "layers.0.bogus";
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "tensor name", "name", "layers.0.bogus",
           w.pl.tensors[1]->name);
    t1 = *w.pl.tensors[1];
    t1.offset += 4;
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "tensor offset", "offset", NULL, NULL);
    t1 = *w.pl.tensors[1];
    t1.nbytes += 4;
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "tensor size", "nbytes", NULL, NULL);
    bad = w.pl;
    bad.total_bytes += 8;
    snprintf(v1, sizeof(v1), "%llu", (unsigned long long)bad.total_bytes);
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "total bytes", "total_bytes", v1, NULL);
    bad = w.pl;
    bad.n_tokens--;
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "token count", "tokens", NULL, NULL);
    bad = w.pl;
    uint8_t sha[32];
    memcpy(sha, w.l.sha256, 32);
    sha[5] ^= 1;
    bad.sha256.data = sha;
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "sha256", "sha256", "declared", NULL);
    c0 = w.c[0];
    c0.layout = NULL;
    rc = feed(m, &w, order, &c0, 0, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "no layout", "layout", NULL, NULL);

    /* The chunks. */
    Tandem__V1__SnapshotChunk c2 = w.c[2];
    uint8_t *flip = malloc(c2.data.len);
    memcpy(flip, c2.data.data, c2.data.len);
    flip[3] ^= 0x40;
    c2.data.data = flip;
    rc = feed(m, &w, order, &c2, 2, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "bad crc32c", "chunk 2", "crc32c", NULL);
    c2.crc32c = tdm_crc32c(0, flip, c2.data.len); /* consistent chunk, wrong payload */
    rc = feed(m, &w, order, &c2, 2, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "bad sha256", "sha256", NULL, NULL);
    c2 = w.c[2];
    c2.offset += 1;
    rc = feed(m, &w, order, &c2, 2, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "bad offset", "offset 1001", "carried 1000", NULL);
    c2 = w.c[2];
    c2.data.len = 0;
    c2.crc32c = tdm_crc32c(0, NULL, 0);
    rc = feed(m, &w, order, &c2, 2, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "empty chunk", "chunk 2", "no data", NULL);
    c2 = w.c[2];
    c2.snapshot_id = "snap-2";
    rc = feed(m, &w, order, &c2, 2, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "snapshot id changes", "snap-2", "snap-1", NULL);
    c2 = w.c[2];
    c2.layout = &w.pl;
    rc = feed(m, &w, order, &c2, 2, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "second layout", "chunk 2", "layout", NULL);

    int *o2 = calloc(w.n + 3, sizeof(int));
    memcpy(o2, order, (w.n + 1) * sizeof(int));
    o2[2] = 3, o2[3] = 2; /* swapped */
    rc = feed(m, &w, o2, NULL, -1, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "out of order", "expected chunk 2", "got 3", NULL);
    memcpy(o2, order, (w.n + 1) * sizeof(int));
    o2[3] = 2; /* repeated */
    rc = feed(m, &w, o2, NULL, -1, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "repeated", "expected chunk 3", "repeated", NULL);
    for (uint32_t i = 2; i <= w.n; i++) /* chunk 2 missing */
        o2[i] = order[i + 1 <= w.n ? i + 1 : w.n];
    rc = feed(m, &w, o2, NULL, -1, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "missing", "expected chunk 2", "got 3", NULL);
    memcpy(o2, order, (w.n + 1) * sizeof(int));
    o2[w.n - 1] = -1; /* truncated: no last */
    rc = feed(m, &w, o2, NULL, -1, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "truncated", "last", NULL, NULL);
    memcpy(o2, order, (w.n + 1) * sizeof(int));
    o2[w.n] = (int)w.n - 1; /* the last one again */
    o2[w.n + 1] = -1;
    rc = feed(m, &w, o2, NULL, -1, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "after last", "no chunk may follow", NULL, NULL);
    /* More bytes than declared: the last chunk carries extra. */
    Tandem__V1__SnapshotChunk cl = w.c[w.n - 1];
    uint8_t *more = calloc(cl.data.len + 16, 1);
    memcpy(more, cl.data.data, cl.data.len);
    cl.data.data = more;
    cl.data.len += 16;
    cl.crc32c = tdm_crc32c(0, more, cl.data.len);
    rc = feed(m, &w, order, &cl, (int)w.n - 1, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "more than declared", "run past total_bytes", NULL,
           NULL);
    /* The last flag early: fewer bytes than declared. */
    cl = w.c[w.n - 2];
    cl.last = true;
    memcpy(o2, order, (w.n + 1) * sizeof(int));
    o2[w.n - 1] = -1;
    rc = feed(m, &w, o2, &cl, (int)w.n - 2, &err, NULL);
    expect(rc, &err, TDM_ERR_INVALID_ARGUMENT, "fewer than declared", "total_bytes", NULL, NULL);

    /* Another model's importer (another shape) refuses it by its layout. */
    free(more);
    free(flip);
    free(o2);
    free(order);
    wire_free(&w);

    /* The importer's other sequence is as it was. */
    run_same(m, &bystander, &twin, 6, 555, "bystander");
    tdm_seq_destroy(bystander.s);
    tdm_seq_destroy(twin.s);
    tdm_seq_destroy(src.s);
    printf("%-10s wire: chunked round trip identical; every corrupt snapshot refused\n", name);
}

/* CRC32C against its published check value. */
static void checksums(void)
{
    const char *s = "123456789";
    CHECK(tdm_crc32c(0, s, 9) == 0xe3069283u, "crc32c check value: 0x%08x", tdm_crc32c(0, s, 9));
    uint32_t part = tdm_crc32c(0, s, 4);
    CHECK(tdm_crc32c(part, s + 4, 5) == 0xe3069283u, "crc32c in two parts");
    /* Every length and alignment against the bit-at-a-time definition. */
    static uint8_t buf[1031];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof(buf); i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n + off <= sizeof(buf); n += 1 + n / 16) {
            uint32_t c = 0xffffffffu;
            for (size_t i = 0; i < n; i++) {
                c ^= buf[off + i];
                for (int k = 0; k < 8; k++)
                    c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
            }
            CHECK(tdm_crc32c(0, buf + off, n) == ~c, "crc32c of %zu bytes at offset %zu", n, off);
        }
    uint8_t d[32];
    tdm_sha256("abc", 3, d);
    CHECK(d[0] == 0xba && d[1] == 0x78 && d[31] == 0xad, "sha256(abc)");
}

int main(void)
{
    checksums();
    tdm_backend *be = test_backend();
    const char *names[] = {"f32_gqa", "bf16_alt"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        tdm_model *m = fixture_model(names[i], be);
        round_trips(m, names[i]);
        wire_cases(m, names[i]);
        tdm_model_destroy(m);
    }
    be->destroy(be);
    printf("engine snapshot: ok\n");
    return 0;
}
