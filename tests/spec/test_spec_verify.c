/*
 * Speculative verification is lossless: sequences produced by drafting from
 * q and verifying against p are distributed exactly as sequences sampled
 * from p alone. Checked with a chi-square test on an enumerable Markov
 * "model" (vocabulary 5, sequences of 3 tokens: 125 cells), for several
 * sampling settings and draft lengths. A deliberately broken verifier must
 * fail the same test, so the test can fail.
 */
#include "adaptive.h"
#include "ngram.h"
#include "sampling.h"
#include "verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V 5
#define L 3
#define CELLS (V * V * V)

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

/* Markov tables of logits: next-token logits given the previous token. */
static float target_logits[V][V];
static float draft_logits[V][V];

static void make_tables(tdm_rng *rng)
{
    for (int a = 0; a < V; a++)
        for (int b = 0; b < V; b++) {
            target_logits[a][b] = (float)(3.0 * tdm_rng_uniform(rng) - 1.5);
            draft_logits[a][b] = (float)(3.0 * tdm_rng_uniform(rng) - 1.5);
        }
}

/* Exact probability of each 3-token sequence under the target's sampling. */
static void exact_probs(const tdm_sampling *s, int start, double *out)
{
    float p[3][V];
    int order[V];
    (void)p;
    for (int c = 0; c < CELLS; c++) {
        int t[L] = {c / (V * V), (c / V) % V, c % V};
        double prob = 1.0;
        int prev = start;
        for (int i = 0; i < L; i++) {
            float pr[V];
            tdm_sampling_probs(s, target_logits[prev], V, pr, order);
            prob *= pr[t[i]];
            prev = t[i];
        }
        out[c] = prob;
    }
}

typedef enum { VERIFY_CORRECT, VERIFY_ALWAYS_ACCEPT, VERIFY_NO_RESIDUAL } verify_mode;

/* Generates L tokens speculatively; returns the cell index. */
static int generate(const tdm_sampling *ts, const tdm_sampling *ds, int k, int start, tdm_rng *rng,
                    verify_mode mode, void *scratch)
{
    int out[L + 16];
    int n = 0;
    int prev = start;
    /* The target's draws are keyed by seed and position: a seed per run. */
    const uint64_t seed = tdm_rng_next(rng);
    if (k < 0 || k > 8) /* the arrays below hold blocks of up to 8 drafts */
        return -1;
    while (n < L) {
        uint32_t drafts[8];
        float qrows[8][V];
        uint32_t ids[8][V];
        tdm_draft_dist dists[8];
        int order[V];
        int p = prev;
        for (int i = 0; i < k; i++) {
            tdm_sampling_probs(ds, draft_logits[p], V, qrows[i], order);
            int x = tdm_sampling_draw(qrows[i], V, tdm_rng_uniform(rng));
            drafts[i] = (uint32_t)x;
            for (int j = 0; j < V; j++)
                ids[i][j] = (uint32_t)j;
            dists[i].n = V;
            dists[i].ids = ids[i];
            dists[i].probs = qrows[i];
            p = x;
        }
        float logits[9][V];
        p = prev;
        for (int i = 0; i <= k; i++) {
            memcpy(logits[i], target_logits[p], sizeof(logits[i]));
            if (i < k)
                p = (int)drafts[i];
        }
        tdm_verdict v;
        if (mode == VERIFY_ALWAYS_ACCEPT) {
            v.accepted = k;
            v.next_token =
                tdm_verify_sample_one(ts, seed, (uint32_t)(n + k), logits[k], V, scratch);
        } else {
            int rc = tdm_verify_block(ts, seed, (uint32_t)n, &logits[0][0], V, drafts, k, dists,
                                      scratch, &v);
            if (rc != 0)
                return -1;
            /* The verdict in parts, from the rows' distributions (a step's
             * probs_of: the drafts' probabilities, the last row's draw, the
             * first rejected row's residual), is the same, and so is a
             * plain row's draw. */
            float prows[9][V], px[8];
            for (int i = 0; i <= k; i++)
                tdm_sampling_probs(ts, logits[i], V, prows[i], order);
            for (int i = 0; i < k; i++)
                px[i] = prows[i][drafts[i]];
            tdm_verdict vp = {tdm_verify_accepted(seed, (uint32_t)n, px, drafts, k, dists), -1};
            vp.next_token =
                vp.accepted < k
                    ? tdm_verify_residual(seed, (uint32_t)(n + vp.accepted), prows[vp.accepted], V,
                                          drafts[vp.accepted], &dists[vp.accepted], scratch)
                    : tdm_sampling_draw(prows[k], V,
                                        tdm_verify_bonus_uniform(seed, (uint32_t)(n + k)));
            CHECK(vp.accepted == v.accepted && vp.next_token == v.next_token,
                  "verdict in parts (%d, %d) against from logits (%d, %d)", vp.accepted,
                  vp.next_token, v.accepted, v.next_token);
            CHECK(tdm_sampling_draw(prows[0], V, tdm_verify_bonus_uniform(seed, (uint32_t)n)) ==
                      tdm_verify_sample_one(ts, seed, (uint32_t)n, logits[0], V, scratch),
                  "a plain row's draw from its distribution");
            if (mode == VERIFY_NO_RESIDUAL && v.accepted < k) {
                /* Wrong: correction drawn from p instead of max(0, p - q). */
                v.next_token = tdm_verify_sample_one(ts, seed, (uint32_t)(n + v.accepted),
                                                     logits[v.accepted], V, scratch);
            }
        }
        for (int i = 0; i < v.accepted; i++)
            out[n++] = (int)drafts[i];
        out[n++] = v.next_token;
        prev = v.next_token;
    }
    return out[0] * V * V + out[1] * V + out[2];
}

/* Chi-square statistic over cells with expected count >= 5 (others pooled). */
static double chi_square(const long *counts, const double *probs, long total, int *df)
{
    double stat = 0.0, pool_e = 0.0, pool_o = 0.0;
    int cells = 0;
    for (int c = 0; c < CELLS; c++) {
        double e = probs[c] * (double)total;
        if (e < 5.0) {
            pool_e += e;
            pool_o += (double)counts[c];
            continue;
        }
        stat += (counts[c] - e) * (counts[c] - e) / e;
        cells++;
    }
    if (pool_e >= 5.0) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    } else if (pool_o > 0 && pool_e == 0.0) {
        stat = INFINITY; /* produced a sequence of probability zero */
    }
    *df = cells - 1;
    return stat;
}

/* Upper critical value of chi-square at p = 0.001 (Wilson–Hilferty). */
static double chi_critical(int df)
{
    double z = 3.090; /* one-sided 0.001 */
    double h = 2.0 / (9.0 * df);
    return df * pow(1.0 - h + z * sqrt(h), 3.0);
}

static double run_case(const tdm_sampling *ts, const tdm_sampling *ds, int k, verify_mode mode,
                       uint64_t seed, int *df_out)
{
    static long counts[CELLS];
    double probs[CELLS];
    memset(counts, 0, sizeof(counts));
    exact_probs(ts, 0, probs);
    tdm_rng rng;
    tdm_rng_seed(&rng, seed);
    void *scratch = malloc(tdm_verify_scratch_bytes(V));
    const long N = 60000;
    for (long i = 0; i < N; i++) {
        int c = generate(ts, ds, k, 0, &rng, mode, scratch);
        if (c < 0) {
            free(scratch);
            return INFINITY;
        }
        counts[c]++;
    }
    free(scratch);
    return chi_square(counts, probs, N, df_out);
}

static void test_lossless(void)
{
    tdm_rng rng;
    tdm_rng_seed(&rng, 12345);
    make_tables(&rng);
    struct {
        tdm_sampling t, d;
        int k;
    } cases[] = {
        {{1.0f, 0.0f, 0}, {1.0f, 0.0f, 0}, 1},
        {{1.0f, 0.0f, 0}, {1.0f, 0.0f, 0}, 4},
        {{0.7f, 0.0f, 0}, {1.3f, 0.0f, 0}, 3},
        {{1.0f, 0.8f, 0}, {1.0f, 0.0f, 0}, 2}, /* target top-p */
        {{1.0f, 0.0f, 3}, {0.5f, 0.9f, 0}, 4}, /* target top-k, sparse draft */
        {{1.0f, 0.0f, 0}, {0.0f, 0.0f, 0}, 3}, /* greedy (one-hot) drafter */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int df = 0;
        double stat = run_case(&cases[i].t, &cases[i].d, cases[i].k, VERIFY_CORRECT, 777 + i, &df);
        double crit = chi_critical(df);
        printf("case %zu: k=%d chi2=%.1f df=%d critical(0.001)=%.1f\n", i, cases[i].k, stat, df,
               crit);
        CHECK(stat < crit,
              "case %zu: speculative output distribution differs from target "
              "(chi2 %.1f >= %.1f)",
              i, stat, crit);
    }
    /* The same test catches broken verifiers. */
    int df = 0;
    double stat = run_case(&cases[2].t, &cases[2].d, 3, VERIFY_ALWAYS_ACCEPT, 99, &df);
    printf("broken (always accept): chi2=%.1f critical=%.1f\n", stat, chi_critical(df));
    CHECK(stat > chi_critical(df), "an always-accepting verifier passed the chi-square test");
    stat = run_case(&cases[2].t, &cases[2].d, 3, VERIFY_NO_RESIDUAL, 98, &df);
    printf("broken (no residual): chi2=%.1f critical=%.1f\n", stat, chi_critical(df));
    CHECK(stat > chi_critical(df), "a verifier without residual sampling passed the test");
}

static void test_greedy(void)
{
    enum { VG = 7 };
    float logits[4][VG];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < VG; j++)
            logits[i][j] = (float)((i * 3 + j * 5) % VG);
    /* argmax of row i: the j with (3i + 5j) % 7 == 6 */
    int am[4];
    for (int i = 0; i < 4; i++)
        am[i] = tdm_sampling_argmax(logits[i], VG);
    void *scratch = malloc(tdm_verify_scratch_bytes(VG));
    tdm_sampling greedy = {0};
    tdm_verdict v;
    uint32_t d[3] = {(uint32_t)am[0], (uint32_t)am[1], (uint32_t)((am[2] + 1) % VG)};
    CHECK(tdm_verify_block(&greedy, 0, 0, &logits[0][0], VG, d, 3, NULL, scratch, &v) == 0, "rc");
    CHECK(v.accepted == 2 && v.next_token == am[2], "greedy partial: got %d/%d", v.accepted,
          v.next_token);
    d[2] = (uint32_t)am[2];
    tdm_verify_block(&greedy, 0, 0, &logits[0][0], VG, d, 3, NULL, scratch, &v);
    CHECK(v.accepted == 3 && v.next_token == am[3], "greedy full: got %d/%d", v.accepted,
          v.next_token);
    d[0] = VG + 3;
    CHECK(tdm_verify_block(&greedy, 0, 0, &logits[0][0], VG, d, 3, NULL, scratch, &v) == -1,
          "out-of-vocabulary draft accepted");
    CHECK(tdm_verify_block_argmax(am, VG, d, 3, NULL, &v) == -1,
          "out-of-vocabulary draft accepted from argmax ids");
    /* From argmax ids: the verdict the logits give, for every block of up to
     * three drafts over this vocabulary's first tokens and the argmaxes. */
    int32_t ids[4];
    for (int i = 0; i < 4; i++)
        ids[i] = am[i];
    for (int k = 0; k <= 3; k++)
        for (int code = 0; code < 27; code++) {
            uint32_t dr[3];
            for (int i = 0, c = code; i < 3; i++, c /= 3)
                dr[i] = c % 3 == 2 ? (uint32_t)am[i] : (uint32_t)(c % 3);
            tdm_verdict a, b;
            CHECK(tdm_verify_block(&greedy, 0, 0, &logits[0][0], VG, dr, k, NULL, scratch, &a) == 0,
                  "rc");
            CHECK(tdm_verify_block_argmax(ids, VG, dr, k, NULL, &b) == 0, "rc from argmax ids");
            CHECK(a.accepted == b.accepted && a.next_token == b.next_token,
                  "k=%d block %d: logits give %d/%d, argmax ids %d/%d", k, code, a.accepted,
                  a.next_token, b.accepted, b.next_token);
        }
    free(scratch);
}

static void test_ngram(void)
{
    uint32_t ctx[] = {1, 2, 3, 4, 5, 9, 9, 1, 2, 3};
    uint32_t out[8];
    int n = tdm_ngram_propose(ctx, 10, 1, 3, 4, out);
    CHECK(n == 4 && out[0] == 4 && out[1] == 5 && out[2] == 9 && out[3] == 9,
          "ngram proposal: n=%d", n);
    uint32_t none[] = {1, 2, 3, 4};
    CHECK(tdm_ngram_propose(none, 4, 1, 3, 4, out) == 0, "ngram proposed without a match");
}

/* A uniform draw in [0, 1) from the xorshift state *y. */
static double u01(uint64_t *y)
{
    *y ^= *y << 13;
    *y ^= *y >> 7;
    *y ^= *y << 17;
    return (double)(*y >> 11) / 9007199254740992.0;
}

/* The rule's parameters as the verifier sets them (vsched.c: a gain of 5 %
 * asked for, pauses of 32 tokens, four rounds before a switch-off), a first
 * block of at most 4; the limit, the priors and the tokens each test's own. */
static tdm_adaptive_params serving(int k_max, double cost, double fixed, int tokens_left)
{
    return (tdm_adaptive_params){.k_max = k_max,
                                 .k_initial = 4,
                                 .min_gain = 0.05,
                                 .pause_tokens = 32,
                                 .min_rounds = 4,
                                 .cost_prior = cost,
                                 .fixed_prior = fixed,
                                 .tokens_left = tokens_left};
}

/* Drafts accepted of a block of k up to the first rejected one: the first
 * with probability a, each later one with probability later. */
static int accepted_by_position(uint64_t *y, int k, double a, double later)
{
    int n = 0;
    while (n < k && u01(y) < (n == 0 ? a : later))
        n++;
    return n;
}

/* ... each with probability a. */
static int accepted_of(uint64_t *y, int k, double a)
{
    return accepted_by_position(y, k, a, a);
}

/* One request of `tokens` tokens under the adaptive rule, a block's first
 * draft accepted with probability `acc` and each later one with acc_later,
 * at a draft cost c and a round cost f (both in plain steps, as the rule
 * measures them), and p->open_cost plain steps each time the drafter opens
 * the sequence (its start and every probe): its time in plain steps. mem:
 * the drafter's acceptance on earlier requests, kept as the verifier keeps
 * it (the request's priors; its rounds noted). */
static double adaptive_request_cost(const tdm_adaptive_params *p, int tokens, double acc,
                                    double acc_later, double c, double f, uint64_t *y,
                                    tdm_accept_memory *mem)
{
    tdm_adaptive s;
    tdm_adaptive_params pp = *p;
    pp.accept_prior = tdm_accept_memory_prior(mem, false);
    pp.accept_positions = mem->pos;
    tdm_adaptive_init(&s, &pp);
    if (s.k_next == 0)
        tdm_accept_memory_prior(mem, true);
    double cost = 0;
    bool open = false;
    for (int n = 0; n < tokens;) {
        if (s.k_next == 0) {
            tdm_adaptive_on_plain_token(&s);
            cost += 1;
            n++;
            open = false;
            continue;
        }
        if (!open && p->open_cost > 0)
            cost += p->open_cost;
        open = true;
        const int got = accepted_by_position(y, s.k_next, acc, acc_later);
        cost += 1 + f + c * s.k_next;
        n += got + 1;
        tdm_accept_memory_note(mem, s.k_next, got);
        tdm_adaptive_on_round(&s, s.k_next, got, c, f);
    }
    return cost / tokens;
}

/* The rule never loses more than 3 % against plain decoding: drafts that
 * are never accepted (a drafter with random weights, or one that does not
 * fit the text), at the costs measured on one H200 for the MTP head (c
 * 0.16, f 0.07) and the 0.8B drafter (c 0.38, f 0.07), and where drafts
 * cost more than they can win even at the prior acceptance (a batch of
 * 32: c 0.6, f 0.4), in requests of 128 and 512 tokens, starting from those
 * costs as priors (as the verifier passes them on from earlier requests);
 * each open on the drafter (the start and every probe) costs as many
 * plain steps as the third number (its prefill of the sequence's tokens,
 * measured on the H200 for the 0.8B drafter: about 5 rounds). 50 requests
 * one after another, the drafter's acceptance remembered between them. */
static void test_adaptive_never_loses(void)
{
    static const double costs[][3] = {
        {0.16, 0.07, 0}, {0.38, 0.07, 0}, {0.05, 0.02, 0}, {0.38, 0.07, 5}, {0.6, 0.4, 10}};
    uint64_t y = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < sizeof(costs) / sizeof(costs[0]); i++)
        for (int tokens = 128; tokens <= 512; tokens *= 4) {
            tdm_adaptive_params p = serving(8, costs[i][0], costs[i][1], tokens);
            p.open_cost = costs[i][2];
            double sum = 0;
            tdm_accept_memory mem = {0};
            for (int r = 0; r < 50; r++)
                sum +=
                    adaptive_request_cost(&p, tokens, 0.0, 0.0, costs[i][0], costs[i][1], &y, &mem);
            const double rel = sum / 50;
            printf("adaptive, acceptance 0, c %.2f f %.2f open %.0f, %d tokens: %.3f x plain's "
                   "time\n",
                   costs[i][0], costs[i][1], costs[i][2], tokens, rel);
            CHECK(rel <= 1.03,
                  "acceptance 0, c %.2f f %.2f open %.0f, %d tokens: %.3f x plain's time",
                  costs[i][0], costs[i][1], costs[i][2], tokens, rel);
        }
}

/* The drafter's acceptance remembered across requests does not shut a
 * drafter out for good: after 30 requests whose drafts are never accepted
 * (later ones start paused), drafts accepted with probability 0.8 again
 * bring speculation back within 20 requests, and the 20 after those run at
 * least 1.1x plain (c 0.38, f 0.07, open 5). */
static void test_adaptive_memory_recovers(void)
{
    tdm_adaptive_params p = serving(8, 0.38, 0.07, 128);
    p.open_cost = 5;
    uint64_t y = 0x51ed270b27c3a5f1ull;
    tdm_accept_memory mem = {0};
    double lost = 0;
    for (int r = 0; r < 30; r++)
        lost += adaptive_request_cost(&p, 128, 0.0, 0.0, 0.38, 0.07, &y, &mem);
    lost /= 30;
    for (int r = 0; r < 20; r++)
        adaptive_request_cost(&p, 128, 0.8, 0.8, 0.38, 0.07, &y, &mem);
    double sum = 0;
    for (int r = 0; r < 20; r++)
        sum += adaptive_request_cost(&p, 128, 0.8, 0.8, 0.38, 0.07, &y, &mem);
    const double speed = 20 / sum;
    printf("adaptive memory: 30 requests at acceptance 0 %.3f x plain's time; acceptance read "
           "%.2f after 20 more at 0.8; the 20 after those %.3f x plain\n",
           lost, tdm_accept_memory_prior(&mem, false), speed);
    CHECK(lost <= 1.03, "acceptance 0: %.3f x plain's time", lost);
    CHECK(tdm_accept_memory_prior(&mem, false) <= 0.7,
          "a remembered acceptance above the prior: %.2f", tdm_accept_memory_prior(&mem, false));
    CHECK(speed >= 1.1, "after the drafter is right again: %.3f x plain", speed);
}

/* Acceptance by position. Drafts accepted at 0.8 for a block's first and
 * 0.95 for each later one (a real drafter's rise along the block), blocks
 * of four: the positions read 0.8 and 0.95 (within 0.03 over 3,000
 * rounds), where the pooled rate reads about 0.9 for all of them. A
 * position read low and then never run fades back to the pooled rate: a
 * drafter remembered at 0.3 for its second draft (observed for sure) and
 * drafting 0.8 each, at c 0.38 and f 0.07, runs blocks of two or more in
 * its fifth request at the latest, and its requests from the fifth on run
 * at least 1.3x plain (1.37x; without the fade they kept blocks of one for
 * good: 1.25x). */
static void test_accept_positions(void)
{
    tdm_adaptive_params p = serving(4, 0.1, 0.1, 0);
    p.fixed = true;
    tdm_adaptive a;
    tdm_adaptive_init(&a, &p);
    uint64_t y = 0x2545f4914f6cdd1dull;
    double sum[4] = {0}, pooled = 0;
    for (int i = 0; i < 4000; i++) {
        tdm_adaptive_on_round(&a, 4, accepted_by_position(&y, 4, 0.8, 0.95), 0.1, 0.1);
        if (i < 1000)
            continue;
        for (int j = 0; j < 4; j++)
            sum[j] += tdm_accept_positions_rate(&a.pos, j, a.accept_rate);
        pooled += a.accept_rate;
    }
    printf("acceptance by position (0.8, then 0.95): %.3f %.3f %.3f %.3f, pooled %.3f\n",
           sum[0] / 3000, sum[1] / 3000, sum[2] / 3000, sum[3] / 3000, pooled / 3000);
    CHECK(fabs(sum[0] / 3000 - 0.8) < 0.03, "position 0 reads %.3f for 0.8", sum[0] / 3000);
    for (int j = 1; j < 4; j++)
        CHECK(fabs(sum[j] / 3000 - 0.95) < 0.03, "position %d reads %.3f for 0.95", j,
              sum[j] / 3000);
    /* a position read low, never run again */
    tdm_adaptive_params q = serving(8, 0.38, 0.07, 128);
    tdm_accept_memory mem = {0};
    for (int i = 0; i < 40; i++)
        tdm_accept_memory_note(&mem, 2, 1); /* first accepted, second rejected */
    for (int i = 0; i < 40; i++)
        tdm_accept_memory_note(&mem, 1, 1);
    mem.pos.hit[1] = 0.3;
    mem.pos.weight[1] = 1.0;
    int first_long = -1;
    double steps = 0;
    for (int r = 0; r < 20; r++) {
        tdm_adaptive_params pr = q;
        pr.accept_prior = tdm_accept_memory_prior(&mem, false);
        pr.accept_positions = mem.pos;
        tdm_adaptive s;
        tdm_adaptive_init(&s, &pr);
        double cost = 0;
        for (int n = 0; n < 128;) {
            if (s.k_next == 0) {
                tdm_adaptive_on_plain_token(&s);
                cost += 1;
                n++;
                continue;
            }
            if (s.k_next >= 2 && first_long < 0)
                first_long = r;
            const int got = accepted_of(&y, s.k_next, 0.8);
            cost += 1 + 0.07 + 0.38 * s.k_next;
            n += got + 1;
            tdm_accept_memory_note(&mem, s.k_next, got);
            tdm_adaptive_on_round(&s, s.k_next, got, 0.38, 0.07);
        }
        if (r >= 4)
            steps += cost;
    }
    const double speed = 16 * 128 / steps;
    printf("a second position remembered at 0.3: blocks of two or more from request %d; "
           "requests 5-20 %.3f x plain\n",
           first_long, speed);
    CHECK(first_long >= 0 && first_long <= 4, "blocks of two or more from request %d", first_long);
    CHECK(speed >= 1.3, "requests 5-20 at %.3f x plain", speed);
}

/* Where nothing measured the costs yet (the first requests of a verifier:
 * no cost or fixed prior) and a draft costs more than a plain step
 * (measured on the 2-core CPU at eight streams: c 1.44, f 1.61), a drafter
 * whose drafts are accepted at 0.8 speculates two rounds, the first at the
 * block the rule's guess (c 0.1, f 0) favours: its first measurements
 * replace the guess instead of moving it by EMA steps, and costs that lose
 * even at full acceptance switch it off after two rounds. A 128-token
 * request then takes at most 1.06x plain's time (1.106x when the
 * measurements moved the guess by EMA steps and only min_rounds losing
 * rounds paused it); the requests after it start paused (their priors
 * measured). A single slow first round (c 2.4, then 0.38) does not pause a
 * drafter that pays. */
static void test_adaptive_unmeasured_costs(void)
{
    tdm_adaptive_params p = serving(4, -1, -1, 128);
    uint64_t y = 0x9e3779b97f4a7c15ull;
    double sum = 0;
    for (int r = 0; r < 50; r++) {
        tdm_accept_memory mem = {0}; /* every request the first of its verifier */
        sum += adaptive_request_cost(&p, 128, 0.8, 0.8, 1.44, 1.61, &y, &mem);
    }
    printf("adaptive, costs unmeasured, c 1.44 f 1.61 at acceptance 0.8: %.3f x plain's time\n",
           sum / 50);
    CHECK(sum / 50 <= 1.06, "costs unmeasured, c 1.44 f 1.61: %.3f x plain's time", sum / 50);
    tdm_adaptive a;
    tdm_adaptive_init(&a, &p);
    CHECK(a.k_next == 4, "no costs known: the first block is k_initial, got %d", a.k_next);
    tdm_adaptive_on_round(&a, 4, 3, 1.44, 1.61);
    CHECK(a.cost == 1.44 && a.fixed == 1.61 && a.k_next > 0 && a.pauses == 0,
          "the first measurement replaces the guess: c %.2f f %.2f, k %d", a.cost, a.fixed,
          a.k_next);
    tdm_adaptive_on_round(&a, a.k_next, 1, 1.44, 1.61);
    CHECK(a.k_next == 0 && a.pauses == 1 && a.pause_why &&
              !strcmp(a.pause_why, "costs lose even with every draft accepted") &&
              a.pause_at[1] == 1.44 && a.pause_at[2] == 1.61,
          "costs that lose at full acceptance, twice: k %d, why %s (c %.2f f %.2f)", a.k_next,
          a.pause_why ? a.pause_why : "-", a.pause_at[1], a.pause_at[2]);
    tdm_adaptive_init(&a, &p);
    tdm_adaptive_on_round(&a, 4, 3, 2.4, 0.1);
    for (int i = 0; i < 12; i++)
        tdm_adaptive_on_round(&a, a.k_next, a.k_next > 2 ? 3 : a.k_next, 0.38, 0.1);
    CHECK(a.k_next > 0 && a.pauses == 0 && a.cost < 0.5,
          "one slow first round paused a drafter that pays: k %d, pauses %d, c %.2f", a.k_next,
          a.pauses, a.cost);
}

/* What an open costs: unknown until three opens were seen, then their
 * median, so one slow open (a cold drafter's first prompt, 69 ms where opens
 * take about 1) neither starts the requests after it paused nor stays the
 * estimate; the rule then opens a request its tokens repay. */
static void test_open_cost(void)
{
    tdm_open_cost c = {0};
    CHECK(tdm_open_cost_ms(&c) < 0, "no open seen: %.2f", tdm_open_cost_ms(&c));
    tdm_open_cost_note(&c, 69.0);
    tdm_open_cost_note(&c, NAN);
    tdm_open_cost_note(&c, -1.0);
    tdm_open_cost_note(&c, 1.2);
    CHECK(tdm_open_cost_ms(&c) < 0, "two opens (and two waits not taken): %.2f",
          tdm_open_cost_ms(&c));
    tdm_open_cost_note(&c, 0.9);
    CHECK(tdm_open_cost_ms(&c) == 1.2, "69, 1.2 and 0.9 ms: median %.2f", tdm_open_cost_ms(&c));
    tdm_open_cost_note(&c, 1.1);
    tdm_open_cost_note(&c, 70.0);
    CHECK(tdm_open_cost_ms(&c) == 1.1, "0.9, 1.1 and 70 ms: median %.2f", tdm_open_cost_ms(&c));
    /* a 128-token request at a plain round of 0.2 ms, drafts that pay */
    tdm_adaptive_params p = serving(4, 0.3, 0.1, 128);
    tdm_adaptive a;
    p.open_cost = tdm_open_cost_ms(&c) / 0.2;
    tdm_adaptive_init(&a, &p);
    CHECK(a.k_next > 0, "opens of 1.1 ms: the request opens, k %d (%s)", a.k_next,
          a.pause_why ? a.pause_why : "-");
    p.open_cost = 69.0 / 0.2;
    tdm_adaptive_init(&a, &p);
    CHECK(
        a.k_next == 0 && a.pause_why && !strcmp(a.pause_why, "its tokens would not repay the open"),
        "an open of 69 ms starts it paused: k %d (%s)", a.k_next, a.pause_why ? a.pause_why : "-");
}

/* A cost in ms is judged in plain steps of the batch a request joins: the
 * demo pair on one H100, plain rounds of 0.197 ms at one sequence and 0.56
 * at 32, a draft measured at 0.06 ms a sequence. At one sequence it is 0.3
 * of a step (speculation pays), at 32 it is 3.4 (it loses, and a request of
 * a burst of 32 starts paused instead of opening on the drafter). */
static void test_cost_at_batch(void)
{
    tdm_steptime m = {0};
    CHECK(tdm_steptime_cost_at(&m, 0.06, 1) < 0, "no round known: %.2f",
          tdm_steptime_cost_at(&m, 0.06, 1));
    for (int i = 0; i < 4; i++) {
        tdm_steptime_tick(&m);
        tdm_steptime_add_plain(&m, 1, 0.197);
        tdm_steptime_add_plain(&m, 32, 0.56);
        tdm_steptime_add(&m, 1, 0.197);
        tdm_steptime_add(&m, 32, 0.56);
    }
    const double c1 = tdm_steptime_cost_at(&m, 0.06, 1), c32 = tdm_steptime_cost_at(&m, 0.06, 32);
    CHECK(fabs(c1 - 0.06 / 0.197) < 1e-9 && fabs(c32 - 0.06 / (0.56 / 32)) < 1e-9,
          "a 0.06 ms draft: %.3f of a step at 1, %.3f at 32", c1, c32);
    CHECK(tdm_steptime_cost_at(&m, -1.0, 32) < 0, "no cost measured: unknown");
    tdm_adaptive_params p = serving(4, 0, 0.1, 128);
    tdm_adaptive a;
    p.cost_prior = c1;
    tdm_adaptive_init(&a, &p);
    CHECK(a.k_next > 0, "at one sequence it opens: k %d", a.k_next);
    p.cost_prior = c32;
    tdm_adaptive_init(&a, &p);
    CHECK(a.k_next == 0, "at 32 it starts paused: k %d", a.k_next);
}

/* The plain round a speculative round is judged against: measured where a
 * round of that batch size ran plainly within TDM_STEPTIME_PLAIN_FRESH
 * rounds, else the line fitted to every step. Shaped as the 2-core CPU at
 * eight streams: speculative rounds of 36 and 40 rows took 13 and 14 ms,
 * whose line puts a plain 8-row round at 6 ms where it takes 3. At a = 0.8
 * and block 4 speculation then loses (3.36 tokens in 14 ms against 3 ms a
 * token plainly): judged against the line the rule goes on (S(4) 1.4),
 * against the measured round it pauses. */
static void test_steptime_plain(void)
{
    tdm_steptime m = {0};
    double t = 0, f, c;
    CHECK(!tdm_steptime_plain(&m, 8, &t) && tdm_steptime_wants_plain(&m, 8),
          "nothing measured: no plain round, one wanted");
    for (int i = 0; i < 20; i++) {
        tdm_steptime_add(&m, i % 2 ? 36 : 40, i % 2 ? 13.0 : 14.0);
        tdm_steptime_tick(&m);
    }
    CHECK(tdm_steptime_plain(&m, 8, &t) && fabs(t - 6.0) < 1e-6,
          "the line's plain 8-row round: %.3f", t);
    tdm_steptime_round_cost(&m, 8, 8, 32, 14.0, 0.0, &f, &c);
    tdm_adaptive_params p = serving(4, 0, 0, 0);
    tdm_adaptive line, measured;
    tdm_adaptive_init(&line, &p);
    tdm_adaptive_init(&measured, &p);
    uint64_t y = 0x2545f4914f6cdd1dull;
    for (int r = 0; r < 8 && line.k_next > 0; r++) {
        tdm_adaptive_on_round(&line, line.k_next, accepted_of(&y, line.k_next, 0.8), c, f);
    }
    CHECK(line.k_next > 0 && line.pauses == 0,
          "judged against the line (c %.2f) the rule should go on: k %d, %d pauses", c, line.k_next,
          line.pauses);
    tdm_steptime_add_plain(&m, 8, 3.0);
    CHECK(!tdm_steptime_wants_plain(&m, 8) && tdm_steptime_wants_plain(&m, 7),
          "measured at 8 sequences: wanted %d at 8, %d at 7", tdm_steptime_wants_plain(&m, 8),
          tdm_steptime_wants_plain(&m, 7));
    CHECK(tdm_steptime_plain(&m, 8, &t) && t == 3.0, "the measured plain round: %.3f", t);
    tdm_steptime_round_cost(&m, 8, 8, 32, 14.0, 0.0, &f, &c);
    CHECK(fabs(c - 11.0 / (32 * 0.375)) < 1e-9, "a draft against the measured round: %.3f", c);
    for (int r = 0; r < 8 && measured.k_next > 0; r++) {
        tdm_adaptive_on_round(&measured, measured.k_next, accepted_of(&y, measured.k_next, 0.8), c,
                              f);
    }
    CHECK(measured.k_next == 0 && measured.pauses == 1 && measured.pause_why &&
              !strcmp(measured.pause_why, "expected to lose"),
          "judged against the measured round (c %.2f) the rule should pause: k %d (%s)", c,
          measured.k_next, measured.pause_why ? measured.pause_why : "-");
    /* A later measurement moves it; an old one stands no more and the next
     * replaces it; sizes beyond the table are the line's. */
    tdm_steptime_add_plain(&m, 8, 4.0);
    CHECK(tdm_steptime_plain(&m, 8, &t) && t > 3.0 && t < 4.0, "moved to %.3f", t);
    for (unsigned i = 0; i < TDM_STEPTIME_PLAIN_FRESH; i++)
        tdm_steptime_tick(&m);
    CHECK(tdm_steptime_wants_plain(&m, 8) && tdm_steptime_plain(&m, 8, &t) && fabs(t - 6.0) < 1e-6,
          "a stale plain round: wanted again, the line's %.3f stands", t);
    tdm_steptime_add_plain(&m, 8, 2.5);
    CHECK(tdm_steptime_plain(&m, 8, &t) && t == 2.5, "a stale round replaced: %.3f", t);
    tdm_steptime_add_plain(&m, TDM_STEPTIME_PLAIN_MAX + 1, 1.0);
    CHECK(!tdm_steptime_wants_plain(&m, TDM_STEPTIME_PLAIN_MAX + 1) &&
              tdm_steptime_plain(&m, TDM_STEPTIME_PLAIN_MAX + 1, &t) && t > 60,
          "beyond the table: the line's %.3f", t);
}

/* A long run of rounds of one row count (fixed blocks of 8 at one
 * sequence: 9-row verify steps of 4.28 ms, as on one H100 with the 4B
 * shape) leaves no line through the steps. The plain round of one sequence
 * measured before them (3.7 ms) must still stand, stale as it is: time
 * proportional to rows puts it at 0.48 ms, and a draft that costs 0.3 plain
 * steps then reads as 3.2, which starts the next adaptive requests paused. */
static void test_steptime_one_row_count(void)
{
    tdm_steptime m = {0};
    double t = 0, f, c;
    tdm_steptime_add_plain(&m, 1, 3.7);
    for (int i = 0; i < 100; i++) {
        tdm_steptime_add(&m, 1, 3.7);
        tdm_steptime_tick(&m);
    }
    for (unsigned i = 0; i < 2 * TDM_STEPTIME_PLAIN_FRESH; i++) {
        tdm_steptime_add(&m, 9, 4.28);
        tdm_steptime_tick(&m);
    }
    CHECK(tdm_steptime_wants_plain(&m, 1), "the plain round of one sequence is stale");
    CHECK(tdm_steptime_plain(&m, 1, &t) && t == 3.7,
          "one row count: the stale measured round, %.3f", t);
    CHECK(tdm_steptime_round_cost(&m, 1, 1, 8, 8.28 + 4.28, 0.0, &f, &c) &&
              fabs(c - (12.56 - 3.7) / (8 * 3.7)) < 1e-9,
          "a draft of the run: %.3f plain steps", c);
    /* never measured plainly: rows in proportion, as before */
    CHECK(tdm_steptime_plain(&m, 2, &t) && fabs(t - 2 * 4.28 / 9) < 1e-6,
          "one row count, nothing measured at 2: %.3f", t);
}

static void test_adaptive(void)
{
    tdm_adaptive_params p = {
        .k_max = 8, .k_initial = 4, .min_gain = 0.05, .pause_tokens = 10, .min_rounds = 4};
    tdm_adaptive a;
    /* The first block is the one the priors favour: at a = 0.7 and a draft
     * costing 0.3 of a plain step, S(1..4) = 1.31, 1.37, 1.33, 1.26. */
    tdm_adaptive_params costly = p;
    costly.cost_prior = 0.3;
    tdm_adaptive_init(&a, &costly);
    CHECK(a.k_next == 2, "the priors favour a first block of 2, got %d", a.k_next);
    tdm_adaptive_init(&a, &p);
    CHECK(a.k_next == 4, "at the default cost prior the first block is k_initial, got %d",
          a.k_next);
    /* An open that costs 50 tokens: at S(4) = 1.98 a request with 100
     * tokens to go wins back 49.5 of them and starts paused; one with 200
     * to go speculates. */
    tdm_adaptive_params opens = p;
    opens.open_cost = 50;
    opens.tokens_left = 100;
    tdm_adaptive_init(&a, &opens);
    CHECK(a.k_next == 0 && a.pauses == 1 && a.pause_why &&
              !strcmp(a.pause_why, "its tokens would not repay the open"),
          "an open the request cannot repay: k %d (%s)", a.k_next, a.pause_why ? a.pause_why : "-");
    opens.tokens_left = 200;
    tdm_adaptive_init(&a, &opens);
    CHECK(a.k_next == 4, "an open the request repays: k %d", a.k_next);
    tdm_adaptive_init(&a, &p);
    for (int i = 0; i < 20; i++)
        tdm_adaptive_on_round(&a, a.k_next, a.k_next, 0.05, 0.0);
    CHECK(a.k_next == 8, "full acceptance should draft k_max, got %d", a.k_next);
    for (int i = 0; i < 100 && a.k_next > 0; i++)
        tdm_adaptive_on_round(&a, a.k_next, 0, 0.05, 0.0);
    CHECK(a.k_next == 0 && a.pauses == 1 && a.pause_why && !strcmp(a.pause_why, "expected to lose"),
          "zero acceptance should pause speculation (%s)", a.pause_why ? a.pause_why : "-");
    for (int i = 0; i < 10; i++)
        tdm_adaptive_on_plain_token(&a);
    CHECK(a.k_next == 1 && a.probes == 1 && a.accept_rate == 0.7,
          "a probe from the prior acceptance should follow the pause, k=%d, a=%.2f", a.k_next,
          a.accept_rate);
    /* Where a draft costs half a plain step and a round a tenth, the prior
     * acceptance (0.7) pays: a probe's outcome decides. A rejected probe
     * pauses again, twice as long as the pause before (at least 60 tokens:
     * a probe costs 0.6 plain steps, 1 % of 60); an accepted one restarts. */
    tdm_adaptive_params pc = p;
    pc.cost_prior = 0.5;
    pc.fixed_prior = 0.1;
    tdm_adaptive fails, wins;
    tdm_adaptive_init(&fails, &pc);
    CHECK(fails.k_next > 0, "a = 0.7 at c 0.5, f 0.1 pays: should start speculating");
    for (int i = 0; i < 100 && fails.k_next > 0; i++)
        tdm_adaptive_on_round(&fails, fails.k_next, 0, 0.5, 0.1);
    CHECK(fails.k_next == 0 && fails.paused_left == 60, "paused for %d, not 60", fails.paused_left);
    wins = fails;
    for (int i = 0; i < 60; i++) {
        tdm_adaptive_on_plain_token(&fails);
        tdm_adaptive_on_plain_token(&wins);
    }
    CHECK(fails.k_next == 1 && wins.k_next == 1, "probes after 60 tokens");
    tdm_adaptive_on_round(&fails, 1, 0, 0.5, 0.1);
    CHECK(fails.k_next == 0 && fails.paused_left == 120,
          "a rejected probe should pause for 120, got %d (k %d)", fails.paused_left, fails.k_next);
    for (int i = 0; i < 119; i++)
        tdm_adaptive_on_plain_token(&fails);
    CHECK(fails.k_next == 0, "the doubled pause ended early");
    tdm_adaptive_on_plain_token(&fails);
    CHECK(fails.k_next == 1 && fails.probes == 2, "a second probe should follow the doubled pause");
    tdm_adaptive_on_round(&wins, 1, 1, 0.5, 0.1);
    CHECK(wins.k_next > 0 && wins.pauses == 1, "an accepted probe should restart speculation");
    /* An accepted probe restarts from the block the prior favours, not
     * from k_max (one accepted draft is not every draft accepted). */
    tdm_adaptive_params pq = p;
    pq.cost_prior = 0.4;
    pq.fixed_prior = 0.1;
    tdm_adaptive probe;
    tdm_adaptive_init(&probe, &pq);
    for (int i = 0; i < 100 && probe.k_next > 0; i++)
        tdm_adaptive_on_round(&probe, probe.k_next, 0, 0.4, 0.1);
    for (int i = 0; i < 1000 && probe.k_next == 0; i++)
        tdm_adaptive_on_plain_token(&probe);
    CHECK(probe.k_next == 1, "a probe after the pause");
    tdm_adaptive_on_round(&probe, 1, 1, 0.4, 0.1);
    CHECK(probe.k_next >= 1 && probe.k_next <= 3,
          "an accepted probe should restart at the prior's block (1..3), got %d", probe.k_next);
    /* Drafts accepted with probability 0.8 each, at c 0.46 and f 0.1 (a
     * 0.8B-shaped drafter for a 4B-shaped target on one H200): every block
     * length from 1 to 4 pays 1.13-1.2x, and the rule speculates in at least
     * 85 % of the rounds of 128-token requests (the estimate's noise must
     * not pause it), with the costs as noisy as measured on the GPU: each
     * round's within 10 %, and one round in twenty (a block length the
     * drafter runs for the first time, a step that waited) twice as long.
     * Its time is within 5 % of the best fixed block's. */
    uint64_t y = 0x9e3779b97f4a7c15ull;
    int spec_rounds = 0, all_rounds = 0;
    double steps = 0;
    for (int r = 0; r < 200; r++) {
        tdm_adaptive_params pr = p;
        pr.cost_prior = 0.46;
        pr.fixed_prior = 0.1;
        tdm_adaptive s;
        tdm_adaptive_init(&s, &pr);
        for (int n = 0; n < 128; all_rounds++) {
            if (s.k_next == 0) {
                tdm_adaptive_on_plain_token(&s);
                n++;
                continue;
            }
            const int acc = accepted_of(&y, s.k_next, 0.8);
            spec_rounds++;
            n += acc + 1;
            const double u = u01(&y);
            const double noise = u < 0.05 ? 2.0 : 0.9 + 0.2 * (u - 0.05) / 0.95;
            steps += 1 + (0.1 + 0.46 * s.k_next) * noise;
            tdm_adaptive_on_round(&s, s.k_next, acc, 0.46 * noise, 0.1 * noise);
        }
    }
    const int plain_rounds = all_rounds - spec_rounds;
    steps += plain_rounds;
    /* The best fixed block at these costs (1.05 times them on average):
     * k = 2 or 3, S = 1.18. */
    double best_fixed = 0;
    for (int k = 1; k <= 8; k++) {
        const double e = (1 - pow(0.8, k + 1)) / 0.2, sk = e / (1 + (0.1 + 0.46 * k) * 1.05);
        best_fixed = sk > best_fixed ? sk : best_fixed;
    }
    const double speed = 200.0 * 128 / steps; /* tokens a plain step */
    printf("adaptive, a = 0.8, noisy costs: speculated in %d of %d rounds, %.3f x plain "
           "(best fixed block %.3f x)\n",
           spec_rounds, all_rounds, speed, best_fixed);
    CHECK(spec_rounds >= 0.85 * all_rounds, "a = 0.8: speculated in %d of %d rounds", spec_rounds,
          all_rounds);
    CHECK(speed >= 0.95 * best_fixed, "a = 0.8: %.3f x plain, the best fixed block %.3f x", speed,
          best_fixed);
    /* Expensive drafts pay less: the chosen k shrinks with cost. */
    tdm_adaptive b;
    tdm_adaptive_init(&b, &p);
    for (int i = 0; i < 20; i++)
        tdm_adaptive_on_round(&b, 10, 7, 0.3, 0.0);
    CHECK(b.k_next > 0 && b.k_next < 8, "costly drafts should shorten blocks, got %d", b.k_next);
    /* A fixed cost per round (the exchange) favours longer blocks than the
     * same cost spread over the drafts would, and S(k) counts it once. */
    tdm_adaptive f;
    tdm_adaptive_init(&f, &p);
    for (int i = 0; i < 20; i++)
        tdm_adaptive_on_round(&f, 10, 7, 0.1, 0.4);
    double e3 = 1, run = 1;
    for (int i = 0; i < 3; i++) {
        run *= f.pos.hit[i] + (1 - f.pos.weight[i]) * f.accept_rate;
        e3 += run;
    }
    CHECK(fabs(tdm_adaptive_speedup(&f, 3) - e3 / (1 + f.fixed + 3 * f.cost)) < 1e-9,
          "S(3) = E(3) / (1 + f + 3c), E(3) = 1 + a0 + a0 a1 + a0 a1 a2");
    CHECK(f.k_next >= b.k_next, "a fixed cost should not shorten blocks (%d < %d)", f.k_next,
          b.k_next);
    /* Where a probe costs many plain steps, pauses grow so that probing
     * costs at most 1 % of plain decoding: a probe of cost f + c = 3 steps
     * waits at least 300 tokens. */
    tdm_adaptive e;
    tdm_adaptive_init(&e, &p);
    for (int i = 0; i < 20 && e.k_next > 0; i++)
        tdm_adaptive_on_round(&e, e.k_next, 0, 0.5, 2.5);
    CHECK(e.k_next == 0 && e.paused_left >= (int)ceil((e.fixed + e.cost) / 0.01) - 1 &&
              e.paused_left >= 200,
          "a costly probe should pause >= 100 x its cost (f %.2f c %.2f), paused %d", e.fixed,
          e.cost, e.paused_left);
    /* The acceptance estimate is per drafted token up to the first rejected
     * one: drafts accepted with probability 0.8 each, k = 4 fixed, read
     * 0.8 (accepted/drafted would be 0.59). */
    tdm_adaptive_params fp = p;
    fp.fixed = true;
    tdm_adaptive h;
    tdm_adaptive_init(&h, &fp);
    uint64_t x = 88172645463325252ull;
    double sum = 0;
    for (int i = 0; i < 4000; i++) {
        const int n = accepted_of(&x, 4, 0.8);
        tdm_adaptive_on_round(&h, 4, n, 0.1, 0.0);
        if (i >= 1000)
            sum += h.accept_rate;
    }
    CHECK(fabs(sum / 3000 - 0.8) < 0.03, "acceptance estimate %.3f for a true 0.8", sum / 3000);
    /* A verifier where speculation is known to be costly starts a sequence
     * paused, for that long. */
    tdm_adaptive_params q = p;
    q.cost_prior = 0.5;
    q.fixed_prior = 2.5;
    tdm_adaptive g;
    tdm_adaptive_init(&g, &q);
    CHECK(g.k_next == 0 && g.paused_left >= 300,
          "a costly prior should start paused for >= 300 "
          "tokens, got k %d paused %d",
          g.k_next, g.paused_left);
}

/* A probe runs only where its best outcome, its one draft accepted, would
 * restart speculation. Measured on two CPU cores at eight streams: drafts
 * accepted at 0.73, c 0.76 and f 0.15 a plain step, where the acceptance a
 * probe can show (0.73) never pays, and every request probed once, re-opened
 * on the drafter, and paused again. At those costs no probe runs, and the
 * pause says why; when the costs of the moment fall (the batch shrank:
 * c 0.2, f 0.1), the next one does. Nor does a probe run where the tokens
 * left cannot repay its open, as at a start: an open of 45 tokens, repaid
 * by 150 tokens at the start (S 1.46), not by the 114 left after four
 * rejected blocks and a pause of 32 (S 1.53 after an accepted probe). */
static void test_adaptive_probe_worth(void)
{
    tdm_adaptive_params p = serving(4, 0.76, 0.15, 1000);
    tdm_adaptive a;
    tdm_adaptive_init(&a, &p);
    CHECK(a.k_next == 0, "c 0.76, f 0.15 at a = 0.7: should start paused, k %d", a.k_next);
    for (int i = 0; i < 600; i++)
        tdm_adaptive_on_plain_token(&a);
    CHECK(a.k_next == 0 && a.probes == 0 && a.pause_why &&
              !strcmp(a.pause_why, "a probe could not restart it"),
          "a probe that cannot restart speculation ran: k %d, %d probe(s) (%s)", a.k_next, a.probes,
          a.pause_why ? a.pause_why : "-");
    int waited = 0;
    for (; waited < 600 && a.k_next == 0; waited++) {
        tdm_adaptive_set_costs(&a, 0.2, 0.1);
        tdm_adaptive_on_plain_token(&a);
    }
    CHECK(a.k_next == 1 && a.probes == 1 && waited <= a.pause_len,
          "at c 0.2, f 0.1 a probe should follow within a pause (%d): k %d after %d tokens",
          a.pause_len, a.k_next, waited);
    tdm_adaptive_on_round(&a, 1, 1, 0.2, 0.1);
    CHECK(a.k_next > 0, "an accepted probe at c 0.2, f 0.1 should restart speculation");
    /* the open */
    tdm_adaptive_params po = p;
    po.cost_prior = 0.2;
    po.fixed_prior = 0.1;
    po.open_cost = 45;
    po.tokens_left = 150;
    tdm_adaptive b;
    tdm_adaptive_init(&b, &po);
    CHECK(b.k_next > 0, "150 tokens to go repay an open of 45 at c 0.2, f 0.1 (S 1.46): k %d",
          b.k_next);
    for (int i = 0; i < 20 && b.k_next > 0; i++)
        tdm_adaptive_on_round(&b, b.k_next, 0, 0.2, 0.1);
    CHECK(b.k_next == 0, "never accepted: should pause");
    int tokens = 0;
    for (; tokens < 1000 && b.k_next == 0; tokens++)
        tdm_adaptive_on_plain_token(&b);
    CHECK(b.k_next == 0 && b.probes == 0 && b.pause_why &&
              !strcmp(b.pause_why, "its tokens would not repay a probe's open"),
          "a probe whose open the tokens left cannot repay ran: k %d, %d probe(s) (%s)", b.k_next,
          b.probes, b.pause_why ? b.pause_why : "-");
}

static void note_round(void *user, int k, int n)
{
    int *rounds = user; /* [0]: count, then (k, n) pairs */
    rounds[1 + 2 * rounds[0]] = k;
    rounds[2 + 2 * rounds[0]] = n;
    rounds[0]++;
}

/* Scores: positions replay as the rounds a block would run (a hand-worked
 * case), and a paused sequence restarts on scores where its drafter pays,
 * stays paused (scored again after as many tokens) where it does not, and is not scored
 * where the costs alone lose. The demo pair on one H100 at one stream: a
 * draft costs c 0.55 and the exchange f 0.1 a plain step, where a = 0.7
 * (the prior) pays by no block, and the drafter's drafts are accepted at
 * 0.80 first and 0.92 later in a block (a block of 4 gains 16 %). */
static void test_adaptive_scores(void)
{
    /* 1 1 0 | 1 1 1 1 (4 accepted, the bonus at 7) | 0 | 0 | 1 ... past the end */
    const uint8_t hits[] = {1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1};
    int got[1 + 2 * 16] = {0};
    const int n = tdm_score_rounds(hits, (int)sizeof(hits), 4, note_round, got);
    const int want[] = {4, 2, 4, 4, 4, 0, 4, 0};
    CHECK(n == 4 && got[0] == 4 && !memcmp(got + 1, want, sizeof(want)),
          "replayed rounds: %d, (%d,%d) (%d,%d) (%d,%d) (%d,%d); want 4: (4,2) (4,4) (4,0) (4,0)",
          n, got[1], got[2], got[3], got[4], got[5], got[6], got[7], got[8]);

    tdm_adaptive_params p = serving(4, 0.55, 0.1, 2000);
    tdm_adaptive a;
    tdm_adaptive_init(&a, &p);
    CHECK(a.k_next == 0 && !tdm_adaptive_score_due(&a),
          "c 0.55, f 0.1: starts paused, no score yet");
    int t = 0;
    for (; t < 100 && !tdm_adaptive_score_due(&a); t++)
        tdm_adaptive_on_plain_token(&a);
    CHECK(t == 32, "a score is due after pause_tokens (32) tokens: after %d", t);
    uint64_t y = 7;
    uint8_t h[64];
    for (int i = 0; i < 64;) { /* a drafter at 0.80 first, 0.92 later, in rounds of 4 */
        const int acc = accepted_by_position(&y, 4, 0.80, 0.92);
        for (int j = 0; j < acc && i < 64; j++)
            h[i++] = 1;
        if (i < 64)
            h[i++] = acc == 4; /* the verifier's token: a draft there was the next block's */
    }
    tdm_adaptive_on_scored(&a, h, 64, NULL);
    CHECK(a.k_next >= 2 && a.scores == 1 && a.score_starts == 1 &&
              tdm_adaptive_speedup(&a, a.k_next) >= 1.05,
          "scored at 0.80 / 0.92: speculation should restart at a block >= 2 that pays: k %d, "
          "S(k) %.3f, %d score(s)",
          a.k_next, tdm_adaptive_speedup(&a, a.k_next > 0 ? a.k_next : 4), a.scores);

    tdm_adaptive b;
    tdm_adaptive_init(&b, &p);
    for (int i = 0; i < 32; i++)
        tdm_adaptive_on_plain_token(&b);
    for (int i = 0; i < 64; i++)
        h[i] = u01(&y) < 0.3;
    tdm_adaptive_on_scored(&b, h, 64, NULL);
    CHECK(b.k_next == 0 && b.scores == 1 && !tdm_adaptive_score_due(&b),
          "scored at 0.3: stays paused (k %d)", b.k_next);
    for (t = 0; t < 200 && !tdm_adaptive_score_due(&b); t++)
        tdm_adaptive_on_plain_token(&b);
    CHECK(t == 32, "after a score that did not restart, the next after 32 tokens: %d", t);
    CHECK(b.accept_rate < 0.6,
          "the scores' acceptance stands through the pause's probe check: %.2f", b.accept_rate);

    /* Costs that lose even with every draft accepted: nothing to score. */
    const tdm_adaptive_params pc = serving(4, 1.5, 0.5, 2000);
    tdm_adaptive c;
    tdm_adaptive_init(&c, &pc);
    for (t = 0; t < 500; t++) {
        tdm_adaptive_on_plain_token(&c);
        CHECK(!tdm_adaptive_score_due(&c), "c 1.5, f 0.5: a score fell due at %d tokens", t);
        if (tdm_adaptive_score_due(&c))
            break;
    }
    /* A fixed block is never paused, never scored. */
    tdm_adaptive_params pf = p;
    pf.fixed = true;
    tdm_adaptive f;
    tdm_adaptive_init(&f, &pf);
    tdm_adaptive_on_scored(&f, hits, (int)sizeof(hits), NULL);
    CHECK(f.k_next == 4 && f.scores == 0 && !tdm_adaptive_score_due(&f),
          "a fixed block is not scored: k %d", f.k_next);
}

/* Measured costs at which no acceptance pays hold every request paused, with
 * nothing due that would measure them again: each such start relaxes them
 * towards what was timed before serving, until a request is scored again. */
static void test_adaptive_relax_costs(void)
{
    /* The demo pair on one H100: drafts measured at 1.05 plain steps, 0.55 timed. */
    double c = 1.05, f = 0.30;
    const double timed_c = 0.55, timed_f = 0.15;
    int starts = 0;
    bool due = false;
    for (; starts < 50 && !due; starts++) {
        tdm_adaptive a;
        const tdm_adaptive_params p = serving(4, c, f, 2000);
        tdm_adaptive_init(&a, &p);
        CHECK(a.k_next == 0, "start %d at %.3f + %.3f: starts paused", starts, f, c);
        for (int t = 0; t < 32; t++)
            tdm_adaptive_on_plain_token(&a);
        due = tdm_adaptive_score_due(&a);
        const double c0 = c, f0 = f;
        const bool moved = tdm_adaptive_relax_costs(&a, &c, &f, timed_c, timed_f, 0.1);
        CHECK(moved == !due, "start %d: relaxed %d where a score is %s", starts, moved,
              due ? "due" : "not due");
        if (moved)
            CHECK(fabs(c - (c0 + 0.1 * (timed_c - c0))) < 1e-12 &&
                      fabs(f - (f0 + 0.1 * (timed_f - f0))) < 1e-12,
                  "a tenth of the way: %.4f + %.4f from %.4f + %.4f", f, c, f0, c0);
    }
    CHECK(due && starts <= 6,
          "a request should be scored again within a few starts: %d starts, at %.3f + %.3f", starts,
          f, c);

    /* Never past what was timed, and never up towards it. */
    double lo_c = 0.90, lo_f = 0.9; /* c timed dearer still; at 0.9 + 0.2 none pays */
    tdm_adaptive a;
    for (int i = 0; i < 200; i++) {
        const tdm_adaptive_params p = serving(4, lo_c, lo_f, 2000);
        tdm_adaptive_init(&a, &p);
        tdm_adaptive_relax_costs(&a, &lo_c, &lo_f, 1.0, 0.2, 0.1);
    }
    CHECK(lo_c == 0.90 && lo_f >= 0.2 && lo_f < 0.21,
          "c timed dearer stays 0.90 (%.3f); f relaxes towards 0.2, never past it: %.4f", lo_c,
          lo_f);

    /* Paused for its acceptance, not its costs: the costs stand. */
    tdm_adaptive_params pa = serving(4, 0.55, 0.1, 2000);
    pa.accept_prior = 0.1;
    tdm_adaptive b;
    tdm_adaptive_init(&b, &pa);
    double bc = 0.55, bf = 0.1;
    CHECK(b.k_next == 0 && !tdm_adaptive_relax_costs(&b, &bc, &bf, 0.3, 0.05, 0.1) && bc == 0.55,
          "a request paused at acceptance 0.1 on costs that could pay relaxes nothing");

    /* A fixed block, and a speculating request, relax nothing. */
    tdm_adaptive_params pf = serving(4, 1.5, 0.5, 2000);
    pf.fixed = true;
    tdm_adaptive_init(&b, &pf);
    bc = 1.5;
    bf = 0.5;
    CHECK(!tdm_adaptive_relax_costs(&b, &bc, &bf, 0.3, 0.05, 0.1), "a fixed block relaxes nothing");
    tdm_adaptive_init(&b, &pa);
    b.k_next = 2;
    CHECK(!tdm_adaptive_relax_costs(&b, &bc, &bf, 0.3, 0.05, 0.1), "a speculating request neither");
}

/* Relaxed towards what speculating alone costs at the request's batch
 * (tdm_adaptive_timed, one sequence drafted), with the timings one H100 gave the demo pair
 * (verifier: plain steps and what a verify adds a draft; drafter: passes of
 * 1 x 8, 16 x 8 and 1 x 1 tokens). At a batch of 32 no start of the
 * bench's three loads of 512 requests is ever scored: one sequence
 * restarting there makes the whole batch wait on its drafter. Towards the
 * costs of all 32 speculating, sharing the drafter's passes, the same starts
 * were scored, restarted alone, and adaptive read 0.95-0.97 of plain. At one
 * stream both are the same. */
static void test_adaptive_relax_alone(void)
{
    const double pass = 0.121 - (0.721 - 0.121) / 7; /* a pass whatever its length */
    const double token1 = (0.721 - pass) / 8, token16 = (1.266 - pass) / (16 * 8);
    const double plain32 = 0.408 + (0.408 - 0.307) / 8 * 16, verify32 = 0.002, exchange = 0.01;
    double tc, tf;
    tdm_adaptive_timed(plain32, 32, 1, verify32, token1, pass, exchange, &tc, &tf);
    CHECK(fabs(tc - (verify32 + token1) / (plain32 / 32)) < 1e-12 && tc > 4.5 && tc < 4.7 &&
              fabs(tf - (pass + exchange) / (plain32 / 32)) < 1e-12,
          "alone at 32: %.3f + %.3f a draft", tf, tc);
    /* all 32 drafted, sharing the drafter's passes: the verifier's guess */
    double shared_c, shared_f;
    tdm_adaptive_timed(plain32, 32, 32, verify32, token16, pass, exchange, &shared_c, &shared_f);
    CHECK(fabs(shared_c - (verify32 + token16) / (plain32 / 32)) < 1e-12 && shared_c < 0.7 &&
              fabs(shared_f - (pass / plain32 + exchange / (plain32 / 32))) < 1e-12,
          "shared at 32: %.3f + %.3f a draft", shared_f, shared_c);
    /* starts at the costs measured there: 4.30 + 10.06 a draft */
    for (int alone = 1; alone >= 0; alone--) {
        double c = 10.06, f = 4.30;
        int scored_at = -1;
        for (int start = 0; start < 3 * 512 && scored_at < 0; start++) {
            tdm_adaptive a;
            const tdm_adaptive_params p = serving(4, c, f, 2000);
            tdm_adaptive_init(&a, &p);
            for (int t = 0; t < 32; t++)
                tdm_adaptive_on_plain_token(&a);
            if (tdm_adaptive_score_due(&a))
                scored_at = start;
            else
                tdm_adaptive_relax_costs(&a, &c, &f, alone ? tc : shared_c, alone ? tf : shared_f,
                                         0.1 / 32);
        }
        if (alone)
            CHECK(scored_at < 0 && c >= tc && f <= 4.30,
                  "alone: no start of 1536 at a batch of 32 is scored (%d), costs %.3f + %.3f",
                  scored_at, f, c);
        else
            CHECK(scored_at >= 0, "towards the shared costs (%.3f + %.3f) a start is scored: %d",
                  shared_f, shared_c, scored_at);
    }
    /* At one stream speculating alone is all there is: the same targets. */
    tdm_adaptive_timed(0.177, 1, 1, 0.012, token1, pass, exchange, &tc, &tf);
    CHECK(fabs(tc - (0.012 + token1) / 0.177) < 1e-12 && tc > 0.5 && tc < 0.6 &&
              fabs(tf - (pass / 0.177 + exchange / 0.177)) < 1e-12,
          "at one stream: %.3f + %.3f a draft", tf, tc);
    tdm_adaptive_timed(0, 8, 1, 0.01, 0.1, 0.1, 0.1, &tc, &tf);
    CHECK(tc == -1.0 && tf == -1.0, "no plain step timed: nothing to relax towards");
    tdm_adaptive_timed(0.4, 8, 0, 0.01, 0.1, 0.1, 0.1, &tc, &tf);
    CHECK(tc == -1.0 && tf == -1.0, "no sequence drafted: no cost");
}

/* Drafting ahead: tdm_run_ahead_gain against a simulation of the rounds'
 * timeline (the drafter's chain and the verify step at once, a draft per
 * position accepted with probability a, the guess of the next token right
 * with probability a), and the measured acceptance it is given. */
static double sim_round_ms(double a, int k, double draft_ms, double verify_ms, bool ahead,
                           uint64_t *y)
{
    const int rounds = 200000;
    double total = 0;
    for (int r = 0; r < rounds; r++) {
        int run = 0; /* positions right in a row, the guess the last */
        while (run < k + 1 && u01(y) < a)
            run++;
        if (!ahead) {
            total += k * draft_ms + verify_ms;
            continue;
        }
        /* the chain ahead (k + 1 drafts) runs beside the verify step */
        const double ready = fmax(verify_ms, (k + 1) * draft_ms);
        total += run == k + 1 ? ready : ready + k * draft_ms;
    }
    return total / rounds;
}

static void test_run_ahead_gain(void)
{
    uint64_t y = 88172645463325252ull;
    static const struct {
        double a;
        int k;
        double draft_ms, verify_ms;
    } cases[] = {
        {0.8, 4, 0.96, 3.3}, /* a 0.8B drafter's chain outlasts the 4B verify step */
        {0.95, 4, 0.96, 3.3}, {0.6, 4, 0.15, 2.0}, /* a chain within the verify step */
        {0.8, 4, 1.0, 0.2},                        /* a slow drafter for a fast verifier */
        {1.0, 2, 0.5, 0.5},   {0.3, 8, 0.2, 1.0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const double a = cases[i].a, D = cases[i].draft_ms, VS = cases[i].verify_ms;
        const int k = cases[i].k;
        const double saved =
            sim_round_ms(a, k, D, VS, false, &y) - sim_round_ms(a, k, D, VS, true, &y);
        const double gain = tdm_run_ahead_gain(a, k, k * D, VS);
        CHECK(fabs(saved - gain) < 0.01 * (k * D + VS), "case %zu: simulated %.4f ms, formula %.4f",
              i, saved, gain);
    }
    CHECK(tdm_run_ahead_gain(0.8, 4, 3.85, 3.3) < 0 && tdm_run_ahead_gain(0.95, 4, 3.85, 3.3) > 0,
          "a chain that outlasts the verify step pays only for a drafter that is right often");
    CHECK(tdm_run_ahead_gain(0.05, 4, 0.6, 2.0) > 0, "a chain within the verify step always pays");
    CHECK(tdm_run_ahead_gain(1.0, 4, 4.0, 0.2) < 0, "a drafter much slower than the verifier");
    CHECK(tdm_run_ahead_gain(0.8, 0, 1, 1) == 0 && tdm_run_ahead_gain(0.8, 4, NAN, 1) == 0,
          "no block, no time: no gain");
    tdm_accept_memory m = {0};
    CHECK(tdm_accept_memory_rate(&m) < 0, "nothing measured");
    for (int r = 0; r < 100; r++)
        tdm_accept_memory_note(&m, 4, r % 5 == 4 ? 4 : 3); /* 3 of 4, then all 4 */
    /* per round: accepted 3.2 a round over trials 4.0 (3 + the rejected one, or 4) */
    CHECK(fabs(tdm_accept_memory_rate(&m) - 0.8) < 0.03 &&
              tdm_accept_memory_prior(&m, false) <= 0.7,
          "measured acceptance %.3f (0.8), uncapped; the prior stays capped",
          tdm_accept_memory_rate(&m));
}

int main(void)
{
    test_accept_positions();
    test_greedy();
    test_ngram();
    test_adaptive();
    test_adaptive_never_loses();
    test_adaptive_unmeasured_costs();
    test_steptime_plain();
    test_open_cost();
    test_cost_at_batch();
    test_steptime_one_row_count();
    test_adaptive_memory_recovers();
    test_adaptive_probe_worth();
    test_adaptive_scores();
    test_adaptive_relax_costs();
    test_adaptive_relax_alone();
    test_run_ahead_gain();
    test_lossless();
    if (failures) {
        printf("%d check(s) failed\n", failures);
        return 1;
    }
    printf("all spec checks passed\n");
    return 0;
}
