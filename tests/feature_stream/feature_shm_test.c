/*
 * feature_shm_test.c - the feature stream's shared-memory ring
 * (service/feature_shm.h): a segment offered by one side and mapped by the
 * other carries rows to the bit, through wrap-arounds of the ring, and the
 * space the reader releases is reused; a full ring refuses a reservation
 * (the rows then go inline) without blocking; a drafter's map refuses a
 * name of another form, a missing segment, another nonce and another size;
 * a Features message's reference is checked (out of the ring, wrapping,
 * backwards, too far ahead, wrong length, inline data beside it, no ring)
 * and refused naming the field, the drafter's rows left as they were; the
 * segment's name is gone from /dev/shm once unlinked and after destroy.
 */
#include "../config/check.h"
#include "feature_shm.h"
#include "feature_stream.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool in_dev_shm(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

static Tandem__V1__FeatureShmOffer offer_of(tdm_feat_ring *r, uint8_t *nonce)
{
    Tandem__V1__FeatureShmOffer o = TANDEM__V1__FEATURE_SHM_OFFER__INIT;
    memcpy(nonce, tdm_feat_ring_nonce(r), TDM_FEAT_SHM_NONCE);
    o.name = (char *)tdm_feat_ring_name(r);
    o.nonce.data = nonce;
    o.nonce.len = TDM_FEAT_SHM_NONCE;
    o.ring_bytes = tdm_feat_ring_bytes(r);
    return o;
}

/* Rows out through the ring and back, as a verifier and a drafter do, for
 * many rounds: the same values as the inline path gives. */
static void test_round_trip(Tandem__V1__FeatureDtype dtype)
{
    const int W = 200;
    tdm_feat_ring *r = NULL;
    tdm_error err = {0};
    CHECK(tdm_feat_ring_create(TDM_FEAT_SHM_MIN, &r, &err) == TDM_OK, "create: %s", err.msg);
    if (!r)
        return;
    CHECK(strncmp(tdm_feat_ring_name(r), TDM_FEAT_SHM_PREFIX, strlen(TDM_FEAT_SHM_PREFIX)) == 0,
          "name %s", tdm_feat_ring_name(r));
    CHECK(in_dev_shm(tdm_feat_ring_name(r)), "the segment is in /dev/shm");
    uint8_t nonce[TDM_FEAT_SHM_NONCE];
    Tandem__V1__FeatureShmOffer o = offer_of(r, nonce);
    tdm_feat_map m;
    CHECK(tdm_feat_map_open(&o, &m, &err) == TDM_OK, "map: %s", err.msg);
    char name[64];
    snprintf(name, sizeof(name), "%s", tdm_feat_ring_name(r));
    tdm_feat_ring_unlink(r);
    CHECK(!in_dev_shm(name), "unlinked: gone from /dev/shm, both still mapped");
    tdm_feat_out out, ref_out;
    tdm_feat_in in, ref_in;
    tdm_feat_out_init(&out, W, dtype, 0);
    tdm_feat_out_init(&ref_out, W, dtype, 0);
    tdm_feat_in_init(&in, W);
    tdm_feat_in_init(&ref_in, W);
    float *rows = malloc(40 * W * sizeof(float));
    int pos = 0, full = 0;
    for (int round = 0; round < 400; round++) {
        const int n = 1 + (round * 7) % 37; /* 1..37 rows: wraps the 64 KiB ring often */
        for (int i = 0; i < n * W; i++)
            rows[i] = (float)(pos + i / W) + (float)(i % W) * 0.001f - 0.37f * (float)round;
        tdm_feat_out_append(&out, rows, n);
        tdm_feat_out_append(&ref_out, rows, n);
        Tandem__V1__Features f;
        Tandem__V1__FeatureShmRef ref;
        bool shm = tdm_feat_out_ring(&out, r, &f, &ref);
        if (!shm) {
            /* The drafter has not released enough: inline, as a verifier does. */
            full++;
            CHECK(tdm_feat_out_messages(&out, (size_t)1 << 30, &f, 1) == 1, "inline message");
        }
        CHECK(tdm_feat_in_append_shm(&in, &f, &m, "Verdict.hidden", &err) == TDM_OK, "round %d: %s",
              round, err.msg);
        Tandem__V1__Features g;
        tdm_feat_out_messages(&ref_out, (size_t)1 << 30, &g, 1);
        CHECK(tdm_feat_in_append(&ref_in, &g, "x", &err) == TDM_OK, "inline: %s", err.msg);
        tdm_feat_out_sent(&out);
        tdm_feat_out_sent(&ref_out);
        CHECK(in.rows == ref_in.rows && in.position == ref_in.position &&
                  memcmp(in.data, ref_in.data, (size_t)in.rows * W * sizeof(float)) == 0,
              "round %d: the ring's rows are the inline rows", round);
        tdm_feat_in_clear(&in);
        tdm_feat_in_clear(&ref_in);
        /* The drafter says what it read every tenth round only. */
        if (round % 10 == 9)
            CHECK(tdm_feat_ring_release(r, m.consumed), "release %llu",
                  (unsigned long long)m.consumed);
        pos += n;
    }
    CHECK(full > 0 && full < 300, "a full ring sent %d of 400 rounds inline", full);
    CHECK(!tdm_feat_ring_release(r, m.consumed + ((uint64_t)1 << 40)),
          "a release beyond what was written is refused");
    /* A reservation never blocks: a ring-sized one fails while rows are held. */
    uint64_t off;
    CHECK(tdm_feat_ring_used(r) == 0 || !tdm_feat_ring_reserve(r, TDM_FEAT_SHM_MIN, &off),
          "no room: NULL");
    free(rows);
    tdm_feat_out_free(&out);
    tdm_feat_out_free(&ref_out);
    tdm_feat_in_free(&in);
    tdm_feat_in_free(&ref_in);
    tdm_feat_map_close(&m);
    tdm_feat_ring_destroy(r);
}

static void test_map_refusals(void)
{
    tdm_feat_ring *r = NULL;
    tdm_error err = {0};
    CHECK(tdm_feat_ring_create(TDM_FEAT_SHM_MIN, &r, &err) == TDM_OK, "create: %s", err.msg);
    if (!r)
        return;
    char name[64];
    snprintf(name, sizeof(name), "%s", tdm_feat_ring_name(r));
    uint8_t nonce[TDM_FEAT_SHM_NONCE];
    Tandem__V1__FeatureShmOffer o = offer_of(r, nonce);
    tdm_feat_map m;
    /* Another nonce: not the verifier's segment. */
    nonce[5] ^= 1;
    CHECK(tdm_feat_map_open(&o, &m, &err) == TDM_ERR_PERMISSION_DENIED && !m.map, "nonce");
    CHECK_HAS(err.msg, "nonce");
    nonce[5] ^= 1;
    /* Another size. */
    o.ring_bytes *= 2;
    CHECK(tdm_feat_map_open(&o, &m, &err) == TDM_ERR_INVALID_ARGUMENT, "size");
    o.ring_bytes /= 2;
    /* A name of another form, and a segment that is not there (another host). */
    o.name = "/etc-passwd";
    CHECK(tdm_feat_map_open(&o, &m, &err) == TDM_ERR_INVALID_ARGUMENT, "name form");
    CHECK_HAS(err.msg, "FeatureShmOffer.name");
    o.name = "/tandem-feat-1-00000000000000000000000000000000";
    CHECK(tdm_feat_map_open(&o, &m, &err) == TDM_ERR_NOT_FOUND, "missing: %s", err.msg);
    CHECK_HAS(err.msg, "cannot open the verifier's shared-memory segment");
    o.name = name;
    o.nonce.len = 3;
    CHECK(tdm_feat_map_open(&o, &m, &err) == TDM_ERR_INVALID_ARGUMENT, "nonce length");
    o.nonce.len = TDM_FEAT_SHM_NONCE;
    CHECK(tdm_feat_map_open(&o, &m, &err) == TDM_OK, "the right one: %s", err.msg);
    tdm_feat_map_close(&m);
    CHECK(in_dev_shm(name), "still linked (the verifier unlinks)");
    tdm_feat_ring_destroy(r);
    CHECK(!in_dev_shm(name), "destroy unlinks: nothing left in /dev/shm");
    CHECK(tdm_feat_ring_create(1000, &r, &err) == TDM_ERR_INVALID_ARGUMENT && !r, "tiny ring");
}

/* Malformed references: refused naming the field, the rows left as they were. */
static void test_ref_check(void)
{
    const uint64_t R = 4096;
    const int W = 8; /* f32: 32 bytes a row */
    uint8_t *ring = calloc(1, R);
    tdm_feat_map m = {.map = ring, .map_len = R, .ring = ring, .ring_bytes = R, .consumed = 1000};
    tdm_feat_in in;
    tdm_feat_in_init(&in, W);
    Tandem__V1__FeatureShmRef ref = TANDEM__V1__FEATURE_SHM_REF__INIT;
    Tandem__V1__Features f = TANDEM__V1__FEATURES__INIT;
    f.rows = 2;
    f.width = W;
    f.dtype = TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32;
    f.shm = &ref;
    tdm_error err = {0};
    uint64_t pos;
    struct {
        uint64_t offset, length;
        const char *want;
    } bad[] = {
        {1000, 63, "Verdict.hidden.shm.length 63: 2 rows of 8 values take 64 bytes"},
        {4090, 64, "runs past the end of the ring"}, /* wraps */
        {8192 + 4090, 64, "runs past the end of the ring"},
        {936, 64, "lies before what was read"},                 /* backwards */
        {1000 + 4096, 64, "a ring (4096 bytes) or more ahead"}, /* a lap ahead */
        {UINT64_MAX - 10, 64, "past the end of the ring"},      /* overflow */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ref.offset = bad[i].offset;
        ref.length = bad[i].length;
        CHECK(tdm_feat_shm_ref_check(R, m.consumed, &f, 64, "Verdict.hidden", &pos, &err) ==
                  TDM_ERR_INVALID_ARGUMENT,
              "case %zu accepted", i);
        CHECK_HAS(err.msg, bad[i].want);
        CHECK(tdm_feat_in_append_shm(&in, &f, &m, "Verdict.hidden", &err) ==
                  TDM_ERR_INVALID_ARGUMENT,
              "case %zu appended", i);
        CHECK(in.rows == 0 && m.consumed == 1000, "case %zu: left as it was", i);
    }
    /* Wrong rows for the length; data beside the reference; no ring. */
    ref.offset = 1000;
    ref.length = 64;
    f.rows = 3;
    CHECK(tdm_feat_in_append_shm(&in, &f, &m, "x", &err) == TDM_ERR_INVALID_ARGUMENT, "rows");
    CHECK_HAS(err.msg, "x.shm.length 64: 3 rows of 8 values take 96 bytes");
    f.rows = 2;
    uint8_t junk[64] = {0};
    f.data.data = junk;
    f.data.len = 64;
    CHECK(tdm_feat_in_append_shm(&in, &f, &m, "x", &err) == TDM_ERR_INVALID_ARGUMENT, "both");
    CHECK_HAS(err.msg, "both inline data");
    f.data.len = 0;
    f.data.data = NULL;
    CHECK(tdm_feat_in_append_shm(&in, &f, NULL, "x", &err) == TDM_ERR_INVALID_ARGUMENT, "none");
    CHECK_HAS(err.msg, "has none");
    CHECK(tdm_feat_in_append(&in, &f, "x", &err) == TDM_ERR_INVALID_ARGUMENT, "inline-only API");
    /* A good one: read, consumed moves past it. */
    float v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (float)i * 1.5f;
    memcpy(ring + 1000, v, sizeof(v));
    CHECK(tdm_feat_in_append_shm(&in, &f, &m, "x", &err) == TDM_OK, "good: %s", err.msg);
    CHECK(in.rows == 2 && memcmp(in.data, v, sizeof(v)) == 0 && m.consumed == 1064,
          "read: %d rows, consumed %llu", in.rows, (unsigned long long)m.consumed);
    /* Ahead of what was read, within a ring: fine (skipped space). */
    ref.offset = 1064 + 2000;
    f.position = 2;
    CHECK(tdm_feat_shm_ref_check(R, m.consumed, &f, 64, "x", &pos, &err) == TDM_OK &&
              pos == (1064 + 2000) % R,
          "ahead within a ring: %s", err.msg);
    tdm_feat_in_free(&in);
    free(ring);
}

static void test_transport_names(void)
{
    CHECK(tdm_feat_transport_parse("shm") == TDM_FEAT_TRANSPORT_SHM, "shm");
    CHECK(tdm_feat_transport_parse("grpc") == TDM_FEAT_TRANSPORT_GRPC, "grpc");
    CHECK(tdm_feat_transport_parse("auto") == TDM_FEAT_TRANSPORT_AUTO, "auto");
    CHECK_STR(tdm_feat_transport_name(TDM_FEAT_TRANSPORT_SHM), "shm");
}

int main(void)
{
    test_round_trip(TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16);
    test_round_trip(TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32);
    test_map_refusals();
    test_ref_check();
    test_transport_names();
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
