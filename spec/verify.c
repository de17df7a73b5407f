#include "verify.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

size_t tdm_verify_scratch_bytes(int vocab)
{
    return (size_t)vocab * (2 * sizeof(float) + sizeof(int));
}

int tdm_verify_sample_probs(uint64_t seed, uint32_t position, const float *probs, int vocab)
{
    tdm_rng rng;
    tdm_rng_seed_at(&rng, seed, position, TDM_DRAW_TARGET);
    return tdm_sampling_draw(probs, vocab, tdm_rng_uniform(&rng));
}

int tdm_verify_sample_one(const tdm_sampling *s, uint64_t seed, uint32_t position,
                          const float *logits, int vocab, void *scratch)
{
    if (tdm_sampling_is_greedy(s))
        return tdm_sampling_argmax(logits, vocab);
    float *p = scratch;
    int *order = (int *)(p + 2 * (size_t)vocab);
    tdm_sampling_probs(s, logits, vocab, p, order);
    return tdm_verify_sample_probs(seed, position, p, vocab);
}

/* -1 when a draft token or a distribution id is outside the vocabulary. */
static int check_block(int vocab, const uint32_t *drafts, int k, const tdm_draft_dist *dists)
{
    for (int i = 0; i < k; i++) {
        if (drafts[i] >= (uint32_t)vocab)
            return -1;
        if (dists && dists[i].n > 0)
            for (int j = 0; j < dists[i].n; j++)
                if (dists[i].ids[j] >= (uint32_t)vocab)
                    return -1;
    }
    return 0;
}

int tdm_verify_block_argmax(const int32_t *target_argmax, int vocab, const uint32_t *drafts, int k,
                            const tdm_draft_dist *dists, tdm_verdict *out)
{
    if (check_block(vocab, drafts, k, dists) < 0)
        return -1;
    int i = 0;
    while (i < k && (uint32_t)target_argmax[i] == drafts[i])
        i++;
    out->accepted = i;
    out->next_token = target_argmax[i];
    return 0;
}

/* q(x) for the draft distribution at one position. */
static float draft_prob(const tdm_draft_dist *d, uint32_t drafted, uint32_t x)
{
    if (d == NULL || d->n == 0)
        return x == drafted ? 1.0f : 0.0f;
    for (int i = 0; i < d->n; i++)
        if (d->ids[i] == x)
            return d->probs[i];
    return 0.0f;
}

/* Rejection sampling over rows that are logits (given false: each row's
 * distribution worked out into scratch) or already distributions. */
static int sampled_block(const tdm_sampling *s, uint64_t seed, uint32_t position, const float *rows,
                         bool given, int vocab, const uint32_t *drafts, int k,
                         const tdm_draft_dist *dists, void *scratch, tdm_verdict *out);

int tdm_verify_block_probs(const tdm_sampling *s, uint64_t seed, uint32_t position,
                           const float *target_probs, int vocab, const uint32_t *drafts, int k,
                           const tdm_draft_dist *dists, void *scratch, tdm_verdict *out)
{
    if (check_block(vocab, drafts, k, dists) < 0)
        return -1;
    return sampled_block(s, seed, position, target_probs, true, vocab, drafts, k, dists, scratch,
                         out);
}

int tdm_verify_block(const tdm_sampling *s, uint64_t seed, uint32_t position,
                     const float *target_logits, int vocab, const uint32_t *drafts, int k,
                     const tdm_draft_dist *dists, void *scratch, tdm_verdict *out)
{
    if (check_block(vocab, drafts, k, dists) < 0)
        return -1;

    if (tdm_sampling_is_greedy(s)) {
        int i = 0;
        for (; i < k; i++) {
            int best = tdm_sampling_argmax(target_logits + (size_t)i * vocab, vocab);
            if ((uint32_t)best != drafts[i]) {
                out->accepted = i;
                out->next_token = best;
                return 0;
            }
        }
        out->accepted = k;
        out->next_token = tdm_sampling_argmax(target_logits + (size_t)k * vocab, vocab);
        return 0;
    }

    return sampled_block(s, seed, position, target_logits, false, vocab, drafts, k, dists, scratch,
                         out);
}

/* Row i's distribution: the given row, or worked out into p. */
static const float *row_probs(const tdm_sampling *s, const float *rows, bool given, int vocab,
                              int i, float *p, int *order)
{
    const float *row = rows + (size_t)i * (size_t)vocab;
    if (given)
        return row;
    tdm_sampling_probs(s, row, vocab, p, order);
    return p;
}

static int sampled_block(const tdm_sampling *s, uint64_t seed, uint32_t position, const float *rows,
                         bool given, int vocab, const uint32_t *drafts, int k,
                         const tdm_draft_dist *dists, void *scratch, tdm_verdict *out)
{
    float *pbuf = scratch;
    float *resid = pbuf + vocab;
    int *order = (int *)(resid + vocab);
    tdm_rng rng;
    for (int i = 0; i < k; i++) {
        tdm_rng_seed_at(&rng, seed, position + (uint32_t)i, TDM_DRAW_TARGET);
        const tdm_draft_dist *d = dists ? &dists[i] : NULL;
        const float *p = row_probs(s, rows, given, vocab, i, pbuf, order);
        uint32_t x = drafts[i];
        float px = p[x];
        float qx = draft_prob(d, x, x);
        /* Accept with probability min(1, p/q). A draft the drafter could not
         * have drawn (q = 0) is rejected outright. */
        double u = tdm_rng_uniform(&rng);
        if (qx > 0.0f && (px >= qx || u * (double)qx < (double)px))
            continue;
        /* Rejected: draw from normalise(max(0, p - q)). */
        memcpy(resid, p, sizeof(float) * (size_t)vocab);
        if (d == NULL || d->n == 0) {
            resid[x] -= 1.0f;
        } else {
            for (int j = 0; j < d->n; j++)
                resid[d->ids[j]] -= d->probs[j];
        }
        double mass = 0.0;
        for (int t = 0; t < vocab; t++) {
            if (resid[t] < 0.0f)
                resid[t] = 0.0f;
            mass += resid[t];
        }
        int next;
        if (mass <= 0.0) {
            /* p == q exactly: rejection has probability zero; rounding got us
             * here. Sampling from p is then the exact answer. */
            next = tdm_sampling_draw(p, vocab, tdm_rng_uniform(&rng));
        } else {
            double v = tdm_rng_uniform(&rng) * mass;
            next = -1;
            double acc = 0.0;
            for (int t = 0; t < vocab; t++) {
                if (resid[t] <= 0.0f)
                    continue;
                acc += resid[t];
                next = t;
                if (v < acc)
                    break;
            }
        }
        out->accepted = i;
        out->next_token = next;
        return 0;
    }
    const float *p = row_probs(s, rows, given, vocab, k, pbuf, order);
    tdm_rng_seed_at(&rng, seed, position + (uint32_t)k, TDM_DRAW_TARGET);
    out->accepted = k;
    out->next_token = tdm_sampling_draw(p, vocab, tdm_rng_uniform(&rng));
    return 0;
}
