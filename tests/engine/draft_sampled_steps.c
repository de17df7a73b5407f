/* draft_sampled_steps.c - see draft_sampled_steps.h. */
#include "draft_sampled_steps.h"
#include "sampling.h"
#include "steps.h"
#include "util.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 9, NSEQ = 3, KMAX = 4 };

static tdm_seq *seq_of(tdm_model *m, int salt)
{
    tdm_error err;
    const int V = tdm_model_get_config(m)->vocab_size;
    const tdm_seq_params p = {.strategy = tdm_model_backend(m)->gdn_replay ? TDM_STATE_REPLAY
                                                                           : TDM_STATE_EXTRA_BUFFER,
                              .max_draft = 8};
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + salt * 101 + 11) % V);
    tdm_seq *s;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(s, prompt, PROMPT, NULL, &err) == TDM_OK, "%s", err.msg);
    return s;
}

/* The settings tried: neither cut, top-k, top-p, both, a flat temperature. */
static const tdm_sampling settings[] = {
    {1.0f, 0.0f, 0}, {0.8f, 0.0f, 7}, {1.0f, 0.8f, 0}, {0.6f, 0.9f, 20}, {2.5f, 0.0f, 0},
};

/* One call of three sequences on m (device chains where m's backend has
 * them) against verify calls on r (the same model), settings a and b for
 * the sampled two. */
static void one_call(const char *name, tdm_model *m, tdm_model *r, int a, int b, int round)
{
    tdm_error err;
    const int V = tdm_model_get_config(m)->vocab_size, Vl = tdm_model_draft_vocab_size(m);
    const bool exact = strcmp(tdm_model_backend(m)->name, "cpu") == 0;
    tdm_seq *sq[NSEQ], *rq[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        sq[i] = seq_of(m, i + 3 * round);
        rq[i] = seq_of(r, i + 3 * round);
    }
    const int k[NSEQ] = {KMAX, 2, 3};
    const tdm_sampling *set[NSEQ] = {&settings[a], NULL, &settings[b]};
    int32_t lead[NSEQ], drafts[NSEQ][KMAX];
    double u[NSEQ][KMAX];
    float *probs[NSEQ];
    tdm_draft_sampling ds[NSEQ];
    const tdm_draft_sampling *sp[NSEQ];
    const int32_t *lp[NSEQ];
    int32_t *dp[NSEQ];
    int one[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        lead[i] = (int32_t)((round * 53 + i * 29 + 5) % V);
        lp[i] = &lead[i];
        dp[i] = drafts[i];
        one[i] = 1;
        for (int j = 0; j < KMAX; j++)
            u[i][j] = fmod(0.137 + 0.618033988749895 * (double)(1 + j + 7 * i + 31 * round), 1.0);
        probs[i] = calloc((size_t)KMAX * (size_t)Vl, sizeof(float));
        CHECK(probs[i], "out of memory");
        if (set[i])
            ds[i] = (tdm_draft_sampling){set[i]->temperature, set[i]->top_p, set[i]->top_k, u[i],
                                         probs[i]};
        sp[i] = set[i] ? &ds[i] : NULL;
    }
    CHECK(tdm_seq_draft_sampled(sq, NSEQ, lp, one, k, sp, dp, &err) == TDM_OK, "%s: %s", name,
          err.msg);

    /* The definition: a verify call a draft, the draw on the host. */
    float *lg = malloc((size_t)V * sizeof(float)), *p = malloc((size_t)V * sizeof(float));
    int *order = malloc((size_t)V * sizeof(int));
    CHECK(lg && p && order, "out of memory");
    for (int i = 0; i < NSEQ; i++) {
        int32_t prev = lead[i];
        for (int j = 0; j < k[i]; j++) {
            const int32_t *tp = &prev;
            const int nt = 1;
            const tdm_step_out o = {.logits = lg};
            CHECK(tdm_seq_verify_out(&rq[i], 1, &tp, &nt, &o, &err) == TDM_OK, "%s", err.msg);
            int32_t want;
            if (!set[i]) {
                want = tdm_sampling_argmax(lg, V);
            } else {
                tdm_sampling_probs(set[i], lg, V, p, order);
                want = tdm_sampling_draw(p, V, u[i][j]);
                double worst = 0.0;
                int support_m = 0, support_r = 0, apart = 0;
                for (int t = 0; t < Vl; t++) {
                    const float got = probs[i][(size_t)j * Vl + t];
                    const float ref = p[tdm_model_draft_vocab_id(m, t)];
                    const double d = fabs((double)got - (double)ref);
                    worst = d > worst ? d : worst;
                    support_m += got > 0.0f;
                    support_r += ref > 0.0f;
                    apart += (got > 0.0f) != (ref > 0.0f);
                }
                CHECK(exact ? worst == 0.0 : worst <= 1e-6,
                      "%s: sequence %d (T %g, top_p %g, top_k %u) draft %d: a probability "
                      "differs from the host's by %g",
                      name, i, (double)set[i]->temperature, (double)set[i]->top_p, set[i]->top_k,
                      j, worst);
                CHECK(apart == 0, "%s: sequence %d draft %d: supports of %d and %d tokens differ",
                      name, i, j, support_m, support_r);
            }
            CHECK(drafts[i][j] == want,
                  "%s: sequence %d (%s) draft %d: %d, drawn on the host from the verify call's "
                  "logits: %d",
                  name, i, set[i] ? "sampled" : "greedy", j, drafts[i][j], want);
            prev = want;
        }
    }
    /* Both keep one draft: the same state either way. */
    for (int i = 0; i < NSEQ; i++) {
        CHECK(tdm_seq_commit(sq[i], 1, &err) == TDM_OK && tdm_seq_commit(rq[i], 1, &err) == TDM_OK,
              "%s", err.msg);
        CHECK(steps_same_state(sq[i], rq[i]), "%s: sequence %d: states differ after the commit",
              name, i);
        tdm_seq_destroy(sq[i]);
        tdm_seq_destroy(rq[i]);
        free(probs[i]);
    }
    free(lg);
    free(p);
    free(order);
}

/* A verify call whose sampled sequences' rows are kept as distributions
 * (tdm_step_out.probs_of) against the same call's logits turned on the
 * host: each kept sequence's draw from its last row, each other row's
 * probability of the next row's token, and every kept row fetched
 * afterwards; a greedy sequence's rows stay logits and are not kept. */
enum { NP = 4 };
static void probs_of_check(const char *name, tdm_model *m, tdm_model *r)
{
    tdm_error err;
    const int V = tdm_model_get_config(m)->vocab_size;
    const bool exact = strcmp(tdm_model_backend(m)->name, "cpu") == 0;
    const int nt[NP] = {3, 3, 1, 4}; /* sequence 1 greedy; 2 a plain row */
    tdm_seq *sq[NP], *rq[NP];
    int32_t blocks[NP][4];
    const int32_t *tp[NP];
    tdm_sample_row of[NP];
    int row0[NP], rows = 0;
    for (int i = 0; i < NP; i++) {
        sq[i] = seq_of(m, 40 + i);
        rq[i] = seq_of(r, 40 + i);
        for (int j = 0; j < nt[i]; j++)
            blocks[i][j] = (int32_t)((i * 71 + j * 13 + 2) % V);
        tp[i] = blocks[i];
        row0[i] = rows;
        rows += nt[i];
        const tdm_sampling *st = &settings[(i * 2 + 1) % 5];
        of[i] = i == 1 ? (tdm_sample_row){0} /* greedy */
                       : (tdm_sample_row){st->temperature, st->top_p, st->top_k, 0,
                                          fmod(0.29 + 0.618033988749895 * i, 1.0)};
    }
    float *got = calloc((size_t)rows * V, sizeof(float)), *lg = calloc((size_t)rows * V, 4),
          *fx = calloc((size_t)rows * V, sizeof(float)), *picked = calloc((size_t)rows, 4),
          *p = malloc((size_t)V * 4);
    int *order = malloc((size_t)V * sizeof(int));
    int32_t drawn[NP];
    CHECK(got && lg && fx && picked && p && order, "out of memory");
    tdm_step_out o = {.logits = got, .probs_of = of, .drawn = drawn, .picked = picked};
    CHECK(tdm_seq_verify_out(sq, NP, tp, nt, &o, &err) == TDM_OK, "%s: %s", name, err.msg);
    o = (tdm_step_out){.logits = lg};
    CHECK(tdm_seq_verify_out(rq, NP, tp, nt, &o, &err) == TDM_OK, "%s: %s", name, err.msg);
    /* Every kept row, fetched into another buffer than the step's. */
    int kept[4 * NP], nk = 0;
    for (int i = 0; i < NP; i++)
        for (int j = 0; i != 1 && j < nt[i]; j++)
            kept[nk++] = row0[i] + j;
    CHECK(tdm_step_probs_fetch(m, fx, kept, nk, &err) == TDM_OK, "%s: %s", name, err.msg);
    for (int i = 0; i < NP; i++)
        for (int j = 0; j < nt[i]; j++) {
            const int row = row0[i] + j;
            const float *l = lg + (size_t)row * V;
            const tdm_sampling st = {of[i].temperature, of[i].top_p, of[i].top_k};
            const float *g = i == 1 ? got + (size_t)row * V : fx + (size_t)row * V, *want = l;
            if (i != 1) {
                tdm_sampling_probs(&st, l, V, p, order);
                want = p;
            }
            double worst = 0.0;
            int apart = 0;
            for (int t = 0; t < V; t++) {
                const double d = fabs((double)g[t] - (double)want[t]);
                worst = d > worst ? d : worst;
                apart += i != 1 && (g[t] > 0.0f) != (want[t] > 0.0f);
            }
            CHECK((exact || i == 1 ? worst == 0.0 : worst <= 1e-6) && apart == 0,
                  "%s: sequence %d row %d: %s differ from the host's by %g (%d tokens in one "
                  "support only)",
                  name, i, j, i == 1 ? "logits" : "fetched probabilities", worst, apart);
            if (i == 1)
                continue;
            if (j + 1 < nt[i]) {
                const float pw = p[blocks[i][j + 1]];
                const double d = fabs((double)picked[row] - (double)pw);
                CHECK(exact ? d == 0.0 : d <= 1e-6,
                      "%s: sequence %d row %d: picked %.9g, the host's probability of the next "
                      "row's token %d is %.9g",
                      name, i, j, (double)picked[row], blocks[i][j + 1], (double)pw);
            } else {
                const int w = tdm_sampling_draw(p, V, of[i].u);
                CHECK(drawn[i] == w, "%s: sequence %d: drew %d from its last row, the host %d",
                      name, i, drawn[i], w);
            }
        }
    /* A row the step did not keep, and rows after the model's next call. */
    const int greedy_row = row0[1];
    CHECK(tdm_step_probs_fetch(m, fx, &greedy_row, 1, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "not kept"),
          "%s: a greedy row fetched: %s", name, err.msg);
    for (int i = 0; i < NP; i++)
        CHECK(tdm_seq_commit(sq[i], -1, &err) == TDM_OK, "%s: %s", name, err.msg);
    {
        const int one = 1;
        o = (tdm_step_out){.logits = got};
        CHECK(tdm_seq_verify_out(sq, 1, tp, &one, &o, &err) == TDM_OK, "%s: %s", name, err.msg);
        CHECK(tdm_step_probs_fetch(m, fx, kept, 1, &err) == TDM_ERR_INVALID_ARGUMENT,
              "%s: a row fetched after the next call was not refused", name);
    }
    for (int i = 0; i < NP; i++) {
        tdm_seq_destroy(sq[i]);
        tdm_seq_destroy(rq[i]);
    }
    free(got);
    free(lg);
    free(fx);
    free(picked);
    free(p);
    free(order);
}

void draft_sampled_check(const char *name, tdm_backend *be)
{
    tdm_error err;
    tdm_model *m = fixture_model(name, be), *r = fixture_model(name, be);
    tdm_model *mv = fixture_model(name, be), *rv = fixture_model(name, be);
    const int V = tdm_model_get_config(m)->vocab_size;
    int n;
    int32_t *ids = every_third_ids(V, &n);
    CHECK(tdm_model_set_draft_vocab(mv, ids, n, &err) == TDM_OK &&
              tdm_model_set_draft_vocab(rv, ids, n, &err) == TDM_OK,
          "%s: %s", name, err.msg);
    /* The same backend without sample_to: chains by verify calls drawing
     * on the host, a step's distributions turned on the host. */
    tdm_backend host = *be;
    host.destroy = NULL;
    host.sample_to = NULL;
    tdm_model *mh = fixture_model(name, &host), *mhv = fixture_model(name, &host);
    CHECK(tdm_model_set_draft_vocab(mhv, ids, n, &err) == TDM_OK, "%s: %s", name, err.msg);
    probs_of_check(name, m, r);
    probs_of_check(name, mh, r);
    /* A step's distributions on a model with a draft vocabulary: refused. */
    {
        tdm_seq *q = seq_of(mv, 1);
        const int32_t t = 3;
        const int32_t *tp = &t;
        const int one = 1;
        float *lg = malloc((size_t)V * sizeof(float));
        const tdm_sample_row of = {1.0f, 0.0f, 0, 0, 0.0};
        int32_t drawn;
        const tdm_step_out o = {.logits = lg, .probs_of = &of, .drawn = &drawn};
        CHECK(lg && tdm_seq_verify_out(&q, 1, &tp, &one, &o, &err) == TDM_ERR_INVALID_ARGUMENT &&
                  strstr(err.msg, "draft vocabulary"),
              "%s: distributions of a model with a draft vocabulary: %s", name, err.msg);
        free(lg);
        tdm_seq_destroy(q);
    }
    const int ns = (int)(sizeof(settings) / sizeof(settings[0]));
    for (int a = 0; a < ns; a++) {
        one_call(name, m, r, a, (a + 2) % ns, a);
        one_call(name, mv, rv, a, (a + 3) % ns, a + ns);
        one_call(name, mh, r, a, (a + 1) % ns, a + 2 * ns);
        one_call(name, mhv, rv, a, (a + 4) % ns, a + 3 * ns);
    }
    printf("%s: a verify call's sampled rows kept as distributions (draws, picks, fetches), and "
           "sampled draft chains (%d "
           "settings, a greedy chain beside, with and without a draft vocabulary of %d, with "
           "and without the backend's sample_to): the host's drafts, from distributions %s the "
           "host's\n",
           name, ns, n, strcmp(be->name, "cpu") == 0 ? "equal to" : "within 1e-6 of");
    free(ids);
    tdm_model_destroy(m);
    tdm_model_destroy(r);
    tdm_model_destroy(mv);
    tdm_model_destroy(rv);
    tdm_model_destroy(mh);
    tdm_model_destroy(mhv);
}
