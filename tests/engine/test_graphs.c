/*
 * test_graphs.c - the engine's side of the backend graph contract
 * (backend.h: graph_begin / graph_end), on the CPU backend dressed as a
 * backend with graphs. Its graph_begin claims every step (returns 1); the
 * ops of a step run as they are called, except in the steps it refuses,
 * where they do nothing and graph_end returns 1, as a replay that did not
 * match its graph does. Checked:
 *  - between graph_begin and graph_end the engine calls op slots only (the
 *    logits download comes after graph_end);
 *  - a refused step is run again, so the step script (steps.c) gives every
 *    logit and final state of the plain CPU backend to the bit;
 *  - keys: equal for steps of one shape (decode steps across the KV growth,
 *    whichever sequences fill the rows, no_buffer verify rows, which run as
 *    decode rows do); different where the ops differ (rows, their split,
 *    extra_buffer verify rows, logits or not, a prompt chunk);
 *  - with tdm_model_set_graphs(m, 0) no graph slot is called;
 *  - an MTP head's draft chain and a verdict's prime without logits
 *    (tdm_mtp_set_graphs): bracketed, op slots only inside, refused ones run
 *    again, the drafts and the primed logits those of the plain CPU backend.
 */
#include "bench_util.h"
#include "draft_sampled_steps.h"
#include "draft_vocab_steps.h"
#include "mtp.h"
#include "steps.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    tdm_backend *cpu; /* the backend doing the work */
    int in_step;      /* between graph_begin and graph_end */
    int refusing;     /* this step's ops do nothing; graph_end says 1 */
    int refuse_every; /* refuse every n-th step; 0: none */
    long steps, refused;
    long outside; /* non-op slots called inside a step */
    uint64_t last_key;
} fk;

static int fk_graph_begin(void *ctx, uint64_t key)
{
    (void)ctx;
    CHECK(!fk.in_step, "graph_begin inside a step");
    fk.in_step = 1;
    fk.steps++;
    fk.last_key = key;
    fk.refusing = fk.refuse_every && fk.steps % fk.refuse_every == 0;
    return 1;
}

static int fk_graph_end(void *ctx)
{
    (void)ctx;
    CHECK(fk.in_step, "graph_end without graph_begin");
    fk.in_step = 0;
    if (!fk.refusing)
        return 0;
    fk.refusing = 0;
    fk.refused++;
    return 1;
}

/* Op slots: the CPU's, unless the step is refused. */
#define FK_OP(name, params, args)                                                                  \
    static void fk_##name params                                                                   \
    {                                                                                              \
        if (!fk.refusing)                                                                          \
            fk.cpu->name args;                                                                     \
    }
FK_OP(embed, (void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H),
      (ctx, y, e, ids, R, H))
FK_OP(matmul, (void *ctx, float *y, const float *x, tdm_weight w, int R, int in, int out, int acc),
      (ctx, y, x, w, R, in, out, acc))
FK_OP(rmsnorm,
      (void *ctx, float *y, const float *x, const float *w, int R, int n, float eps, int zc),
      (ctx, y, x, w, R, n, eps, zc))
FK_OP(rmsnorm_gated,
      (void *ctx, float *y, const float *x, const float *z, const float *w, int R, int n,
       float eps),
      (ctx, y, x, z, w, R, n, eps))
FK_OP(attn_prep,
      (void *ctx, float *q, float *gate, const float *qg, const float *k, const float *v,
       const float *qn, const float *kn, float eps, const int32_t *pos, const float *f, int rot,
       const tdm_attn_seg *s, int n, int nH, int nKV, int D),
      (ctx, q, gate, qg, k, v, qn, kn, eps, pos, f, rot, s, n, nH, nKV, D))
FK_OP(attention,
      (void *ctx, float *out, const float *q, const float *g, const tdm_attn_seg *s, int n, int nH,
       int nKV, int D),
      (ctx, out, q, g, s, n, nH, nKV, D))
FK_OP(silu_mul, (void *ctx, float *y, const float *a, const float *b, size_t n), (ctx, y, a, b, n))
FK_OP(conv_silu,
      (void *ctx, float *y, const float *x, const float *w, const tdm_conv_seg *s, int n, int C,
       int K),
      (ctx, y, x, w, s, n, C, K))
FK_OP(gdn_recurrent,
      (void *ctx, float *out, const float *qkv, int st, tdm_gdn_gates gt, const tdm_gdn_seg *s,
       int n, int Hk, int Hv, int Dk, int Dv),
      (ctx, out, qkv, st, gt, s, n, Hk, Hv, Dk, Dv))
FK_OP(softmax, (void *ctx, float *x, int R, int n), (ctx, x, R, n))
FK_OP(argmax_to,
      (void *ctx, int32_t *out, const float *x, const int32_t *rows, int nr, int n,
       const int32_t *map),
      (ctx, out, x, rows, nr, n, map))
FK_OP(embed_dev, (void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H),
      (ctx, y, e, ids, R, H))
FK_OP(sample_to,
      (void *ctx, int32_t *out, float *probs, const float *x, const int32_t *rows, int nr, int n,
       const int32_t *map, const tdm_sample_row *srows),
      (ctx, out, probs, x, rows, nr, n, map, srows))
#undef FK_OP

/* Every other slot: counted when called inside a step. */
#define FK_OUTSIDE (fk.outside += fk.in_step)
static void *fk_alloc(void *ctx, size_t n)
{
    FK_OUTSIDE;
    return fk.cpu->alloc(ctx, n);
}
static void fk_free(void *ctx, void *p)
{
    FK_OUTSIDE;
    fk.cpu->free(ctx, p);
}
static void fk_upload(void *ctx, void *d, const void *s, size_t n)
{
    FK_OUTSIDE;
    fk.cpu->upload(ctx, d, s, n);
}
static void fk_download(void *ctx, void *d, const void *s, size_t n)
{
    FK_OUTSIDE;
    fk.cpu->download(ctx, d, s, n);
}
static void fk_copy(void *ctx, void *d, const void *s, size_t n)
{
    FK_OUTSIDE;
    fk.cpu->copy(ctx, d, s, n);
}
static const void *fk_weight_map(void *ctx, const void *h, size_t n, int *owned)
{
    FK_OUTSIDE;
    return fk.cpu->weight_map(ctx, h, n, owned);
}
static void fk_sync(void *ctx)
{
    FK_OUTSIDE;
    fk.cpu->sync(ctx);
}
static void *fk_host_alloc(void *ctx, size_t n)
{
    FK_OUTSIDE;
    return fk.cpu->host_alloc(ctx, n);
}
static void fk_host_free(void *ctx, void *p)
{
    FK_OUTSIDE;
    fk.cpu->host_free(ctx, p);
}
static void fk_gdn_replay(void *ctx, const tdm_gdn_seg *s, int n, int Hk, int Hv, int Dk, int Dv)
{
    FK_OUTSIDE;
    fk.cpu->gdn_replay(ctx, s, n, Hk, Hv, Dk, Dv);
}
static void fk_argmax(void *ctx, int32_t *out, const float *x, int R, int n)
{
    FK_OUTSIDE;
    fk.cpu->argmax(ctx, out, x, R, n);
}

/* The CPU backend's context with the slots above; destroyed with it. */
static tdm_backend fake_backend(tdm_backend *cpu)
{
    fk.cpu = cpu;
    tdm_backend b = *cpu;
    b.destroy = NULL; /* the CPU backend is destroyed through fk.cpu */
    b.alloc = fk_alloc;
    b.free = fk_free;
    b.upload = fk_upload;
    b.download = fk_download;
    b.copy = fk_copy;
    b.weight_map = fk_weight_map;
    b.sync = fk_sync;
    b.host_alloc = fk_host_alloc;
    b.host_free = fk_host_free;
    b.graph_begin = fk_graph_begin;
    b.graph_end = fk_graph_end;
    b.embed = fk_embed;
    b.matmul = fk_matmul;
    b.rmsnorm = fk_rmsnorm;
    b.rmsnorm_gated = fk_rmsnorm_gated;
    b.attn_prep = fk_attn_prep;
    b.attention = fk_attention;
    b.silu_mul = fk_silu_mul;
    b.conv_silu = fk_conv_silu;
    b.gdn_recurrent = fk_gdn_recurrent;
    b.gdn_replay = fk_gdn_replay;
    b.argmax = fk_argmax;
    b.softmax = fk_softmax;
    b.argmax_to = fk_argmax_to;
    b.embed_dev = fk_embed_dev;
    b.sample_to = fk_sample_to;
    return b;
}

/* The script on the dressed backend, refusing every n-th step, against the
 * plain one. */
static void check_script(const char *name, tdm_backend *cpu, tdm_backend *fake, int refuse_every)
{
    tdm_model *ref = fixture_model(name, cpu), *m = fixture_model(name, fake);
    steps_run a, b;
    steps_run_script(ref, &a);
    fk.refuse_every = refuse_every;
    const long steps0 = fk.steps, refused0 = fk.refused;
    steps_run_script(m, &b);
    fk.refuse_every = 0;
    CHECK(fk.steps - steps0 >= b.calls, "%s: %ld bracketed steps for %d calls", name,
          fk.steps - steps0, b.calls);
    CHECK(!refuse_every || fk.refused > refused0, "%s: no step was refused", name);
    CHECK(fk.outside == 0, "%s: %ld non-op slot calls inside a step", name, fk.outside);
    CHECK(a.n == b.n && memcmp(a.logits, b.logits, a.n * sizeof(float)) == 0,
          "%s: logits differ from the plain backend's", name);
    for (int i = 0; i < STEPS_NSEQ; i++)
        CHECK(steps_same_state(a.seqs[i], b.seqs[i]), "%s: sequence %d: states differ", name, i);
    printf("%s: %d calls, %ld steps bracketed, %ld refused and run again: logits and states "
           "bit-identical, no non-op slot inside a step\n",
           name, b.calls, fk.steps - steps0, fk.refused - refused0);
    steps_run_free(&a);
    steps_run_free(&b);
    tdm_model_destroy(ref);
    tdm_model_destroy(m);
}

static tdm_seq *seq(tdm_model *m, tdm_state_strategy s, int plen)
{
    tdm_seq_params p = {s, 4, 0};
    tdm_seq *q;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &q, &err) == TDM_OK, "%s", err.msg);
    int32_t prompt[16];
    for (int i = 0; i < plen; i++)
        prompt[i] = (int32_t)(i * 7 + 3);
    CHECK(tdm_seq_prefill(q, prompt, plen, NULL, &err) == TDM_OK, "%s", err.msg);
    return q;
}

static float key_logits[16 * 512];

/* The key of the step a decode call of n sequences runs. */
static uint64_t decode_key(tdm_seq **s, int n)
{
    int32_t t[4] = {1, 2, 3, 4};
    tdm_error err;
    CHECK(tdm_seq_decode(s, n, t, key_logits, &err) == TDM_OK, "%s", err.msg);
    return fk.last_key;
}

/* The key of a verify call of n sequences, nt[i] tokens each. */
static uint64_t verify_key(tdm_seq **s, int n, const int *nt)
{
    static const int32_t t[5] = {5, 6, 7, 8, 9};
    const int32_t *tp[4] = {t, t, t, t};
    tdm_error err;
    CHECK(tdm_seq_verify(s, n, tp, nt, key_logits, &err) == TDM_OK, "%s", err.msg);
    return fk.last_key;
}

static void check_keys(tdm_backend *fake)
{
    tdm_model *m = fixture_model("f32_gqa", fake);
    tdm_error err;
    tdm_seq *a = seq(m, TDM_STATE_EXTRA_BUFFER, 10), *b = seq(m, TDM_STATE_EXTRA_BUFFER, 3);
    tdm_seq *c = seq(m, TDM_STATE_NO_BUFFER, 5);
    /* Decode through the KV growth at 64 positions: one key. */
    const uint64_t k1 = decode_key(&a, 1);
    for (int i = 0; i < 70; i++)
        CHECK(decode_key(&a, 1) == k1, "decode step %d at length %d has another key", i,
              tdm_seq_length(a));
    tdm_seq *ab[2] = {a, b}, *ba[2] = {b, a}, *ac[2] = {a, c};
    const uint64_t k2 = decode_key(ab, 2);
    CHECK(k2 != k1, "one row and two rows share a key");
    CHECK(decode_key(ba, 2) == k2 && decode_key(ac, 2) == k2,
          "two decode rows of other sequences have another key");
    /* A no_buffer verify row runs as a decode row does; extra_buffer ones
     * write per-position states. */
    const int one[2] = {1, 1}, two[2] = {2, 1}, three[2] = {1, 2};
    CHECK(verify_key(&c, 1, one) == k1, "a no_buffer verify row differs from a decode row");
    CHECK(tdm_seq_commit(c, 0, &err) == TDM_OK, "%s", err.msg);
    const uint64_t kx = verify_key(&a, 1, one);
    CHECK(kx != k1, "an extra_buffer verify row shares the key of a decode row");
    /* Appended to the pending row: same shape, same key. */
    CHECK(verify_key(&a, 1, one) == kx, "an appended verify row has another key");
    CHECK(tdm_seq_commit(a, 1, &err) == TDM_OK, "%s", err.msg);
    /* Replay verify rows keep conv windows and record their inputs: a key of
     * their own, the same when appended. */
    tdm_seq *d = seq(m, TDM_STATE_REPLAY, 4);
    const uint64_t kr = verify_key(&d, 1, one);
    CHECK(kr != k1 && kr != kx, "a replay verify row shares the key of another kind of row");
    CHECK(verify_key(&d, 1, one) == kr, "an appended replay verify row has another key");
    CHECK(tdm_seq_commit(d, 1, &err) == TDM_OK, "%s", err.msg);
    tdm_seq_destroy(d);
    const uint64_t k21 = verify_key(ab, 2, two), k12 = verify_key(ab, 2, three);
    CHECK(k21 != k12, "rows split 2+1 and 1+2 share a key");
    CHECK(tdm_seq_commit(a, 0, &err) == TDM_OK && tdm_seq_commit(b, 1, &err) == TDM_OK, "%s",
          err.msg);
    /* A no_buffer commit that recomputes runs without logits. */
    const int five[1] = {5};
    const uint64_t kv5 = verify_key(&c, 1, five);
    CHECK(tdm_seq_commit(c, 2, &err) == TDM_OK, "%s", err.msg);
    CHECK(fk.last_key != kv5, "the recompute (3 rows, no logits) shares the verify's key");
    const uint64_t krec = fk.last_key;
    const int32_t p3[3] = {1, 2, 3};
    CHECK(tdm_seq_prefill(c, p3, 3, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(fk.last_key != krec, "a 3-token prompt chunk shares the key of 3 rows without logits");
    /* Graphs off: no slot. */
    const long steps = fk.steps;
    tdm_model_set_graphs(m, 0);
    decode_key(&a, 1);
    CHECK(fk.steps == steps, "graphs off, yet graph_begin was called");
    printf("keys: one per step shape (decode across KV growth and batch members, appended "
           "verify rows), distinct for rows, split, extra_buffer, replay, logits, prompt chunks; "
           "graphs off calls no slot\n");
    tdm_seq_destroy(a);
    tdm_seq_destroy(b);
    tdm_seq_destroy(c);
    tdm_model_destroy(m);
}

/* tdm_seq_draft on a backend without device drafting (one verify call a
 * draft, argmaxes on the host) gives what the device form gives. */
static void check_draft_forms(const char *name, tdm_backend *cpu)
{
    tdm_backend calls = *cpu;
    calls.destroy = NULL;
    calls.argmax_to = NULL;
    calls.embed_dev = NULL;
    tdm_model *dev = fixture_model(name, cpu), *host = fixture_model(name, &calls);
    steps_run a, b;
    steps_run_script(dev, &a);
    steps_run_script(host, &b);
    CHECK(a.n == b.n && memcmp(a.logits, b.logits, a.n * sizeof(float)) == 0,
          "%s: drafts on the device differ from drafts by verify calls", name);
    for (int i = 0; i < STEPS_NSEQ; i++)
        CHECK(steps_same_state(a.seqs[i], b.seqs[i]), "%s: sequence %d: states differ", name, i);
    printf("%s: device drafting and verify-call drafting: drafts, logits and states identical\n",
           name);
    steps_run_free(&a);
    steps_run_free(&b);
    tdm_model_destroy(dev);
    tdm_model_destroy(host);
}

/* Rounds of prime, draft k and rollback on an MTP head, the same on the
 * plain CPU backend and on the dressed one with the head's graphs on. */
static void check_mtp(tdm_backend *cpu, tdm_backend *fake)
{
    static const bench_shape tiny = {"tiny", 64, 8, 96, 2, 1, 32, 2, 4, 16, 16, 320};
    char dir[] = "/tmp/tandem_graphs_mtp_XXXXXX", msg[512];
    CHECK(mkdtemp(dir), "mkdtemp failed");
    CHECK(bench_write_model_layout(dir, &tiny, BENCH_LAYOUT_MTP, 0, msg, sizeof(msg)) == 0, "%s",
          msg);
    tdm_error err;
    tdm_mtp *h[2];
    tdm_mtp_seq *q[2][2];
    CHECK(tdm_mtp_open(dir, cpu, &h[0], &err) == TDM_OK &&
              tdm_mtp_open(dir, fake, &h[1], &err) == TDM_OK,
          "%s", err.msg);
    tdm_mtp_set_graphs(h[1], 1);
    enum { H = 64, T = 12, ROUNDS = 6 };
    float hid[T * H];
    int32_t next[T];
    for (int i = 0; i < T * H; i++)
        hid[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int i = 0; i < T; i++)
        next[i] = (int32_t)((i * 29 + 5) % tiny.V);
    float *logits[2];
    for (int b = 0; b < 2; b++) {
        logits[b] = malloc(2 * 3 * (size_t)tiny.V * sizeof(float));
        for (int i = 0; i < 2; i++) {
            CHECK(tdm_mtp_seq_create(h[b], 0, &q[b][i], &err) == TDM_OK, "%s", err.msg);
            CHECK(tdm_mtp_prime(q[b][i], hid, next, 6 + i, NULL, &err) == TDM_OK, "%s", err.msg);
        }
    }
    const long steps0 = fk.steps, refused0 = fk.refused;
    fk.refuse_every = 3;
    for (int r = 0; r < ROUNDS; r++) {
        const int k[2] = {4, 2 + r % 3};
        int32_t d[2][2][4];
        for (int b = 0; b < 2; b++) {
            int32_t *dp[2] = {d[b][0], d[b][1]};
            CHECK(tdm_mtp_draft_n(q[b], 2, k, NULL, dp, NULL, &err) == TDM_OK, "%s", err.msg);
            if (r % 2 == 1) /* a draft call continuing from the carried draft */
                CHECK(tdm_mtp_draft_n(q[b], 2, k, NULL, dp, NULL, &err) == TDM_OK, "%s", err.msg);
        }
        for (int i = 0; i < 2; i++)
            CHECK(memcmp(d[0][i], d[1][i], (size_t)k[i] * sizeof(int32_t)) == 0,
                  "MTP round %d, sequence %d: drafts differ from the plain backend's", r, i);
        /* The verdict: roll back to the primed prefix and prime a row or two;
         * the primed rows' logits must match too. */
        for (int b = 0; b < 2; b++)
            for (int i = 0; i < 2; i++) {
                const int at = tdm_mtp_seq_length(q[b][i]) - (r % 2 ? 2 * k[i] - 1 : k[i] - 1);
                CHECK(tdm_mtp_rollback(q[b][i], at, &err) == TDM_OK, "%s", err.msg);
                const int n = 1 + (r + i) % 2, p = (at + r) % (T - 2);
                /* Without logits a prime of a verdict's rows is a graph too. */
                float *lg = r % 2 ? logits[b] + (size_t)i * 3 * tiny.V : NULL;
                CHECK(tdm_mtp_prime(q[b][i], hid + (size_t)p * H, next + p, n, lg, &err) == TDM_OK,
                      "%s", err.msg);
                if (b == 1 && lg)
                    CHECK(memcmp(logits[0] + (size_t)i * 3 * tiny.V,
                                 logits[1] + (size_t)i * 3 * tiny.V,
                                 (size_t)n * tiny.V * sizeof(float)) == 0,
                          "MTP round %d, sequence %d: primed logits differ", r, i);
            }
    }
    fk.refuse_every = 0;
    CHECK(fk.steps - steps0 >= ROUNDS, "MTP: %ld chains bracketed", fk.steps - steps0);
    CHECK(fk.refused > refused0, "MTP: no chain was refused");
    CHECK(fk.outside == 0, "MTP: %ld non-op slot calls inside a chain", fk.outside);
    printf("MTP head: %ld draft chains and primes bracketed, %ld refused and run again: drafts and "
           "primed "
           "logits bit-identical\n",
           fk.steps - steps0, fk.refused - refused0);
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < 2; i++)
            tdm_mtp_seq_destroy(q[b][i]);
        tdm_mtp_destroy(h[b]);
        free(logits[b]);
    }
    dir_remove(dir);
}

int main(void)
{
    tdm_backend *cpu = test_backend();
    tdm_backend fake = fake_backend(cpu);
    check_draft_forms("f32_gqa", cpu);
    draft_vocab_check("f32_gqa", cpu);
    draft_vocab_check("bf16_alt", cpu);
    draft_vocab_fp8_check("f32_gqa", cpu);
    draft_vocab_fp8_check("bf16_realdims", cpu);
    draft_sampled_check("f32_gqa", cpu);
    draft_sampled_check("bf16_alt", &fake);
    check_script("f32_gqa", cpu, &fake, 3);
    check_script("bf16_alt", cpu, &fake, 2);
    check_script("f32_odd", cpu, &fake, 0);
    check_keys(&fake);
    check_mtp(cpu, &fake);
    cpu->destroy(cpu);
    printf("engine graphs: all checks passed\n");
    return 0;
}
