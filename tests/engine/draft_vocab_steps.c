/* draft_vocab_steps.c - see draft_vocab_steps.h. */
#include "draft_vocab_steps.h"
#include "safetensors.h"
#include "steps.h"
#include "util.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 11, BLOCK = 3, K = 4 };

static tdm_seq *seq_of(tdm_model *m, const int32_t *prompt)
{
    tdm_error err;
    const tdm_seq_params p = {.strategy = tdm_model_backend(m)->gdn_replay ? TDM_STATE_REPLAY
                                                                           : TDM_STATE_EXTRA_BUFFER,
                              .max_draft = 8};
    tdm_seq *s;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(s, prompt, PROMPT, NULL, &err) == TDM_OK, "%s", err.msg);
    return s;
}

static bool listed(const int32_t *ids, int n, int32_t t)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == t)
            return true;
    return false;
}

/* The best listed token of a whole-vocabulary row (lowest id on ties). */
static int32_t best_listed(const float *row, const int32_t *ids, int n)
{
    int32_t b = ids[0];
    for (int i = 1; i < n; i++)
        if (row[ids[i]] > row[b])
            b = ids[i];
    return b;
}

void draft_vocab_check(const char *name, tdm_backend *be)
{
    tdm_error err;
    tdm_backend calls = *be; /* drafting by verify calls, argmaxes on the host */
    calls.destroy = NULL;
    calls.argmax_to = NULL;
    calls.embed_dev = NULL;
    tdm_model *whole = fixture_model(name, be), *dv = fixture_model(name, be),
              *dvc = fixture_model(name, &calls);
    const int V = tdm_model_get_config(whole)->vocab_size;
    int n;
    int32_t *ids = every_third_ids(V, &n);
    const int32_t twice[3] = {1, 5, 5}, past[2] = {0, V};
    CHECK(tdm_model_set_draft_vocab(dv, twice, 3, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "entry 2"),
          "%s: a vocabulary listing 5 twice: %s", name, err.msg);
    CHECK(tdm_model_set_draft_vocab(dv, past, 2, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "outside"),
          "%s: a vocabulary past the model's: %s", name, err.msg);
    CHECK(tdm_model_set_draft_vocab(dv, ids, n, &err) == TDM_OK &&
              tdm_model_set_draft_vocab(dvc, ids, n, &err) == TDM_OK,
          "%s: %s", name, err.msg);
    CHECK(tdm_model_draft_vocab_size(dv) == n && tdm_model_draft_vocab_size(whole) == V,
          "%s: vocabulary sizes %d and %d", name, tdm_model_draft_vocab_size(dv),
          tdm_model_draft_vocab_size(whole));
    /* A step streams the listed rows instead of the whole LM head. */
    const size_t H = (size_t)tdm_model_get_config(whole)->hidden_size,
                 wb = tdm_model_weight_bytes(whole), db = tdm_model_weight_bytes(dv);
    CHECK(wb > db && (wb - db) % (H * (size_t)(V - n)) == 0 &&
              ((wb - db) / (H * (size_t)(V - n)) == 2 || (wb - db) / (H * (size_t)(V - n)) == 4),
          "%s: weight bytes a step streams: %zu with the vocabulary, %zu without", name, db, wb);
    CHECK(tdm_model_set_draft_vocab(dv, ids, n, &err) == TDM_ERR_FAILED_PRECONDITION,
          "%s: a second vocabulary accepted", name);

    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % V);
    tdm_seq *sw = seq_of(whole, prompt), *sd = seq_of(dv, prompt), *sc = seq_of(dvc, prompt);

    /* A verify block: logits and argmaxes. */
    const int32_t block[BLOCK] = {prompt[3], prompt[7], (int32_t)(V - 1)};
    const int32_t *bp = block;
    const int nb = BLOCK;
    float *lw = malloc((size_t)BLOCK * V * sizeof(float)), *ld = malloc((size_t)BLOCK * V * 4);
    int32_t aw[BLOCK], ad[BLOCK];
    tdm_step_out o = {.logits = lw, .argmax = aw};
    CHECK(tdm_seq_verify_out(&sw, 1, &bp, &nb, &o, &err) == TDM_OK, "%s", err.msg);
    o = (tdm_step_out){.logits = ld, .argmax = ad};
    CHECK(tdm_seq_verify_out(&sd, 1, &bp, &nb, &o, &err) == TDM_OK, "%s", err.msg);
    const double tol = 1e-5 * (double)max_abs(lw, (size_t)BLOCK * V);
    for (int r = 0; r < BLOCK; r++) {
        const float *w = lw + (size_t)r * V, *d = ld + (size_t)r * V;
        for (int t = 0, x = 0; t < V; t++) {
            const bool in = x < n && ids[x] == t;
            x += in;
            if (in)
                CHECK(fabs((double)d[t] - (double)w[t]) <= tol,
                      "%s: row %d: token %d's logit %g, the whole model's %g", name, r, t,
                      (double)d[t], (double)w[t]);
            else
                CHECK(isinf(d[t]) && d[t] < 0, "%s: row %d: unlisted token %d has logit %g", name,
                      r, t, (double)d[t]);
        }
        const int32_t b = best_listed(w, ids, n);
        CHECK(listed(ids, n, ad[r]) && (double)w[ad[r]] >= (double)w[b] - tol,
              "%s: row %d: argmax %d (logit %g), the best listed token is %d (%g)", name, r, ad[r],
              listed(ids, n, ad[r]) ? (double)w[ad[r]] : 0.0, b, (double)w[b]);
        CHECK(aw[r] == argmax_row(w, V), "%s: row %d: the whole model's argmax", name, r);
    }
    o = (tdm_step_out){0};
    CHECK(tdm_seq_verify_out(&sc, 1, &bp, &nb, &o, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_commit(sw, BLOCK - 1, &err) == TDM_OK &&
              tdm_seq_commit(sd, BLOCK - 1, &err) == TDM_OK &&
              tdm_seq_commit(sc, BLOCK - 1, &err) == TDM_OK,
          "%s", err.msg);

    /* Greedy drafts: each the best listed token of the whole model's row,
     * followed on the whole model one verify call a draft. */
    const int32_t lead = block[BLOCK - 1];
    const int32_t *lp = &lead;
    const int one = 1, k = K;
    int32_t dd[K], dc[K];
    int32_t *ddp = dd, *dcp = dc;
    CHECK(tdm_seq_draft(&sd, 1, &lp, &one, &k, NULL, &ddp, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_draft(&sc, 1, &lp, &one, &k, NULL, &dcp, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(dd, dc, sizeof(dd)) == 0,
          "%s: drafts on the device %d %d %d %d, by verify calls %d %d %d %d", name, dd[0], dd[1],
          dd[2], dd[3], dc[0], dc[1], dc[2], dc[3]);
    for (int j = 0; j < K; j++) {
        const int32_t *tp = j == 0 ? &lead : &dd[j - 1];
        o = (tdm_step_out){.logits = lw};
        CHECK(tdm_seq_verify_out(&sw, 1, &tp, &one, &o, &err) == TDM_OK, "%s", err.msg);
        const int32_t b = best_listed(lw, ids, n);
        CHECK(listed(ids, n, dd[j]) && (double)lw[dd[j]] >= (double)lw[b] - tol,
              "%s: draft %d is %d (logit %g), the best listed token is %d (%g)", name, j, dd[j],
              listed(ids, n, dd[j]) ? (double)lw[dd[j]] : 0.0, b, (double)lw[b]);
    }
    /* Two drafts accepted: the three models' states agree (the listed rows
     * change no state). */
    CHECK(tdm_seq_commit(sw, 2, &err) == TDM_OK && tdm_seq_commit(sd, 2, &err) == TDM_OK &&
              tdm_seq_commit(sc, 2, &err) == TDM_OK,
          "%s", err.msg);
    CHECK(steps_same_state(sw, sd) && steps_same_state(sd, sc),
          "%s: states after the drafts' commit differ from the whole model's", name);
    printf("%s: draft vocabulary of %d of %d tokens: logits, argmaxes and %d greedy drafts (device "
           "and verify calls) are the whole model's best listed tokens; states unchanged\n",
           name, n, V, K);
    tdm_seq_destroy(sw);
    tdm_seq_destroy(sd);
    tdm_seq_destroy(sc);
    free(lw);
    free(ld);
    free(ids);
    tdm_model_destroy(whole);
    tdm_model_destroy(dv);
    tdm_model_destroy(dvc);
}

/* The n rows of the checkpoint's LM head (the embedding's table when tied)
 * of least largest magnitude, ascending; whether their largest is below half
 * the head's (so a scale of their own would be finer than the head's). */
static bool least_rows(const char *dir, bool tied, int V, int H, int32_t *ids, int n)
{
    tdm_st_file *f;
    tdm_error err;
    CHECK(tdm_st_open(dir, &f, &err) == TDM_OK, "%s", err.msg);
    const char *suffix = tied ? "embed_tokens.weight" : "lm_head.weight";
    const tdm_st_tensor *t = NULL;
    for (size_t i = 0; i < tdm_st_count(f) && !t; i++) {
        const tdm_st_tensor *c = tdm_st_at(f, i);
        const size_t nl = strlen(c->name), sl = strlen(suffix);
        if (nl >= sl && strcmp(c->name + nl - sl, suffix) == 0 && strncmp(c->name, "mtp.", 4))
            t = c;
    }
    CHECK(t && t->numel == (int64_t)V * H &&
              (t->dtype == TDM_ST_DTYPE_BF16 || t->dtype == TDM_ST_DTYPE_F32),
          "%s: the LM head's tensor (%s)", dir, suffix);
    float *amax = calloc((size_t)V, sizeof(float));
    float all = 0.0f;
    for (int r = 0; r < V; r++) {
        for (int i = 0; i < H; i++) {
            const size_t k = (size_t)r * H + (size_t)i;
            float v;
            if (t->dtype == TDM_ST_DTYPE_F32) {
                memcpy(&v, (const char *)t->data + 4 * k, 4);
            } else {
                uint16_t b;
                memcpy(&b, (const char *)t->data + 2 * k, 2);
                const uint32_t u = (uint32_t)b << 16;
                memcpy(&v, &u, 4);
            }
            amax[r] = fmaxf(amax[r], fabsf(v));
        }
        all = fmaxf(all, amax[r]);
    }
    float most = 0.0f;
    for (int j = 0; j < n; j++) { /* the least of those not taken */
        int b = -1;
        for (int r = 0; r < V; r++)
            if (amax[r] >= 0.0f && (b < 0 || amax[r] < amax[b]))
                b = r;
        most = fmaxf(most, amax[b]);
        amax[b] = -1.0f;
    }
    for (int r = 0, j = 0; r < V; r++) /* ascending */
        if (amax[r] < 0.0f)
            ids[j++] = r;
    free(amax);
    tdm_st_close(f);
    return most < 0.5f * all;
}

void draft_vocab_fp8_check(const char *name, tdm_backend *be)
{
    tdm_error err;
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/%s/model", TANDEM_ENGINE_FIXTURES, name);
    tdm_model *whole = fixture_model(name, be), *before = fixture_model(name, be),
              *after = fixture_model(name, be);
    const tdm_model_config *c = tdm_model_get_config(whole);
    const int V = c->vocab_size;
    enum { N = 4 };
    int32_t ids[N];
    CHECK(least_rows(dir, c->tie_word_embeddings, V, c->hidden_size, ids, N),
          "%s: no rows of the LM head lie below half its largest magnitude", name);
    const size_t stored = tdm_model_weight_bytes(whole);
    CHECK(tdm_model_set_weights_fp8(whole, NULL, NULL, &err) == TDM_OK &&
              tdm_model_set_draft_vocab(before, ids, N, &err) == TDM_OK &&
              tdm_model_set_weights_fp8(before, NULL, NULL, &err) == TDM_OK &&
              tdm_model_set_weights_fp8(after, NULL, NULL, &err) == TDM_OK &&
              tdm_model_set_draft_vocab(after, ids, N, &err) == TDM_OK,
          "%s: %s", name, err.msg);
    /* The rounded model streams a byte a value of the head (the head alone
     * saves V·H bytes or more); the vocabulary's streams its rows instead
     * (either order). */
    const size_t H = (size_t)c->hidden_size, wb = tdm_model_weight_bytes(whole);
    CHECK(wb + (size_t)V * H <= stored &&
              tdm_model_weight_bytes(before) == tdm_model_weight_bytes(after) &&
              tdm_model_weight_bytes(before) == wb - (size_t)(V - N) * H,
          "%s: fp8 weight bytes %zu (stored %zu), with the vocabulary %zu set before, %zu after",
          name, wb, stored, tdm_model_weight_bytes(before), tdm_model_weight_bytes(after));
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 29 + 5) % V);
    tdm_model *ms[3] = {whole, before, after};
    float *l[3];
    const int32_t block[BLOCK] = {prompt[2], prompt[9], ids[0]};
    const int32_t *bp = block;
    const int nb = BLOCK;
    for (int i = 0; i < 3; i++) {
        tdm_seq *s = seq_of(ms[i], prompt);
        l[i] = malloc((size_t)BLOCK * V * sizeof(float));
        const tdm_step_out o = {.logits = l[i]};
        CHECK(tdm_seq_verify_out(&s, 1, &bp, &nb, &o, &err) == TDM_OK, "%s", err.msg);
        tdm_seq_destroy(s);
    }
    const double tol = 1e-5 * (double)max_abs(l[0], (size_t)BLOCK * V);
    for (int i = 1; i < 3; i++)
        for (int r = 0; r < BLOCK; r++)
            for (int j = 0; j < N; j++) {
                const double w = l[0][(size_t)r * V + ids[j]], d = l[i][(size_t)r * V + ids[j]];
                CHECK(fabs(d - w) <= tol,
                      "%s: vocabulary set %s the rounding: row %d, token %d: logit %.9g, the "
                      "rounded model's %.9g",
                      name, i == 1 ? "before" : "after", r, ids[j], d, w);
            }
    printf("%s: fp8: a draft vocabulary of the %d least rows (set before or after the rounding) "
           "gives the rounded model's logits\n",
           name, N);
    for (int i = 0; i < 3; i++) {
        free(l[i]);
        tdm_model_destroy(ms[i]);
    }
}
