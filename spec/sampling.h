/*
 * sampling.h - turning logits into tokens: a seeded random generator, the
 * sampling distribution (temperature, top-k, top-p), argmax and draws.
 *
 * Shared by the verifier (target sampling, rejection sampling) and the
 * drafter (draft sampling), so that both sides apply the same settings the
 * same way. Everything here is pure computation over caller-owned arrays.
 */
#ifndef TANDEM_SPEC_SAMPLING_H
#define TANDEM_SPEC_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

/* xoshiro256** seeded through splitmix64: fast, reproducible across builds. */
typedef struct tdm_rng {
    uint64_t s[4];
} tdm_rng;

void tdm_rng_seed(tdm_rng *rng, uint64_t seed);
uint64_t tdm_rng_next(tdm_rng *rng);
/* Uniform in [0, 1) with 53 random bits. */
double tdm_rng_uniform(tdm_rng *rng);

/* Who draws at a position: each has its own independent stream, so that the
 * drafter's draw and the verifier's acceptance test at one position never
 * share a number. */
typedef enum {
    TDM_DRAW_TARGET = 1, /* the verifier: acceptance test, then the token drawn */
    TDM_DRAW_DRAFT = 2,  /* the drafter's proposal */
} tdm_draw_stream;

/* The generator for the draws of one position of a request: keyed by the
 * request's seed, the position of the token being drawn in the whole
 * sequence (prompt first) and the stream, not by how many numbers were
 * drawn before. A request that continues elsewhere from its tokens (after
 * a move or a crash) therefore draws exactly what it would have drawn. */
void tdm_rng_seed_at(tdm_rng *rng, uint64_t seed, uint64_t position, tdm_draw_stream stream);

typedef struct tdm_sampling {
    float temperature; /* <= 0: greedy */
    float top_p;       /* <= 0 or >= 1: off */
    uint32_t top_k;    /* 0: off */
} tdm_sampling;

bool tdm_sampling_is_greedy(const tdm_sampling *s);

/* Index of the largest logit; the lowest index wins ties (as torch.argmax). */
int tdm_sampling_argmax(const float *logits, int vocab);

/*
 * The distribution tokens are drawn from under `s`: softmax(logits / T)
 * restricted to the top-k tokens and then to the smallest prefix of the
 * sorted tokens whose mass reaches top_p, renormalised. For greedy settings
 * it is a one-hot on the argmax. Writes probs[vocab] (zeros outside the
 * support); `order` is scratch of vocab ints. Returns the support size.
 */
int tdm_sampling_probs(const tdm_sampling *s, const float *logits, int vocab, float *probs,
                       int *order);

/* Draws from probs[vocab] (summing to ~1) with the uniform u in [0,1). */
int tdm_sampling_draw(const float *probs, int vocab, double u);

#endif
