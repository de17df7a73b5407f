/*
 * capacity.h - the engine's memory arithmetic: what a sequence, the
 * workspace of a forward step and the weights take in backend memory, as
 * sizes computed from a model's config.json alone, and how many sequences a
 * memory budget holds.
 *
 * Owns the only formulas for those sizes: seq.c allocates sequence state and
 * the workspace with the functions below, so an estimate made here (before a
 * model is loaded, or offline by --check-config) is what the engine will
 * allocate. A sequence's KV caches are counted at `positions` positions, the
 * most the sequence is created for (tdm_seq_params.max_positions).
 *
 * Pure arithmetic: no allocation, no backend, no I/O.
 */
#ifndef TANDEM_ENGINE_CAPACITY_H
#define TANDEM_ENGINE_CAPACITY_H

#include "defs.h"
#include "model_config.h"
#include "status.h"

#include <stddef.h>

/* Floats of one linear-attention layer's state for one sequence. */
typedef struct tdm_state_floats {
    size_t conv;   /* [K-1, conv_dim] conv window */
    size_t rec;    /* [Hv, Dk, Dv] recurrent state */
    size_t conv_x; /* strategy's conv windows: [k+1, ...] (extra_buffer, replay), [1, ...]
                      checkpoint (no_buffer) */
    size_t rec_x;  /* strategy's states: [k+1, Hv, Dk, Dv] (extra_buffer), one checkpoint
                      (no_buffer), or [k+1, gdn input floats] recurrence records (replay) */
} tdm_state_floats;

void tdm_capacity_state_floats(const tdm_model_config *c, tdm_state_strategy strategy,
                               int max_draft, tdm_state_floats *out);

/* conv_dim of the linear layers: 2·Hk·Dk + Hv·Dv. */
size_t tdm_capacity_conv_dim(const tdm_model_config *c);
/* Floats of one attention layer's K (or V) cache row: nKV·D. */
size_t tdm_capacity_kv_width(const tdm_model_config *c);

/* A sequence's bytes by kind with its KV caches at `positions` positions
 * (what tdm_seq_memory_usage reports for such a sequence). */
typedef struct tdm_seq_bytes {
    size_t kv, recurrent, conv, strategy;
} tdm_seq_bytes;

void tdm_capacity_seq_bytes(const tdm_model_config *c, tdm_state_strategy strategy, int max_draft,
                            int positions, tdm_seq_bytes *out);
size_t tdm_seq_bytes_total(const tdm_seq_bytes *b);

/* Bytes of one prefix-cache block (prefix_cache.h) of `block` positions:
 * per linear layer its conv window and recurrent state, per attention layer
 * K and V of the block's positions, all fp32. Host memory, outside any
 * budget of backend memory. */
size_t tdm_capacity_prefix_block_bytes(const tdm_model_config *c, int block);

/* The workspace of a forward step of `rows` rows: 18 pieces, each rounded up
 * to 16 floats (64-byte alignment). sizes: NULL, or the floats of each piece
 * in the order of tdm_workspace (engine_internal.h). Returns the bytes. */
#define TDM_WORKSPACE_PIECES 18
size_t tdm_capacity_workspace_bytes(const tdm_model_config *c, int rows, size_t *sizes);

/* Rows of the largest forward step a verifier with n sequences runs: every
 * sequence verifying a full block (n·(k+1)), or one prompt chunk
 * (TDM_PREFILL_ROWS), whichever is more. */
#define TDM_PREFILL_ROWS 128
int tdm_capacity_step_rows(int nseq, int max_draft);

/* Weights resident in backend memory: matrices at matrix_elem_bytes (2 for
 * bf16, 4 for f32 and for f16, which is converted), vectors as f32; the
 * embedding table and, when untied, the LM head. */
size_t tdm_capacity_weight_bytes(const tdm_model_config *c, size_t matrix_elem_bytes);

/* The MTP head (mtp.h): its own weights resident in backend memory (mtp.fc
 * and its decoder layer at matrix_elem_bytes, its norms as f32; the
 * embedding and LM head are the target's), and one MTP sequence with its KV
 * cache at `positions` positions (and the head's last output). */
size_t tdm_capacity_mtp_weight_bytes(const tdm_model_config *c, size_t matrix_elem_bytes);
size_t tdm_capacity_mtp_seq_bytes(const tdm_model_config *c, int positions);

/* What a budget of backend memory holds. */
typedef struct tdm_capacity_params {
    tdm_model_config cfg;
    tdm_state_strategy strategy;
    int max_draft;            /* k */
    int max_context;          /* KV positions per sequence */
    size_t matrix_elem_bytes; /* as tdm_capacity_weight_bytes */
    size_t budget;            /* backend memory the verifier may use */
} tdm_capacity_params;

typedef struct tdm_capacity {
    tdm_seq_bytes seq; /* one sequence at max_context */
    size_t seq_total;  /* their sum */
    size_t weights;    /* tdm_capacity_weight_bytes */
    size_t ws_per_seq; /* workspace rows one more sequence adds: (k+1) rows */
    size_t workspace;  /* the largest step's workspace at max_sequences sequences */
    size_t budget;     /* as given */
    size_t used;       /* weights + workspace + max_sequences·seq_total */
    int max_sequences; /* the most that fit; 0: not even one */
    int capped;        /* set when the count stopped at TDM_CAPACITY_MAX_SEQUENCES */
} tdm_capacity;

#define TDM_CAPACITY_MAX_SEQUENCES 65536

/* The largest n with weights + workspace(step_rows(n)) + n·seq_total <= budget. */
void tdm_capacity_compute(const tdm_capacity_params *p, tdm_capacity *out);

/* The arithmetic, one line per term ("per sequence: kv ... = ..."), each
 * line starting with `prefix`. Returns the length written (snprintf). */
int tdm_capacity_format(const tdm_capacity_params *p, const tdm_capacity *c, const char *prefix,
                        char *buf, size_t len);

/* "80.0 GiB"-style rendering of a byte count. */
const char *tdm_capacity_bytes_str(size_t bytes, char *buf, size_t len);

#endif
