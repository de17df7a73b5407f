/*
 * snapshot.h - state snapshots: a sequence's state at its committed position
 * as a layout descriptor plus a payload, and the checks of the chunked wire
 * format that carries them (proto/tandem/v1/snapshot.proto).
 *
 * Owns: the layout (which tensors, in which order, with which dtype and
 * shape, for a model's configuration and a committed length), export of a
 * sequence into a layout + payload, import of a layout + payload into a new
 * sequence, and the assembler that rebuilds a payload from received chunks,
 * refusing anything that does not add up before a sequence is touched.
 *
 * The layout is backend-neutral and strategy-neutral: every state is the
 * fp32 the engine keeps, tensors in layer order, per linear-attention layer
 * "layers.L.conv" [K-1, conv_dim] then "layers.L.recurrent" [Hv, Dk, Dv], per
 * attention layer "layers.L.key" and "layers.L.value" [committed, nKV, D]
 * (the engine's KV dtype, fp32). Only committed state travels: no verify may
 * be pending, and no per-position scratch of a strategy is part of it, so a
 * snapshot taken under one strategy imports under any other.
 *
 * A second kind of layout (prefix_block > 0) carries a prompt prefix's
 * cached blocks (engine/prefix_cache.h) between verifiers' prefix caches:
 * per block the states at its end and its own K and V, checked and
 * assembled like a sequence's, never imported as a sequence.
 *
 * Wire: chunk 0 carries the layout (and nothing of the payload); chunks
 * 1..n carry the payload in order, each at most chunk_bytes, with its offset
 * and a CRC32C of its data; the last chunk has `last` set; the layout's
 * sha256 covers the whole payload.
 *
 * Threading: none of its own; an assembler belongs to one caller.
 */
#ifndef TANDEM_ENGINE_SNAPSHOT_H
#define TANDEM_ENGINE_SNAPSHOT_H

#include "buildinfo.h" /* TDM_SNAPSHOT_LAYOUT_VERSION: the layout this build writes */
#include "engine.h"
#include "model_config.h"
#include "status.h"
#include "tandem/v1/snapshot.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Payload bytes per chunk when a caller asks for none, and the most. */
#define TDM_SNAPSHOT_DEFAULT_CHUNK (1u << 20)
#define TDM_SNAPSHOT_MAX_CHUNK (16u << 20)

typedef struct tdm_snap_tensor {
    char name[48]; /* "layers.3.recurrent" */
    uint32_t layer;
    int dtype; /* Tandem__V1__SnapshotDtype */
    int ndim;
    uint64_t shape[3];
    uint64_t offset, nbytes; /* in the payload */
} tdm_snap_tensor;

typedef struct tdm_snap_layout {
    uint32_t version;
    char fingerprint[80];
    uint32_t committed;       /* positions the state covers */
    int32_t *tokens;          /* [committed] those tokens (owned) */
    tdm_snap_tensor *tensors; /* [n_tensors] (owned) */
    size_t n_tensors;
    uint64_t total_bytes;
    uint8_t sha256[32];
    bool verified; /* the payload handed over with it was checked against sha256 */
    /* 0: a sequence's state. > 0: a prefix's cached blocks of this many
     * tokens (committed / prefix_block of them; tdm_snap_layout_expected_prefix). */
    uint32_t prefix_block;
} tdm_snap_layout;

/* Frees what a layout owns and zeroes it (a zeroed layout is fine). */
void tdm_snap_layout_free(tdm_snap_layout *l);

/* The layout of a sequence of a model with configuration cfg at `committed`
 * positions: version, fingerprint, tensors and total_bytes; no tokens, no
 * digest. The caller frees it. */
void tdm_snap_layout_expected(const tdm_model_config *cfg, const char *fingerprint,
                              uint32_t committed, tdm_snap_layout *out);

/* The layout of a prompt prefix's `committed` tokens as the prefix cache
 * keeps them (engine/prefix_cache.h), in blocks of `block` tokens
 * (committed a multiple of it): per block i, per layer in order,
 * "blocks.i.layers.L.conv" and ".recurrent" (the states at the block's end)
 * or ".key" and ".value" [block, nKV, D] (the block's own positions); each
 * block's bytes are a cache entry's payload. The caller frees it. */
void tdm_snap_layout_expected_prefix(const tdm_model_config *cfg, const char *fingerprint,
                                     uint32_t committed, uint32_t block, tdm_snap_layout *out);

/* Whether `l` is a layout this build can import into a model with
 * configuration cfg and fingerprint: FAILED_PRECONDITION for another layout
 * version or model fingerprint, INVALID_ARGUMENT for a committed length past
 * max_committed, tokens that do not match it or lie outside the vocabulary,
 * or a tensor whose name, layer, dtype, shape, offset or size differs from
 * the expected one. Messages name the field and both values. */
tdm_status tdm_snap_layout_check(const tdm_snap_layout *l, const tdm_model_config *cfg,
                                 const char *fingerprint, uint32_t max_committed, tdm_error *err);
/* (A layout with prefix_block > 0 is checked against
 * tdm_snap_layout_expected_prefix, and refused unless its committed length
 * is a positive multiple of the block.) */

/* ---- sequences -------------------------------------------------------- */

/* The state of s at its committed position: a layout (tokens copied from
 * `tokens`, which must hold exactly the committed length, and the payload's
 * SHA-256) and a payload of layout->total_bytes (*payload: malloc'ed, the
 * caller frees). FAILED_PRECONDITION while a verify is pending. */
tdm_status tdm_seq_snapshot(const tdm_seq *s, const char *fingerprint, const int32_t *tokens,
                            int n_tokens, tdm_snap_layout *layout, uint8_t **payload,
                            tdm_error *err);
/* The same in two parts: the copy of the state (all a thread that owns the
 * sequence must do; its layout's sha256 is left zero), then the digest
 * (any thread; seconds for gigabytes, so not on a scheduler's thread). */
tdm_status tdm_seq_snapshot_take(const tdm_seq *s, const char *fingerprint, const int32_t *tokens,
                                 int n_tokens, tdm_snap_layout *layout, uint8_t **payload,
                                 tdm_error *err);
void tdm_snap_seal(tdm_snap_layout *layout, const uint8_t *payload);

/* A new sequence (strategy and max_draft from p) holding the state of a
 * snapshot: the layout is checked (tdm_snap_layout_check, with the model's
 * max_position_embeddings as the longest) and the payload against its
 * SHA-256 (unless the assembler did: layout->verified) before anything is
 * allocated. On success the caller owns *out. */
tdm_status tdm_seq_from_snapshot(tdm_model *m, const tdm_seq_params *p, const char *fingerprint,
                                 const tdm_snap_layout *l, const uint8_t *payload, tdm_seq **out,
                                 tdm_error *err);

/* ---- checksums ---------------------------------------------------------- */

/* CRC32C (Castagnoli) of n bytes, continuing from crc (0 to start). */
uint32_t tdm_crc32c(uint32_t crc, const void *data, size_t n);
void tdm_sha256(const void *data, size_t n, uint8_t out[32]);

/* ---- wire ---------------------------------------------------------------- */

/* The layout as a message whose fields point into l and into `tensors` /
 * `ptrs` / `shapes` (caller's arrays of l->n_tensors entries): valid while
 * they are. */
void tdm_snap_layout_to_proto(const tdm_snap_layout *l, Tandem__V1__SnapshotLayout *out,
                              Tandem__V1__SnapshotTensor *tensors,
                              Tandem__V1__SnapshotTensor **ptrs, uint64_t (*shapes)[3]);
/* A received layout as a tdm_snap_layout (the caller frees it); refuses
 * (INVALID_ARGUMENT, naming the field) what does not fit one: a fingerprint
 * or tensor name too long, a tensor of more than 3 dimensions, token ids
 * past int32, more than max_tokens tokens or max_tensors tensors. */
tdm_status tdm_snap_layout_from_proto(const Tandem__V1__SnapshotLayout *in, size_t max_tokens,
                                      size_t max_tensors, tdm_snap_layout *out, tdm_error *err);

/* Chunks of a payload of `total` bytes at chunk_bytes each, chunk 0 (the
 * layout) included. */
uint32_t tdm_snap_chunk_count(uint64_t total, uint32_t chunk_bytes);

/* Rebuilds a snapshot from received chunks, in order. */
typedef struct tdm_snap_asm tdm_snap_asm;

/* An assembler for a model with configuration cfg (borrowed) and this
 * fingerprint (copied), accepting committed lengths up to max_committed. */
tdm_snap_asm *tdm_snap_asm_create(const tdm_model_config *cfg, const char *fingerprint,
                                  uint32_t max_committed);
/* The same for a prefix's cached blocks of `block` tokens (FetchPrefix):
 * a layout of another kind or block size is refused. */
tdm_snap_asm *tdm_snap_asm_create_prefix(const tdm_model_config *cfg, const char *fingerprint,
                                         uint32_t max_committed, uint32_t block);
void tdm_snap_asm_destroy(tdm_snap_asm *a);
/* Takes the next chunk. Refuses, naming the field and both values: a chunk
 * out of order, missing or repeated (index), a chunk after the last one, a
 * layout in a chunk other than 0 or none in chunk 0, a layout that fails
 * tdm_snap_layout_check, a snapshot_id that changes, data in chunk 0, an
 * offset other than the bytes received so far, a data chunk without data
 * (so a stream has at most total_bytes chunks), more bytes than the layout
 * declares, a CRC32C that does not match. After a refusal the assembler
 * refuses everything. */
tdm_status tdm_snap_asm_add(tdm_snap_asm *a, const Tandem__V1__SnapshotChunk *c, tdm_error *err);
/* The end of the stream: refuses a stream without its `last` chunk or with
 * fewer bytes than declared, and a payload whose SHA-256 differs. On success
 * *layout (marked verified) and *payload move to the caller (free them with
 * tdm_snap_layout_free and free()). */
tdm_status tdm_snap_asm_finish(tdm_snap_asm *a, tdm_snap_layout *layout, uint8_t **payload,
                               tdm_error *err);
/* The snapshot_id of chunk 0 ("" before it, or when it had none). */
const char *tdm_snap_asm_id(const tdm_snap_asm *a);

#endif
