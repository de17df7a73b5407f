/*
 * steps.h - a fixed script of engine calls that goes through every shape of
 * forward step the services use: prompt chunks, decode across the KV
 * growth at 64 positions, verify + commit under extra_buffer, no_buffer and
 * replay, verify blocks beside decode rows, appended one-token verifies (how
 * a drafter drafts), batches whose membership and order change. Tests run it
 * twice under different conditions (graphs on and off, say) and compare
 * every logit and the final states to the bit.
 */
#ifndef TANDEM_TESTS_ENGINE_STEPS_H
#define TANDEM_TESTS_ENGINE_STEPS_H

#include "engine_internal.h"

#include <stddef.h>

#define STEPS_NSEQ 4

typedef struct steps_run {
    float *logits; /* every logit the script produced, in call order */
    size_t n, cap; /* floats */
    int calls;     /* engine calls that ran a forward pass */
    tdm_seq *seqs[STEPS_NSEQ];
} steps_run;

/* Runs the script on m (the same token ids every time); exits on an engine
 * error. The caller frees the result with steps_run_free. */
void steps_run_script(tdm_model *m, steps_run *r);
void steps_run_free(steps_run *r);

/* Whether two sequences (possibly of different models and backends) have
 * the same length and bit-identical committed states: conv windows,
 * recurrent states and the KV entries up to their length. */
int steps_same_state(const tdm_seq *a, const tdm_seq *b);

#endif
