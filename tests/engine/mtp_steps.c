/* mtp_steps.c - see mtp_steps.h. */
#include "mtp_steps.h"
#include "sampling.h"
#include "util.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T0 MTP_STEPS_PROMPT
#define K MTP_STEPS_DRAFTS

/* A target run over toks: hidden states after the final norm [n, H] and the
 * argmax of the last position. */
static float *target_hidden(tdm_model *m, const int32_t *toks, int n, int32_t *next)
{
    const int H = tdm_model_get_config(m)->hidden_size;
    tdm_seq_params p = {TDM_STATE_EXTRA_BUFFER, 4, 0};
    tdm_seq *s;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    float *hid = malloc((size_t)n * (size_t)H * sizeof(float));
    int32_t *am = malloc((size_t)n * sizeof(int32_t));
    const tdm_step_out o = {.hidden = hid, .argmax = am};
    CHECK(tdm_seq_prefill_out(s, toks, n, &o, &err) == TDM_OK, "%s", err.msg);
    *next = am[n - 1];
    free(am);
    tdm_seq_destroy(s);
    return hid;
}

static tdm_mtp_seq *mseq(tdm_mtp *h, int max_positions)
{
    tdm_mtp_seq *s;
    tdm_error err;
    CHECK(tdm_mtp_seq_create(h, max_positions, &s, &err) == TDM_OK, "%s", err.msg);
    return s;
}

static void prime(tdm_mtp_seq *s, const float *hid, const int32_t *next, int n, float *logits)
{
    tdm_error err;
    CHECK(tdm_mtp_prime(s, hid, next, n, logits, &err) == TDM_OK, "%s", err.msg);
}

static void draft(tdm_mtp_seq *s, int k, int32_t *d, float *logits)
{
    tdm_error err;
    CHECK(tdm_mtp_draft(s, k, d, logits, &err) == TDM_OK, "%s", err.msg);
}

/* Three sequences primed and drafting in batches (tdm_mtp_prime_n,
 * tdm_mtp_draft_n) against each alone: 100 + 60 + 5 primed rows (more than
 * one forward of TDM_PREFILL_ROWS, split inside a sequence), drafts of
 * different lengths, a second draft call continuing from the carried draft,
 * then a rollback and a prime of one more row each. hid [nh, H] are hidden
 * states to cycle through. */
static void batch(const char *name, tdm_mtp *h, const float *hid, int nh, size_t H, size_t V)
{
    enum { NB = 3 };
    const int n[NB] = {100, 60, 5}, k1[NB] = {3, 1, 4}, k2[NB] = {2, 3, 1};
    float *hb[NB];
    int32_t *nx[NB];
    for (int i = 0; i < NB; i++) {
        hb[i] = malloc((size_t)n[i] * H * sizeof(float));
        nx[i] = malloc((size_t)n[i] * sizeof(int32_t));
        for (int r = 0; r < n[i]; r++) {
            memcpy(hb[i] + (size_t)r * H, hid + (size_t)((r + 3 * i) % nh) * H, H * sizeof(float));
            nx[i][r] = (int32_t)((r * 13 + 7 * i + 1) % (int)V);
        }
    }
    tdm_mtp_seq *one[NB], *all[NB], *dev[NB]; /* dev: drafts without logits, some forced */
    float *lone = malloc(165 * V * 4), *lall = malloc(165 * V * 4);
    int32_t d1[NB][8], d2[NB][8], d3[NB][8];
    int32_t *dp[NB], *dq[NB];
    size_t at = 0;
    tdm_error err;
    for (int i = 0; i < NB; i++) {
        one[i] = mseq(h, 0);
        all[i] = mseq(h, 0);
        dev[i] = mseq(h, 0);
        dq[i] = d3[i];
        prime(one[i], hb[i], nx[i], n[i], lone + at * V);
        at += (size_t)n[i];
        dp[i] = d2[i];
    }
    const float *const hp[NB] = {hb[0], hb[1], hb[2]};
    const int32_t *const np[NB] = {nx[0], nx[1], nx[2]};
    CHECK(tdm_mtp_prime_n(all, NB, hp, np, n, lall, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(lone, lall, 165 * V * 4) == 0, "%s: a batched prime differs", name);
    CHECK(tdm_mtp_prime_n(dev, NB, hp, np, n, NULL, &err) == TDM_OK, "%s", err.msg);
    const int *ks[2] = {k1, k2};
    for (int round = 0; round < 2; round++) {
        at = 0;
        for (int i = 0; i < NB; i++) {
            draft(one[i], ks[round][i], d1[i], lone + at * V);
            at += (size_t)ks[round][i];
        }
        CHECK(tdm_mtp_draft_n(all, NB, ks[round], NULL, dp, lall, &err) == TDM_OK, "%s", err.msg);
        for (int i = 0; i < NB; i++)
            CHECK(memcmp(d1[i], d2[i], (size_t)ks[round][i] * 4) == 0,
                  "%s: batched drafts differ (sequence %d, round %d)", name, i, round);
        CHECK(memcmp(lone, lall, at * V * 4) == 0, "%s: batched draft logits differ (round %d)",
              name, round);
        /* Without logits (the steps on the device where the backend can),
         * then forced to the very drafts: the same drafts, the same state. */
        const int32_t *const fp[NB] = {d1[0], d1[1], d1[2]};
        CHECK(tdm_mtp_draft_n(dev, NB, ks[round], round ? fp : NULL, dq, NULL, &err) == TDM_OK,
              "%s", err.msg);
        for (int i = 0; i < NB; i++)
            CHECK(memcmp(d1[i], d3[i], (size_t)ks[round][i] * 4) == 0,
                  "%s: drafts without logits differ (sequence %d, round %d%s)", name, i, round,
                  round ? ", forced" : "");
    }
    const int32_t *const np1[NB] = {nx[0] + 1, nx[1] + 1, nx[2] + 1};
    const int ones[NB] = {1, 1, 1};
    for (int i = 0; i < NB; i++) {
        CHECK(tdm_mtp_rollback(one[i], n[i], &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_mtp_rollback(all[i], n[i], &err) == TDM_OK, "%s", err.msg);
        prime(one[i], hb[i], nx[i] + 1, 1, lone + (size_t)i * V);
    }
    CHECK(tdm_mtp_prime_n(all, NB, hp, np1, ones, lall, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(lone, lall, NB * V * 4) == 0, "%s: a batched prime after rollback differs", name);
    for (int i = 0; i < NB; i++)
        CHECK(tdm_mtp_rollback(dev[i], n[i], &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_mtp_prime_n(dev, NB, hp, np1, ones, lall, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(lone, lall, NB * V * 4) == 0,
          "%s: a prime after drafts without logits and forced drafts differs", name);
    /* Forced proposals other than the argmax are what the call returns. */
    int32_t fx[NB][4];
    const int32_t *const fxp[NB] = {fx[0], fx[1], fx[2]};
    const int four[NB] = {4, 4, 4};
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < 4; j++)
            fx[i][j] = (int32_t)((d1[i][0] + 1 + j + i) % (int)V);
    CHECK(tdm_mtp_draft_n(dev, NB, four, fxp, dq, NULL, &err) == TDM_OK, "%s", err.msg);
    for (int i = 0; i < NB; i++)
        CHECK(memcmp(fx[i], d3[i], sizeof(fx[i])) == 0, "%s: forced drafts not returned", name);
    const int32_t *const twice[2] = {nx[0], nx[0]};
    tdm_mtp_seq *dup[2] = {all[0], all[0]};
    CHECK(tdm_mtp_prime_n(dup, 2, hp, twice, ones, NULL, &err) == TDM_ERR_INVALID_ARGUMENT,
          "a sequence twice in a batch");
    for (int i = 0; i < NB; i++) {
        tdm_mtp_seq_destroy(one[i]);
        tdm_mtp_seq_destroy(all[i]);
        tdm_mtp_seq_destroy(dev[i]);
        free(hb[i]);
        free(nx[i]);
    }
    free(lone);
    free(lall);
}

/* A draft vocabulary (tdm_mtp_set_vocab) on a third head of m: every third
 * token and the last. Drafts without logits, and with logits, against the
 * whole head's logits for the same proposals (forced): each draft is the
 * best of the vocabulary's tokens in that row, and the logits are the
 * whole head's at those tokens and -inf elsewhere. Misuse refused. */
static void vocab(const char *name, tdm_model *m, const float *hid, const int32_t *next, int n,
                  size_t V)
{
    tdm_error err;
    tdm_mtp *h, *w;
    CHECK(tdm_mtp_create(m, &h, &err) == TDM_OK && tdm_mtp_create(m, &w, &err) == TDM_OK, "%s",
          err.msg);
    int nv;
    int32_t *ids = every_third_ids((int)V, &nv);
    const int32_t bad_order[3] = {1, 5, 5}, bad_range[2] = {0, (int32_t)V};
    CHECK(tdm_mtp_set_vocab(h, bad_order, 3, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "entry 2"),
          "%s: a vocabulary listing 5 twice: %s", name, err.msg);
    CHECK(tdm_mtp_set_vocab(h, bad_range, 2, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "outside"),
          "%s: a vocabulary past the model's: %s", name, err.msg);
    CHECK(tdm_mtp_set_vocab(h, ids, nv, &err) == TDM_OK, "%s: %s", name, err.msg);
    CHECK(tdm_mtp_vocab_size(h) == nv && tdm_mtp_vocab_size(w) == (int)V, "%s: vocabulary sizes",
          name);
    CHECK(tdm_mtp_set_vocab(h, ids, nv, &err) == TDM_ERR_FAILED_PRECONDITION, "%s: set twice",
          name);
    tdm_mtp_seq *a = mseq(h, 0), *b = mseq(h, 0), *f = mseq(w, 0);
    prime(a, hid, next, n, NULL);
    prime(b, hid, next, n, NULL);
    prime(f, hid, next, n, NULL);
    int32_t da[K], db[K], df[K];
    float *lb = malloc(K * V * 4), *lf = malloc(K * V * 4);
    draft(a, K, da, NULL); /* on the device where the backend can */
    draft(b, K, db, lb);
    const int32_t *fp = da;
    const int k = K;
    int32_t *dfp = df;
    CHECK(tdm_mtp_draft_n(&f, 1, &k, &fp, &dfp, lf, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(da, db, sizeof(da)) == 0, "%s: vocabulary drafts with and without logits differ",
          name);
    const double scale = max_abs(lf, K * V);
    for (int j = 0; j < K; j++) {
        const float *rb = lb + (size_t)j * V, *rf = lf + (size_t)j * V;
        float best = -INFINITY;
        int in = 0;
        for (int t = 0, x = 0; t < (int)V; t++) {
            const bool listed = x < nv && ids[x] == t;
            x += listed;
            if (!listed) {
                CHECK(isinf(rb[t]) && rb[t] < 0,
                      "%s: draft %d: token %d outside the vocabulary "
                      "has logit %g",
                      name, j, t, (double)rb[t]);
                continue;
            }
            CHECK(fabs((double)rb[t] - (double)rf[t]) <= 1e-5 * scale,
                  "%s: draft %d: token %d's logit %g, the whole head's %g", name, j, t,
                  (double)rb[t], (double)rf[t]);
            best = rf[t] > best ? rf[t] : best;
            in += t == da[j];
        }
        CHECK(in == 1, "%s: draft %d is token %d, outside the vocabulary", name, j, da[j]);
        CHECK((double)rf[da[j]] >= (double)best - 1e-5 * scale,
              "%s: draft %d: token %d (logit %g) is not the vocabulary's best (%g)", name, j, da[j],
              (double)rf[da[j]], (double)best);
    }
    printf("%s: drafts from %d of %zu tokens: %d %d %d %d\n", name, nv, V, da[0], da[1], da[2],
           da[3]);
    tdm_mtp_seq_destroy(a);
    tdm_mtp_seq_destroy(b);
    tdm_mtp_seq_destroy(f);
    tdm_mtp_destroy(h);
    tdm_mtp_destroy(w);
    free(lb);
    free(lf);
    free(ids);
}

/* Sampled drafts (tdm_mtp_draft_sampled) against their definition: three
 * sequences draft in one call, two sampled under settings that cut the
 * support by top-k, top-p, both or neither, one greedy; on heads opened from
 * dir with the whole vocabulary and with every third token, through the
 * backend's sample_to (graphs on: the second round replays the first's
 * shape with other uniforms) and on the backend without it (the host's
 * draws). Each sequence against the same head drafting the same tokens as
 * forced proposals with their logits: a sampled draft must be
 * tdm_sampling_draw's from tdm_sampling_probs of its row with its uniform,
 * and its distribution that row's (to the bit on the CPU backend, within
 * 1e-6 with the same support on others); a greedy one the row's argmax. */
static void sampled(const char *name, tdm_backend *be, const char *dir, const float *hid,
                    const int32_t *next, int n, size_t V)
{
    static const tdm_sampling set[] = {
        {1.0f, 0.0f, 0}, {0.8f, 0.0f, 7}, {1.0f, 0.8f, 0}, {0.6f, 0.9f, 20}, {2.5f, 0.0f, 0},
    };
    enum { NS = 3 };
    tdm_error err;
    tdm_backend host = *be;
    host.destroy = NULL;
    host.sample_to = NULL;
    const bool exact = strcmp(be->name, "cpu") == 0;
    int nv;
    int32_t *ids = every_third_ids((int)V, &nv);
    float *lg = malloc((size_t)K * V * 4), *p = malloc(V * 4);
    int *order = malloc(V * sizeof(int));
    CHECK(lg && p && order, "out of memory");
    int checked = 0;
    for (int mode = 0; mode < 4; mode++) { /* bit 0: a draft vocabulary; bit 1: no sample_to */
        tdm_backend *b = mode & 2 ? &host : be;
        tdm_mtp *h, *r;
        CHECK(tdm_mtp_open(dir, b, &h, &err) == TDM_OK && tdm_mtp_open(dir, b, &r, &err) == TDM_OK,
              "%s: %s", name, err.msg);
        tdm_mtp_set_graphs(h, 1);
        CHECK(!(mode & 1) || (tdm_mtp_set_vocab(h, ids, nv, &err) == TDM_OK &&
                              tdm_mtp_set_vocab(r, ids, nv, &err) == TDM_OK),
              "%s: %s", name, err.msg);
        const size_t W = (size_t)tdm_mtp_vocab_size(h);
        for (int round = 0; round < 2; round++) {
            const int k[NS] = {K, 2, 3};
            const tdm_sampling *st[NS] = {&set[(round + mode) % 5], NULL,
                                          &set[(round + 2 * mode + 2) % 5]};
            tdm_mtp_seq *q[NS], *rq[NS];
            double u[NS][K];
            float *probs[NS];
            tdm_draft_sampling ds[NS];
            const tdm_draft_sampling *sp[NS];
            int32_t d[NS][K], *dp[NS];
            for (int i = 0; i < NS; i++) {
                q[i] = mseq(h, 0);
                rq[i] = mseq(r, 0);
                prime(q[i], hid, next, n - i, NULL);
                prime(rq[i], hid, next, n - i, NULL);
                for (int j = 0; j < K; j++)
                    u[i][j] = fmod(0.137 + 0.618033988749895 *
                                               (double)(1 + j + 7 * i + 31 * round + 97 * mode),
                                   1.0);
                probs[i] = calloc((size_t)K * W, sizeof(float));
                CHECK(probs[i], "out of memory");
                if (st[i])
                    ds[i] = (tdm_draft_sampling){st[i]->temperature, st[i]->top_p, st[i]->top_k,
                                                 u[i], probs[i]};
                sp[i] = st[i] ? &ds[i] : NULL;
                dp[i] = d[i];
            }
            CHECK(tdm_mtp_draft_sampled(q, NS, k, sp, dp, &err) == TDM_OK, "%s: %s", name, err.msg);
            for (int i = 0; i < NS; i++) {
                const int32_t *fp = d[i];
                int32_t rd[K], *rdp = rd;
                CHECK(tdm_mtp_draft_n(&rq[i], 1, &k[i], &fp, &rdp, lg, &err) == TDM_OK, "%s: %s",
                      name, err.msg);
                for (int j = 0; j < k[i]; j++) {
                    const float *row = lg + (size_t)j * V;
                    int32_t want;
                    if (!st[i]) {
                        want = (int32_t)argmax_row(row, (int)V);
                    } else {
                        tdm_sampling_probs(st[i], row, (int)V, p, order);
                        want = tdm_sampling_draw(p, (int)V, u[i][j]);
                        double worst = 0.0;
                        int apart = 0;
                        for (size_t t = 0; t < W; t++) {
                            const float g = probs[i][(size_t)j * W + t];
                            const float ref = p[tdm_mtp_vocab_id(h, (int)t)];
                            const double dd = fabs((double)g - (double)ref);
                            worst = dd > worst ? dd : worst;
                            apart += (g > 0.0f) != (ref > 0.0f);
                        }
                        CHECK((exact ? worst == 0.0 : worst <= 1e-6) && apart == 0,
                              "%s (mode %d round %d): sequence %d (T %g, top_p %g, top_k %u) "
                              "draft %d: its distribution differs from its row's by %g (%d "
                              "tokens in one support only)",
                              name, mode, round, i, (double)st[i]->temperature,
                              (double)st[i]->top_p, st[i]->top_k, j, worst, apart);
                    }
                    CHECK(d[i][j] == want,
                          "%s (mode %d round %d): sequence %d (%s) draft %d: %d, from its row "
                          "on the host %d",
                          name, mode, round, i, st[i] ? "sampled" : "greedy", j, d[i][j], want);
                    checked++;
                }
                tdm_mtp_seq_destroy(q[i]);
                tdm_mtp_seq_destroy(rq[i]);
                free(probs[i]);
            }
        }
        tdm_mtp_destroy(h);
        tdm_mtp_destroy(r);
    }
    printf("%s: %d sampled and greedy MTP drafts drawn as their rows' distributions give them "
           "(whole vocabulary and %d tokens, with and without sample_to)\n",
           name, checked, nv);
    free(ids);
    free(lg);
    free(p);
    free(order);
}

void mtp_steps_check(const char *name, const char *dir, tdm_model *m, tdm_mtp *h, tdm_mtp *h2,
                     int fp8, mtp_steps_out *out)
{
    const tdm_model_config *c = tdm_model_get_config(m);
    const size_t H = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    tdm_error err;
    /* The target's tokens: a prompt, then 3 more positions "verified". */
    int32_t toks[T0 + 4];
    for (int i = 0; i < T0 + 4; i++)
        toks[i] = (int32_t)((i * 37 + 11) % c->vocab_size);
    int32_t x_n;
    float *hid = target_hidden(m, toks, T0 + 3, &x_n); /* [T0 + 3, H] */
    int32_t next[T0 + 3];                              /* next[p]: the token at p + 1 */
    for (int p = 0; p < T0 + 2; p++)
        next[p] = toks[p + 1];
    next[T0 + 2] = x_n;

    /* One prime against chunks of 4 and 6. */
    float *la = malloc(T0 * V * 4), *lb = malloc((T0 + 3) * V * 4);
    tdm_mtp_seq *a = mseq(h, 0), *b = mseq(h, T0 + K);
    prime(a, hid, next, T0, la);
    prime(b, hid, next, 4, lb);
    prime(b, hid + 4 * H, next + 4, T0 - 4, lb + 4 * V);
    CHECK(memcmp(la, lb, T0 * V * 4) == 0, "%s: a prime in chunks differs", name);
    CHECK(tdm_mtp_seq_length(a) == T0, "length %d", tdm_mtp_seq_length(a));

    /* The first draft is the last primed row's argmax; two calls = one. */
    int32_t da[K], db[K];
    float *dla = malloc(K * V * 4), *dlb = malloc(K * V * 4);
    draft(a, K, da, dla);
    CHECK(memcmp(dla, la + (T0 - 1) * V, V * 4) == 0, "%s: draft 1's logits", name);
    CHECK(da[0] == argmax_row(la + (T0 - 1) * V, (int)V), "%s: draft 1 is not the argmax", name);
    CHECK(tdm_mtp_seq_length(a) == T0 + K - 1, "after drafting: length %d", tdm_mtp_seq_length(a));
    draft(b, 2, db, dlb);
    draft(b, K - 2, db + 2, dlb + 2 * V);
    CHECK(memcmp(da, db, sizeof(da)) == 0 && memcmp(dla, dlb, K * V * 4) == 0,
          "%s: drafts in two calls differ from one call", name);

    /* Misuse. */
    CHECK(tdm_mtp_prime(a, hid, next, 1, NULL, &err) == TDM_ERR_FAILED_PRECONDITION &&
              strstr(err.msg, "roll back"),
          "%s: a prime over draft rows: %s", name, err.msg);
    CHECK(tdm_mtp_rollback(a, T0 + K, &err) == TDM_ERR_INVALID_ARGUMENT, "rollback past the end");

    /* The target accepts 2 of the drafts and brings 3 rows (positions T0 ..
     * T0+2): roll back to the primed prefix and prime them. The same as a
     * fresh sequence primed with all T0 + 3 rows. */
    CHECK(tdm_mtp_rollback(a, T0, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_mtp_draft(a, 1, da, NULL, &err) == TDM_ERR_FAILED_PRECONDITION,
          "a draft with nothing primed since the rollback");
    float *l3 = malloc(3 * V * 4), *lf = malloc((T0 + 3) * V * 4);
    prime(a, hid + T0 * H, next + T0, 3, l3);
    tdm_mtp_seq *f = mseq(h, 0);
    prime(f, hid, next, T0 + 3, lf);
    CHECK(memcmp(l3, lf + T0 * V, 3 * V * 4) == 0, "%s: rows primed after a rollback differ", name);
    int32_t dfr[K];
    draft(a, K, da, dla);
    draft(f, K, dfr, dlb);
    CHECK(memcmp(da, dfr, sizeof(da)) == 0 && memcmp(dla, dlb, K * V * 4) == 0,
          "%s: drafts after a rollback differ from a fresh sequence's", name);

    batch(name, h, hid, T0 + 3, H, V);
    if (!fp8)
        vocab(name, m, hid, next, T0 + 3, V);
    sampled(name, tdm_model_backend(m), dir, hid, next, T0 + 3, V);

    /* A head opened from the folder: the same bits. */
    tdm_mtp_seq *o = mseq(h2, 0);
    prime(o, hid, next, T0 + 3, lb);
    CHECK(memcmp(lb, lf, (T0 + 3) * V * 4) == 0, "%s: tdm_mtp_open's head differs", name);
    draft(o, K, dfr, dlb);
    CHECK(memcmp(dla, dlb, K * V * 4) == 0, "%s: tdm_mtp_open's drafts differ", name);
    printf("%s: drafts %d %d %d %d, max|logit| %.3f\n", name, da[0], da[1], da[2], da[3],
           (double)max_abs(lf, (T0 + 3) * V));
    CHECK(max_abs(lf, (T0 + 3) * V) > 0, "all-zero logits");

    out->prime = lf;
    out->draft = dla;
    memcpy(out->drafts, da, sizeof(da));
    out->rows = T0 + 3;
    tdm_mtp_seq_destroy(a);
    tdm_mtp_seq_destroy(b);
    tdm_mtp_seq_destroy(f);
    tdm_mtp_seq_destroy(o);
    free(hid);
    free(la);
    free(lb);
    free(dlb);
    free(l3);
}

void mtp_steps_out_free(mtp_steps_out *o)
{
    free(o->prime);
    free(o->draft);
}
