/*
 * adaptive.h - how many tokens to draft next, per sequence, and when to stop
 * speculating because it does not pay.
 *
 * The rule (documented in README.md, "Adaptive speculation"):
 *  - a = the per-token acceptance rate: each drafted token up to the first
 *    rejected one is a trial (those after it are not seen), so a round
 *    that accepts n of k drafts adds n accepted out of n + (n < k) trials;
 *    both sums are exponential moving averages (weight 0.1), starting from
 *    a prior of 0.7 (accepted/drafted would read 0.59 where every token is
 *    accepted with probability 0.8 and k = 4);
 *  - f = the measured cost of speculating at all in a round (the exchange
 *    with the drafter: wire and hand-offs, whatever k; and the verifier's
 *    work after the step that a verify block adds: its commit and verdict),
 *    and c = the measured
 *    cost of one drafted token (drafter time plus the extra verify work),
 *    both relative to one plain decoding step of the sequence and averaged
 *    (EMA weight 0.3, towards the median of the last three rounds'
 *    measurements, so that one slow round does not pause a drafter that
 *    pays); where no earlier request measured them (no cost_prior or
 *    fixed_prior), the median of the first rounds' measurements replaces
 *    the rule's guess until three are in: a guess is not a measurement (EMA
 *    steps away from it kept requests speculating some eight rounds where a
 *    draft costs more than a plain step, the CPU at eight streams);
 *  - with k drafts a round yields E(k) = 1 + a_0 + a_0 a_1 + ... +
 *    a_0 ... a_(k-1) tokens, a_i the acceptance at position i (below:
 *    around a; where every position's is a, E(k) = (1 - a^(k+1)) / (1 - a)),
 *    and costs 1 + f + c*k steps, so the expected speed-up is
 *    S(k) = E(k) / (1 + f + c*k);
 *  - the next block length is the k in [1, k_max] with the largest S(k);
 *  - if the best S(k) has been below 1 (speculation loses) for min_rounds
 *    rounds in a row since speculation last (re)started, or if min_rounds
 *    rounds since then accepted no draft at all, speculation is
 *    switched off for this sequence for `pause_tokens` tokens, then probed
 *    again with k = 1 (acceptance can recover, e.g. entering boilerplate)
 *    from the prior acceptance, as a new sequence starts;
 *    the probe's own outcome decides: its draft accepted (and the estimate
 *    paying by min_gain) restarts speculation, rejected doubles the next
 *    pause (at most 32 x pause_tokens). Where the costs alone lose (S(k) < 1
 *    for every k even with every draft accepted) two rounds in a row, it is
 *    switched off without waiting for min_rounds: no acceptance pays. A
 *    probe costs about f + c plain steps, so no pause is shorter than
 *    (f + c) / probe_share tokens: probing never costs more than
 *    probe_share (1 %) of plain decoding's speed. A probe is run only
 *    where its best outcome (its draft accepted) would restart speculation:
 *    the speed-up at the acceptance that outcome gives pays by min_gain,
 *    at the costs of now (tdm_adaptive_set_costs, while paused), and the
 *    tokens left repay its open as below (judged at the drafter's
 *    remembered acceptance instead where that is below the prior); else
 *    the pause goes on.
 * A sequence starts from cost_prior; if speculation would not pay even at
 * the prior acceptance, it starts paused (and probes like any pause). It
 * also starts paused where the tokens it may still generate cannot win back
 * what opening it on the drafter costs (open_cost: tokens_left x (1 - 1/S)
 * must exceed it). (A probe's open costs less: the drafter catches up on the
 * tokens of the pause alone.)
 * Scoring: while paused, a greedy sequence's model drafter may be asked how
 * its drafts would have fared on the tokens decoded since it last saw the
 * sequence (drafter.proto, DraftScore): under greedy decoding a draft is
 * accepted exactly where it is the token decoded there, so the positions
 * replay as the rounds blocks of k_max would have run, each weighed as a
 * speculative round's acceptance (tdm_adaptive_on_scored). Where the
 * estimate then pays by min_gain and the tokens left repay the open,
 * speculation restarts at the block it favours; otherwise the next score
 * comes after pause_tokens more. Without it a drafter judged at the prior
 * acceptance where that does not pay (the demo pair on one H100: a block of 4
 * gains 12-16 % at 0.77 a draft, rising along the block) is never run, so
 * never measured. A score costs the sequence nothing
 * (it decodes on; the answer comes when it comes), only the drafter a
 * catch-up it makes anyway at the next open; it is asked for only where
 * some acceptance could pay at the costs of now (every draft accepted pays
 * by min_gain).
 * Every decision is counted so that it is visible in the request's stats.
 */
#ifndef TANDEM_SPEC_ADAPTIVE_H
#define TANDEM_SPEC_ADAPTIVE_H

#include <stdbool.h>
#include <stdint.h>

/* ---- acceptance by position ------------------------------------------------
 *
 * A draft's chance of being accepted where every draft before it in its
 * block was, by its position in the block (0: the first draft). A real
 * drafter's rises along the block (the demo pair on one H100: 0.80 for the
 * first draft, 0.89-0.95 for the later ones): one rate for every position,
 * read off short blocks, understates what longer ones yield. hit[i] is a moving average (weight 0.1
 * an observation) of position i's outcomes (1 accepted, 0 rejected) started at 0, and weight[i] the
 * weight observed so far (1 - 0.9^observations); the estimate at i is hit[i] + (1 - weight[i]) x a
 * pooled rate, so that a position seen rarely reads as the pooled rate, and one never seen, as it.
 */
#define TDM_ADAPTIVE_POSITIONS 64

typedef struct tdm_accept_positions {
    double hit[TDM_ADAPTIVE_POSITIONS], weight[TDM_ADAPTIVE_POSITIONS];
} tdm_accept_positions;

/* A block of k drafts of which the first n were accepted: positions
 * 0..n-1 accepted, position n (where n < k) rejected, the later ones not
 * seen. */
void tdm_accept_positions_note(tdm_accept_positions *p, int k, int n);
/* The estimate at position i around the pooled rate. */
double tdm_accept_positions_rate(const tdm_accept_positions *p, int i, double pooled);

typedef struct tdm_adaptive_params {
    int k_max;          /* most drafts per round (verifier and drafter limits) */
    int k_initial;      /* longest first block (the priors pick it up to this); fixed: every block */
    double min_gain;    /* required expected speed-up over plain decoding, e.g. 0.05 */
    int pause_tokens;   /* plain tokens before probing again */
    int min_rounds;     /* rounds observed before speculation may be switched off */
    double cost_prior;  /* starting estimate of c (e.g. measured on earlier requests); <= 0: 0.1 */
    /* cost_prior is a guess, not a measurement of this deployment's rounds
     * (e.g. what the verify step's extra rows alone cost, timed before the
     * verifier served, without the drafter's part): the first rounds'
     * measurements replace it, as they replace the rule's own guess. */
    bool cost_guessed;
    /* Starting acceptance (a new sequence's, and every probe's): e.g. what
     * this drafter's drafts were accepted at on earlier requests; outside
     * (0, 1): 0.7. */
    double accept_prior;
    /* ... and by position (tdm_accept_memory's; zero: nothing seen). */
    tdm_accept_positions accept_positions;
    double fixed_prior; /* starting estimate of f; < 0: 0 */
    bool fixed;         /* true: always k_initial, never switch off (benchmarks, tests) */
    /* Tokens the sequence loses while its drafter opens it (catches up on
     * its tokens before the first block; the sequence waits meanwhile),
     * measured on earlier opens; <= 0: none known. */
    double open_cost;
    int tokens_left; /* tokens the request may still generate (counted down); <= 0: unknown */
} tdm_adaptive_params;

/* A cost's last three measurements (their median moves the estimate).
 * guess: the estimate is still the rule's own prior, not a measurement of
 * this deployment; the first measurements replace it (their median) instead
 * of moving it by EMA steps. */
typedef struct tdm_cost_window {
    double x[3];
    int n;
    bool guess;
} tdm_cost_window;

typedef struct tdm_adaptive {
    tdm_adaptive_params p;
    double accept_rate; /* accepted / trials, over every position */
    double accepted_ema, trials_ema;
    tdm_accept_positions pos; /* by position, around accept_rate */
    double cost;        /* EMA of per-draft-token cost relative to a plain step */
    double fixed;       /* EMA of the per-round cost of speculating, relative to a plain step */
    int k_next;         /* block length for the next round; 0 = speculation paused */
    int paused_left;    /* plain tokens left before the next probe */
    int pause_len;      /* length of the current pause */
    int rounds;
    int since_start;    /* rounds since speculation last (re)started */
    int accepted_since_start; /* drafts accepted in those rounds */
    int pauses;         /* times speculation was switched off */
    int score_left;     /* plain tokens before the next score (while paused) */
    int scores;         /* scores weighed */
    int score_starts;   /* times a score restarted speculation */
    bool scored;        /* this pause's estimates are scored ones: a probe keeps them */
    int probes;         /* rounds run to test whether it pays again */
    bool probing;       /* the next round is a probe, whose outcome decides */
    int below;          /* rounds in a row whose estimates say speculation loses */
    int lost;           /* rounds in a row whose costs lose even with every draft accepted */
    tdm_cost_window cost_win, fixed_win;
    /* Why speculation was last switched off (a static string; NULL: never)
     * and the estimates then: acceptance, c and f. */
    const char *pause_why;
    double pause_at[3];
} tdm_adaptive;

void tdm_adaptive_init(tdm_adaptive *a, const tdm_adaptive_params *p);

/* After a speculative round: k drafted, n accepted, and the measured costs
 * relative to a plain step: of one drafted token, and of the round's
 * exchange (< 0: unknown, keep the estimate). */
void tdm_adaptive_on_round(tdm_adaptive *a, int drafted, int accepted, double cost_per_draft,
                           double fixed_cost);

/* After a plain (non-speculative) step while paused. */
void tdm_adaptive_on_plain_token(tdm_adaptive *a);

/* While paused: what speculating would cost now, relative to a plain step
 * (<= 0: keep the estimate), e.g. as measured on other requests at the
 * verifier's current batch; the next probe is judged on them. */
void tdm_adaptive_set_costs(tdm_adaptive *a, double cost, double fixed);

/* Whether a score is due: paused, score_left counted down, and some
 * acceptance would pay at the costs of now. */
bool tdm_adaptive_score_due(const tdm_adaptive *a);

/* The best speed-up over plain decoding with every draft accepted, at the
 * estimated costs: below 1 + min_gain the costs alone keep it paused, and
 * nothing (no score, no probe) would measure the drafter again. */
double tdm_adaptive_ceiling(const tdm_adaptive *a);

/* The costs a started from (tdm_adaptive_init), as measured on speculative
 * rounds (plain steps: *cost a draft, *fixed a round), where they alone keep
 * it paused (tdm_adaptive_ceiling below 1 + min_gain): each moves the share
 * `step` (0..1) of the way back towards what was timed before serving
 * (timed_cost, timed_fixed), where that is lower and known (> 0). Returns
 * whether they moved. Costs are measured only while requests speculate, so
 * costs that read so dear, with no score or probe due, would stand for good;
 * relaxed a little each request that starts on them, a later request is
 * scored again, and its rounds, if it restarts, measure them afresh. */
bool tdm_adaptive_relax_costs(const tdm_adaptive *a, double *cost, double *fixed, double timed_cost,
                              double timed_fixed, double step);

/* What speculation costs a sequence, in plain steps of it (plain_ms / n, a
 * plain step of its batch of n shared by its sequences), when `drafted` of
 * the batch's sequences speculate and share the drafter's passes (n: the
 * whole batch; 1: it alone, the others decoding plainly while every round
 * waits for its block). *cost a draft: what verifying one adds to the step
 * (verify_ms) and what the drafter takes for one token of one sequence in a
 * pass of `drafted` (token_ms); *fixed a round: its share of the drafter's
 * pass whatever its length (pass_ms / drafted) and the exchange
 * (exchange_ms). The verifier's guess before any round is measured prices
 * the whole batch speculating; what tdm_adaptive_relax_costs relaxes towards
 * prices it alone, since a request that restarts restarts alone and at a
 * batch of n the batch waits on its drafter (the demo pair on one H100 at a
 * batch of 32: 4.6 plain steps of a sequence a draft alone, 0.6 with all 32
 * speculating, and measured 10). -1 in both where plain_ms, n or drafted
 * is not positive. */
void tdm_adaptive_timed(double plain_ms, int n, int drafted, double verify_ms, double token_ms,
                        double pass_ms, double exchange_ms, double *cost, double *fixed);

/* The rounds of k drafts that n scored positions replay, in order: each is
 * (drafts accepted, drafts tried) = (the hits in a row from its start, at
 * most k), and the next starts after it and the token the verifier would
 * have decided. fn is called with (user, k, accepted) for each; returns how
 * many. */
int tdm_score_rounds(const uint8_t *hits, int n, int k, void (*fn)(void *, int, int), void *user);

/* Expected speed-up S(k) under the current estimates. */
double tdm_adaptive_speedup(const tdm_adaptive *a, int k);

/* The median of x[0..2] (the cost window's, and timings taken thrice). */
double tdm_median3(const double *x);

/* ---- a drafter's acceptance across requests --------------------------------
 *
 * Moving averages (weight 0.1 a round) of a drafter's accepted drafts and
 * trials over its speculative rounds, kept by the verifier per drafter: the
 * starting acceptance (accept_prior) of its next requests. Without it every
 * request of a drafter that is never right pays an open and min_rounds
 * losing rounds. */
typedef struct tdm_accept_memory {
    double accepted, trials;
    tdm_accept_positions pos; /* by position (a request's accept_positions) */
} tdm_accept_memory;

/* A speculative round: k drafts, n accepted. */
void tdm_accept_memory_note(tdm_accept_memory *m, int k, int n);
/* The acceptance, within [0.02, 0.7]; -1 until some five rounds are known.
 * Capped at the rule's prior: history only makes a drafter's requests more
 * careful (measured on one H200, a higher prior from a drafter that is right
 * opened more requests at batch 8 on the demo pair, 0.83-0.86x plain, where
 * what an open costs the batch is not counted); the positions a drafter's
 * blocks reached (tdm_accept_memory.pos) say what it measured there.
 * nudge (a request starts paused): a low acceptance moves a tenth of the
 * way back to the rule's prior (0.7), and what each position observed fades
 * by a tenth (its estimate towards the pooled rate), so that after a dozen
 * requests without speculation one tries again, instead of never (a
 * position read low, then never run, kept its estimate). */
double tdm_accept_memory_prior(tdm_accept_memory *m, bool nudge);
/* The acceptance per draft as measured (accepted / trials, where a round's
 * trials are its accepted drafts and the rejected one), uncapped; -1 until
 * some five rounds are known. */
double tdm_accept_memory_rate(const tdm_accept_memory *m);

/* A score's positions (hits[i]: 1 where the drafter's greedy draft was the
 * token decoded there): weighed as the rounds of k_max drafts they replay
 * (tdm_score_rounds), into the drafter's memory m too (NULL: none); restarts
 * speculation where the estimate pays (k_next > 0 after). */
void tdm_adaptive_on_scored(tdm_adaptive *a, const uint8_t *hits, int n, tdm_accept_memory *m);

/* ---- what an open costs ----------------------------------------------------
 *
 * How long a sequence waits for its first block after an open (its drafter
 * catching up on its tokens), over the verifier's last three opens: their
 * median, and unknown while fewer were seen. open_cost (tdm_adaptive_params)
 * starts a request paused where its tokens would not repay an open, so one
 * slow open (a cold drafter's first prompt: 69 ms on one H100 where opens take
 * about 1) held in a moving average kept every later request from opening,
 * and so from ever measuring a faster one. */
typedef struct tdm_open_cost {
    double ms[3];
    uint64_t n;
} tdm_open_cost;

/* An open's wait, ms (not finite or < 0: ignored). */
void tdm_open_cost_note(tdm_open_cost *c, double ms);
/* The median of the last three opens' waits, ms; -1 while fewer were seen. */
double tdm_open_cost_ms(const tdm_open_cost *c);

/* ---- drafting ahead of verdicts (run-ahead) --------------------------------
 *
 * A drafter on a device of its own may draft the block of round r + 1 while
 * round r is verified, assuming block r is accepted whole and its own guess
 * of the verifier's next token: a chain of k + 1 drafts. That block stands
 * with probability accept^(k + 1), and then the round does without the
 * drafter's chain of k drafts after the verdict (chain_ms). Every round pays
 * the time by which the chain ahead outlasts the verify step (verify_ms): a
 * verdict that refutes it waits for it to end. The expected ms a round
 * saves (negative: a loss):
 *     accept^(k + 1) * chain_ms - max(0, chain_ms * (k + 1) / k - verify_ms).
 * So it always pays where the chain ahead fits in the verify step, and where
 * it does not, only for a drafter that is right often enough. */
double tdm_run_ahead_gain(double accept, int k, double chain_ms, double verify_ms);

/* ---- the cost model: what a drafted token costs ----------------------------
 *
 * The time of one forward step as a function of its rows, t = a + b * rows,
 * fitted by least squares with exponential forgetting. A GPU streaming
 * weights has a large a (rows are nearly free); a compute-bound CPU has a
 * small a. The cost c of one drafted token that the rule above weighs is
 * (round time - plain round) / (drafted tokens * plain step per sequence),
 * judged on the very rounds speculation runs.
 * The plain round of n sequences is the one measured as such (a round in
 * which none of them verified drafts) within the last
 * TDM_STEPTIME_PLAIN_FRESH rounds, where there is one; else the fit's, or
 * where the recent steps all had one row count (no line through them) the
 * last one measured at any time. The
 * fit alone is not enough: it extrapolates from the speculative rounds' rows
 * to n rows, and where a step's time is not a line in its rows (a CPU's
 * row tiles) or the drafter computed beside those steps (two processes on
 * two cores), it put a plain 8-row step at 5.9 ms where one takes 3.0: the
 * drafts looked cheap, and speculation that lost went on. */
#define TDM_STEPTIME_PLAIN_MAX 256     /* batch sizes whose plain rounds are kept */
#define TDM_STEPTIME_PLAIN_FRESH 1024u /* rounds a plain round's time stands for */

typedef struct tdm_steptime {
    double s0, s1, s2, t0, t1; /* sums of w, w*R, w*R^2, w*t, w*R*t */
    uint64_t round;            /* rounds seen (tdm_steptime_tick) */
    /* per batch size n: the plain rounds' time (EMA) and the round it was
     * last measured at (0: never) */
    double plain_ms[TDM_STEPTIME_PLAIN_MAX + 1];
    uint64_t plain_at[TDM_STEPTIME_PLAIN_MAX + 1];
} tdm_steptime;

/* A round passed (measured or not). */
void tdm_steptime_tick(tdm_steptime *m);
/* A step of `rows` rows took `ms`. */
void tdm_steptime_add(tdm_steptime *m, int rows, double ms);
/* A plain round of n sequences (one row each, no drafts) took `ms`. */
void tdm_steptime_add_plain(tdm_steptime *m, int n, double ms);
/* Whether the plain round of n sequences lacks a measurement within the
 * last TDM_STEPTIME_PLAIN_FRESH rounds (n within TDM_STEPTIME_PLAIN_MAX). */
bool tdm_steptime_wants_plain(const tdm_steptime *m, int n);
/* Predicted time of a plain round of n rows; false until there is data. */
bool tdm_steptime_plain(const tdm_steptime *m, int n, double *out);
/* A cost in ms (a draft's, or speculating's per sequence, as measured on
 * earlier rounds at whatever batch) in plain steps per sequence of a round
 * of n sequences, the batch a request joins: cost_ms / (plain round of n /
 * n). -1 where the cost or that round is not known. A burst's requests
 * arrive while the last round may hold one sequence; judged at that round,
 * the demo pair's draft read as 0.37 of a step where at the 32 they join it
 * is 9.3 (one H100). */
double tdm_steptime_cost_at(const tdm_steptime *m, double cost_ms, int n);
/* The costs of a round of `seqs` sequences, `spec` of them speculating, that
 * drafted `drafted` tokens in all and took `round_ms` (waiting for blocks and
 * the step), of which `exchange_ms` (at most) does not grow with the drafts:
 * *fixed the exchange per speculating sequence, *per_draft each drafted
 * token, both relative to a plain step per sequence. False (both < 0) when
 * unknown. */
bool tdm_steptime_round_cost(const tdm_steptime *m, int seqs, int spec, int drafted,
                             double round_ms, double exchange_ms, double *fixed,
                             double *per_draft);

#endif
