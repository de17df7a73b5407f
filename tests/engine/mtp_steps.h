/*
 * mtp_steps.h - the MTP head's row contract (engine/mtp.h) on any backend:
 * a prime in one call or in chunks, drafts in one call or two, rollback to
 * the primed prefix then a prime of the verified rows against a fresh
 * sequence, batches of sequences (tdm_mtp_prime_n, tdm_mtp_draft_n) against
 * each alone, misuse refused, a second head (tdm_mtp_open) giving the same
 * bits. Shared by the engine's test (CPU) and the CUDA test, which also
 * compares what it brings back across backends.
 */
#ifndef TANDEM_TESTS_ENGINE_MTP_STEPS_H
#define TANDEM_TESTS_ENGINE_MTP_STEPS_H

#include "mtp.h"

#define MTP_STEPS_PROMPT 10 /* primed positions before the first draft */
#define MTP_STEPS_DRAFTS 4

typedef struct mtp_steps_out {
    float *prime; /* host [rows, vocab]: a fresh sequence primed with every row */
    float *draft; /* host [MTP_STEPS_DRAFTS, vocab]: the drafts' logits after it */
    int32_t drafts[MTP_STEPS_DRAFTS];
    int rows;
} mtp_steps_out;

/* Runs the checks on head h of model m loaded from dir (h2: the same head
 * loaded another way); exits on a failure naming `name`. *out gets what
 * came back (free it with mtp_steps_out_free). fp8: m, h and h2 compute with
 * FP8 weights; the draft vocabulary's checks, on fresh heads of m whose rows
 * must give the whole head's logits, are then left out (a vocabulary's rows
 * round on a scale of their own). */
void mtp_steps_check(const char *name, const char *dir, tdm_model *m, tdm_mtp *h, tdm_mtp *h2,
                     int fp8, mtp_steps_out *out);
void mtp_steps_out_free(mtp_steps_out *o);

#endif
