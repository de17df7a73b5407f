/*
 * draft_vocab_steps.h - a drafter model's draft vocabulary
 * (tdm_model_set_draft_vocab) against the same model without one, on any
 * backend: shared by the engine's graph test (CPU) and the CUDA graph test.
 */
#ifndef TANDEM_TESTS_ENGINE_DRAFT_VOCAB_STEPS_H
#define TANDEM_TESTS_ENGINE_DRAFT_VOCAB_STEPS_H

#include "engine.h"

/* On fixture `name` loaded onto be: misuse refused; a verify block's logits
 * are the whole model's at the listed tokens (every third and the last) and
 * -inf elsewhere, its argmaxes the best listed tokens; greedy drafts
 * (tdm_seq_draft, on the device where be can and by verify calls) are each
 * step's best listed token of the whole model's row, drafts and states the
 * same either way; and a commit after them leaves the states of a model
 * without a vocabulary. Exits on a failure. */
void draft_vocab_check(const char *name, tdm_backend *be);
/* With FP8 weights (tdm_model_set_weights_fp8), on fixture `name` (rows of
 * whole 64-value steps): a vocabulary of the LM head's rows of least
 * magnitude (where a scale of their own, finer than the head's, could round
 * a value otherwise: below the head's normal range), set before the rounding
 * and after it, streams the same bytes and gives the listed logits of the
 * whole rounded model: its rows are the rounded head's. Exits on a
 * failure. */
void draft_vocab_fp8_check(const char *name, tdm_backend *be);

#endif
