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

/* Sort context for qsort: descending probability, ascending id on ties, so
 * the support chosen by top-k / top-p is deterministic. */
static _Thread_local const float *tl_sort_probs;

static int cmp_desc(const void *a, const void *b)
{
    int ia = *(const int *)a, ib = *(const int *)b;
    float pa = tl_sort_probs[ia], pb = tl_sort_probs[ib];
    if (pa > pb)
        return -1;
    if (pa < pb)
        return 1;
    return (ia > ib) - (ia < ib);
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

    for (int i = 0; i < vocab; i++)
        order[i] = i;
    tl_sort_probs = probs;
    qsort(order, (size_t)vocab, sizeof(int), cmp_desc);
    int keep = use_k ? (int)s->top_k : vocab;
    if (use_p) {
        double mass = 0.0;
        int n = 0;
        while (n < keep) {
            mass += probs[order[n]];
            n++;
            if (mass >= (double)s->top_p)
                break;
        }
        keep = n;
    }
    double kept = 0.0;
    for (int i = 0; i < keep; i++)
        kept += probs[order[i]];
    for (int i = keep; i < vocab; i++)
        probs[order[i]] = 0.0f;
    for (int i = 0; i < keep; i++)
        probs[order[i]] = (float)((double)probs[order[i]] / kept);
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
