/*
 * test_strategies.c - verify/commit under extra_buffer, no_buffer and replay against
 * plain one-token-at-a-time decoding, batched calls against unbatched ones,
 * what a step brings back (tdm_seq_step_out) and fork.
 *
 * These compare independently computed paths of the engine (a verify block,
 * whole or appended in two calls, vs a chain of decode steps; a checkpoint+recompute vs
 * per-position states vs replaying recorded recurrence inputs; a batch vs single sequences); the
 * results must be bit-identical, because
 * every op computes a row the same way whatever the batch (backend.h). Also: an extra_buffer
 * commit through a backend's copy_n, on a model deep enough to need more than one batch of
 * copies, against the same commits made copy by copy.
 */
#include "bench_util.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static int rnd(int n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

#define MAXK 6

static tdm_seq *make(tdm_model *m, tdm_state_strategy s)
{
    tdm_seq_params p = {s, MAXK, 0};
    tdm_seq *q;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &q, &err) == TDM_OK, "%s", err.msg);
    return q;
}

/* Random prompts, random draft blocks, random acceptance: after each commit,
 * extra_buffer, no_buffer, replay and sequential decode must agree to the
 * bit (a commit may keep no row at all). */
static void strategies(tdm_model *m, const char *name)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    enum { NS = 3 }; /* the strategies */
    const tdm_state_strategy kinds[NS] = {TDM_STATE_EXTRA_BUFFER, TDM_STATE_NO_BUFFER,
                                          TDM_STATE_REPLAY};
    tdm_error err;
    for (int trial = 0; trial < 3; trial++) {
        tdm_seq *all[NS + 1];
        for (int j = 0; j < NS; j++)
            all[j] = make(m, kinds[j]);
        tdm_seq *sq = all[NS] = make(m, TDM_STATE_EXTRA_BUFFER);
        int plen = 1 + rnd(20);
        int32_t prompt[32];
        for (int i = 0; i < plen; i++)
            prompt[i] = rnd(V);
        for (int i = 0; i <= NS; i++)
            CHECK(tdm_seq_prefill(all[i], prompt, plen, NULL, &err) == TDM_OK, "%s", err.msg);
        float *l[NS];
        for (int j = 0; j < NS; j++)
            l[j] = malloc((size_t)(MAXK + 1) * V * 4);
        float *ls = malloc((size_t)V * 4);
        for (int round = 0; round < 8; round++) {
            /* acc -1: every row dropped (a drafter's block drafted ahead
             * whose first draft the verifier rejected) */
            int k = rnd(MAXK + 1), ntok = k + 1, acc = rnd(k + 2) - 1;
            int32_t blk[MAXK + 1];
            for (int i = 0; i < ntok; i++)
                blk[i] = rnd(V);
            /* Some run their block in two appended verify calls (how a
             * drafter drafts token by token); rows must not change. */
            int split = ntok > 1 ? 1 + rnd(ntok - 1) : ntok, rest = ntok - split;
            const int32_t *bp = blk, *bp2 = blk + split;
            for (int j = 0; j < NS; j++) {
                if ((round + j) % 2 == 0 || rest == 0) {
                    CHECK(tdm_seq_verify(&all[j], 1, &bp, &ntok, l[j], &err) == TDM_OK, "%s",
                          err.msg);
                    continue;
                }
                CHECK(tdm_seq_verify(&all[j], 1, &bp, &split, l[j], &err) == TDM_OK, "%s", err.msg);
                CHECK(tdm_seq_verify(&all[j], 1, &bp2, &rest, l[j] + (size_t)split * V, &err) ==
                          TDM_OK,
                      "%s", err.msg);
            }
            for (int j = 1; j < NS; j++)
                CHECK(memcmp(l[0], l[j], (size_t)ntok * V * 4) == 0,
                      "%s: round %d: %s verify logits differ from extra_buffer's", name, round,
                      tdm_state_strategy_name(kinds[j]));
            for (int j = 0; j < NS; j++)
                CHECK(tdm_seq_commit(all[j], acc, &err) == TDM_OK, "%s", err.msg);
            for (int i = 0; i <= acc; i++) {
                CHECK(tdm_seq_decode(&sq, 1, &blk[i], ls, &err) == TDM_OK, "%s", err.msg);
                CHECK(memcmp(ls, l[0] + (size_t)i * V, (size_t)V * 4) == 0,
                      "%s: trial %d round %d: verify row %d != sequential decode", name, trial,
                      round, i);
            }
            for (int j = 0; j < NS; j++)
                CHECK(tdm_seq_length(all[j]) == tdm_seq_length(sq),
                      "%s: %s: length differs after commit", name,
                      tdm_state_strategy_name(kinds[j]));
        }
        /* The committed states themselves: one more decode on each. */
        int32_t t = rnd(V);
        float *lx = malloc((size_t)(NS + 1) * V * 4);
        for (int i = 0; i <= NS; i++)
            CHECK(tdm_seq_decode(&all[i], 1, &t, lx + (size_t)i * V, &err) == TDM_OK, "%s",
                  err.msg);
        for (int i = 1; i <= NS; i++)
            CHECK(memcmp(lx, lx + (size_t)i * V, (size_t)V * 4) == 0,
                  "%s: states after commit differ (%s against extra_buffer)", name,
                  i < NS ? tdm_state_strategy_name(kinds[i]) : "sequential decode");
        free(lx);
        for (int j = 0; j < NS; j++)
            free(l[j]);
        free(ls);
        for (int i = 0; i <= NS; i++)
            tdm_seq_destroy(all[i]);
    }
    printf("%-14s strategies: extra_buffer == no_buffer == replay == sequential decode\n", name);
}

/* Sequences of different lengths in one decode and one verify call must give
 * the rows they give alone. */
static void batching(tdm_model *m, const char *name)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    enum { N = 4 };
    tdm_error err;
    tdm_seq *b[N], *u[N];
    for (int i = 0; i < N; i++) {
        /* every strategy in the batch: extra_buffer, no_buffer, replay, extra_buffer */
        const tdm_state_strategy st = (tdm_state_strategy)(i % 3);
        b[i] = make(m, st);
        u[i] = make(m, st);
        int32_t prompt[40];
        int plen = 3 + 9 * i;
        for (int j = 0; j < plen; j++)
            prompt[j] = rnd(V);
        CHECK(tdm_seq_prefill(b[i], prompt, plen, NULL, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_prefill(u[i], prompt, plen, NULL, &err) == TDM_OK, "%s", err.msg);
    }
    float *lb = malloc((size_t)N * (MAXK + 1) * V * 4), *lu = malloc((size_t)(MAXK + 1) * V * 4);
    for (int round = 0; round < 3; round++) {
        int32_t tok[N];
        for (int i = 0; i < N; i++)
            tok[i] = rnd(V);
        CHECK(tdm_seq_decode(b, N, tok, lb, &err) == TDM_OK, "%s", err.msg);
        for (int i = 0; i < N; i++) {
            CHECK(tdm_seq_decode(&u[i], 1, &tok[i], lu, &err) == TDM_OK, "%s", err.msg);
            CHECK(memcmp(lu, lb + (size_t)i * V, (size_t)V * 4) == 0,
                  "%s: batched decode row %d differs", name, i);
        }
        int32_t blk[N][MAXK + 1];
        const int32_t *bp[N];
        int nt[N], acc[N];
        for (int i = 0; i < N; i++) {
            nt[i] = 1 + rnd(MAXK + 1);
            acc[i] = rnd(nt[i]);
            for (int j = 0; j < nt[i]; j++)
                blk[i][j] = rnd(V);
            bp[i] = blk[i];
        }
        CHECK(tdm_seq_verify(b, N, bp, nt, lb, &err) == TDM_OK, "%s", err.msg);
        size_t off = 0;
        for (int i = 0; i < N; i++) {
            CHECK(tdm_seq_verify(&u[i], 1, &bp[i], &nt[i], lu, &err) == TDM_OK, "%s", err.msg);
            CHECK(memcmp(lu, lb + off * V, (size_t)nt[i] * V * 4) == 0,
                  "%s: batched verify of sequence %d differs", name, i);
            off += (size_t)nt[i];
            CHECK(tdm_seq_commit(b[i], acc[i], &err) == TDM_OK, "%s", err.msg);
            CHECK(tdm_seq_commit(u[i], acc[i], &err) == TDM_OK, "%s", err.msg);
        }
    }
    /* Misuse is an error, not a crash. */
    int32_t t = 0;
    const int32_t *tp = &t;
    int one = 1, many = MAXK + 2;
    CHECK(tdm_seq_commit(b[0], 0, &err) == TDM_ERR_FAILED_PRECONDITION, "commit without verify");
    CHECK(tdm_seq_verify(&b[0], 1, &tp, &many, lb, &err) == TDM_ERR_INVALID_ARGUMENT,
          "too many drafts");
    CHECK(tdm_seq_verify(&b[0], 1, &tp, &one, lb, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_decode(&b[0], 1, &t, lb, &err) == TDM_ERR_FAILED_PRECONDITION,
          "decode while a verify is pending");
    CHECK(tdm_seq_commit(b[0], 1, &err) == TDM_ERR_INVALID_ARGUMENT, "accept more than ran");
    CHECK(tdm_seq_commit(b[0], -2, &err) == TDM_ERR_INVALID_ARGUMENT, "keep fewer than none");
    CHECK(tdm_seq_commit(b[0], 0, &err) == TDM_OK, "%s", err.msg);
    t = V;
    CHECK(tdm_seq_decode(&b[0], 1, &t, lb, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "vocabulary"),
          "token out of range: %s", err.msg);
    tdm_seq *dup[2] = {b[1], b[1]};
    int32_t tt[2] = {0, 0};
    CHECK(tdm_seq_decode(dup, 2, tt, lb, &err) == TDM_ERR_INVALID_ARGUMENT, "duplicate seq");
    for (int i = 0; i < N; i++) {
        tdm_seq_destroy(b[i]);
        tdm_seq_destroy(u[i]);
    }
    free(lb);
    free(lu);
    printf("%-14s batching: batched decode/verify == unbatched\n", name);
}

/* tdm_seq_step_out: the argmax of every row, and the logits only of the
 * sequences that want them (the other rows untouched), equal to what
 * tdm_seq_step brings back on an identical batch. */
static void step_out(tdm_model *m, const char *name)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    enum { N = 4 };
    tdm_error err;
    tdm_seq *a[N], *b[N];
    for (int i = 0; i < N; i++) {
        a[i] = make(m, TDM_STATE_EXTRA_BUFFER);
        b[i] = make(m, TDM_STATE_EXTRA_BUFFER);
        int32_t prompt[16];
        for (int j = 0; j < 5 + i; j++)
            prompt[j] = rnd(V);
        CHECK(tdm_seq_prefill(a[i], prompt, 5 + i, NULL, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_prefill(b[i], prompt, 5 + i, NULL, &err) == TDM_OK, "%s", err.msg);
    }
    const size_t rows_max = (size_t)N * (MAXK + 1);
    float *la = malloc(rows_max * V * 4), *lb = malloc(rows_max * V * 4);
    int32_t *am = malloc(rows_max * 4);
    const uint8_t masks[][N] = {{1, 0, 1, 0}, {0, 0, 0, 0}, {1, 1, 0, 1}};
    for (int round = 0; round < 3; round++) {
        int32_t blk[N][MAXK + 1];
        const int32_t *bp[N];
        int nt[N], rows = 0;
        for (int i = 0; i < N; i++) {
            nt[i] = 1 + (i + round) % 2 * rnd(MAXK + 1); /* decode rows and verify blocks */
            for (int j = 0; j < nt[i]; j++)
                blk[i][j] = rnd(V);
            bp[i] = blk[i];
            rows += nt[i];
        }
        memset(lb, 0xff, (size_t)rows * V * 4); /* NaN: rows not asked for stay so */
        CHECK(tdm_seq_step(a, N, bp, nt, la, &err) == TDM_OK, "%s", err.msg);
        const tdm_step_out out = {.logits = lb, .want_logits = masks[round], .argmax = am};
        CHECK(tdm_seq_step_out(b, N, bp, nt, &out, &err) == TDM_OK, "%s", err.msg);
        for (int i = 0, r = 0; i < N; i++)
            for (int j = 0; j < nt[i]; j++, r++) {
                const float *ra = la + (size_t)r * V, *rb = lb + (size_t)r * V;
                CHECK(am[r] == argmax_row(ra, V), "%s: row %d argmax %d, logits say %d", name, r,
                      (int)am[r], argmax_row(ra, V));
                if (masks[round][i])
                    CHECK(memcmp(ra, rb, (size_t)V * 4) == 0, "%s: row %d logits differ", name, r);
                else
                    for (int v = 0; v < V; v++)
                        CHECK(rb[v] != rb[v], "%s: row %d of an unwanted sequence written", name,
                              r);
            }
        for (int i = 0; i < N; i++)
            if (nt[i] > 1) {
                CHECK(tdm_seq_commit(a[i], nt[i] - 1, &err) == TDM_OK, "%s", err.msg);
                CHECK(tdm_seq_commit(b[i], nt[i] - 1, &err) == TDM_OK, "%s", err.msg);
            }
    }
    for (int i = 0; i < N; i++) {
        tdm_seq_destroy(a[i]);
        tdm_seq_destroy(b[i]);
    }
    free(la);
    free(lb);
    free(am);
    printf("%-14s step_out: argmax of every row, logits of the wanted sequences only\n", name);
}

/* A fork continues exactly like its parent and is independent of it. */
static void fork_test(tdm_model *m, const char *name)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    tdm_error err;
    tdm_seq *a = make(m, TDM_STATE_EXTRA_BUFFER), *ref = make(m, TDM_STATE_EXTRA_BUFFER);
    int32_t prompt[80];
    for (int i = 0; i < 80; i++)
        prompt[i] = rnd(V);
    CHECK(tdm_seq_prefill(a, prompt, 80, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(ref, prompt, 80, NULL, &err) == TDM_OK, "%s", err.msg);
    tdm_seq *f;
    CHECK(tdm_seq_fork(a, &f, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_length(f) == 80, "fork length");
    float *l1 = malloc((size_t)V * 4), *l2 = malloc((size_t)V * 4);
    /* The parent takes another path first; the fork must not notice. */
    for (int i = 0; i < 5; i++) {
        int32_t t = rnd(V);
        CHECK(tdm_seq_decode(&a, 1, &t, l1, &err) == TDM_OK, "%s", err.msg);
    }
    for (int i = 0; i < 5; i++) {
        int32_t t = rnd(V);
        CHECK(tdm_seq_decode(&f, 1, &t, l1, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_decode(&ref, 1, &t, l2, &err) == TDM_OK, "%s", err.msg);
        CHECK(memcmp(l1, l2, (size_t)V * 4) == 0, "%s: fork differs from its parent's past", name);
    }
    int32_t t = 1;
    const int32_t *tp = &t;
    int one = 1;
    tdm_seq *f2;
    CHECK(tdm_seq_verify(&a, 1, &tp, &one, l1, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_fork(a, &f2, &err) == TDM_ERR_FAILED_PRECONDITION, "fork while pending");
    CHECK(tdm_seq_commit(a, 0, &err) == TDM_OK, "%s", err.msg);
    tdm_seq_destroy(a);
    tdm_seq_destroy(f);
    tdm_seq_destroy(ref);
    free(l1);
    free(l2);
    printf("%-14s fork: independent and exact\n", name);
}

/* A prompt longer than the engine's prefill chunk (128), in one call, in
 * uneven pieces and one token at a time: the same logits at every position. */
static void long_prompt(tdm_model *m, const char *name)
{
    const int V = tdm_model_get_config(m)->vocab_size, N = 300;
    tdm_error err;
    int32_t *p = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        p[i] = rnd(V);
    float *a = malloc((size_t)N * V * 4), *b = malloc((size_t)N * V * 4);
    tdm_seq *s1 = make(m, TDM_STATE_EXTRA_BUFFER), *s2 = make(m, TDM_STATE_NO_BUFFER);
    CHECK(tdm_seq_prefill(s1, p, N, a, &err) == TDM_OK, "%s", err.msg);
    int cuts[] = {0, 1, 130, 131, 257, N};
    for (size_t i = 0; i + 1 < sizeof(cuts) / sizeof(cuts[0]); i++)
        CHECK(tdm_seq_prefill(s2, p + cuts[i], cuts[i + 1] - cuts[i], b + (size_t)cuts[i] * V,
                              &err) == TDM_OK,
              "%s", err.msg);
    CHECK(memcmp(a, b, (size_t)N * V * 4) == 0, "%s: chunked prefill differs", name);
    tdm_seq *s3 = make(m, TDM_STATE_EXTRA_BUFFER);
    for (int i = 0; i < N; i++) {
        CHECK(tdm_seq_decode(&s3, 1, &p[i], b, &err) == TDM_OK, "%s", err.msg);
        CHECK(memcmp(b, a + (size_t)i * V, (size_t)V * 4) == 0,
              "%s: decode of position %d differs from the prefill", name, i);
    }
    tdm_seq_destroy(s1);
    tdm_seq_destroy(s2);
    tdm_seq_destroy(s3);
    free(p);
    free(a);
    free(b);
    printf("%-14s long prompt: one call == pieces == token by token (%d positions)\n", name, N);
}

static void memory_report(tdm_model *m, const char *name)
{
    tdm_seq_memory me, mn, mr;
    tdm_seq *e = make(m, TDM_STATE_EXTRA_BUFFER), *n = make(m, TDM_STATE_NO_BUFFER);
    tdm_seq *r = make(m, TDM_STATE_REPLAY);
    tdm_seq_memory_usage(e, &me);
    tdm_seq_memory_usage(n, &mn);
    tdm_seq_memory_usage(r, &mr);
    printf("%-14s state memory per sequence (k=%d): recurrent %zu B, conv %zu B; strategy extra: "
           "extra_buffer %zu B, no_buffer %zu B, replay %zu B\n",
           name, MAXK, me.recurrent_bytes, me.conv_bytes, me.strategy_bytes, mn.strategy_bytes,
           mr.strategy_bytes);
    CHECK(me.strategy_bytes == (size_t)(MAXK + 1) * (me.recurrent_bytes + me.conv_bytes),
          "extra_buffer keeps k+1 states");
    CHECK(mn.strategy_bytes == mn.recurrent_bytes + mn.conv_bytes, "no_buffer keeps 1 checkpoint");
    /* replay: k+1 conv windows and k+1 rows of recurrence inputs, far less
     * than extra_buffer's states (a row is k, v and two gates per layer) */
    CHECK(mr.strategy_bytes > (size_t)(MAXK + 1) * mr.conv_bytes &&
              mr.strategy_bytes < me.strategy_bytes,
          "replay keeps %zu B", mr.strategy_bytes);
    tdm_seq_destroy(e);
    tdm_seq_destroy(n);
    tdm_seq_destroy(r);
}

/* The CPU backend dressed with a copy_n that counts its calls and copies
 * through the CPU's copy. */
static tdm_backend *cn_cpu;
static int cn_calls, cn_entries, cn_most;

static void counting_copy_n(void *ctx, int n, void *const *dst, const void *const *src,
                            const size_t *nbytes)
{
    cn_calls++;
    cn_entries += n;
    cn_most = n > cn_most ? n : cn_most;
    for (int i = 0; i < n; i++)
        cn_cpu->copy(ctx, dst[i], src[i], nbytes[i]);
}

/* 48 layers, 36 of them linear: a commit copies 72 states, more than one
 * copy_n batch. Verify rounds with random acceptance on the dressed backend
 * and on the plain one (copy by copy) must give the same logits to the bit,
 * and every verify row the logits of decoding its tokens one at a time
 * (which commits nothing), so a state left behind by a commit shows in the
 * next round. */
static void commit_batches(tdm_backend *be)
{
    const bench_shape sh = {"deep", 32, 48, 64, 2, 1, 16, 1, 2, 16, 16, 96};
    char dir[] = "/tmp/tandem_deep_XXXXXX", err_msg[256];
    CHECK(mkdtemp(dir), "mkdtemp failed");
    CHECK(bench_write_model(dir, &sh, err_msg, sizeof(err_msg)) == 0, "%s", err_msg);
    tdm_backend dressed = *be;
    dressed.destroy = NULL;
    dressed.copy_n = counting_copy_n;
    cn_cpu = be;
    tdm_model *m0, *m1;
    tdm_error err;
    CHECK(tdm_model_load(dir, be, &m0, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_model_load(dir, &dressed, &m1, &err) == TDM_OK, "%s", err.msg);
    const int V = sh.V, rounds = 4;
    tdm_seq *a = make(m0, TDM_STATE_EXTRA_BUFFER), *b = make(m1, TDM_STATE_EXTRA_BUFFER);
    tdm_seq *sq = make(m0, TDM_STATE_EXTRA_BUFFER), *rp = make(m0, TDM_STATE_REPLAY);
    int32_t prompt[5] = {3, 1, 4, 1, 5};
    CHECK(tdm_seq_prefill(a, prompt, 5, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(rp, prompt, 5, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(b, prompt, 5, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(sq, prompt, 5, NULL, &err) == TDM_OK, "%s", err.msg);
    float *la = malloc((size_t)(MAXK + 1) * V * 4), *lb = malloc((size_t)(MAXK + 1) * V * 4);
    float *ls = malloc((size_t)V * 4), *lr = malloc((size_t)(MAXK + 1) * V * 4);
    for (int round = 0; round < rounds; round++) {
        int32_t blk[MAXK + 1];
        const int ntok = MAXK + 1, acc = rnd(ntok);
        for (int i = 0; i < ntok; i++)
            blk[i] = rnd(V);
        const int32_t *bp = blk;
        CHECK(tdm_seq_verify(&a, 1, &bp, &ntok, la, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_verify(&b, 1, &bp, &ntok, lb, &err) == TDM_OK, "%s", err.msg);
        CHECK(memcmp(la, lb, (size_t)ntok * V * 4) == 0, "deep: round %d: verify logits differ",
              round);
        CHECK(tdm_seq_verify(&rp, 1, &bp, &ntok, lr, &err) == TDM_OK, "%s", err.msg);
        CHECK(memcmp(la, lr, (size_t)ntok * V * 4) == 0,
              "deep: round %d: replay's verify logits differ", round);
        CHECK(tdm_seq_commit(rp, acc, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_commit(a, acc, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_commit(b, acc, &err) == TDM_OK, "%s", err.msg);
        for (int i = 0; i <= acc; i++) {
            CHECK(tdm_seq_decode(&sq, 1, &blk[i], ls, &err) == TDM_OK, "%s", err.msg);
            CHECK(memcmp(ls, lb + (size_t)i * V, (size_t)V * 4) == 0,
                  "deep: round %d: verify row %d != sequential decode", round, i);
        }
    }
    CHECK(tdm_seq_decode(&a, 1, prompt, la, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_decode(&b, 1, prompt, lb, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(la, lb, (size_t)V * 4) == 0, "deep: logits after the commits differ");
    CHECK(tdm_seq_decode(&rp, 1, prompt, lr, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(la, lr, (size_t)V * 4) == 0, "deep: logits after replay's commits differ");
    CHECK(cn_entries == rounds * 72, "copy_n moved %d states, not %d", cn_entries, rounds * 72);
    CHECK(cn_calls == rounds * 2 && cn_most <= 64, "copy_n: %d calls, up to %d copies each",
          cn_calls, cn_most);
    printf("deep (48 layers): %d commits through copy_n in %d calls == copy by copy == replay\n",
           rounds, cn_calls);
    free(lr);
    tdm_seq_destroy(rp);
    free(la);
    free(lb);
    free(ls);
    tdm_seq_destroy(a);
    tdm_seq_destroy(b);
    tdm_seq_destroy(sq);
    tdm_model_destroy(m0);
    tdm_model_destroy(m1);
    dir_remove(dir);
}

int main(void)
{
    tdm_backend *be = test_backend();
    const char *names[] = {"f32_gqa", "bf16_alt", "f32_tied", "f32_odd"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        tdm_model *m = fixture_model(names[i], be);
        strategies(m, names[i]);
        batching(m, names[i]);
        step_out(m, names[i]);
        fork_test(m, names[i]);
        long_prompt(m, names[i]);
        memory_report(m, names[i]);
        tdm_model_destroy(m);
    }
    commit_batches(be);
    be->destroy(be);
    return 0;
}
