/*
 * mtp.h - the multi-token-prediction (MTP) head that Qwen3.5/3.6 checkpoints
 * carry beside the text model (mtp.* tensors), run as a drafter.
 *
 * Owns: the head's weights (mtp.fc split into its two halves, three
 * zero-centred norms, one gated-attention decoder layer) on the backend, and
 * per sequence its KV cache and the head's last output. It shares the
 * target's token embedding and LM head (tied or not): from the loaded model
 * (tdm_mtp_create) or from its own load of just those (tdm_mtp_open, for a
 * drafter that receives the target's hidden states from elsewhere).
 *
 * One row at position p takes the target's hidden state at p and the token
 * at p + 1, and predicts the token at p + 2 (engine/README.md, MTP, gives
 * the sources of this convention):
 *
 *   e = pre_fc_norm_embedding(embed(token[p+1]))      RMSNorm (1 + w)
 *   g = pre_fc_norm_hidden(hidden[p])                 RMSNorm (1 + w)
 *   x = fc(cat(e, g))                                 [H, 2H]: e first
 *   x = decoder layer mtp.layers.0 (gated attention at position p, own KV)
 *   y = norm(x)                                       RMSNorm (1 + w)
 *   logits = lm_head(y)
 *
 * `hidden` is the target's state after its final norm (what its LM head
 * reads: tdm_step_out.hidden). Drafting feeds y back as the next row's
 * hidden together with the token just drafted.
 *
 * A drafting round, with the target at n positions and its next token x[n]:
 *   tdm_mtp_prime(hidden[p], x[p+1]) for the positions not primed yet, up
 *     to p = n - 1;
 *   tdm_mtp_draft(k): d1 = argmax of the last primed row, then k - 1 rows
 *     of (y, d_j) at positions n .. n+k-2;
 *   the target verifies x[n], d1..dk, accepts a drafts and gives x[n+a+1];
 *   tdm_mtp_rollback(n) drops the draft rows, and the next prime brings the
 *     target's hidden states of positions n .. n+a with tokens
 *     d1..da, x[n+a+1].
 *
 * Threading: as the model's (one call at a time per model: the head uses
 * its workspace). Numbers: fp32 activations and caches.
 */
#ifndef TANDEM_ENGINE_MTP_H
#define TANDEM_ENGINE_MTP_H

#include "engine.h"

typedef struct tdm_mtp tdm_mtp;
typedef struct tdm_mtp_seq tdm_mtp_seq;

/* The MTP head of the checkpoint m was loaded from, sharing m's embedding
 * and LM head; m must outlive it. NOT_FOUND naming the missing tensor when
 * the checkpoint has no head (or an incomplete one); UNIMPLEMENTED for
 * config.json's mtp_num_hidden_layers above 1. */
tdm_status tdm_mtp_create(tdm_model *m, tdm_mtp **out, tdm_error *err);
/* The same from a checkpoint folder, loading only the embedding, the final
 * norm and the LM head of the target beside the head (no decoder layers). */
tdm_status tdm_mtp_open(const char *dir, tdm_backend *be, tdm_mtp **out, tdm_error *err);
/* The checks of tdm_mtp_open without a backend: every tensor present, of its
 * shape and a supported dtype. */
tdm_status tdm_mtp_check(const char *dir, tdm_error *err);
void tdm_mtp_destroy(tdm_mtp *h); /* NULL is fine; its sequences first */
/* Bytes of the head's own tensors as stored (the shared ones not counted). */
size_t tdm_mtp_weight_bytes(const tdm_mtp *h);
const tdm_model_config *tdm_mtp_get_config(const tdm_mtp *h);

/* Drafts from n token ids only (ascending, each once, within the model's
 * vocabulary), as FR-Spec and SGLang's speculative token maps do: a draft
 * step's LM head reads those rows alone (a copy, [n, H], loaded here), so
 * it streams n/vocab of the head's bytes; a draft's logits are -inf
 * outside them, and greedy drafts are the argmax among them (lowest id on
 * ties). A prime's logits stay the whole vocabulary's. Once per head,
 * before its first draft: FAILED_PRECONDITION the second time;
 * INVALID_ARGUMENT naming the first entry out of order or range. */
tdm_status tdm_mtp_set_vocab(tdm_mtp *h, const int32_t *ids, int n, tdm_error *err);
/* What tdm_mtp_set_weights_fp8 did: matrices rounded and left as stored
 * (the LM head's among them where it rounded it), the head's own weights'
 * bytes before and after, and what became of the LM head. */
typedef enum tdm_mtp_fp8_head {
    TDM_MTP_FP8_HEAD_ROUNDED, /* the LM head of the head's own load: rounded */
    TDM_MTP_FP8_HEAD_KEPT,    /* the same, left as stored (tdm_model_set_weights_fp8 says when) */
    TDM_MTP_FP8_HEAD_TARGETS, /* the target's (tdm_mtp_create): the target's own rounding
                                 (tdm_model_set_weights_fp8) decides */
} tdm_mtp_fp8_head;
typedef struct tdm_mtp_fp8 {
    int converted, kept;
    size_t before, after;
    tdm_mtp_fp8_head lm_head;
    int tied;       /* that LM head is the embedding's table (rounded: both read it so) */
    int vocab_rows; /* a draft vocabulary's rows were among those rounded */
} tdm_mtp_fp8;
/* The head computing with its matrices rounded to FP8 E4M3 as
 * tdm_model_set_weights_fp8 rounds a model's: mtp.fc's two halves, the
 * decoder layer's projections, for tdm_mtp_open the LM head (a tied one is
 * the embedding's table, which then reads the rounded values), and a draft
 * vocabulary's rows, which are the LM head's rounded under its scale (one
 * set later is rounded as it loads); the norms stay as loaded. Drafts are
 * then exactly those of a checkpoint holding the rounded values. Once per
 * head, before its first prime: FAILED_PRECONDITION the second time;
 * RESOURCE_EXHAUSTED when the backend cannot hold a rounded copy. got: NULL,
 * or what it did. */
tdm_status tdm_mtp_set_weights_fp8(tdm_mtp *h, tdm_mtp_fp8 *got, tdm_error *err);
/* Tokens a draft can be: the draft vocabulary's, or the model's; the id of
 * the t-th of them. */
int tdm_mtp_vocab_size(const tdm_mtp *h);
int32_t tdm_mtp_vocab_id(const tdm_mtp *h, int t);
/* tdm_model_host_alloc and tdm_model_host_free of the head's model: host
 * memory a draft's distributions come back into fastest. */
void *tdm_mtp_host_alloc(tdm_mtp *h, size_t nbytes);
void tdm_mtp_host_free(tdm_mtp *h, void *p);
/* Whether a draft's steps after its first go through the backend's graph
 * slots (backend.h: graph_begin), as one launch on a backend with graphs
 * and device drafting; off by default. The same bits either way. */
void tdm_mtp_set_graphs(tdm_mtp *h, int on);

/* A sequence of the head: an empty KV cache for max_positions positions (0:
 * it starts small and grows). */
tdm_status tdm_mtp_seq_create(tdm_mtp *h, int max_positions, tdm_mtp_seq **out, tdm_error *err);
void tdm_mtp_seq_destroy(tdm_mtp_seq *s); /* NULL is fine */
/* Positions in the head's KV cache, draft rows included. */
int tdm_mtp_seq_length(const tdm_mtp_seq *s);
/* Backend memory the sequence holds now (tdm_capacity_mtp_seq_bytes at its
 * KV cache's capacity). */
size_t tdm_mtp_seq_bytes(const tdm_mtp_seq *s);

/* Runs n rows at positions length .. length+n-1: row i takes the target's
 * hidden state of its position, hidden host [n, H], and next[i], the token
 * at the position after it. logits: NULL, or host [n, vocab], row i the
 * head's prediction for position length+i+2. FAILED_PRECONDITION while
 * draft rows are in the cache (roll them back first). */
tdm_status tdm_mtp_prime(tdm_mtp_seq *s, const float *hidden, const int32_t *next, int n,
                         float *logits, tdm_error *err);

/* k greedy drafts (argmax, lowest id on ties) into drafts[k], continuing
 * from the last primed row or from the last draft call (k - 1 rows a call;
 * a later call first runs the previous call's last draft). logits: NULL, or
 * host [k, vocab], the distribution each draft was taken from.
 * FAILED_PRECONDITION when nothing was primed since the last rollback. */
tdm_status tdm_mtp_draft(tdm_mtp_seq *s, int k, int32_t *drafts, float *logits, tdm_error *err);

/* The same for nseq sequences of one head in one batch of forwards (rows of
 * at most TDM_PREFILL_ROWS): sequence i primes n[i] rows from hidden[i]
 * (host [n[i], H]) and next[i]; logits NULL or host [sum n, vocab], the
 * sequences' rows in order. The rows give the bits they give alone. */
tdm_status tdm_mtp_prime_n(tdm_mtp_seq *const *seqs, int nseq, const float *const *hidden,
                           const int32_t *const *next, const int *n, float *logits, tdm_error *err);
/* k[i] drafts of sequence i into drafts[i], one forward per draft step for
 * all the sequences still drafting; logits NULL or host [sum k, vocab],
 * sequence i's k[i] rows together, in sequence order. The bits of
 * tdm_mtp_draft on each alone. forced: NULL, or forced[i] [k[i]] the
 * proposals to take instead of the argmax (each one still computed and fed
 * to the next step as a draft would be: a benchmark's controlled
 * acceptance). Without logits, on a backend with device drafting
 * (backend.h: argmax_to, embed_dev), the steps run without a trip to the
 * host between them. */
tdm_status tdm_mtp_draft_n(tdm_mtp_seq *const *seqs, int nseq, const int *k,
                           const int32_t *const *forced, int32_t *const *drafts, float *logits,
                           tdm_error *err);

/* tdm_mtp_draft_n where sequence i with sampling[i] set draws its drafts
 * (tdm_sampling_probs + tdm_sampling_draw with u[j] over its draft
 * vocabulary's logits) instead of taking the argmax, its distributions
 * into sampling[i]->probs ([k[i], tdm_mtp_vocab_size], entry t for the
 * token tdm_mtp_vocab_id(h, t)), as tdm_seq_draft_sampled does for a
 * model: with the backend's sample_to on the device like a greedy chain
 * (on CUDA a draw may differ from the host's where u lies within rounding
 * of a cumulative boundary), else on the host. sampling NULL, or an entry
 * NULL: greedy. */
tdm_status tdm_mtp_draft_sampled(tdm_mtp_seq *const *seqs, int nseq, const int *k,
                                 const tdm_draft_sampling *const *sampling, int32_t *const *drafts,
                                 tdm_error *err);

/* Keeps positions 0 .. position-1 of the cache (0 <= position <= length);
 * an attention cache needs nothing else. Unless position == length, the
 * next draft needs a prime first. */
tdm_status tdm_mtp_rollback(tdm_mtp_seq *s, int position, tdm_error *err);

#endif
