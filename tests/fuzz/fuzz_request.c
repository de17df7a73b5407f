/*
 * fuzz_request.c - the messages a service decodes from a client or a peer,
 * decoded as the RPC layer decodes them (tdm_rpc_unpack) and checked by the
 * code the services run on them
 * (service/request_check.c; the compatibility rules for a registering
 * replica's descriptor). Sampling settings that pass the checks are then
 * used as the verifier and the drafter use them: the distribution they give
 * must be one (probabilities in 0..1 summing to 1) and a draw must land in
 * its support.
 *
 * Input: one byte picks the message, the rest is the encoded message.
 *   0 GenerateRequest (gateway)     1 RunRequest (verifier)
 *   2 DraftRequest (drafter)        3 DraftResponse (verifier)
 *   4 RegisterRequest (gateway)     5 HeartbeatRequest, DeregisterRequest,
 *                                     TokenizeRequest, DetokenizeRequest
 */
#include "fuzz.h"

#include "rpc.h"

#include "compat.h"
#include "defs.h"
#include "feature_shm.h"
#include "feature_stream.h"
#include "request_check.h"
#include "sampling.h"
#include "tandem/v1/registry.pb-c.h"

#include <math.h>
#include <string.h>

/* The verifier and drafter the checks are made for (the demo models). */
#define VOCAB 4096
#define MAX_CONTEXT 4096
#define MAX_DRAFT 8
#define POSITION 17 /* committed length a DraftBlock must continue from */

/* What the gateway does with a registering replica's descriptor (and a
 * heartbeat's load): keep a copy by packing it, and unpack that later. */
static void check_copy(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    FUZZ_CHECK(buf && protobuf_c_message_pack(m, buf) == n, "pack of %s", m->descriptor->name);
    ProtobufCMessage *copy = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
    FUZZ_CHECK(copy, "a received %s does not decode once re-encoded", m->descriptor->name);
    protobuf_c_message_free_unpacked(copy, NULL);
    free(buf);
}

/* A refusal always says what was refused. */
static void check_refusal(tdm_status rc, const tdm_error *err)
{
    if (rc != TDM_OK)
        FUZZ_CHECK(err->msg[0] != '\0', "refused (%s) without a message", tdm_status_name(rc));
}

/* Uses accepted sampling settings on logits drawn from the input bytes. */
static void use_sampling(const Tandem__V1__SamplingParams *sp, const uint8_t *data, size_t size)
{
    enum { V = 64 };
    float logits[V], probs[V];
    int order[V];
    for (int i = 0; i < V; i++)
        logits[i] = size ? (float)(int8_t)data[(size_t)i % size] / 8.0f : 0.0f;
    tdm_sampling s = tdm_req_sampling(sp);
    int support = tdm_sampling_probs(&s, logits, V, probs, order);
    FUZZ_CHECK(support >= 1 && support <= V, "support %d", support);
    double sum = 0;
    int nonzero = 0;
    for (int i = 0; i < V; i++) {
        FUZZ_CHECK(probs[i] >= 0.0f && probs[i] <= 1.0f,
                   "probs[%d] = %g (T %g, top_p %g, top_k %u)", i, probs[i], s.temperature, s.top_p,
                   s.top_k);
        sum += probs[i];
        nonzero += probs[i] > 0.0f;
    }
    FUZZ_CHECK(fabs(sum - 1.0) < 1e-3, "probabilities sum to %g (T %g, top_p %g, top_k %u)", sum,
               s.temperature, s.top_p, s.top_k);
    FUZZ_CHECK(nonzero <= support, "%d tokens with mass outside a support of %d", nonzero, support);
    tdm_rng rng;
    tdm_rng_seed(&rng, sp ? sp->seed : 0);
    for (int k = 0; k < 4; k++) {
        int t = tdm_sampling_draw(probs, V, tdm_rng_uniform(&rng));
        FUZZ_CHECK(t >= 0 && t < V && probs[t] > 0.0f, "drew %d", t);
    }
}

static void generate(const ProtobufCMessage *m, const uint8_t *data, size_t size)
{
    const Tandem__V1__GenerateRequest *req = (const Tandem__V1__GenerateRequest *)m;
    tdm_error err;
    tdm_status rc = tdm_req_check_generate(req, &err);
    check_refusal(rc, &err);
    if (rc != TDM_OK)
        return;
    FUZZ_CHECK(req->max_tokens <= TDM_REQ_MAX_TOKENS && req->n_stop <= 16, "limits");
    if (req->request_id[0])
        FUZZ_CHECK(tdm_req_check_label("request_id", req->request_id, 128, NULL) == TDM_OK,
                   "request_id");
    use_sampling(req->sampling, data, size);
}

static void run(const ProtobufCMessage *m, const uint8_t *data, size_t size)
{
    const Tandem__V1__RunRequest *req = (const Tandem__V1__RunRequest *)m;
    tdm_error err;
    tdm_status rc = tdm_req_check_run(req, VOCAB, MAX_CONTEXT, MAX_DRAFT, &err);
    check_refusal(rc, &err);
    if (rc != TDM_OK)
        return;
    if (req->snapshot_id && req->snapshot_id[0]) {
        /* continues an imported snapshot: the prompt, max_tokens and sampling
         * come with the snapshot */
        FUZZ_CHECK(req->n_prompt_ids == 0, "prompt ids beside a snapshot_id");
        FUZZ_CHECK(tdm_req_check_label("snapshot_id", req->snapshot_id, 128, NULL) == TDM_OK,
                   "snapshot_id");
        if (req->drafter && req->drafter->address[0])
            FUZZ_CHECK(req->drafter->block_size >= 1 && req->drafter->block_size <= MAX_DRAFT,
                       "block size %u", req->drafter->block_size);
        return;
    }
    FUZZ_CHECK(req->n_prompt_ids >= 1 && req->n_prompt_ids < MAX_CONTEXT, "prompt length");
    for (size_t i = 0; i < req->n_prompt_ids; i++)
        FUZZ_CHECK(req->prompt_ids[i] < VOCAB, "prompt id");
    FUZZ_CHECK(req->max_tokens >= 1 && req->max_tokens <= TDM_REQ_MAX_TOKENS, "max_tokens");
    if (req->drafter && req->drafter->address[0])
        FUZZ_CHECK(req->drafter->block_size >= 1 && req->drafter->block_size <= MAX_DRAFT,
                   "block size %u", req->drafter->block_size);
    use_sampling(req->sampling, data, size);
}

/* The hidden states an MTP drafter takes from a message (feature_stream.h):
 * decoded into its buffer of rows of FEAT_WIDTH values, or refused. */
#define FEAT_WIDTH 4
#define FEAT_RING 4096
static void draft_features(const Tandem__V1__DraftRequest *req)
{
    const Tandem__V1__Features *f =
        req->kind_case == TANDEM__V1__DRAFT_REQUEST__KIND_OPEN       ? req->open->hidden
        : req->kind_case == TANDEM__V1__DRAFT_REQUEST__KIND_VERDICT  ? req->verdict->hidden
        : req->kind_case == TANDEM__V1__DRAFT_REQUEST__KIND_FEATURES ? req->features->hidden
                                                                     : NULL;
    tdm_error err;
    if (req->kind_case == TANDEM__V1__DRAFT_REQUEST__KIND_OPEN) {
        tdm_feat_request fr;
        tdm_status rc =
            tdm_feat_request_from_proto(req->open->features, "SequenceOpen.features", &fr, &err);
        check_refusal(rc, &err);
        FUZZ_CHECK(rc != TDM_OK || (fr.n >= 0 && fr.n <= TDM_FEAT_MAX_SPECS), "specs %d", fr.n);
    }
    if (!f)
        return;
    tdm_feat_in in;
    tdm_feat_in_init(&in, FEAT_WIDTH);
    tdm_status rc = tdm_feat_in_append(&in, f, "hidden", &err);
    check_refusal(rc, &err);
    FUZZ_CHECK(rc != TDM_OK ||
                   (in.rows == (int)f->rows && (f->rows == 0 || in.position == (int)f->position)),
               "rows %d of %u", in.rows, f->rows);
    /* The same rows again overlap the ones held: refused, nothing changes. */
    if (rc == TDM_OK && f->rows > 0) {
        FUZZ_CHECK(tdm_feat_in_append(&in, f, "hidden", &err) == TDM_ERR_INVALID_ARGUMENT,
                   "an overlap accepted");
        FUZZ_CHECK(in.rows == (int)f->rows, "a refused append changed the rows");
    }
    tdm_feat_in_free(&in);
    /* The same message on a stream with a shared-memory ring (feature_shm.h):
     * a reference is read only within the ring, or refused. */
    static uint8_t ring[FEAT_RING];
    tdm_feat_map map = {
        .map = ring, .map_len = sizeof(ring), .ring = ring, .ring_bytes = sizeof(ring)};
    tdm_feat_in_init(&in, FEAT_WIDTH);
    rc = tdm_feat_in_append_shm(&in, f, &map, "hidden", &err);
    check_refusal(rc, &err);
    FUZZ_CHECK(rc != TDM_OK || !f->shm ||
                   (f->shm->offset % sizeof(ring) + f->shm->length <= sizeof(ring) &&
                    map.consumed == f->shm->offset + f->shm->length),
               "a reference outside the ring read");
    FUZZ_CHECK(rc == TDM_OK || map.consumed == 0, "a refused reference moved consumed");
    tdm_feat_in_free(&in);
}

static void draft_request(const ProtobufCMessage *m, const uint8_t *data, size_t size)
{
    const Tandem__V1__DraftRequest *req = (const Tandem__V1__DraftRequest *)m;
    draft_features(req);
    if (req->kind_case != TANDEM__V1__DRAFT_REQUEST__KIND_OPEN)
        return;
    tdm_error err;
    tdm_status rc = tdm_req_check_sequence_open(req->open, VOCAB, TDM_MAX_DRAFT_BLOCK, &err);
    check_refusal(rc, &err);
    if (rc != TDM_OK)
        return;
    FUZZ_CHECK(req->open->n_tokens >= 1, "tokens");
    if (req->open->score)
        FUZZ_CHECK(req->open->block_size == 0 && req->open->score_from >= 1 &&
                       req->open->score_from <= req->open->n_tokens,
                   "score open");
    else
        FUZZ_CHECK(req->open->block_size >= 1 && req->open->block_size <= TDM_MAX_DRAFT_BLOCK,
                   "block size");
    use_sampling(req->open->sampling, data, size);
}

static void draft_response(const ProtobufCMessage *m)
{
    const Tandem__V1__DraftResponse *resp = (const Tandem__V1__DraftResponse *)m;
    if (resp->kind_case != TANDEM__V1__DRAFT_RESPONSE__KIND_BLOCK)
        return;
    const Tandem__V1__DraftBlock *b = resp->block;
    tdm_error err;
    tdm_status rc = tdm_req_check_draft_block(b, POSITION, MAX_DRAFT, VOCAB, &err);
    check_refusal(rc, &err);
    if (rc != TDM_OK)
        return;
    FUZZ_CHECK(b->position == POSITION && b->n_tokens <= MAX_DRAFT, "block shape");
    /* What verification reads: each draft, its probability, its distribution. */
    for (size_t j = 0; j < b->n_tokens; j++) {
        FUZZ_CHECK(b->tokens[j] < VOCAB, "draft");
        if (b->n_token_probs)
            FUZZ_CHECK(b->token_probs[j] >= 0.0f && b->token_probs[j] <= 1.0f, "q");
        if (b->n_dists)
            for (size_t t = 0; t < b->dists[j]->n_ids; t++)
                FUZZ_CHECK(b->dists[j]->ids[t] < VOCAB && b->dists[j]->probs[t] <= 1.0f, "dist");
    }
}

static void register_request(const ProtobufCMessage *m)
{
    const Tandem__V1__RegisterRequest *req = (const Tandem__V1__RegisterRequest *)m;
    tdm_error err;
    tdm_status rc = tdm_req_check_descriptor(req->descriptor, &err);
    check_refusal(rc, &err);
    if (rc != TDM_OK)
        return;
    const Tandem__V1__Descriptor *d = req->descriptor;
    /* The rules the gateway runs between a new replica and those it has:
     * here the replica against itself in every position. */
    tdm_compat_refusal out[8];
    size_t n = tdm_compat_check_pair(d, d, out, 8);
    for (size_t i = 0; i < n && i < 8; i++) {
        FUZZ_CHECK(out[i].message[0] != '\0', "a refusal without a message");
        Tandem__V1__Refusal r = TANDEM__V1__REFUSAL__INIT;
        tdm_compat_refusal_to_proto(&out[i], &r);
        tdm_compat_refusal_proto_clear(&r);
    }
    n = tdm_compat_check_replicas(d, d, out, 8);
    for (size_t i = 0; i < n && i < 8; i++)
        FUZZ_CHECK(out[i].message[0] != '\0', "a refusal without a message");
    n = tdm_compat_check_gateway(d, d, out, 8);
    for (size_t i = 0; i < n && i < 8; i++)
        FUZZ_CHECK(out[i].message[0] != '\0', "a refusal without a message");
    char name[512];
    tdm_compat_service_name(d, name, sizeof(name));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    static const ProtobufCMessageDescriptor *const other[] = {
        &tandem__v1__heartbeat_request__descriptor, &tandem__v1__deregister_request__descriptor,
        &tandem__v1__tokenize_request__descriptor, &tandem__v1__detokenize_request__descriptor};
    const ProtobufCMessageDescriptor *d;
    unsigned mode = data[0] % 9;
    switch (mode) {
    case 0:
        d = &tandem__v1__generate_request__descriptor;
        break;
    case 1:
        d = &tandem__v1__run_request__descriptor;
        break;
    case 2:
        d = &tandem__v1__draft_request__descriptor;
        break;
    case 3:
        d = &tandem__v1__draft_response__descriptor;
        break;
    case 4:
        d = &tandem__v1__register_request__descriptor;
        break;
    default:
        d = other[mode - 5];
        break;
    }
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    ProtobufCMessage *m = tdm_rpc_unpack(d, p, n, NULL);
    if (!m)
        return 0;
    check_copy(m);
    switch (mode) {
    case 0:
        generate(m, p, n);
        break;
    case 1:
        run(m, p, n);
        break;
    case 2:
        draft_request(m, p, n);
        break;
    case 3:
        draft_response(m);
        break;
    case 4:
        register_request(m);
        break;
    default:
        break;
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
