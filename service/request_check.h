/*
 * request_check.h - the checks every service applies to the generation
 * parameters a client (or a peer) sends, so that the gateway and the
 * verifier refuse the same values with the same words, and the one reading
 * of a request's sampling settings.
 */
#ifndef TANDEM_COMMON_REQUEST_CHECK_H
#define TANDEM_COMMON_REQUEST_CHECK_H

#include "sampling.h"
#include "status.h"
#include "tandem/v1/common.pb-c.h"

#include <stdint.h>

/* Largest max_tokens a request may ask for. */
#define TDM_REQ_MAX_TOKENS (1u << 20)

/* INVALID_ARGUMENT naming the field when temperature is outside 0..100 or
 * top_p outside 0..1 (NaN included); sp may be NULL (defaults). */
tdm_status tdm_req_check_sampling(const Tandem__V1__SamplingParams *sp, tdm_error *err);

/* INVALID_ARGUMENT when max_tokens is above TDM_REQ_MAX_TOKENS. */
tdm_status tdm_req_check_max_tokens(uint32_t max_tokens, tdm_error *err);

/* The sampling settings of sp (NULL: greedy defaults). */
tdm_sampling tdm_req_sampling(const Tandem__V1__SamplingParams *sp);

#endif
