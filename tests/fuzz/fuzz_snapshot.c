/*
 * fuzz_snapshot.c - the import side of state snapshots (engine/snapshot.h):
 * received chunks decoded as the RPC layer decodes them (tdm_rpc_unpack),
 * checked and assembled by the assembler the verifier's ImportSnapshot runs,
 * and an accepted snapshot imported into a sequence of a small model (the
 * engine fixture f32_gqa, fingerprint FINGERPRINT) under one of the three
 * strategies, which then decodes a token.
 *
 * Invariants: a refusal is INVALID_ARGUMENT or FAILED_PRECONDITION (or
 * RESOURCE_EXHAUSTED for memory) with a message, and every chunk after it is
 * refused too; an accepted snapshot has the layout the model expects for its
 * committed length, a payload whose SHA-256 is the declared one, and imports
 * into a sequence of exactly that length.
 *
 * Input: byte 0: bit 0 set: the harness recomputes each chunk's CRC32C (so
 * mutations reach the checks after it); bits 1-2: the strategy of the
 * importing sequence. Then records: a 3-byte little-endian length and that
 * many bytes of an encoded SnapshotChunk.
 */
#include "fuzz.h"

#include "engine.h"
#include "rpc.h"
#include "snapshot.h"

#include <stdio.h>
#include <string.h>

#define FINGERPRINT "fuzz-snapshot-model"

static tdm_backend *be;
static tdm_model *model;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/engine/f32_gqa/model", TANDEM_FUZZ_FIXTURES_DIR);
    tdm_error err;
    be = tdm_backend_cpu_create(1);
    FUZZ_CHECK(be, "no CPU backend");
    FUZZ_CHECK(tdm_model_load(dir, be, &model, &err) == TDM_OK, "%s", err.msg);
    return 0;
}

static void check_refusal(tdm_status rc, const tdm_error *err)
{
    FUZZ_CHECK(rc == TDM_ERR_INVALID_ARGUMENT || rc == TDM_ERR_FAILED_PRECONDITION ||
                   rc == TDM_ERR_RESOURCE_EXHAUSTED,
               "refused with %s: %s", tdm_status_name(rc), err->msg);
    FUZZ_CHECK(err->msg[0] != '\0', "refused (%s) without a message", tdm_status_name(rc));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!model)
        LLVMFuzzerInitialize(NULL, NULL);
    fuzz_input in = {data, size};
    const uint8_t mode = fuzz_take_u8(&in);
    const tdm_model_config *cfg = tdm_model_get_config(model);
    const uint32_t max_committed = 256; /* a verifier's max_context, kept small */
    tdm_snap_asm *a = tdm_snap_asm_create(cfg, FINGERPRINT, max_committed);
    tdm_status rc = TDM_OK;
    tdm_error err = {0};
    while (in.n > 0 && rc == TDM_OK) {
        size_t len = (size_t)fuzz_take_u8(&in) | (size_t)fuzz_take_u8(&in) << 8 |
                     (size_t)fuzz_take_u8(&in) << 16;
        if (len > in.n)
            len = in.n;
        ProtobufCMessage *m =
            tdm_rpc_unpack(&tandem__v1__snapshot_chunk__descriptor, in.p, len, NULL);
        in.p += len;
        in.n -= len;
        if (!m)
            continue; /* the RPC layer refuses what does not decode */
        Tandem__V1__SnapshotChunk *c = (Tandem__V1__SnapshotChunk *)m;
        if (mode & 1)
            c->crc32c = tdm_crc32c(0, c->data.data, c->data.len);
        rc = tdm_snap_asm_add(a, c, &err);
        if (rc != TDM_OK) {
            check_refusal(rc, &err);
            tdm_error again;
            tdm_status rc2 = tdm_snap_asm_add(a, c, &again);
            FUZZ_CHECK(rc2 != TDM_OK, "a chunk accepted after a refusal");
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    tdm_snap_layout l;
    uint8_t *payload = NULL;
    if (rc == TDM_OK) {
        rc = tdm_snap_asm_finish(a, &l, &payload, &err);
        if (rc != TDM_OK)
            check_refusal(rc, &err);
    }
    tdm_snap_asm_destroy(a);
    if (rc != TDM_OK)
        return 0;

    /* Accepted: the layout is the model's, the payload its digest's. */
    tdm_snap_layout e;
    tdm_snap_layout_expected(cfg, FINGERPRINT, l.committed, &e);
    FUZZ_CHECK(l.committed <= max_committed && l.n_tensors == e.n_tensors &&
                   l.total_bytes == e.total_bytes,
               "accepted a layout of %u positions, %zu tensors, %llu bytes", l.committed,
               l.n_tensors, (unsigned long long)l.total_bytes);
    FUZZ_CHECK(tdm_snap_layout_check(&l, cfg, FINGERPRINT, max_committed, &err) == TDM_OK,
               "an accepted layout fails its check: %s", err.msg);
    uint8_t digest[32];
    tdm_sha256(payload, (size_t)l.total_bytes, digest);
    FUZZ_CHECK(memcmp(digest, l.sha256, 32) == 0, "accepted a payload of another digest");
    tdm_snap_layout_free(&e);

    const tdm_state_strategy st[4] = {TDM_STATE_EXTRA_BUFFER, TDM_STATE_NO_BUFFER, TDM_STATE_REPLAY,
                                      TDM_STATE_EXTRA_BUFFER};
    tdm_seq_params p = {st[(mode >> 1) & 3], 4, 0};
    tdm_seq *s = NULL;
    rc = tdm_seq_from_snapshot(model, &p, FINGERPRINT, &l, payload, &s, &err);
    FUZZ_CHECK(rc == TDM_OK, "an assembled snapshot does not import: %s", err.msg);
    FUZZ_CHECK(tdm_seq_length(s) == (int)l.committed, "imported length %d, committed %u",
               tdm_seq_length(s), l.committed);
    int32_t tok = l.committed > 0 ? l.tokens[l.committed - 1] : 0;
    FUZZ_CHECK(tdm_seq_decode(&s, 1, &tok, NULL, &err) == TDM_OK, "decode after import: %s",
               err.msg);
    tdm_seq_destroy(s);
    tdm_snap_layout_free(&l);
    free(payload);
    return 0;
}
