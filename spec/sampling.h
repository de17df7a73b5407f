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
