/* adaptive.c - see adaptive.h. */
#include "adaptive.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

/* The acceptance estimate's weight: low enough that two rejected rounds in
 * a row at a per-token acceptance of 0.8 do not read as a collapse (at 0.3
 * a model drafter with a = 0.8 was paused in most rounds); the costs move
 * faster, as they change with the batch. */
#define ACCEPT_WEIGHT 0.1
#define EMA_WEIGHT 0.3
#define PRIOR_ACCEPT 0.7
#define PRIOR_COST 0.1
#define PROBE_SHARE 0.01 /* of plain decoding's speed that probing may cost */

/* A pause of at least n tokens, and long enough that the probe ending it
 * (about f + c plain steps) costs at most PROBE_SHARE of them. */
static int pause_floor(const tdm_adaptive *a, int n)
{
    double need = (a->fixed + a->cost) / PROBE_SHARE;
    if (need > 1e6)
        need = 1e6;
    return need > n ? (int)ceil(need) : n;
}

/* Plain tokens between a paused sequence's scores: pause_tokens. Not more
 * after a score that did not restart it, as probes back off: the drafter
 * catches up on every token either way (at a score, or at the next open),
 * and text turns in tens of tokens (the demo pair's first 32 positions after
 * a prompt accept about half as often as the next 64). */
static int score_every(const tdm_adaptive *a)
{
    return a->p.pause_tokens > 0 ? a->p.pause_tokens : 1;
}

/* Notes why speculation stops now, and the estimates it stops on. */
static void note_pause(tdm_adaptive *a, const char *why)
{
    a->pauses++;
    a->pause_why = why;
    a->pause_at[0] = a->accept_rate;
    a->pause_at[1] = a->cost;
    a->pause_at[2] = a->fixed;
}

/* Whether the tokens the request may still generate win back an open on
 * the drafter (open_cost tokens) at speed-up `best`; true where either is
 * unknown. */
static bool open_repays(const tdm_adaptive *a, double best)
{
    return a->p.open_cost <= 0 || a->p.tokens_left <= 0 || best <= 0 ||
           a->p.tokens_left * (1.0 - 1.0 / best) > a->p.open_cost;
}

/* Counts the request's tokens down (p.tokens_left, where known; at least
 * one, since 0 reads as unknown). */
static void tokens_done(tdm_adaptive *a, int n)
{
    if (a->p.tokens_left > 0)
        a->p.tokens_left = a->p.tokens_left > n ? a->p.tokens_left - n : 1;
}

/* What a position past the blocks being run keeps of its observations a
 * round: its estimate fades back to the pooled rate in some 35 rounds. A
 * position estimated low on a few blocks, and then never run because of
 * that estimate, would otherwise keep it for good (simulated, requests whose
 * drafts were accepted at 0.8 each drafted blocks of one for as long as
 * their second position read 0.53). */
#define POSITION_KEEP 0.98

void tdm_accept_positions_note(tdm_accept_positions *p, int k, int n)
{
    if (k > TDM_ADAPTIVE_POSITIONS)
        k = TDM_ADAPTIVE_POSITIONS;
    for (int i = 0; i < k && i <= n; i++) {
        p->hit[i] = (1.0 - ACCEPT_WEIGHT) * p->hit[i] + ACCEPT_WEIGHT * (i < n);
        p->weight[i] = (1.0 - ACCEPT_WEIGHT) * p->weight[i] + ACCEPT_WEIGHT;
    }
    for (int i = k < 0 ? 0 : k; i < TDM_ADAPTIVE_POSITIONS; i++) {
        p->hit[i] *= POSITION_KEEP;
        p->weight[i] *= POSITION_KEEP;
    }
}

double tdm_accept_positions_rate(const tdm_accept_positions *p, int i, double pooled)
{
    if (i < 0 || i >= TDM_ADAPTIVE_POSITIONS)
        return pooled;
    return p->hit[i] + (1.0 - p->weight[i]) * pooled;
}

/* The best S(k), k <= kmax, and its k. */
static double best_speedup(const tdm_adaptive *a, int kmax, int *k_best)
{
    double best = 0;
    for (int k = 1; k <= kmax; k++) {
        const double s = tdm_adaptive_speedup(a, k);
        if (s > best) {
            best = s;
            *k_best = k;
        }
    }
    return best;
}

void tdm_adaptive_init(tdm_adaptive *a, const tdm_adaptive_params *p)
{
    a->p = *p;
    if (a->p.k_max < 1)
        a->p.k_max = 1;
    if (a->p.k_initial < 1 || a->p.k_initial > a->p.k_max)
        a->p.k_initial = a->p.k_max;
    if (!(a->p.accept_prior > 0 && a->p.accept_prior < 1))
        a->p.accept_prior = PRIOR_ACCEPT;
    a->accept_rate = a->p.accept_prior;
    a->accepted_ema = a->p.accept_prior;
    a->trials_ema = 1.0;
    a->pos = a->p.accept_positions;
    a->cost = a->p.cost_prior > 0 ? a->p.cost_prior : PRIOR_COST;
    a->fixed = a->p.fixed_prior > 0 ? a->p.fixed_prior : 0.0;
    a->k_next = a->p.k_initial;
    a->paused_left = 0;
    a->rounds = 0;
    a->since_start = 0;
    a->accepted_since_start = 0;
    a->pause_len = a->p.pause_tokens;
    a->pauses = 0;
    a->score_left = score_every(a);
    a->scores = 0;
    a->score_starts = 0;
    a->scored = false;
    a->probes = 0;
    a->probing = false;
    a->below = 0;
    a->lost = 0;
    a->pause_why = NULL;
    a->cost_win = (tdm_cost_window){{0}, 0, !(a->p.cost_prior > 0) || a->p.cost_guessed};
    a->fixed_win = (tdm_cost_window){{0}, 0, !(a->p.fixed_prior > 0)};
    if (!a->p.fixed) {
        /* The block the priors say is best: a sequence's first blocks see
         * only the prior acceptance, so k_initial is the longest it starts
         * with, not what it starts with. What the request's tokens can win
         * back at that speed-up must exceed what opening it on the drafter
         * costs. */
        const double best = best_speedup(a, a->p.k_initial, &a->k_next);
        if (best < 1.0 + a->p.min_gain || !open_repays(a, best)) {
            /* Not worth it here even if this sequence drafts well: start
             * paused and let the probes find out. */
            a->k_next = 0;
            a->pause_len = pause_floor(a, a->pause_len);
            a->paused_left = a->pause_len;
            note_pause(a, best < 1.0 + a->p.min_gain ? "would not pay at the starting estimates"
                                                     : "its tokens would not repay the open");
        }
    }
}

double tdm_adaptive_speedup(const tdm_adaptive *a, int k)
{
    double run = 1.0, expected = 1.0;
    for (int i = 0; i < k; i++) {
        run *= tdm_accept_positions_rate(&a->pos, i, a->accept_rate);
        expected += run;
    }
    return expected / (1.0 + a->fixed + a->cost * k);
}

static void switch_off(tdm_adaptive *a, bool probing, const char *why)
{
    /* A probe that fails doubles the next pause (up to 32 times the first),
     * so that probing costs little where speculation never pays. */
    a->pause_len = probing ? (a->pause_len * 2 < a->p.pause_tokens * 32 ? a->pause_len * 2
                                                                        : a->p.pause_tokens * 32)
                           : a->p.pause_tokens;
    a->pause_len = pause_floor(a, a->pause_len);
    a->k_next = 0;
    a->paused_left = a->pause_len;
    note_pause(a, why);
    a->since_start = 0;
    a->accepted_since_start = 0;
    a->below = 0;
    a->lost = 0;
    a->score_left = score_every(a);
    a->scored = false;
}

double tdm_adaptive_ceiling(const tdm_adaptive *a)
{
    double ceiling = 0;
    for (int k = 1; k <= a->p.k_max; k++) {
        const double s = (double)(k + 1) / (1.0 + a->fixed + a->cost * k);
        ceiling = s > ceiling ? s : ceiling;
    }
    return ceiling;
}

static void choose(tdm_adaptive *a)
{
    int best = 1;
    double best_s = tdm_adaptive_speedup(a, 1);
    for (int k = 2; k <= a->p.k_max; k++) {
        double s = tdm_adaptive_speedup(a, k);
        if (s > best_s) {
            best_s = s;
            best = k;
        }
    }
    if (a->probing) {
        /* The probe's own outcome decides: its one draft rejected pauses
         * again (an estimate still near the prior would call a rejected
         * draft a = 0.63 and, where drafts are cheap, start some ten losing
         * rounds); accepted, speculation restarts where the estimate says
         * it pays by min_gain, from the block the estimate favours, and
         * runs min_rounds rounds before it may stop again. */
        a->probing = false;
        if (a->accepted_since_start == 0 || best_s < 1.0 + a->p.min_gain) {
            switch_off(a, true,
                       a->accepted_since_start == 0 ? "the probe's draft was rejected"
                                                    : "the probe's estimates would not pay");
            return;
        }
        a->since_start = 0;
        a->accepted_since_start = 0;
        a->k_next = best;
        return;
    }
    /* Once running, speculation stops only where it is expected to lose,
     * min_rounds rounds in a row: stopping at a gain below min_gain throws
     * the gain away, and the estimates' noise near the threshold (two
     * rejected blocks in a row, a slow round) would pause a drafter that
     * pays.
     * Not one draft accepted in min_rounds rounds stops it too, whatever
     * the estimate (still near the prior after so few rounds) says: a
     * drafter whose drafts are accepted with probability 0.7 has its first
     * draft rejected four times in a row in under 1 % of starts, and one
     * that never fits the text would otherwise lose some ten rounds. */
    const bool none = a->since_start >= a->p.min_rounds && a->accepted_since_start == 0;
    /* The costs alone lose: the best block pays less than plain decoding
     * even if every draft were accepted. The acceptance estimate's noise,
     * which min_rounds waits out, cannot change that; two rounds in a row
     * (one slow round is not a cost) switch it off. */
    a->lost = tdm_adaptive_ceiling(a) < 1.0 ? a->lost + 1 : 0;
    if (a->lost >= 2) {
        switch_off(a, false, "costs lose even with every draft accepted");
        return;
    }
    a->below = best_s < 1.0 ? a->below + 1 : 0;
    if ((a->below >= a->p.min_rounds && a->since_start >= a->p.min_rounds) || none) {
        switch_off(a, false, none ? "no draft accepted" : "expected to lose");
        return;
    }
    a->k_next = best;
}

double tdm_median3(const double *x)
{
    const double lo = x[0] < x[1] ? x[0] : x[1], hi = x[0] < x[1] ? x[1] : x[0];
    return x[2] < lo ? lo : x[2] > hi ? hi : x[2];
}

/* An EMA step towards the median of the last three rounds' measured costs
 * (the lower of the first two): one slow round (a block length the drafter
 * runs for the first time, a step that waited for the GPU; at one draft a
 * round, a step 1 ms slow doubles its cost) must not read as drafts that
 * stopped paying, while a real change shows in two rounds. While the
 * estimate is the rule's guess (w->guess), the median itself, until three
 * measurements are in. x < 0 or not finite: unknown, kept. */
static void cost_step(double *est, tdm_cost_window *w, double x)
{
    if (!(x >= 0.0) || !isfinite(x))
        return;
    w->x[w->n++ % 3] = x;
    double m = x;
    if (w->n == 2) {
        m = w->x[0] < w->x[1] ? w->x[0] : w->x[1];
    } else if (w->n >= 3) {
        m = tdm_median3(w->x);
    }
    if (w->guess) {
        *est = m;
        w->guess = w->n < 3;
        return;
    }
    *est = (1.0 - EMA_WEIGHT) * *est + EMA_WEIGHT * m;
}

/* A block of k drafts, n accepted: the pooled estimate and the positions'. */
static void note_acceptance(tdm_adaptive *a, int k, int n)
{
    const int trials = n + (n < k);
    a->accepted_ema = (1.0 - ACCEPT_WEIGHT) * a->accepted_ema + ACCEPT_WEIGHT * n;
    a->trials_ema = (1.0 - ACCEPT_WEIGHT) * a->trials_ema + ACCEPT_WEIGHT * trials;
    a->accept_rate = a->trials_ema > 0 ? a->accepted_ema / a->trials_ema : PRIOR_ACCEPT;
    tdm_accept_positions_note(&a->pos, k, n);
}

void tdm_adaptive_on_round(tdm_adaptive *a, int drafted, int accepted, double cost_per_draft,
                           double fixed_cost)
{
    a->rounds++;
    a->since_start++;
    tokens_done(a, (drafted > 0 ? accepted : 0) + 1);
    if (drafted <= 0)
        return;
    a->accepted_since_start += accepted;
    note_acceptance(a, drafted, accepted);
    cost_step(&a->cost, &a->cost_win, cost_per_draft);
    cost_step(&a->fixed, &a->fixed_win, fixed_cost);
    if (a->p.fixed) {
        a->k_next = a->p.k_initial;
        return;
    }
    choose(a);
}

void tdm_adaptive_set_costs(tdm_adaptive *a, double cost, double fixed)
{
    if (a->k_next > 0 || a->p.fixed)
        return;
    if (cost > 0 && isfinite(cost))
        a->cost = cost;
    if (fixed > 0 && isfinite(fixed))
        a->fixed = fixed;
}

void tdm_adaptive_on_plain_token(tdm_adaptive *a)
{
    tokens_done(a, 1);
    if (a->k_next > 0 || a->p.fixed)
        return;
    if (a->score_left > 0)
        a->score_left--;
    if (--a->paused_left <= 0) {
        /* Probe: one cheap round tells whether acceptance has recovered
         * (choose: its outcome decides). The estimate starts over from the
         * prior, as a new sequence's: the rounds before the pause do not
         * outweigh the probe, and one accepted draft does not read as
         * every draft accepted (held at 0.01 trials, it would, and the
         * next block would be k_max long).
         * A probe is run only where it could restart speculation: its best
         * outcome, its draft accepted, moves the estimate to `hit`, and
         * choose() restarts only where that pays by min_gain; and (as at a
         * start) the tokens left must repay the open it costs (the drafter
         * catches up on the sequence). Measured on two CPU cores at eight
         * streams, probes that could only pause again cost a load 10-25 %
         * of its speed. Where the drafter's acceptance on earlier requests
         * is below the prior, it is judged at that acceptance instead (the
         * remembered acceptance moves back towards the prior as requests
         * start paused, so a later request tries again). Estimates that
         * scores measured in this pause stand instead of the prior. */
        if (!a->scored) {
            a->accepted_ema = a->p.accept_prior;
            a->trials_ema = 1.0;
            a->accept_rate = a->p.accept_prior;
            a->pos = a->p.accept_positions;
        }
        tdm_adaptive hit = *a;
        if (a->p.accept_prior >= PRIOR_ACCEPT)
            note_acceptance(&hit, 1, 1);
        int k;
        const double best = best_speedup(&hit, a->p.k_max, &k);
        const double judged = hit.accept_rate;
        if (best < 1.0 + a->p.min_gain || !open_repays(a, best)) {
            a->paused_left = a->pause_len;
            a->pause_why = best < 1.0 + a->p.min_gain ? "a probe could not restart it"
                                                      : "its tokens would not repay a probe's open";
            a->pause_at[0] = judged;
            a->pause_at[1] = a->cost;
            a->pause_at[2] = a->fixed;
            return;
        }
        a->k_next = 1;
        a->probes++;
        a->probing = true;
        a->since_start = 0;
        a->accepted_since_start = 0;
    }
}

bool tdm_adaptive_score_due(const tdm_adaptive *a)
{
    return a->k_next == 0 && !a->p.fixed && a->score_left <= 0 &&
           tdm_adaptive_ceiling(a) >= 1.0 + a->p.min_gain;
}

static bool relax(double *x, double timed, double step)
{
    if (!(*x > 0) || !isfinite(*x) || !(timed > 0) || timed >= *x)
        return false;
    *x += step * (timed - *x);
    return true;
}

bool tdm_adaptive_relax_costs(const tdm_adaptive *a, double *cost, double *fixed, double timed_cost,
                              double timed_fixed, double step)
{
    if (a->k_next > 0 || a->p.fixed || tdm_adaptive_ceiling(a) >= 1.0 + a->p.min_gain ||
        !(step > 0 && step <= 1))
        return false;
    const bool c = relax(cost, timed_cost, step);
    const bool f = relax(fixed, timed_fixed, step);
    return c || f;
}

void tdm_adaptive_timed(double plain_ms, int n, int drafted, double verify_ms, double token_ms,
                        double pass_ms, double exchange_ms, double *cost, double *fixed)
{
    *cost = *fixed = -1.0;
    if (!(plain_ms > 0) || n < 1 || drafted < 1)
        return;
    const double share = plain_ms / n;
    *cost = ((verify_ms > 0 ? verify_ms : 0) + (token_ms > 0 ? token_ms : 0)) / share;
    *fixed = ((pass_ms > 0 ? pass_ms / drafted : 0) + (exchange_ms > 0 ? exchange_ms : 0)) / share;
}

int tdm_score_rounds(const uint8_t *hits, int n, int k, void (*fn)(void *, int, int), void *user)
{
    int rounds = 0;
    for (int j = 0; j < n && k > 0;) {
        int acc = 0;
        while (acc < k && j + acc < n && hits[j + acc])
            acc++;
        if (acc < k && j + acc >= n)
            break; /* runs past the positions scored: its outcome is not known */
        fn(user, k, acc);
        rounds++;
        j += acc + 1; /* then the verifier's token: the correction, or the bonus */
    }
    return rounds;
}

typedef struct scored_into {
    tdm_adaptive *a;
    tdm_accept_memory *m;
} scored_into;

static void note_scored_round(void *user, int k, int n)
{
    const scored_into *to = user;
    note_acceptance(to->a, k, n);
    if (to->m)
        tdm_accept_memory_note(to->m, k, n);
}

void tdm_adaptive_on_scored(tdm_adaptive *a, const uint8_t *hits, int n, tdm_accept_memory *m)
{
    if (a->k_next > 0 || a->p.fixed)
        return;
    a->scores++;
    scored_into to = {a, m};
    if (tdm_score_rounds(hits, n, a->p.k_max, note_scored_round, &to) > 0)
        a->scored = true;
    a->score_left = score_every(a);
    int k = 1;
    const double best = best_speedup(a, a->p.k_max, &k);
    if (!a->scored || best < 1.0 + a->p.min_gain || !open_repays(a, best))
        return;
    /* Measured on rounds as a block would run them: speculation restarts as
     * after a probe whose draft was accepted. */
    a->k_next = k;
    a->paused_left = 0;
    a->probing = false;
    a->since_start = 0;
    a->accepted_since_start = 0;
    a->below = 0;
    a->lost = 0;
    a->scored = false;
    a->score_starts++;
}

/* ---- a drafter's acceptance across requests --------------------------------- */

void tdm_accept_memory_note(tdm_accept_memory *m, int k, int n)
{
    if (k <= 0)
        return;
    m->accepted = (1.0 - ACCEPT_WEIGHT) * m->accepted + ACCEPT_WEIGHT * n;
    m->trials = (1.0 - ACCEPT_WEIGHT) * m->trials + ACCEPT_WEIGHT * (n + (n < k));
    tdm_accept_positions_note(&m->pos, k, n);
}

double tdm_accept_memory_prior(tdm_accept_memory *m, bool nudge)
{
    if (m->trials < 0.4)
        return -1.0;
    const double a = m->accepted / m->trials;
    if (nudge && a < PRIOR_ACCEPT)
        m->accepted = 0.9 * m->accepted + 0.1 * PRIOR_ACCEPT * m->trials;
    if (nudge) /* the positions' observations fade: a later request tries them again */
        for (int i = 0; i < TDM_ADAPTIVE_POSITIONS; i++) {
            m->pos.hit[i] *= 0.9;
            m->pos.weight[i] *= 0.9;
        }
    return a < 0.02 ? 0.02 : a > PRIOR_ACCEPT ? PRIOR_ACCEPT : a;
}

double tdm_accept_memory_rate(const tdm_accept_memory *m)
{
    return m->trials < 0.4 ? -1.0 : m->accepted / m->trials;
}

void tdm_open_cost_note(tdm_open_cost *c, double ms)
{
    if (!(ms >= 0) || !isfinite(ms))
        return;
    c->ms[c->n++ % 3] = ms;
}

double tdm_open_cost_ms(const tdm_open_cost *c)
{
    return c->n < 3 ? -1.0 : tdm_median3(c->ms);
}

double tdm_run_ahead_gain(double accept, int k, double chain_ms, double verify_ms)
{
    if (k <= 0 || !(chain_ms >= 0) || !(verify_ms >= 0))
        return 0.0;
    const double a = accept < 0 ? 0 : accept > 1 ? 1 : accept;
    const double ahead_ms = chain_ms * (k + 1) / k;
    return pow(a, k + 1) * chain_ms - (ahead_ms > verify_ms ? ahead_ms - verify_ms : 0.0);
}

/* ---- the cost model -------------------------------------------------------- */

void tdm_steptime_add(tdm_steptime *m, int rows, double ms)
{
    const double keep = 0.97;
    double R = rows;
    m->s0 = keep * m->s0 + 1;
    m->s1 = keep * m->s1 + R;
    m->s2 = keep * m->s2 + R * R;
    m->t0 = keep * m->t0 + ms;
    m->t1 = keep * m->t1 + R * ms;
}

void tdm_steptime_tick(tdm_steptime *m)
{
    m->round++;
}

/* Whether n sequences' plain round was measured within the last
 * TDM_STEPTIME_PLAIN_FRESH rounds. */
static bool plain_fresh(const tdm_steptime *m, int n)
{
    return n >= 1 && n <= TDM_STEPTIME_PLAIN_MAX && m->plain_at[n] != 0 &&
           m->round + 1 - m->plain_at[n] < TDM_STEPTIME_PLAIN_FRESH;
}

void tdm_steptime_add_plain(tdm_steptime *m, int n, double ms)
{
    if (n < 1 || n > TDM_STEPTIME_PLAIN_MAX || !(ms > 0) || !isfinite(ms))
        return;
    /* A measurement older than it may stand for is replaced, not averaged. */
    m->plain_ms[n] = plain_fresh(m, n) ? (1.0 - EMA_WEIGHT) * m->plain_ms[n] + EMA_WEIGHT * ms : ms;
    m->plain_at[n] = m->round + 1; /* 0 means never */
}

bool tdm_steptime_wants_plain(const tdm_steptime *m, int n)
{
    return n >= 1 && n <= TDM_STEPTIME_PLAIN_MAX && !plain_fresh(m, n);
}

double tdm_steptime_cost_at(const tdm_steptime *m, double cost_ms, int n)
{
    double round;
    if (!(cost_ms > 0) || n < 1 || !tdm_steptime_plain(m, n, &round) || !(round > 0))
        return -1.0;
    return cost_ms / (round / n);
}

bool tdm_steptime_plain(const tdm_steptime *m, int n, double *out)
{
    if (plain_fresh(m, n)) {
        *out = m->plain_ms[n];
        return true;
    }
    if (m->s0 < 1.0)
        return false;
    double det = m->s0 * m->s2 - m->s1 * m->s1;
    double meanR = m->s1 / m->s0, mean_t = m->t0 / m->s0;
    double b, a;
    if (det > 1e-6 * m->s0 * m->s0) {
        b = (m->s0 * m->t1 - m->s1 * m->t0) / det;
        a = (m->t0 - b * m->s1) / m->s0;
    } else if (n >= 1 && n <= TDM_STEPTIME_PLAIN_MAX && m->plain_at[n] != 0) {
        /* The recent steps had one row count (a long run of fixed blocks):
         * no line through them. A plain round of n measured long ago is
         * still a measurement; time proportional to rows, on a GPU, put a
         * plain round of one sequence at a ninth of its time (9-row verify
         * steps of 4.28 ms: 0.48 against 3.7), and every draft read as
         * costing 3.2 plain steps instead of 0.3. */
        *out = m->plain_ms[n];
        return true;
    } else {
        /* One row count seen so far: assume time proportional to rows. */
        b = mean_t / meanR;
        a = 0;
    }
    if (b < 0)
        b = 0;
    if (a < 0)
        a = 0;
    double t = a + b * n;
    if (!(t > 0))
        return false;
    *out = t;
    return true;
}

bool tdm_steptime_round_cost(const tdm_steptime *m, int seqs, int spec, int drafted,
                             double round_ms, double exchange_ms, double *fixed, double *per_draft)
{
    *fixed = *per_draft = -1.0;
    double plain_round;
    if (drafted <= 0 || spec <= 0 || seqs <= 0 || !tdm_steptime_plain(m, seqs, &plain_round))
        return false;
    const double plain_seq = plain_round / seqs;
    double extra = round_ms - plain_round;
    if (extra < 0)
        extra = 0;
    double ex = exchange_ms > 0 ? exchange_ms : 0;
    if (ex > extra)
        ex = extra;
    *fixed = ex / (spec * plain_seq);
    *per_draft = (extra - ex) / (drafted * plain_seq);
    return true;
}
