/*
 * request_check.h - the checks every service applies to what a client (or a
 * peer) sends, so that the gateway and the verifier refuse the same values
 * with the same words, and the one reading of a request's sampling settings.
 *
 * Every check here looks at one decoded message and the few numbers of the
 * service that receives it (vocabulary, context, block limits); none keeps
 * state, so each can be run on any bytes a peer might send (tests/fuzz).
 * Checks that need a sequence's state (a verdict against the outstanding
 * block) stay with the service that holds it.
 */
#ifndef TANDEM_COMMON_REQUEST_CHECK_H
#define TANDEM_COMMON_REQUEST_CHECK_H

#include "sampling.h"
#include "status.h"
#include "tandem/v1/common.pb-c.h"
#include "tandem/v1/drafter.pb-c.h"
#include "tandem/v1/gateway.pb-c.h"
#include "tandem/v1/verifier.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* Largest max_tokens a request may ask for. */
#define TDM_REQ_MAX_TOKENS (1u << 20)

/* INVALID_ARGUMENT naming the field when temperature is outside 0..100 or
 * top_p outside 0..1 (NaN included); sp may be NULL (defaults). */
tdm_status tdm_req_check_sampling(const Tandem__V1__SamplingParams *sp, tdm_error *err);

/* INVALID_ARGUMENT when max_tokens is above TDM_REQ_MAX_TOKENS. */
tdm_status tdm_req_check_max_tokens(uint32_t max_tokens, tdm_error *err);

/* A client-chosen string that is echoed back and logged (`what` names it):
 * INVALID_ARGUMENT when it is longer than max bytes, not UTF-8 or holds a
 * control character. */
tdm_status tdm_req_check_label(const char *what, const char *s, size_t max, tdm_error *err);

/* What the gateway checks in a Generate request before it reads the prompt:
 * sampling, max_tokens, request_id, speculation mode and stop strings (at
 * most 16, each 1..256 bytes of UTF-8). INVALID_ARGUMENT naming the field. */
tdm_status tdm_req_check_generate(const Tandem__V1__GenerateRequest *req, tdm_error *err);

/* What a verifier with `vocab` tokens, a context of max_context positions
 * and blocks of at most max_draft tokens checks in a Run request before it
 * admits it: a non-empty prompt of ids inside the vocabulary that leaves a
 * position for the first generated token, max_tokens 1..TDM_REQ_MAX_TOKENS,
 * sampling, the drafter's block size (when a drafter with an address is
 * assigned). A Run that continues an imported snapshot (snapshot_id) takes
 * its prompt, max_tokens and sampling from the snapshot: it carries no
 * prompt_ids, and its max_tokens and sampling are not used. */
tdm_status tdm_req_check_run(const Tandem__V1__RunRequest *req, int vocab, int max_context,
                             int max_draft, tdm_error *err);

/* What a drafter with `vocab` tokens and blocks of at most max_block checks
 * in a SequenceOpen: tokens non-empty and inside the vocabulary, block_size
 * 1..max_block, sampling. INVALID_ARGUMENT naming the field. */
tdm_status tdm_req_check_sequence_open(const Tandem__V1__SequenceOpen *o, int vocab, int max_block,
                                       tdm_error *err);

/* Whether a DraftBlock can be verified as it is (a drafter is input like any
 * other): it continues from committed length `position`, holds at most
 * max_drafts tokens inside the vocabulary, as many probabilities (or none)
 * and distributions (or none), every probability in 0..1 and every
 * distribution's ids inside the vocabulary. INVALID_ARGUMENT saying what is
 * wrong ("block for position 7 (expected 5)", ...). */
tdm_status tdm_req_check_draft_block(const Tandem__V1__DraftBlock *b, uint32_t position,
                                     size_t max_drafts, int vocab, tdm_error *err);

/* Longest replica_id a replica may register under. */
#define TDM_REQ_MAX_REPLICA_ID 128
/* Most draft_pass_costs a drafter reports (it times batches of 1, 2, 4, 8, 16). */
#define TDM_REQ_MAX_DRAFT_COSTS 8

/* What the gateway checks in the Descriptor of a RegisterRequest (d may be
 * NULL: missing): role verifier or drafter, replica_id of 1..128 printable
 * characters without spaces, an address of at most 256 characters and an
 * instance_id of 1..64, draft_pass_costs of at most TDM_REQ_MAX_DRAFT_COSTS
 * entries in range. INVALID_ARGUMENT naming the field. */
tdm_status tdm_req_check_descriptor(const Tandem__V1__Descriptor *d, tdm_error *err);

/* The sampling settings of sp (NULL: greedy defaults). */
tdm_sampling tdm_req_sampling(const Tandem__V1__SamplingParams *sp);

#endif
