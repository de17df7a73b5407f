/*
 * request_check.c - checks of what clients and peers send (see
 * request_check.h).
 */
#include "request_check.h"

#include "compat.h"
#include "defs.h"
#include "feature_stream.h"
#include "tokenizer.h"

#include <ctype.h>
#include <string.h>

tdm_status tdm_req_check_sampling(const Tandem__V1__SamplingParams *sp, tdm_error *err)
{
    if (!sp)
        return TDM_OK;
    if (!(sp->temperature >= 0.0f) || sp->temperature > 100.0f)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "sampling.temperature %g is outside 0..100", sp->temperature);
    if (!(sp->top_p >= 0.0f) || sp->top_p > 1.0f)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "sampling.top_p %g is outside 0..1",
                             sp->top_p);
    return TDM_OK;
}

tdm_status tdm_req_check_max_tokens(uint32_t max_tokens, tdm_error *err)
{
    if (max_tokens > TDM_REQ_MAX_TOKENS)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "max_tokens %u is above %u", max_tokens,
                             TDM_REQ_MAX_TOKENS);
    return TDM_OK;
}

tdm_status tdm_req_check_label(const char *what, const char *s, size_t max, tdm_error *err)
{
    size_t n = strlen(s);
    if (n > max)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s has %zu bytes (at most %zu)", what,
                             n, max);
    tdm_status rc = tdm_tok_check_utf8(s, n, err);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "%s", what);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "%s holds a control character (byte 0x%02x at offset %zu)", what,
                                 (unsigned char)s[i], i);
    return TDM_OK;
}

tdm_status tdm_req_check_generate(const Tandem__V1__GenerateRequest *req, tdm_error *err)
{
    tdm_status rc = tdm_req_check_sampling(req->sampling, err);
    if (rc == TDM_OK)
        rc = tdm_req_check_max_tokens(req->max_tokens, err);
    if (rc == TDM_OK)
        rc = tdm_req_check_label("request_id", req->request_id, 128, err);
    if (rc != TDM_OK)
        return rc;
    const Tandem__V1__SpeculationParams *sp = req->speculation;
    if (sp && sp->mode != TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_AUTO &&
        sp->mode != TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_ON &&
        sp->mode != TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_OFF)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "speculation.mode %d is not a SpeculationMode (AUTO 0, ON 1, OFF 2)",
                             (int)sp->mode);
    if (req->n_stop > 16)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "at most 16 stop strings, got %zu",
                             req->n_stop);
    for (size_t i = 0; i < req->n_stop; i++) {
        size_t n = strlen(req->stop[i]);
        if (n == 0 || n > 256)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "stop[%zu] must be 1..256 bytes long", i);
        if ((rc = tdm_tok_check_utf8(req->stop[i], n, err)) != TDM_OK)
            return tdm_error_prefix(err, "stop[%zu]", i);
    }
    return TDM_OK;
}

/* A drafter's draft_pass_costs (field: where they came in, for the error). */
static tdm_status check_draft_costs(Tandem__V1__DraftPassCost *const *c, size_t n,
                                    const char *field, tdm_error *err)
{
    if (n > TDM_REQ_MAX_DRAFT_COSTS)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s has %zu entries, at most %d", field,
                             n, TDM_REQ_MAX_DRAFT_COSTS);
    for (size_t i = 0; i < n; i++)
        if (c[i]->sequences < 1 || c[i]->sequences > 65536 || c[i]->block < 1 ||
            c[i]->block > TDM_MAX_DRAFT_BLOCK || !(c[i]->millis > 0 && c[i]->millis < 600000))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "%s[%zu]: %u sequences, block %u, %g ms is out of range "
                                 "(1..65536 sequences, block 1..%d, 0..600000 ms)",
                                 field, i, c[i]->sequences, c[i]->block, (double)c[i]->millis,
                                 TDM_MAX_DRAFT_BLOCK);
    return TDM_OK;
}

/* A Run's drafter assignment, where it has one. */
static tdm_status check_drafter(const Tandem__V1__DrafterAssignment *da, int max_draft,
                                tdm_error *err)
{
    if (!da || !da->address[0])
        return TDM_OK;
    if (tdm_compat_check_request_block(da->block_size, "drafter.block_size", "(this verifier)",
                                       (uint32_t)max_draft, err) != TDM_OK)
        return err ? err->code : TDM_ERR_INVALID_ARGUMENT;
    return check_draft_costs(da->draft_pass_costs, da->n_draft_pass_costs,
                             "drafter.draft_pass_costs", err);
}

tdm_status tdm_req_check_run(const Tandem__V1__RunRequest *req, int vocab, int max_context,
                             int max_draft, tdm_error *err)
{
    const Tandem__V1__DrafterAssignment *da = req->drafter;
    if (req->snapshot_id && req->snapshot_id[0]) {
        /* echoed in errors: printable UTF-8 of bounded length, as request ids */
        tdm_status lrc = tdm_req_check_label("snapshot_id", req->snapshot_id, 128, err);
        if (lrc != TDM_OK)
            return lrc;
        if (req->n_prompt_ids != 0 || req->generated != 0)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "%s: a Run that continues snapshot %s takes its tokens from the "
                                 "snapshot; got %zu prompt ids, %u generated",
                                 req->n_prompt_ids ? "prompt_ids" : "generated", req->snapshot_id,
                                 req->n_prompt_ids, req->generated);
        return check_drafter(da, max_draft, err);
    }
    if (req->n_prompt_ids == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "prompt_ids is empty");
    for (size_t i = 0; i < req->n_prompt_ids; i++)
        if (req->prompt_ids[i] >= (uint32_t)vocab)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "prompt_ids[%zu] = %u is outside the vocabulary (0..%d)", i,
                                 req->prompt_ids[i], vocab - 1);
    if (req->max_tokens == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "max_tokens must be at least 1");
    if (req->generated >= req->n_prompt_ids || req->generated >= req->max_tokens)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "generated: %u of the %zu prompt_ids were generated, with max_tokens "
                             "%u; at least one must be prompt and one left to generate",
                             req->generated, req->n_prompt_ids, req->max_tokens);
    if (req->n_prompt_ids >= (size_t)max_context)
        return tdm_error_set(
            err, TDM_ERR_INVALID_ARGUMENT,
            "the prompt has %zu tokens; this verifier's max_context %d leaves room "
            "for at most %d (one position for the first generated token)",
            req->n_prompt_ids, max_context, max_context - 1);
    tdm_status rc = tdm_req_check_max_tokens(req->max_tokens, err);
    if (rc == TDM_OK)
        rc = tdm_req_check_sampling(req->sampling, err);
    if (rc != TDM_OK)
        return rc;
    return check_drafter(da, max_draft, err);
}

tdm_status tdm_req_check_sequence_open(const Tandem__V1__SequenceOpen *o, int vocab, int max_block,
                                       tdm_error *err)
{
    if (o->n_tokens == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "SequenceOpen.tokens is empty");
    for (size_t i = 0; i < o->n_tokens; i++)
        if (o->tokens[i] >= (uint32_t)vocab)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "SequenceOpen.tokens[%zu] = %u is outside the vocabulary (0..%d)",
                                 i, o->tokens[i], vocab - 1);
    if (o->score) {
        if (o->block_size != 0)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "SequenceOpen.score with block_size %u (a score drafts no block: "
                                 "0)",
                                 o->block_size);
        if (o->score_from < 1 || o->score_from > o->n_tokens)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "SequenceOpen.score_from %u is outside 1..%zu (its tokens)",
                                 o->score_from, o->n_tokens);
    } else if (o->block_size < 1 || o->block_size > (uint32_t)max_block) {
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "SequenceOpen.block_size %u is outside 1..%d", o->block_size,
                             max_block);
    }
    if (tdm_req_check_sampling(o->sampling, err) != TDM_OK)
        return tdm_error_prefix(err, "SequenceOpen");
    if (o->score) {
        const tdm_sampling sp = tdm_req_sampling(o->sampling);
        if (!tdm_sampling_is_greedy(&sp))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "SequenceOpen.score for a sequence that samples (greedy only: "
                                 "a sampled draft is not accepted exactly where it equals the "
                                 "token)");
    }
    return TDM_OK;
}

tdm_status tdm_req_check_draft_block(const Tandem__V1__DraftBlock *b, uint32_t position,
                                     size_t max_drafts, int vocab, tdm_error *err)
{
    if (b->position != position)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "block for position %u (expected %u)",
                             b->position, position);
    if (b->n_tokens > max_drafts)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "block of %zu drafts (at most %zu)",
                             b->n_tokens, max_drafts);
    if ((b->n_token_probs != 0 && b->n_token_probs != b->n_tokens) ||
        (b->n_dists != 0 && b->n_dists != b->n_tokens))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "block with %zu drafts but %zu probabilities and %zu distributions",
                             b->n_tokens, b->n_token_probs, b->n_dists);
    for (size_t j = 0; j < b->n_tokens; j++)
        if (b->tokens[j] >= (uint32_t)vocab)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "draft token %u outside the vocabulary (0..%d)", b->tokens[j],
                                 vocab - 1);
    for (size_t j = 0; j < b->n_token_probs; j++)
        if (!(b->token_probs[j] >= 0.0f && b->token_probs[j] <= 1.0f))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "draft probability %g outside 0..1",
                                 b->token_probs[j]);
    for (size_t j = 0; j < b->n_dists; j++) {
        const Tandem__V1__DraftDistribution *d = b->dists[j];
        if (d->n_ids != d->n_probs)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "distribution %zu with %zu ids and %zu probabilities", j, d->n_ids,
                                 d->n_probs);
        for (size_t t = 0; t < d->n_ids; t++)
            if (d->ids[t] >= (uint32_t)vocab || !(d->probs[t] >= 0.0f && d->probs[t] <= 1.0f))
                return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                     "distribution %zu with id %u or probability %g out of range",
                                     j, d->ids[t], d->probs[t]);
    }
    return TDM_OK;
}

tdm_status tdm_req_check_descriptor(const Tandem__V1__Descriptor *d, tdm_error *err)
{
    if (!d)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "RegisterRequest.descriptor is missing");
    if (d->role != TANDEM__V1__ROLE__ROLE_VERIFIER && d->role != TANDEM__V1__ROLE__ROLE_DRAFTER)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.role must be ROLE_VERIFIER or ROLE_DRAFTER, got %d",
                             (int)d->role);
    size_t len = strlen(d->replica_id);
    if (len == 0 || len > TDM_REQ_MAX_REPLICA_ID)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.replica_id must have 1 to %d characters, got %zu",
                             TDM_REQ_MAX_REPLICA_ID, len);
    for (size_t i = 0; i < len; i++)
        if (!isgraph((unsigned char)d->replica_id[i]))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "descriptor.replica_id may only hold printable characters "
                                 "without spaces (byte %zu is 0x%02x)",
                                 i, (unsigned char)d->replica_id[i]);
    if (!d->address[0] || strlen(d->address) > 256)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.address must be a host:port of at most 256 characters");
    if (!d->instance_id[0] || strlen(d->instance_id) > 64)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.instance_id must have 1 to 64 characters (a replica picks "
                             "a random one at start), got %zu",
                             strlen(d->instance_id));
    if (strlen(d->device_uuid) > 64)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.device_uuid may have at most 64 characters, got %zu",
                             strlen(d->device_uuid));
    if (strlen(d->host_id) > 64)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.host_id may have at most 64 characters, got %zu",
                             strlen(d->host_id));
    if (strlen(d->cpus) > TDM_CPULIST_TEXT_MAX)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.cpus may have at most %d characters, got %zu",
                             TDM_CPULIST_TEXT_MAX, strlen(d->cpus));
    tdm_cpulist cpus;
    if (d->cpus[0] && tdm_cpulist_parse(d->cpus, &cpus, err) != TDM_OK)
        return tdm_error_prefix(err, "descriptor.cpus");
    if (d->weights[0] && strcmp(d->weights, "checkpoint") != 0 && strcmp(d->weights, "fp8") != 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.weights must be empty, checkpoint or fp8, got '%.32s'",
                             d->weights);
    if (d->draft_vocab_size > d->vocab_size)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "descriptor.draft_vocab_size %u exceeds its vocab_size %u",
                             d->draft_vocab_size, d->vocab_size);
    tdm_status rc = check_draft_costs(d->draft_pass_costs, d->n_draft_pass_costs,
                                      "descriptor.draft_pass_costs", err);
    if (rc != TDM_OK)
        return rc;
    tdm_feat_request fr;
    return tdm_feat_request_from_proto(d->features_needed, "descriptor.features_needed", &fr, err);
}

tdm_sampling tdm_req_sampling(const Tandem__V1__SamplingParams *sp)
{
    tdm_sampling s = {0};
    if (sp) {
        s.temperature = sp->temperature;
        s.top_p = sp->top_p;
        s.top_k = sp->top_k;
    }
    return s;
}
