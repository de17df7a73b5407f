#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tdm_rng_seed(tdm_rng *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

void tdm_rng_seed_at(tdm_rng *rng, uint64_t seed, uint64_t position, tdm_draw_stream stream)
{
    uint64_t x = seed;
    uint64_t h = splitmix64(&x);
    x = h ^ position;
    h = splitmix64(&x);
    x = h ^ (uint64_t)stream;
    tdm_rng_seed(rng, splitmix64(&x));
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t tdm_rng_next(tdm_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double tdm_rng_uniform(tdm_rng *rng)
{
    return (double)(tdm_rng_next(rng) >> 11) * 0x1.0p-53;
}

bool tdm_sampling_is_greedy(const tdm_sampling *s)
{
    return s == NULL || !(s->temperature > 0.0f) || s->top_k == 1;
}

int tdm_sampling_argmax(const float *logits, int vocab)
{
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* The support's order: descending probability, ascending id on ties, so
 * the support chosen by top-k / top-p is deterministic. Only its first
 * tokens are ever needed: top-k selects k of them before sorting, and top-p
 * sorts the tokens above a threshold whose mass reaches top_p, not the
 * vocabulary (a sort of 10^5 ids a sampled row). */
static _Thread_local const float *tl_sort_probs;

static inline bool before(const float *p, int a, int b)
{
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

static int cmp_desc(const void *a, const void *b)
{
    const int ia = *(const int *)a, ib = *(const int *)b;
    return before(tl_sort_probs, ia, ib) ? -1 : before(tl_sort_probs, ib, ia) ? 1 : 0;
}

static void sort_desc(int *order, int n, const float *probs)
{
    tl_sort_probs = probs;
    qsort(order, (size_t)n, sizeof(int), cmp_desc);
}

static inline void swap_int(int *a, int *b)
{
    int t = *a;
    *a = *b;
    *b = t;
}

/* Moves the k first of order[0..n) in the support's order to order[0..k),
 * unsorted (quickselect; median-of-three pivots). */
static void select_first(int *order, int n, int k, const float *p)
{
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2, last = hi - 1;
        if (before(p, order[mid], order[lo]))
            swap_int(&order[mid], &order[lo]);
        if (before(p, order[last], order[lo]))
            swap_int(&order[last], &order[lo]);
        if (before(p, order[mid], order[last]))
            swap_int(&order[mid], &order[last]);
        const int pivot = order[last]; /* the median of the three */
        int store = lo;
        for (int i = lo; i < last; i++)
            if (before(p, order[i], pivot))
                swap_int(&order[i], &order[store++]);
        swap_int(&order[store], &order[last]);
        if (store == k)
            return;
        if (store < k)
            lo = store + 1;
        else
            hi = store;
    }
}

/* A probability's binary exponent (its float's biased exponent field):
 * larger exponents hold larger probabilities. */
static inline int prob_exponent(float p)
{
    uint32_t u;
    memcpy(&u, &p, sizeof(u));
    return (int)((u >> 23) & 0xff);
}

/* order[0..n): the tokens whose probability's exponent is at least E, for
 * the largest E that gives at least `count` of them whose mass reaches
 * `mass` (every token when none does), in id order: the support's first n
 * tokens, as every other token is less likely than each of them. Two passes
 * over the vocabulary: a histogram of the exponents, then the tokens. */
static int candidates(int *order, const float *probs, int vocab, int count, double mass)
{
    int nb[256] = {0};
    double mb[256] = {0};
    for (int i = 0; i < vocab; i++) {
        const int e = prob_exponent(probs[i]);
        nb[e]++;
        mb[e] += probs[i];
    }
    int E = 255, n = 0;
    double m = 0.0;
    for (; E > 0; E--) {
        n += nb[E];
        m += mb[E];
        if (n >= count && m >= mass)
            break;
    }
    n = 0;
    for (int i = 0; i < vocab; i++)
        if (prob_exponent(probs[i]) >= E)
            order[n++] = i;
    return n;
}

int tdm_sampling_probs(const tdm_sampling *s, const float *logits, int vocab, float *probs,
                       int *order)
{
    if (tdm_sampling_is_greedy(s)) {
        memset(probs, 0, sizeof(float) * (size_t)vocab);
        probs[tdm_sampling_argmax(logits, vocab)] = 1.0f;
        return 1;
    }
    /* Softmax in double for the normaliser: vocabularies of 10^5 small terms. */
    float maxl = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > maxl)
            maxl = logits[i];
    double inv_t = 1.0 / (double)s->temperature;
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) {
        double e = exp(((double)logits[i] - (double)maxl) * inv_t);
        probs[i] = (float)e;
        sum += e;
    }
    for (int i = 0; i < vocab; i++)
        probs[i] = (float)((double)probs[i] / sum);

    bool use_k = s->top_k > 0 && s->top_k < (uint32_t)vocab;
    bool use_p = s->top_p > 0.0f && s->top_p < 1.0f;
    if (!use_k && !use_p)
        return vocab;

    /* order[0..n): the support's first n tokens, sorted */
    int n;
    if (use_k) {
        const int c = candidates(order, probs, vocab, (int)s->top_k, 0.0);
        n = (int)s->top_k;
        select_first(order, c, n, probs);
    } else {
        n = candidates(order, probs, vocab, 1, (double)s->top_p);
    }
    sort_desc(order, n, probs);
    int keep = n;
    if (use_p) {
        double mass = 0.0;
        int m = 0;
        while (m < keep) {
            mass += probs[order[m]];
            m++;
            if (mass >= (double)s->top_p)
                break;
        }
        if (m == n && mass < (double)s->top_p && !use_k && n < vocab) {
            /* the sums in another order fell short of top_p: the whole order */
            for (int i = 0; i < vocab; i++)
                order[i] = i;
            sort_desc(order, vocab, probs);
            for (; m < vocab && mass < (double)s->top_p; m++)
                mass += probs[order[m]];
        }
        keep = m;
    }
    double kept = 0.0;
    for (int i = 0; i < keep; i++)
        kept += probs[order[i]];
    /* the support renormalised, marked by its sign; then every other token 0 */
    for (int i = 0; i < keep; i++)
        probs[order[i]] = -(float)((double)probs[order[i]] / kept);
    for (int i = 0; i < vocab; i++)
        probs[i] = probs[i] < 0.0f ? -probs[i] : 0.0f;
    return keep;
}

int tdm_sampling_draw(const float *probs, int vocab, double u)
{
    double acc = 0.0;
    int last = -1;
    for (int i = 0; i < vocab; i++) {
        if (probs[i] <= 0.0f)
            continue;
        acc += probs[i];
        last = i;
        if (u < acc)
            return i;
    }
    /* Rounding left u above the total mass: the last token in the support. */
    return last >= 0 ? last : 0;
}
