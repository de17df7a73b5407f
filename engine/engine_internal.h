/*
 * engine_internal.h - structures shared by the engine's files (model.c,
 * seq.c); not part of the engine's API (tests that compare states read
 * them).
 */
#ifndef TANDEM_ENGINE_INTERNAL_H
#define TANDEM_ENGINE_INTERNAL_H

#include "comm.h"
#include "engine.h"
#include "safetensors.h"
#include "shard.h"

typedef struct tdm_group tdm_group; /* group.c */

/* Weights of one decoder layer. Matrices are [out, in] in backend memory
 * (bf16 or f32); vectors are f32 in backend memory. */
typedef struct tdm_layer_weights {
    tdm_layer_kind kind;
    const float *input_norm, *post_norm; /* [H] zero-centred */
    /* linear attention */
    tdm_weight in_qkv;            /* [conv_dim, H] */
    tdm_weight in_z;              /* [Hv*Dv, H] */
    tdm_weight in_b;              /* [Hv, H] */
    tdm_weight in_a;              /* [Hv, H] */
    tdm_weight out_proj;          /* [H, Hv*Dv] */
    const float *conv_w;          /* [conv_dim, K] */
    const float *A_log, *dt_bias; /* [Hv] */
    const float *gnorm;           /* [Dv] plain weight */
    /* full attention */
    tdm_weight q_proj;            /* [nH*2D, H]: per head D query rows then D gate rows */
    tdm_weight k_proj, v_proj;    /* [nKV*D, H] */
    tdm_weight o_proj;            /* [H, nH*D] */
    const float *q_norm, *k_norm; /* [D] zero-centred */
    /* MLP */
    tdm_weight gate, up; /* [I, H] */
    tdm_weight down;     /* [H, I] */
} tdm_layer_weights;

/* Per-call activations in backend memory, sized for `rows` rows. */
typedef struct tdm_workspace {
    int rows;
    void *block;       /* one allocation holding everything below */
    float *x, *xn;     /* [R, H] residual stream, normed copy */
    float *qkv, *qkvc; /* [R, conv_dim] pre-conv, post-conv */
    float *z;          /* [R, Hv*Dv] */
    float *a, *b;      /* [R, Hv] */
    float *o, *o2;     /* [R, max(Hv*Dv, nH*D)] */
    float *qg;         /* [R, nH*2D] */
    float *q, *gate;   /* [R, nH*D] */
    float *k, *v;      /* [R, nKV*D] */
    float *h1, *h2;    /* [R, I] */
    float *logits;     /* [R, vocab] */
    float *gathered;   /* tensor parallel: [size, R, vocab / size], the ranks' LM head slices */
} tdm_workspace;

/* What loading placed on the backend for a model (or an MTP head, mtp.c):
 * backend memory to free, host buffers that backend weights alias
 * (converted or re-laid-out tensors), and the bytes of the weights as
 * stored. */
typedef struct tdm_weight_store {
    void **owned; /* backend memory to free */
    size_t nowned, capowned;
    void **host; /* host buffers aliased by backend weights */
    size_t nhost, caphost;
    size_t weight_bytes;
} tdm_weight_store;

void tdm_weight_store_free(tdm_backend *be, tdm_weight_store *s);

/* A draft vocabulary (tdm_model_set_draft_vocab, tdm_mtp_set_vocab): the LM
 * head's rows of n token ids, which draft steps read instead of the whole
 * head; n 0: none. */
typedef struct tdm_draft_vocab {
    int n;
    tdm_weight head; /* [n, H], placed in m->into's store */
    int32_t *ids;    /* host [n]: the token ids, ascending */
    int32_t *map;    /* backend [n]: the same, for argmax_to */
} tdm_draft_vocab;

struct tdm_model {
    tdm_model_config cfg;  /* what this model computes with: a rank's slice (shard.h) */
    tdm_model_config full; /* the checkpoint's config (== cfg for a whole model) */
    tdm_comm *comm;        /* a tensor-parallel rank's communicator (borrowed); NULL: whole */
    tdm_shard shard;       /* where the rank's slices lie (rank 0 of 1 for a whole model) */
    tdm_backend *be;
    char *dir; /* the checkpoint folder */
    tdm_st_file *st;
    tdm_weight embed;        /* [vocab, H] */
    tdm_weight lm_head;      /* [vocab, H]; == embed when tied */
    const float *final_norm; /* [H] */
    tdm_layer_weights *layers;
    float *inv_freq; /* host [rot_dim/2] */
    int conv_dim;
    tdm_weight_store store; /* the model's weights, freed at destroy */
    tdm_weight_store *into; /* where loaders record what they place: &store, or an MTP head's */
    tdm_workspace ws;
    tdm_draft_vocab dv; /* every logits row over these ids alone (drafters) */
    int32_t *draft_ids; /* backend memory [draft_cap]: tdm_seq_draft's tokens */
    int draft_cap;
    /* backend memory [draft_probs_rows, draft vocabulary]: a sampled chain's
     * distributions, a row per draft (tdm_seq_draft_sampled) */
    float *draft_probs;
    size_t draft_probs_rows;
    /* backend memory [step_probs_rows, vocabulary], [step_probs_rows] and
     * [step_probs_rows]: a step's rows turned into probabilities
     * (tdm_step_out.probs_of), sample_to's draws and each row's pick */
    float *step_probs;
    int32_t *step_probs_ids;
    float *step_probs_pick;
    size_t step_probs_rows;
    /* The last step's kept rows (tdm_step_probs_fetch): step row
     * kept_rows[j] is in step_probs + j * vocab where kept_dev, else in
     * kept_host + row * vocab. The model's next forward pass drops them. */
    int32_t *kept_rows; /* host [kept_cap] */
    int kept_n, kept_cap;
    bool kept_dev;
    float *kept_host;
    int graphs;       /* steps go through the backend's graph slots (tdm_model_set_graphs) */
    int fp8;          /* matrices rounded to FP8 (tdm_model_set_weights_fp8) */
    tdm_group *group; /* a tensor-parallel model's ranks (group.c); NULL for one model */
};

/* A sequence's state in backend memory (seq.c). */
struct tdm_seq {
    tdm_model *m;
    tdm_seq_params p;
    int n_past; /* positions in the caches, including a pending verify's */
    int kv_cap; /* positions the KV caches hold */
    /* per layer; NULL where the layer kind has no such state */
    float **k, **v;          /* [kv_cap, nKV*D] */
    float **conv;            /* [K-1, conv_dim] last pre-conv inputs, oldest first */
    float **rec;             /* [Hv, Dk, Dv] */
    float **conv_x, **rec_x; /* extra_buffer: [max_draft+1, ...] per position;
                                no_buffer: [1, ...] checkpoint; replay: conv_x
                                per position, rec_x the record of the positions'
                                recurrence inputs [max_draft+1, gdn input floats] */
    int pending;             /* rows of an uncommitted verify, 0 if none */
    int base;                /* n_past before that verify */
    int verifying;           /* set for the duration of a forward: rows join the pending ones */
    int32_t *pend_tokens;    /* [max_draft+1] its tokens (no_buffer recompute) */
    tdm_seq **ranks;         /* a tensor-parallel model's sequence: the ranks' (group.c);
                                nothing else above is set */
};

/* A tensor-parallel model's ranks behind the whole model's API (group.c):
 * each call below runs the same call on every rank's model or sequences, on
 * the ranks' threads, and returns rank 0's results. */
void tdm_group_destroy(tdm_group *g);
void tdm_group_set_graphs(tdm_group *g, int on);
tdm_status tdm_group_reserve_workspace(tdm_group *g, int rows, tdm_error *err);
/* A prefix-cache block of a group's sequence in the checkpoint's layout
 * (prefix_cache.c): every rank takes its slices (tdm_prefix_block_take) and
 * writes them into their places in p; give reads every rank's slices of the
 * prefix's nblocks blocks from their places and uploads them, leaving the
 * sequence at nblocks·B positions. */
tdm_status tdm_group_prefix_take(const tdm_seq *s, int n, int j, int B, uint8_t *p,
                                 tdm_error *err);
tdm_status tdm_group_prefix_give(tdm_seq *s, const void *const *blocks, int nblocks, int B,
                                 tdm_error *err);
/* One model's (or one rank's) prefix-cache block in its own layout, the
 * sizes of its own config (prefix_cache.c): take copies the state at
 * position n, the end of a block of B positions (row j of a pending verify
 * when j >= 0), into p; give queues block i of a prefix from p into s (K and
 * V always, the linear layers' states when `last`); the caller syncs. */
tdm_status tdm_prefix_block_take(const tdm_seq *s, int n, int j, int B, uint8_t *p,
                                 tdm_error *err);
void tdm_prefix_block_give(tdm_seq *s, int i, bool last, int B, const uint8_t *p);
tdm_status tdm_group_seq_create(tdm_model *m, const tdm_seq_params *p, tdm_seq **out,
                                tdm_error *err);
tdm_status tdm_group_seq_fork(const tdm_seq *src, tdm_seq **out, tdm_error *err);
void tdm_group_seq_destroy(tdm_seq *s);
tdm_status tdm_group_prefill(tdm_seq *s, const int32_t *tokens, int n, const tdm_step_out *out,
                             tdm_error *err);
tdm_status tdm_group_step(tdm_seq *const *seqs, int nseq, const int32_t *const *tokens,
                          const int *ntokens, int verify, const tdm_step_out *out, tdm_error *err);
tdm_status tdm_group_decode(tdm_seq *const *seqs, int nseq, const int32_t *tokens, float *logits,
                            tdm_error *err);
tdm_status tdm_group_draft(tdm_seq *const *seqs, int nseq, const int32_t *const *lead,
                           const int *nlead, const int *k, const int32_t *const *forced,
                           int32_t *const *drafts, tdm_error *err);
tdm_status tdm_group_commit(tdm_seq *s, int n_accepted, tdm_error *err);
tdm_status tdm_group_reserve_kv(tdm_seq *s, int n, tdm_error *err);
/* tdm_step_probs_fetch on rank 0's model, on its thread (the only rank a
 * step's probs_of reaches: group.c rank_out). */
tdm_status tdm_group_probs_fetch(tdm_group *g, float *logits, const int *rows, int n,
                                 tdm_error *err);
/* A group's sequence's committed state in the whole model's snapshot layout
 * (l: tdm_snap_layout_expected of the checkpoint's config), out of the
 * ranks' slices into payload, or from payload into a new sequence's
 * (committed positions set). */
struct tdm_snap_layout;
struct tdm_snap_tensor;
/* The backend buffer of s's committed state a snapshot layout tensor
 * (snapshot.h) is: a layer's conv window, recurrent state, K or V cache. */
float *tdm_seq_state_buf(const tdm_seq *s, const struct tdm_snap_tensor *t);
tdm_status tdm_group_seq_export(const tdm_seq *s, const struct tdm_snap_layout *l, uint8_t *payload,
                                tdm_error *err);
tdm_status tdm_group_seq_import(tdm_seq *s, const struct tdm_snap_layout *l, const uint8_t *payload,
                                tdm_error *err);

/* One value folded into a graph key (backend.h: graph_begin). */
static inline uint64_t tdm_key_mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

/* Loading (model.c), for the MTP head (mtp.c). Tensors are looked up under
 * the checkpoint's prefixes when with_prefix is set, as named otherwise;
 * what is placed is recorded in m->into. */
/* A decoder layer of `kind` whose tensors are named `pre` + "self_attn....". */
tdm_status tdm_model_load_layer(tdm_model *m, const char *pre, int with_prefix, tdm_layer_kind kind,
                                tdm_layer_weights *w, tdm_error *err);
/* A vector [n] as f32 (unprefixed name). */
tdm_status tdm_model_load_vector(tdm_model *m, const char *name, int64_t n, const float **out,
                                 tdm_error *err);
/* Columns col0 .. col0+ncols-1 of a [rows, cols] matrix (unprefixed name),
 * as their own [rows, ncols] matrix: a copy, in the storage dtype (bf16) or
 * f32. */
tdm_status tdm_model_load_matrix_cols(tdm_model *m, const char *name, int64_t rows, int64_t cols,
                                      int64_t col0, int64_t ncols, tdm_weight *w, tdm_error *err);
/* Rows ids[0..n) of a [rows, cols] matrix, in that order, as their own
 * [n, cols] matrix (a copy, as tdm_model_load_matrix_cols makes);
 * INVALID_ARGUMENT naming the tensor for an id outside 0..rows-1. */
tdm_status tdm_model_load_matrix_rows(tdm_model *m, const char *name, int with_prefix, int64_t rows,
                                      int64_t cols, const int32_t *ids, int n, tdm_weight *w,
                                      tdm_error *err);
/* A matrix to round to FP8 (tdm_model_set_weights_fp8): the weight, and its
 * shape [rows, cols]. scale_of: NULL, the least scale that covers the
 * matrix; else rows of that matrix ([scale_rows, cols], FP8 already or not),
 * rounded under its scale (a draft vocabulary's rows of an LM head: the
 * head's rows rounded, whichever is rounded first). */
typedef struct tdm_fp8_mat {
    tdm_weight *w;
    int64_t rows, cols;
    const tdm_weight *scale_of;
    int64_t scale_rows;
} tdm_fp8_mat;
/* The most matrices tdm_layer_fp8_mats gives for a layer. */
#define TDM_LAYER_FP8_MATS 8
/* A decoder layer's projections into out[] (at most TDM_LAYER_FP8_MATS);
 * how many. */
int tdm_layer_fp8_mats(const tdm_model_config *c, tdm_layer_weights *lw, tdm_fp8_mat *out);
/* mats[0..n), placed in m->into's store, each replaced by its FP8 codes
 * (tdm_model_set_weights_fp8's rounding) on one pool of the host's cores;
 * *nc and *nk count those rounded and those left as they were. */
tdm_status tdm_model_round_fp8(tdm_model *m, const tdm_fp8_mat *mats, int n, int *nc, int *nk,
                               tdm_error *err);
/* Checks ids (ascending, each once, within the vocabulary: INVALID_ARGUMENT
 * naming the first that is not) and loads their LM-head rows into
 * m->into's store; FAILED_PRECONDITION when dv holds a vocabulary already. */
tdm_status tdm_draft_vocab_load(tdm_model *m, const int32_t *ids, int n, tdm_draft_vocab *dv,
                                tdm_error *err);
/* Frees dv's ids and map (its rows go with their store). */
void tdm_draft_vocab_free(tdm_backend *be, tdm_draft_vocab *dv);
/* A row of dv's logits, row[i] for token ids[i] (i < n), spread out in place
 * to the whole vocabulary [V], -inf for the tokens outside it. */
void tdm_draft_vocab_spread(const tdm_draft_vocab *dv, float *row, int V);
/* A model of `dir` with its embedding, final norm and LM head but no
 * decoder layers (an MTP head's own copy of what it shares; no sequences). */
tdm_status tdm_model_load_head(const char *dir, tdm_backend *be, tdm_model **out, tdm_error *err);

/* Ops of one decoder layer on the workspace rows (seq.c's forward pass, shared
 * with the MTP head): w->x [R, H] is the residual stream. */
/* The gated-attention mixer: x += o_proj(attention(...) * sigmoid(gate)).
 * pos [R] host; segment i's rows are stored into k_cache[i]/v_cache[i] at
 * as[i].n_past (as[i] is filled in from row0/nrows/n_past and the caches). */
void tdm_fwd_attention(tdm_model *m, const tdm_layer_weights *lw, int R, const int32_t *pos,
                       tdm_attn_seg *as, float *const *k_cache, float *const *v_cache, int nseg);
/* The SwiGLU MLP with its norm: x += down(silu(gate(xn)) * up(xn)). */
void tdm_fwd_mlp(tdm_model *m, const tdm_layer_weights *lw, int R);

/* INVALID_ARGUMENT naming the first of the n token ids outside m's
 * vocabulary (seq.c). */
tdm_status tdm_model_check_tokens(const tdm_model *m, const int32_t *t, int n, tdm_error *err);

/* Grows s's KV caches to hold n positions (seq.c), as a forward of that
 * length would; RESOURCE_EXHAUSTED when the backend has no room. */
tdm_status tdm_seq_reserve_kv(tdm_seq *s, int n, tdm_error *err);

#endif
