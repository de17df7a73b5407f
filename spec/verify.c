#include "verify.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

size_t tdm_verify_scratch_bytes(int vocab)
{
    return (size_t)vocab * (2 * sizeof(float) + sizeof(int));
}

static int bonus_draw(uint64_t seed, uint32_t position, const float *target_probs, int vocab);

int tdm_verify_sample_one(const tdm_sampling *s, uint64_t seed, uint32_t position,
                          const float *logits, int vocab, void *scratch)
{
    if (tdm_sampling_is_greedy(s))
        return tdm_sampling_argmax(logits, vocab);
    float *p = scratch;
    int *order = (int *)(p + 2 * (size_t)vocab);
    tdm_sampling_probs(s, logits, vocab, p, order);
    return bonus_draw(seed, position, p, vocab);
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

static int sampled_block(const tdm_sampling *s, uint64_t seed, uint32_t position,
                         const float *logits, int vocab, const uint32_t *drafts, int k,
                         const tdm_draft_dist *dists, void *scratch, tdm_verdict *out);

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

    return sampled_block(s, seed, position, target_logits, vocab, drafts, k, dists, scratch, out);
}

/* Row i's acceptance test: the uniform of its position's stream, the first
 * it draws. A draft the drafter could not have drawn (q = 0) is rejected
 * outright. */
static bool accepts(tdm_rng *rng, uint64_t seed, uint32_t position, float px, float qx)
{
    tdm_rng_seed_at(rng, seed, position, TDM_DRAW_TARGET);
    const double u = tdm_rng_uniform(rng);
    return qx > 0.0f && (px >= qx || u * (double)qx < (double)px);
}

int tdm_verify_accepted(uint64_t seed, uint32_t position, const float *target_px,
                        const uint32_t *drafts, int k, const tdm_draft_dist *dists)
{
    tdm_rng rng;
    int i = 0;
    while (i < k && accepts(&rng, seed, position + (uint32_t)i, target_px[i],
                            draft_prob(dists ? &dists[i] : NULL, drafts[i], drafts[i])))
        i++;
    return i;
}

/* The draw after the acceptance test failed, from rng as that test left it:
 * normalise(max(0, p - q)) into resid. */
static int residual_draw(tdm_rng *rng, const float *p, int vocab, uint32_t x,
                         const tdm_draft_dist *d, float *resid)
{
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
    /* p == q exactly: rejection has probability zero; rounding got us here.
     * Sampling from p is then the exact answer. */
    if (mass <= 0.0)
        return tdm_sampling_draw(p, vocab, tdm_rng_uniform(rng));
    /* the residual unnormalised: the uniform scaled to its mass */
    return tdm_sampling_draw(resid, vocab, tdm_rng_uniform(rng) * mass);
}

int tdm_verify_residual(uint64_t seed, uint32_t position, const float *target_probs, int vocab,
                        uint32_t draft, const tdm_draft_dist *dist, void *scratch)
{
    tdm_rng rng;
    tdm_rng_seed_at(&rng, seed, position, TDM_DRAW_TARGET);
    (void)tdm_rng_uniform(&rng); /* the acceptance test's */
    return residual_draw(&rng, target_probs, vocab, draft, dist, scratch);
}

double tdm_verify_bonus_uniform(uint64_t seed, uint32_t position)
{
    tdm_rng rng;
    tdm_rng_seed_at(&rng, seed, position, TDM_DRAW_TARGET);
    return tdm_rng_uniform(&rng);
}

/* The draw from a row's distribution: the first uniform of its position's
 * stream (the bonus token's, or plain decoding's). */
static int bonus_draw(uint64_t seed, uint32_t position, const float *target_probs, int vocab)
{
    return tdm_sampling_draw(target_probs, vocab, tdm_verify_bonus_uniform(seed, position));
}

/* Rejection sampling over rows of logits, each row's distribution worked
 * out into scratch as the tests reach it. */
static int sampled_block(const tdm_sampling *s, uint64_t seed, uint32_t position,
                         const float *logits, int vocab, const uint32_t *drafts, int k,
                         const tdm_draft_dist *dists, void *scratch, tdm_verdict *out)
{
    float *p = scratch;
    float *resid = p + vocab;
    int *order = (int *)(resid + vocab);
    tdm_rng rng;
    for (int i = 0; i < k; i++) {
        const tdm_draft_dist *d = dists ? &dists[i] : NULL;
        tdm_sampling_probs(s, logits + (size_t)i * (size_t)vocab, vocab, p, order);
        if (accepts(&rng, seed, position + (uint32_t)i, p[drafts[i]],
                    draft_prob(d, drafts[i], drafts[i])))
            continue;
        out->accepted = i;
        out->next_token = residual_draw(&rng, p, vocab, drafts[i], d, resid);
        return 0;
    }
    tdm_sampling_probs(s, logits + (size_t)k * (size_t)vocab, vocab, p, order);
    out->accepted = k;
    out->next_token = bonus_draw(seed, position + (uint32_t)k, p, vocab);
    return 0;
}
