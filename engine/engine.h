/*
 * engine.h - the hybrid-model engine: Qwen3.5 text models (Gated DeltaNet +
 * gated attention) loaded from a Hugging Face checkpoint folder, run on a
 * backend (kernels/backend.h), with sequences that prefill, decode, verify a
 * block of draft tokens and commit the accepted prefix exactly.
 *
 * Owns: the model (config, weights mapped from safetensors and placed on the
 * backend, a workspace for one call at a time) and sequences (KV caches of the
 * attention layers, conv windows and recurrent states of the linear layers,
 * and the scratch the chosen state strategy needs for verify/commit).
 *
 * The checkpoint's MTP head, a drafter run on the target's hidden states
 * (tdm_step_out.hidden), is mtp.h's.
 *
 * Threading: one call at a time per model (calls share its workspace).
 * Numbers: every activation, cache and state is fp32, whatever the storage
 * dtype of the weights (bf16, fp16 or fp32).
 */
#ifndef TANDEM_ENGINE_ENGINE_H
#define TANDEM_ENGINE_ENGINE_H

#include "backend.h"
#include "comm.h"
#include "defs.h"
#include "model_config.h"
#include "status.h"

#include <stddef.h>
#include <stdint.h>

/* ---- model ----------------------------------------------------------- */

typedef struct tdm_model tdm_model;

/* Loads config and weights from a checkpoint folder onto `be` (borrowed: it
 * must outlive the model). On success the caller owns *out. */
tdm_status tdm_model_load(const char *dir, tdm_backend *be, tdm_model **out, tdm_error *err);
/* Rank comm->rank of a model split over comm->size ranks (tensor parallel,
 * shard.h): reads only its slices of the checkpoint onto `be`. comm is
 * borrowed and must outlive the model. Every rank runs the same calls on its
 * own thread, in the same order, with the same sequences and tokens; each
 * gets the whole model's logits and argmaxes. Its config
 * (tdm_model_get_config) is the rank's: its slice's head counts and
 * intermediate size, tp_size = comm->size. Drafting (tdm_seq_draft) and the
 * MTP head need a whole model. */
tdm_status tdm_model_load_rank(const char *dir, tdm_backend *be, tdm_comm *comm, tdm_model **out,
                               tdm_error *err);
/* A model split over n ranks (tensor parallel, shard.h) behind the API of
 * one model: rank r loads its slices onto bes[r] and meets the others through
 * comms[r] (a group: kernels/comm.h); both are borrowed and must outlive the
 * model. Each rank runs on a thread of its own, which first calls bind(r,
 * bind_ctx) when bind is not NULL (the CUDA backend's ops need their device
 * current on the calling thread). Every call on the model and its sequences
 * runs on all ranks and returns rank 0's results: the whole model's logits
 * and argmaxes. The config (tdm_model_get_config) and weight bytes are one
 * rank's, what one device holds; the backend is rank 0's. State snapshots
 * are in the whole model's layout (snapshot.h), and so are its prefix
 * cache's blocks (prefix_cache.h). */
tdm_status tdm_model_load_group(const char *dir, int n, tdm_backend *const *bes,
                                tdm_comm *const *comms, void (*bind)(int rank, void *ctx),
                                void *bind_ctx, tdm_model **out, tdm_error *err);
void tdm_model_destroy(tdm_model *m);
/* The checks of tdm_model_load without a backend: config.json, the
 * checkpoint's headers, and every tensor the config implies present with its
 * shape and a supported dtype. Nothing is copied or placed anywhere, so it is
 * cheap on any model. *weight_bytes (when not NULL) gets the bytes a decode
 * step would stream (tdm_model_weight_bytes). */
tdm_status tdm_model_check(const char *dir, size_t *weight_bytes, tdm_error *err);
const tdm_model_config *tdm_model_get_config(const tdm_model *m);
/* The checkpoint's config: the whole model's also where it is split over
 * ranks (tensor parallel), the one state snapshots are laid out by. */
const tdm_model_config *tdm_model_checkpoint_config(const tdm_model *m);
tdm_backend *tdm_model_backend(const tdm_model *m);
/* Bytes of weights one decode step streams, as stored (every layer, the final
 * norm and the LM head; an untied embedding table is only indexed). */
size_t tdm_model_weight_bytes(const tdm_model *m);
/* Whether forward passes go through the backend's graphs (CUDA: a step is
 * captured the second time its shape is seen, then replayed as one launch).
 * On by default; no effect on a backend without graphs. Results are the
 * same bits either way. */
void tdm_model_set_graphs(tdm_model *m, int on);
int tdm_model_graphs(const tdm_model *m);
/* A drafter's model drafting from n token ids only (ascending, each once,
 * within the vocabulary), as FR-Spec and SGLang's speculative token maps do:
 * every step's LM head then reads those rows alone (a copy, [n, H], loaded
 * here), so a step streams n/vocab of the head's bytes; its logits come back
 * -inf outside them, and argmaxes and greedy drafts are the best among them
 * (lowest id on ties); tdm_model_weight_bytes then counts those rows for
 * the LM head. Once per model, before its first step:
 * FAILED_PRECONDITION the second time and on a tensor-parallel model;
 * INVALID_ARGUMENT naming the first entry out of order or range. */
tdm_status tdm_model_set_draft_vocab(tdm_model *m, const int32_t *ids, int n, tdm_error *err);
/* A drafter's model computing with its matrices rounded to FP8 E4M3, one
 * power-of-two scale a matrix (kernels/backend.h, TDM_DTYPE_FP8): every
 * matrix the layers' projections and the LM head read, whose rows are a
 * multiple of 64 values and whose range a scale covers, is replaced by its
 * codes (a step streams half the bytes of bf16). A tied LM head is the
 * embedding's table, which then reads the rounded values; an untied
 * embedding stays as loaded. A draft vocabulary's rows are the rounded
 * head's (under its scale). Each rounded weight is the E4M3 value
 * nearest weight · 2^-scale, ties to even, with the least scale that keeps
 * the largest magnitude within 448; outputs are then exactly those of a
 * checkpoint holding the rounded values. Once per model, before its first
 * step; a draft vocabulary set later is rounded as it loads. *converted and
 * *kept (either may be NULL) get the matrices rounded and left as they were.
 * FAILED_PRECONDITION on a tensor-parallel model or the second time;
 * RESOURCE_EXHAUSTED when the backend cannot hold a rounded copy. */
tdm_status tdm_model_set_weights_fp8(tdm_model *m, int *converted, int *kept, tdm_error *err);
/* Tokens the model's logits cover: its draft vocabulary's, or all. */
int tdm_model_draft_vocab_size(const tdm_model *m);
/* The token id of entry t of a logits row of that width: t itself without a
 * draft vocabulary. */
int32_t tdm_model_draft_vocab_id(const tdm_model *m, int t);
/* Sizes the workspace for forward steps of up to `rows` rows now
 * (tdm_capacity_workspace_bytes), so that such steps allocate nothing;
 * RESOURCE_EXHAUSTED when the backend cannot hold it. */
tdm_status tdm_model_reserve_workspace(tdm_model *m, int rows, tdm_error *err);
/* Prefills a prompt of `tokens` tokens (id 0) on a throwaway sequence, so
 * that what a backend sets up on the first prompt it prefills is done before
 * a service serves (on CUDA, cuBLAS for the prompts' matmuls: its start took
 * a drafter's first open 69 ms on one H100, and that open's wait was taken
 * for what every open costs). */
tdm_status tdm_model_warm_prompt(tdm_model *m, tdm_state_strategy strategy, int tokens,
                                 tdm_error *err);
/* A prompt long enough for each backend's prompt path (CUDA: cuBLAS from 16 rows). */
#define TDM_WARM_PROMPT_TOKENS 64
/* Host memory the engine downloads into fastest (CUDA: page-locked), for
 * logits buffers; NULL when exhausted. Free it with tdm_model_host_free, on
 * the same model, before the model is destroyed. */
void *tdm_model_host_alloc(tdm_model *m, size_t nbytes);
void tdm_model_host_free(tdm_model *m, void *p); /* NULL is fine */

/* ---- sequences ------------------------------------------------------- */

/* tdm_state_strategy (common/defs.h), the strategy a sequence commits with:
 * - extra_buffer: verify keeps the conv window and recurrent state after
 *   every position; commit picks one. Most memory, no recomputation.
 * - no_buffer: verify checkpoints the states first; a partial accept
 *   restores them and recomputes the accepted positions. Least memory.
 * - replay: verify leaves the recurrent state as it is and records each
 *   position's recurrence inputs (k, v, decay, beta); commit replays the
 *   accepted positions' recurrence on the state (no matrix products). Conv
 *   windows as in extra_buffer (they are small). Little memory, and a verify
 *   writes no per-position states. */

typedef struct tdm_seq_params {
    tdm_state_strategy strategy;
    int max_draft; /* most draft tokens one verify may carry (k); >= 0 */
    /* 0: KV caches start small and double as positions come. > 0: the
     * sequence holds KV for that many positions from its creation (what a
     * caller accounted for it: capacity.h), and grows only past them. */
    int max_positions;
} tdm_seq_params;

typedef struct tdm_seq tdm_seq;

tdm_status tdm_seq_create(tdm_model *m, const tdm_seq_params *p, tdm_seq **out, tdm_error *err);
void tdm_seq_destroy(tdm_seq *s);
/* A full copy of `src` at its committed position (no verify may be pending). */
tdm_status tdm_seq_fork(const tdm_seq *src, tdm_seq **out, tdm_error *err);
/* Committed positions. */
int tdm_seq_length(const tdm_seq *s);

/* Runs n tokens through the sequence (a prompt, or a continuation of it), in
 * chunks. logits: NULL, or host [n, vocab] for every position. */
tdm_status tdm_seq_prefill(tdm_seq *s, const int32_t *tokens, int n, float *logits, tdm_error *err);

/* One token for each of nseq sequences in one batched pass; logits host
 * [nseq, vocab] (may be NULL). */
tdm_status tdm_seq_decode(tdm_seq *const *seqs, int nseq, const int32_t *tokens, float *logits,
                          tdm_error *err);

/* Verifies blocks for nseq sequences in one pass: sequence i gets
 * ntokens[i] = 1 + k_i tokens (its last sampled token then k_i drafts,
 * k_i <= max_draft). logits host [sum ntokens, vocab], sequences in order.
 * A sequence with a pending verify may be verified again: the new rows are
 * appended to the pending ones (at most max_draft + 1 in all), which is how a
 * drafter runs its draft steps one token at a time and still rolls back.
 * Each sequence then needs tdm_seq_commit before a prefill or decode. If the
 * pass fails, each sequence is left at its committed position with nothing
 * pending. */
tdm_status tdm_seq_verify(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                          const int *ntokens, float *logits, tdm_error *err);

/* The verifier's round: sequence i runs ntokens[i] tokens. One token is a
 * plain decode step, committed at once (no per-position states, no
 * checkpoint); more is a verify block (as tdm_seq_verify) that needs
 * tdm_seq_commit. logits host [sum ntokens, vocab]. */
tdm_status tdm_seq_step(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                        const int *ntokens, float *logits, tdm_error *err);

/* What a step brings back to the host. logits: NULL, or host [rows, vocab]
 * with rows in sequence order; sequence i's rows are written when
 * want_logits is NULL or want_logits[i] is set (the others are left as they
 * are). argmax: NULL, or host [rows]: every row's argmax (lowest id on ties),
 * taken where the logits are, so a greedy caller need not copy 4·vocab bytes
 * per row across (1 MB for Qwen3.5's vocabulary). */
typedef struct tdm_step_out {
    float *logits;
    const uint8_t *want_logits;
    int32_t *argmax;
    /* NULL, or host [rows, H]: each row's hidden state after the final norm
     * (what the LM head reads, and what an MTP head takes: mtp.h), for the
     * sequences want_hidden flags (NULL: the same sequences' rows as logits). */
    float *hidden;
    const uint8_t *want_hidden;
    /* NULL, or per sequence [nseq]: a sequence whose logits are wanted and
     * whose settings here sample (temperature > 0, top_k != 1) gets its rows
     * turned into tdm_sampling_probs' probabilities under them (0 outside
     * the support) and kept where the logits are (on the device with the
     * backend's sample_to, else on the host, in its rows of logits): they
     * do not come back, and instead
     *  - drawn[i] = the token tdm_sampling_draw draws from its last row's
     *    distribution with the uniform probs_of[i].u (the draw of plain
     *    decoding, or of a verify block whose drafts all stand);
     *  - picked[r], for each of its other rows r, = row r's probability of
     *    the token row r + 1 takes (its draft: the acceptance test's p).
     * tdm_step_probs_fetch brings a kept row's distribution to the host
     * afterwards (a rejected draft's residual). Not for a model with a
     * draft vocabulary. */
    const tdm_sample_row *probs_of;
    int32_t *drawn; /* host [nseq], with probs_of */
    float *picked;  /* host [rows], with probs_of */
} tdm_step_out;

/* After a step on m with probs_of (and before m's next call): the kept
 * distributions of the step's rows `rows` (numbered as in the step) into
 * logits + row * vocab (host), where its logits would have come. A row the
 * step did not keep is refused (INVALID_ARGUMENT). */
tdm_status tdm_step_probs_fetch(tdm_model *m, float *logits, const int *rows, int n,
                                tdm_error *err);

/* tdm_seq_prefill with a choice of what comes back: logits, argmax and
 * hidden, each for every position (want_logits is unused). */
tdm_status tdm_seq_prefill_out(tdm_seq *s, const int32_t *tokens, int n, const tdm_step_out *out,
                               tdm_error *err);

/* Host buffers a caller keeps for its steps' outputs: logits in the model's
 * fastest host memory (tdm_model_host_alloc; a vocabulary of floats a row,
 * so only as many rows as a step brings back logits for), every row's
 * argmax, and the per-sequence want_logits flags. Grown on demand without a
 * copy (a step reads only what it wrote). Zero-initialise, then reserve
 * before each step; free before the model is destroyed. */
typedef struct tdm_step_buf {
    tdm_model *m;
    float *logits;   /* [logits_cap, vocab]; NULL until a step wants logits */
    int32_t *argmax; /* [rows] */
    uint8_t *want;   /* [rows]: per sequence of a step, its logits are wanted */
    int32_t *drawn;  /* [rows]: per sequence, tdm_step_out.drawn */
    float *picked;   /* [rows]: tdm_step_out.picked */
    size_t rows, logits_cap;
    size_t logit_rows; /* the reserved step's: 0, no logits (tdm_step_buf_out) */
} tdm_step_buf;

/* Room for a step of `rows` rows whose rows below logit_rows may bring back
 * their logits (the sequences whose want flag is set lie there; 0: none, the
 * step's tdm_step_out has no logits); RESOURCE_EXHAUSTED naming the size
 * when the host cannot hold them (the buffer is left as it was). */
tdm_status tdm_step_buf_reserve(tdm_step_buf *b, tdm_model *m, size_t rows, size_t logit_rows,
                                tdm_error *err);
void tdm_step_buf_free(tdm_step_buf *b);
/* The tdm_step_out that writes into b. */
tdm_step_out tdm_step_buf_out(const tdm_step_buf *b);

/* tdm_seq_step and tdm_seq_verify with a choice of what comes back. */
tdm_status tdm_seq_step_out(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                            const int *ntokens, const tdm_step_out *out, tdm_error *err);
tdm_status tdm_seq_verify_out(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                              const int *ntokens, const tdm_step_out *out, tdm_error *err);

/* Greedy drafting: for each sequence i, what k[i] verify calls would do
 * that run lead[i] (nlead[i] tokens) and then, one token a call, each
 * call's draft, where draft j is the argmax of the last row of call j
 * (lowest id on ties), or forced[i][j] when forced is set (a benchmark's
 * controlled proposals; the model still runs every row). drafts[i] gets
 * the k[i] drafts; the rows stay pending (nlead[i] + k[i] - 1 of them, on
 * top of any pending before), to be committed as after tdm_seq_verify. On
 * a backend with device drafting (backend.h: argmax_to, embed_dev) and
 * the extra_buffer or replay strategy, the calls run as one launch with
 * nothing crossing to the host between them (a CUDA graph per shape);
 * otherwise as separate verify calls. k[i] >= 1. If it fails, each
 * sequence is left as it was before the call. */
tdm_status tdm_seq_draft(tdm_seq *const *seqs, int nseq, const int32_t *const *lead,
                         const int *nlead, const int *k, const int32_t *const *forced,
                         int32_t *const *drafts, tdm_error *err);

/* A sequence's sampled draft chain (tdm_seq_draft_sampled): its settings,
 * each draft's uniform draw, and where each draft's distribution goes. */
typedef struct tdm_draft_sampling {
    float temperature, top_p; /* tdm_sampling's (spec/sampling.h) */
    uint32_t top_k;
    const double *u; /* [k]: draft j's uniform in [0, 1) */
    /* host [k, tdm_model_draft_vocab_size]: draft j's distribution,
     * tdm_sampling_probs' probabilities (0 outside the support), entry t
     * for the token tdm_model_draft_vocab_id(m, t) */
    float *probs;
} tdm_draft_sampling;

/* tdm_seq_draft where sequence i with sampling[i] set draws its drafts
 * (tdm_sampling_probs + tdm_sampling_draw with u[j], as a verify call's
 * logits would give on the host) instead of taking the argmax; with the
 * backend's sample_to it runs on the device like a greedy chain, each
 * draft fed to the next step there (on CUDA a draw may differ from the
 * host's where u lies within rounding of a cumulative boundary; its
 * distribution is the one it was drawn from). sampling NULL, or an entry
 * NULL: greedy. */
tdm_status tdm_seq_draft_sampled(tdm_seq *const *seqs, int nseq, const int32_t *const *lead,
                                 const int *nlead, const int *k,
                                 const tdm_draft_sampling *const *sampling,
                                 int32_t *const *drafts, tdm_error *err);

/* Keeps the first n_accepted + 1 positions of the pending verify (-1 <=
 * n_accepted < ntokens) and leaves the sequence exactly as if only those had
 * been run; -1 drops them all (back to the committed position). */
tdm_status tdm_seq_commit(tdm_seq *s, int n_accepted, tdm_error *err);

typedef struct tdm_seq_memory {
    size_t kv_bytes;        /* attention KV caches, as allocated now */
    size_t recurrent_bytes; /* recurrent states of the linear layers */
    size_t conv_bytes;      /* conv windows */
    size_t strategy_bytes;  /* per-position states (extra_buffer), checkpoint (no_buffer) or
                               conv windows and recurrence inputs per position (replay) */
} tdm_seq_memory;

void tdm_seq_memory_usage(const tdm_seq *s, tdm_seq_memory *mem);

#endif
