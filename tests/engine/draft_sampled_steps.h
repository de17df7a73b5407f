/*
 * draft_sampled_steps.h - sampled draft chains (tdm_seq_draft_sampled)
 * against their definition, on any backend: shared by the engine's graph
 * test (CPU) and the CUDA graph test.
 */
#ifndef TANDEM_TESTS_ENGINE_DRAFT_SAMPLED_STEPS_H
#define TANDEM_TESTS_ENGINE_DRAFT_SAMPLED_STEPS_H

#include "engine.h"

/* On fixture `name` loaded onto be: a verify call whose sampled sequences'
 * rows are kept as distributions (tdm_step_out.probs_of) against its
 * logits turned on the host (tdm_sampling_probs): each sequence's draw
 * from its last row, each other row's probability of the next row's token,
 * every kept row fetched (tdm_step_probs_fetch), a greedy one's logits
 * untouched and not kept, nothing kept after the next call. With and
 * without a draft vocabulary:
 * three sequences draft in one call (two sampled under settings that cut
 * the support by top-k, top-p, both or neither, one greedy), each against
 * the same model drafting by verify calls, each draft drawn on the host
 * (tdm_sampling_probs + tdm_sampling_draw with the same uniform) from the
 * verify call's logits. The drafts must be the same, and each draft's
 * distribution the host's: to the bit on the CPU backend, within 1e-6 with
 * the same support on others. A commit after them leaves both sequences
 * the same state. Both again on the backend without sample_to (the
 * engine's host paths); a step's distributions on a model with a draft
 * vocabulary are refused. Exits on a failure. */
void draft_sampled_check(const char *name, tdm_backend *be);

#endif
