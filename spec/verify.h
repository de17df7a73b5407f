/*
 * verify.h - deciding how many draft tokens the target accepts.
 *
 * Given the target's logits at the k+1 positions of a verify pass (after the
 * last committed token and after each of the k drafts) and the drafter's
 * proposal, returns the number of drafts accepted and the token the target
 * contributes (the correction at the first rejection, or the bonus token
 * when every draft was accepted).
 *
 * Greedy settings: accept while the draft equals the target's argmax.
 * Sampling settings: speculative rejection sampling (Leviathan et al. 2023,
 * Chen et al. 2023): accept draft x with probability min(1, p(x)/q(x)); on
 * rejection draw from normalise(max(0, p - q)); after k acceptances draw the
 * bonus token from p. The tokens produced are distributed exactly as if
 * sampled from p alone, whatever q is — provided q is the distribution the
 * drafter actually drew from.
 */
#ifndef TANDEM_SPEC_VERIFY_H
#define TANDEM_SPEC_VERIFY_H

#include "sampling.h"

#include <stddef.h>

#include <stdint.h>

/* The drafter's distribution at one position, sparse. n == 0 means a
 * one-hot on the drafted token (a greedy drafter). */
typedef struct tdm_draft_dist {
    int n;
    const uint32_t *ids;
    const float *probs;
} tdm_draft_dist;

typedef struct tdm_verdict {
    int accepted;   /* drafts accepted, 0..k */
    int next_token; /* correction or bonus token */
} tdm_verdict;

/*
 * target_logits: (k+1, vocab) row-major; drafts: k tokens; dists: k entries,
 * or NULL for one-hot drafts everywhere. scratch: 2*vocab floats + vocab ints
 * (see tdm_verify_scratch_bytes). Sampling settings draw from the request's
 * seed at each row's position (tdm_rng_seed_at, TDM_DRAW_TARGET): row i
 * decides the token at `position` + i of the sequence.
 * Returns -1 when a draft token or a distribution id is outside the
 * vocabulary (the caller treats the block as malformed); 0 otherwise.
 */
int tdm_verify_block(const tdm_sampling *s, uint64_t seed, uint32_t position,
                     const float *target_logits, int vocab,
                     const uint32_t *drafts, int k, const tdm_draft_dist *dists, void *scratch,
                     tdm_verdict *out);

/* Greedy settings from the target's argmax per row (k + 1 ids) instead of
 * its logits: the verdict tdm_verify_block gives for greedy settings, and
 * the same -1 for a block with a token outside the vocabulary. */
int tdm_verify_block_argmax(const int32_t *target_argmax, int vocab, const uint32_t *drafts, int k,
                            const tdm_draft_dist *dists, tdm_verdict *out);

/* Plain decoding: the token at `position` of the sequence from one row of
 * logits (the draw a verify row at that position makes when every draft
 * before it was accepted and it has none). */
int tdm_verify_sample_one(const tdm_sampling *s, uint64_t seed, uint32_t position,
                          const float *logits, int vocab,
                          void *scratch);

/* tdm_verify_block's sampled verdict in parts, for a caller that keeps the
 * target's distributions where they were worked out (a step's
 * tdm_step_out.probs_of) and brings back only what a verdict reads:
 *  - tdm_verify_accepted: how many drafts stand, from target_px[i] = row i's
 *    probability of drafts[i] (tdm_step_out.picked); dists as above, the
 *    ids already checked;
 *  - fewer than k: the token is tdm_verify_residual's, from the first
 *    rejected row's distribution (that row's position, draft and dist;
 *    scratch: tdm_verify_scratch_bytes);
 *  - all k: the token is tdm_sampling_draw's from row k's distribution with
 *    tdm_verify_bonus_uniform at position + k (tdm_step_out.drawn, with
 *    that uniform as the row's u). So is plain decoding's, k = 0. */
int tdm_verify_accepted(uint64_t seed, uint32_t position, const float *target_px,
                        const uint32_t *drafts, int k, const tdm_draft_dist *dists);
int tdm_verify_residual(uint64_t seed, uint32_t position, const float *target_probs, int vocab,
                        uint32_t draft, const tdm_draft_dist *dist, void *scratch);
double tdm_verify_bonus_uniform(uint64_t seed, uint32_t position);

size_t tdm_verify_scratch_bytes(int vocab);

#endif
