/*
 * fuzz_pbjson.c - any tandem.v1 message, as a peer could send it, decoded
 * by protobuf-c and written as JSON the way the CLI's --json does
 * (tdm_pbjson_from_message). Messages are decoded as every service decodes
 * what it receives (tdm_rpc_unpack). The JSON must print, be valid UTF-8 and
 * parse back; the message must pack to bytes that unpack and pack the same.
 *
 * Input: one byte picks the message type (of the table below), the rest is
 * the encoded message.
 */
#include "fuzz.h"

#include "rpc.h"

#include "pbjson.h"
#include "tandem/v1/common.pb-c.h"
#include "tandem/v1/drafter.pb-c.h"
#include "tandem/v1/gateway.pb-c.h"
#include "tandem/v1/registry.pb-c.h"
#include "tandem/v1/snapshot.pb-c.h"
#include "tandem/v1/verifier.pb-c.h"
#include "tokenizer.h"

#include <string.h>

static const ProtobufCMessageDescriptor *const messages[] = {
    &tandem__v1__protocol_version__descriptor,
    &tandem__v1__build_info__descriptor,
    &tandem__v1__descriptor__descriptor,
    &tandem__v1__sampling_params__descriptor,
    &tandem__v1__config_entry__descriptor,
    &tandem__v1__effective_config__descriptor,
    &tandem__v1__counter__descriptor,
    &tandem__v1__refusal__descriptor,
    &tandem__v1__describe_request__descriptor,
    &tandem__v1__describe_response__descriptor,
    &tandem__v1__token_ids__descriptor,
    &tandem__v1__sequence_open__descriptor,
    &tandem__v1__verdict__descriptor,
    &tandem__v1__sequence_close__descriptor,
    &tandem__v1__draft_request__descriptor,
    &tandem__v1__draft_distribution__descriptor,
    &tandem__v1__draft_block__descriptor,
    &tandem__v1__sequence_error__descriptor,
    &tandem__v1__draft_response__descriptor,
    &tandem__v1__chat_message__descriptor,
    &tandem__v1__chat_prompt__descriptor,
    &tandem__v1__speculation_params__descriptor,
    &tandem__v1__generate_request__descriptor,
    &tandem__v1__token_chunk__descriptor,
    &tandem__v1__request_stats__descriptor,
    &tandem__v1__generate_complete__descriptor,
    &tandem__v1__generate_response__descriptor,
    &tandem__v1__tokenize_request__descriptor,
    &tandem__v1__tokenize_response__descriptor,
    &tandem__v1__detokenize_request__descriptor,
    &tandem__v1__detokenize_response__descriptor,
    &tandem__v1__get_model_info_request__descriptor,
    &tandem__v1__model_info__descriptor,
    &tandem__v1__get_status_request__descriptor,
    &tandem__v1__replica_status__descriptor,
    &tandem__v1__pair_status__descriptor,
    &tandem__v1__status_response__descriptor,
    &tandem__v1__register_request__descriptor,
    &tandem__v1__register_response__descriptor,
    &tandem__v1__replica_load__descriptor,
    &tandem__v1__heartbeat_request__descriptor,
    &tandem__v1__heartbeat_response__descriptor,
    &tandem__v1__deregister_request__descriptor,
    &tandem__v1__deregister_response__descriptor,
    &tandem__v1__snapshot_tensor__descriptor,
    &tandem__v1__snapshot_layout__descriptor,
    &tandem__v1__snapshot_chunk__descriptor,
    &tandem__v1__export_snapshot_request__descriptor,
    &tandem__v1__import_snapshot_response__descriptor,
    &tandem__v1__drafter_assignment__descriptor,
    &tandem__v1__run_request__descriptor,
    &tandem__v1__run_complete__descriptor,
    &tandem__v1__run_response__descriptor,
};

/* A received message (tdm_rpc_unpack) packs to bytes that decode again and
 * pack the same: services copy what peers send that way (protobuf-c keeps
 * unknown fields). */
static void check_repack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *a = malloc(n ? n : 1);
    FUZZ_CHECK(a && protobuf_c_message_pack(m, a) == n, "pack of %s", m->descriptor->name);
    ProtobufCMessage *again = protobuf_c_message_unpack(m->descriptor, NULL, n, a);
    FUZZ_CHECK(again, "%s does not unpack what it packed", m->descriptor->name);
    size_t n2 = protobuf_c_message_get_packed_size(again);
    uint8_t *b = malloc(n2 ? n2 : 1);
    FUZZ_CHECK(b && protobuf_c_message_pack(again, b) == n2, "pack");
    FUZZ_CHECK(n2 == n && memcmp(a, b, n) == 0, "%s repacks to other bytes", m->descriptor->name);
    protobuf_c_message_free_unpacked(again, NULL);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const ProtobufCMessageDescriptor *d = messages[data[0] % TDM_ARRAY_LEN(messages)];
    ProtobufCMessage *m = tdm_rpc_unpack(d, data + 1, size - 1, NULL);
    if (!m)
        return 0;
    check_repack(m);
    cJSON *j = tdm_pbjson_from_message(m);
    FUZZ_CHECK(j != NULL, "no JSON for a %s", d->name);
    char *text = cJSON_PrintUnformatted(j);
    FUZZ_CHECK(text != NULL, "the JSON of a %s does not print", d->name);
    size_t len = strlen(text);
    tdm_error err;
    FUZZ_CHECK(tdm_tok_check_utf8(text, len, &err) == TDM_OK, "the JSON of a %s: %s", d->name,
               err.msg);
    cJSON *back = cJSON_ParseWithLength(text, len);
    FUZZ_CHECK(back != NULL, "the JSON of a %s does not parse: %.200s", d->name, text);
    cJSON_Delete(back);
    free(text);
    cJSON_Delete(j);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
