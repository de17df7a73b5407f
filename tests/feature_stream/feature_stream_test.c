/*
 * feature_stream_test.c - the feature stream (service/feature_stream.h):
 * bf16 rounds to nearest even; a sequence's rows split into messages of at
 * most the given bytes (at least one row each), packed and unpacked as the
 * wire carries them, reassemble to the rows sent (to the bit in f32); the
 * drafter's buffer refuses gaps, overlaps, other widths, unknown dtypes and
 * data of the wrong length without changing; requests round-trip and name
 * what this build cannot stream.
 */
#include "../config/check.h"
#include "feature_stream.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_bf16(void)
{
    CHECK(tdm_feat_bf16(1.0f) == 0x3f80, "1.0 -> %04x", tdm_feat_bf16(1.0f));
    CHECK(tdm_feat_bf16(-2.0f) == 0xc000, "-2.0 -> %04x", tdm_feat_bf16(-2.0f));
    /* Halfway cases round to the even neighbour. */
    CHECK(tdm_feat_bf16(1.00390625f) == 0x3f80, "1 + 2^-8 -> %04x", tdm_feat_bf16(1.00390625f));
    CHECK(tdm_feat_bf16(1.01171875f) == 0x3f82, "1 + 3*2^-8 -> %04x", tdm_feat_bf16(1.01171875f));
    CHECK(tdm_feat_bf16(1.0041f) == 0x3f81, "just above halfway rounds up");
    CHECK(isnan(tdm_feat_from_bf16(tdm_feat_bf16(NAN))), "NaN stays NaN");
    CHECK(isinf(tdm_feat_from_bf16(tdm_feat_bf16(INFINITY))), "inf stays inf");
    CHECK(tdm_feat_from_bf16(0x3f80) == 1.0f && tdm_feat_from_bf16(0xc000) == -2.0f, "decode");
    for (float x = -3.0f; x < 3.0f; x += 0.013f) {
        float y = tdm_feat_from_bf16(tdm_feat_bf16(x));
        CHECK(fabsf(y - x) <= fabsf(x) * (1.0f / 256.0f), "%g -> %g", (double)x, (double)y);
    }
}

/* rows [n, w]: row r, value i = r + i / 1000 (exact in f32 for this range? no
 * matter: f32 is compared to itself, bf16 to its own rounding). */
static float *rows_of(int pos, int n, int w)
{
    float *v = malloc((size_t)n * (size_t)w * sizeof(float));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < w; i++)
            v[(size_t)r * w + i] = (float)(pos + r) + (float)i / 1000.0f - 0.5f;
    return v;
}

/* Sends b's rows through the wire into in, as a verifier and a drafter do:
 * all but the last message as FeatureChunk requests, the last in a Verdict. */
static size_t ship(tdm_feat_out *b, size_t max_bytes, tdm_feat_in *in)
{
    Tandem__V1__Features m[256];
    size_t n = tdm_feat_out_messages(b, max_bytes, m, 256);
    CHECK(n <= 256, "%zu messages", n);
    for (size_t i = 0; i < n && i < 256; i++) {
        CHECK(m[i].data.len <= max_bytes || m[i].rows == 1, "message %zu holds %zu bytes", i,
              m[i].data.len);
        Tandem__V1__DraftRequest dr = TANDEM__V1__DRAFT_REQUEST__INIT;
        Tandem__V1__FeatureChunk c = TANDEM__V1__FEATURE_CHUNK__INIT;
        Tandem__V1__Verdict v = TANDEM__V1__VERDICT__INIT;
        if (i + 1 < n) {
            c.sequence_id = 7;
            c.hidden = &m[i];
            dr.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_FEATURES;
            dr.features = &c;
        } else {
            v.sequence_id = 7;
            v.hidden = &m[i];
            dr.kind_case = TANDEM__V1__DRAFT_REQUEST__KIND_VERDICT;
            dr.verdict = &v;
        }
        size_t len = tandem__v1__draft_request__get_packed_size(&dr);
        uint8_t *buf = malloc(len);
        tandem__v1__draft_request__pack(&dr, buf);
        Tandem__V1__DraftRequest *back = tandem__v1__draft_request__unpack(NULL, len, buf);
        CHECK(back != NULL, "message %zu unpacks", i);
        if (back) {
            const Tandem__V1__Features *f =
                back->kind_case == TANDEM__V1__DRAFT_REQUEST__KIND_FEATURES ? back->features->hidden
                                                                            : back->verdict->hidden;
            tdm_error err = {0};
            CHECK(tdm_feat_in_append(in, f, "Verdict.hidden", &err) == TDM_OK, "append %zu: %s", i,
                  err.msg);
            tandem__v1__draft_request__free_unpacked(back, NULL);
        }
        free(buf);
    }
    tdm_feat_out_sent(b);
    return n;
}

static void test_split(Tandem__V1__FeatureDtype dtype)
{
    const int W = 64;
    const size_t vb = tdm_feat_dtype_bytes(dtype);
    tdm_feat_out b;
    tdm_feat_in in;
    tdm_feat_out_init(&b, W, dtype, 0);
    tdm_feat_in_init(&in, W);
    CHECK(tdm_feat_out_messages(&b, 2048, NULL, 0) == 0, "nothing held: no message");
    /* A prompt of 100 positions in messages of 2048 bytes. */
    float *p = rows_of(0, 100, W);
    tdm_feat_out_append(&b, p, 60);
    tdm_feat_out_append(&b, p + 60 * W, 40);
    const size_t per = 2048 / ((size_t)W * vb);
    size_t n = ship(&b, 2048, &in);
    CHECK(n == (100 + per - 1) / per, "%zu messages for 100 rows of %zu a message", n, per);
    CHECK(b.position == 100 && b.rows == 0, "sent: next position %d, %d held", b.position, b.rows);
    CHECK(in.position == 0 && in.rows == 100, "received rows %d..+%d", in.position, in.rows);
    /* A verdict's rows continue them: 5 more, all in one message. */
    float *q = rows_of(100, 5, W);
    tdm_feat_out_append(&b, q, 5);
    CHECK(ship(&b, 2048, &in) == 1, "5 rows: one message");
    CHECK(in.rows == 105, "%d rows", in.rows);
    size_t bad = 0;
    for (int r = 0; r < 105; r++)
        for (int i = 0; i < W; i++) {
            float want = r < 100 ? p[(size_t)r * W + i] : q[(size_t)(r - 100) * W + i];
            if (dtype == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16)
                want = tdm_feat_from_bf16(tdm_feat_bf16(want));
            bad += memcmp(&in.data[(size_t)r * W + i], &want, sizeof(float)) != 0;
        }
    CHECK(bad == 0, "%s: %zu values differ from those sent", tdm_feat_dtype_name(dtype), bad);
    /* A limit below one row still sends a row a message. */
    tdm_feat_in_clear(&in);
    tdm_feat_out_append(&b, q, 3);
    CHECK(ship(&b, 8, &in) == 3, "one row a message");
    CHECK(in.position == 105 && in.rows == 3, "after a clear, rows start where they come: %d+%d",
          in.position, in.rows);
    free(p);
    free(q);
    tdm_feat_out_free(&b);
    tdm_feat_in_free(&in);
}

static void test_refusals(void)
{
    const int W = 4;
    float v[3 * W];
    memset(v, 0, sizeof(v));
    tdm_feat_out b;
    tdm_feat_out_init(&b, W, TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32, 0);
    tdm_feat_out_append(&b, v, 3);
    Tandem__V1__Features m[3];
    CHECK(tdm_feat_out_messages(&b, 16, m, 3) == 3, "3 messages");
    tdm_feat_in in;
    tdm_feat_in_init(&in, W);
    tdm_error err = {0};
    CHECK(tdm_feat_in_append(&in, &m[0], "x", &err) == TDM_OK, "first");
    /* A gap: position 2 after rows 0..0. */
    CHECK(tdm_feat_in_append(&in, &m[2], "Verdict.hidden", &err) == TDM_ERR_INVALID_ARGUMENT,
          "gap refused");
    CHECK_HAS(err.msg, "Verdict.hidden.position 2");
    CHECK_HAS(err.msg, "gap or an overlap");
    CHECK(in.rows == 1 && in.position == 0, "left as it was: %d+%d", in.position, in.rows);
    /* An overlap: position 0 again. */
    CHECK(tdm_feat_in_append(&in, &m[0], "x", &err) == TDM_ERR_INVALID_ARGUMENT, "overlap");
    /* Another width. */
    Tandem__V1__Features w = m[1];
    w.width = 5;
    CHECK(tdm_feat_in_append(&in, &w, "SequenceOpen.hidden", &err) == TDM_ERR_INVALID_ARGUMENT,
          "width");
    CHECK_HAS(err.msg, "SequenceOpen.hidden.width 5: this drafter takes rows of 4 values");
    /* Data of the wrong length, and an unknown dtype. */
    w = m[1];
    w.data.len -= 1;
    CHECK(tdm_feat_in_append(&in, &w, "x", &err) == TDM_ERR_INVALID_ARGUMENT, "length");
    CHECK_HAS(err.msg, "x.data holds 15 bytes, but 1 rows of 4 f32 values take 16");
    w = m[1];
    w.dtype = (Tandem__V1__FeatureDtype)9;
    CHECK(tdm_feat_in_append(&in, &w, "x", &err) == TDM_ERR_INVALID_ARGUMENT, "dtype");
    w.dtype = TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16; /* 16 bytes are 2 bf16 rows, not 1 */
    CHECK(tdm_feat_in_append(&in, &w, "x", &err) == TDM_ERR_INVALID_ARGUMENT, "bf16 length");
    CHECK(in.rows == 1, "still one row");
    CHECK(tdm_feat_in_append(&in, &m[1], "x", &err) == TDM_OK, "the right one: %s", err.msg);
    CHECK(in.rows == 2, "two rows");
    tdm_feat_out_free(&b);
    tdm_feat_in_free(&in);
}

static void test_requests(void)
{
    tdm_feat_request r = {.n = 2,
                          .specs = {{.final_layer = true, .normed = true}, {.layer = 3}},
                          .dtype = TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32};
    char buf[160];
    CHECK_STR(tdm_feat_request_str(&r, buf, sizeof(buf)), "final layer after the norm, layer 3");
    CHECK(tdm_feat_request_missing(&r) == 1, "layer 3 is not streamed by this build");
    Tandem__V1__FeatureRequest m;
    Tandem__V1__FeatureSpec specs[TDM_FEAT_MAX_SPECS], *ptrs[TDM_FEAT_MAX_SPECS];
    tdm_feat_request_to_proto(&r, &m, specs, ptrs);
    tdm_feat_request back;
    tdm_error err = {0};
    CHECK(tdm_feat_request_from_proto(&m, "x", &back, &err) == TDM_OK, "%s", err.msg);
    CHECK(back.n == 2 && back.specs[0].final_layer && back.specs[0].normed &&
              !back.specs[1].final_layer && back.specs[1].layer == 3 &&
              back.dtype == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32,
          "round trip");
    r.n = 1;
    CHECK(tdm_feat_request_missing(&r) == -1, "final normed is streamed");
    CHECK(tdm_feat_request_from_proto(NULL, "x", &back, &err) == TDM_OK && back.n == 0 &&
              back.dtype == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16,
          "none: bf16 by default");
    Tandem__V1__FeatureSpec *many[TDM_FEAT_MAX_SPECS + 1];
    for (int i = 0; i <= TDM_FEAT_MAX_SPECS; i++)
        many[i] = &specs[0];
    m.specs = many;
    m.n_specs = TDM_FEAT_MAX_SPECS + 1;
    CHECK(tdm_feat_request_from_proto(&m, "descriptor.features_needed", &back, &err) ==
              TDM_ERR_INVALID_ARGUMENT,
          "too many specs");
    CHECK_HAS(err.msg, "descriptor.features_needed.specs has 9 entries");
    m.n_specs = 1;
    m.dtype = (Tandem__V1__FeatureDtype)7;
    CHECK(tdm_feat_request_from_proto(&m, "x", &back, &err) == TDM_ERR_INVALID_ARGUMENT,
          "unknown dtype");
    tdm_feat_spec av[TDM_FEAT_MAX_SPECS];
    CHECK(tdm_feat_available(av, TDM_FEAT_MAX_SPECS) == 1 && av[0].final_layer && av[0].normed,
          "this build streams the final layer after the norm");
}

/* tdm_feat_out_take: sent rows kept in order, then given back whole. */
static void test_take(void)
{
    const int W = 8;
    tdm_feat_out b, kept;
    tdm_feat_out_init(&b, W, TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32, 0);
    tdm_feat_out_init(&kept, W, TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32, 0);
    float *p = rows_of(0, 50, W);
    for (int at = 0; at < 50; at += 10) {
        tdm_feat_out_append(&b, p + (size_t)at * W, 10);
        tdm_feat_out_take(&kept, &b);
        CHECK(b.rows == 0 && b.position == at + 10, "taken: %d held at %d", b.rows, b.position);
    }
    CHECK(kept.position == 0 && kept.rows == 50 &&
              memcmp(kept.data, p, 50 * (size_t)W * sizeof(float)) == 0,
          "kept rows %d..+%d in order", kept.position, kept.rows);
    tdm_feat_out_append(&b, p, 3); /* three more, at 50 */
    tdm_feat_out_take(&kept, &b);
    CHECK(kept.rows == 53 && b.position == 53, "53 kept, next at %d", b.position);
    tdm_feat_out empty;
    tdm_feat_out_init(&empty, W, TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32, 0);
    tdm_feat_out_take(&empty, &kept); /* an empty buffer takes the position */
    CHECK(empty.position == 0 && empty.rows == 53 && kept.rows == 0 && kept.position == 53,
          "moved whole: %d rows at %d", empty.rows, empty.position);
    tdm_feat_out_free(&b);
    tdm_feat_out_free(&kept);
    tdm_feat_out_free(&empty);
    free(p);
}

int main(void)
{
    test_bf16();
    test_split(TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32);
    test_split(TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16);
    test_refusals();
    test_requests();
    test_take();
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
