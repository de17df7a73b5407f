/*
 * backend.h - the compute backend interface of the model engine.
 *
 * A backend owns device memory and runs the ops of a hybrid-model forward
 * pass on it. It is a struct of function pointers plus an opaque context
 * (the ggml-backend pattern); the engine calls only these slots and never
 * includes a backend's internals. The CPU backend (kernels/cpu/) computes in
 * fp32 over bf16/fp16/fp32 weights; a CUDA backend implements the same slots.
 *
 * Memory: `alloc` returns backend memory ("device pointers"). The engine only
 * does pointer arithmetic on them and hands them back to ops or copy slots;
 * it never dereferences them. Host memory enters and leaves through
 * upload/download. Activations, caches and states are fp32.
 *
 * Rows: most ops work on R independent rows of a [R, n] matrix. The rows of
 * one call may belong to different sequences (batched decode/verify); ops that
 * read per-sequence state (conv, gated delta rule, attention) take a list of
 * segments, each a contiguous run of rows of one sequence. Every op computes
 * each row with the same arithmetic whatever R and the segmentation are, so a
 * batched call gives bit-identical rows to unbatched ones.
 *
 * Pointers named in the op arguments that are arrays of segments or of
 * positions/token ids are host memory and only read during the call.
 *
 * Graphs: a backend may record the ops of one forward step and replay them
 * on later steps as one launch (graph_begin / graph_end below). A replay
 * re-reads those host arrays, but nothing an op receives by value (sizes,
 * flags, device pointers passed directly): those are what the recorded
 * step was built from.
 *
 * Threading: a backend serves one caller at a time (its ops may use a worker
 * pool of their own); callers that share one serialise their calls.
 */
#ifndef TANDEM_KERNELS_BACKEND_H
#define TANDEM_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef enum tdm_dtype {
    TDM_DTYPE_F32 = 0,
    TDM_DTYPE_BF16 = 1,
    TDM_DTYPE_F16 = 2,
    /* OCP FP8 E4M3 (finite: max 448, subnormals from 2^-9) codes, one per
     * weight, each standing for code · 2^scale_exp (tdm_weight). A matrix
     * of them computes exactly as the bf16 matrix of those values would:
     * every such value is a bf16 (tdm_fp8_value), so the two give the same
     * bits on every path of a backend. Only matrices read by the matmul
     * slots come in it, with `in` a multiple of 64, and the embedding op's
     * table (a tied LM head's). */
    TDM_DTYPE_FP8 = 3,
} tdm_dtype;

size_t tdm_dtype_size(tdm_dtype dt);
const char *tdm_dtype_name(tdm_dtype dt);

/* A weight matrix or vector in backend memory. */
typedef struct tdm_weight {
    const void *data; /* backend memory */
    tdm_dtype dtype;
    int scale_exp; /* TDM_DTYPE_FP8: every code stands for code · 2^scale_exp; else 0 */
} tdm_weight;

/* FP8 E4M3 weights (TDM_DTYPE_FP8). The exponents a matrix may take, so
 * that every value code · 2^e is a normal bf16 (and float). */
#define TDM_FP8_EXP_MIN (-100)
#define TDM_FP8_EXP_MAX 15

/* The value of E4M3 code c times 2^e (exact). */
float tdm_fp8_value(uint8_t c, int e);
/* The scale exponent for a matrix whose largest magnitude is amax: the
 * least e in [TDM_FP8_EXP_MIN, TDM_FP8_EXP_MAX] with amax · 2^-e <= 448,
 * 0 for amax == 0; *e set, returns 0. Returns -1 where none fits: amax not
 * finite, too large, or nonzero and at most 2^(TDM_FP8_EXP_MIN - 10), half
 * the smallest code, where every weight would round to zero. */
int tdm_fp8_scale_exp(float amax, int *e);
/* The E4M3 code nearest v · 2^-e, ties to the even code (|v| · 2^-e <=
 * 448, as tdm_fp8_scale_exp's e gives). */
uint8_t tdm_fp8_encode(float v, int e);

/* One sequence's rows in a causal-conv call. The state holds the last K-1
 * pre-conv inputs, oldest first: [K-1, C]. */
typedef struct tdm_conv_seg {
    int row0, nrows;
    float *state;      /* [K-1, C]; updated in place when states_out is NULL */
    float *states_out; /* NULL, or [nrows, K-1, C]: the state after each row; state is left as is */
} tdm_conv_seg;

/* The inputs of a delta rule's gates (gdn_recurrent). */
typedef struct tdm_gdn_gates {
    const float *a, *b;           /* [R, Hv]: the layer's in_a and in_b projections */
    const float *A_log, *dt_bias; /* [Hv] f32 */
} tdm_gdn_gates;

/* One sequence's rows in a gated-delta-rule call. */
typedef struct tdm_gdn_seg {
    int row0, nrows;
    /* [Hv, Dk, Dv]; updated in place when states_out and inputs are NULL */
    float *state;
    /* NULL, or [nrows, Hv, Dk, Dv]: state after each row; state is left as is */
    float *states_out;
    /* NULL, or a record of rows [>= replayed + nrows, tdm_gdn_input_floats]
     * (the replay strategy): the segment starts from `state` advanced by
     * record rows 0 .. replayed-1, writes each of its own rows' recurrence
     * inputs at record row replayed + i, and leaves `state` as is;
     * gdn_replay later advances it by the rows that were accepted. */
    float *inputs;
    int replayed;
} tdm_gdn_seg;

/* Floats of one row of a delta rule's record (tdm_gdn_seg.inputs): k as
 * read [Hk, Dk] (before its l2 norm), v [Hv, Dv], per v-head the decay
 * exp(g) [Hv] and beta [Hv], per k-head 1/|k| [Hk] as the rows computed it;
 * rounded up to whole 16-byte groups. */
static inline size_t tdm_gdn_input_floats(int Hk, int Hv, int Dk, int Dv)
{
    const size_t n =
        (size_t)Hk * (size_t)Dk + (size_t)Hv * (size_t)Dv + 2 * (size_t)Hv + (size_t)Hk;
    return (n + 3) & ~(size_t)3;
}

/* One sequence's rows in an attention call: row i of the segment is the
 * query at position n_past + i and attends to cache entries 0..n_past+i. */
typedef struct tdm_attn_seg {
    int row0, nrows;
    int n_past;
    float *k_cache; /* [>= n_past + nrows, nKV, D]; attn_prep writes the segment's rows */
    float *v_cache; /* [>= n_past + nrows, nKV, D] */
} tdm_attn_seg;

/* One row's sampling settings in a sample call (tdm_sampling of
 * spec/sampling.h plus the row's uniform draw). No padding: backends may
 * hash staged arguments byte for byte. */
typedef struct tdm_sample_row {
    float temperature; /* <= 0: greedy */
    float top_p;       /* <= 0 or >= 1: off */
    uint32_t top_k;    /* 0: off */
    uint32_t pad;      /* 0 */
    double u;          /* uniform in [0, 1) */
} tdm_sample_row;

typedef struct tdm_backend tdm_backend;

struct tdm_backend {
    const char *name; /* "cpu", "cuda" */
    void *ctx;

    /* --- lifetime and memory ------------------------------------------ */
    /* Frees the backend and its context (not memory the engine still holds). */
    void (*destroy)(tdm_backend *be);
    /* nbytes of backend memory, zero-filled; NULL when exhausted. */
    void *(*alloc)(void *ctx, size_t nbytes);
    /* Frees memory from alloc or weight_map (NULL is fine). */
    void (*free)(void *ctx, void *p);
    /* Host -> backend. */
    void (*upload)(void *ctx, void *dst, const void *src, size_t nbytes);
    /* Backend -> host. */
    void (*download)(void *ctx, void *dst, const void *src, size_t nbytes);
    /* Backend -> backend. */
    void (*copy)(void *ctx, void *dst, const void *src, size_t nbytes);
    /* Optional (NULL: n copy calls). dst[i] = src[i], nbytes[i] each, for
     * i < n, as n copy calls would; the arrays are host memory. */
    void (*copy_n)(void *ctx, int n, void *const *dst, const void *const *src,
                   const size_t *nbytes);
    /* Makes host weight bytes usable by ops; may alias `host` (CPU: no copy,
     * *owned = 0) or copy to the device (*owned = 1: free() it later). The
     * host bytes must outlive the returned pointer when it aliases. */
    const void *(*weight_map)(void *ctx, const void *host, size_t nbytes, int *owned);
    /* Waits until all queued ops are done. */
    void (*sync)(void *ctx);
    /* nbytes of host memory that download writes into fastest (CUDA:
     * page-locked); NULL when exhausted. */
    void *(*host_alloc)(void *ctx, size_t nbytes);
    /* Frees memory from host_alloc (NULL is fine). */
    void (*host_free)(void *ctx, void *p);
    /* Optional (NULL: unknown). Backend memory free now and in all, in
     * bytes (CUDA: the device's; CPU: the host's MemAvailable and MemTotal).
     * Returns 0, or -1 when the backend cannot tell. */
    int (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);

    /* --- graphs (optional: both NULL where the backend has none) --------
     * The engine brackets the ops of one forward step with graph_begin and
     * graph_end. The backend may record the step under `key` and, when a
     * later step has the same key, replay the recording instead of running
     * the calls one by one. Contract:
     *  - graph_end follows every graph_begin, on the same thread, and
     *    brackets do not nest;
     *  - between the two calls only op slots are called (no alloc, free,
     *    upload, download, copy, sync, weight_map, host_alloc, host_free,
     *    argmax or sample);
     *  - every host argument of an op (ids, positions, inv_freq, segment
     *    lists with the state and cache pointers in them) is staged by
     *    the op anew on every call, recorded or not; everything an op
     *    receives by value is not, so the key must determine all of it:
     *    the op sequence, every size and flag, and every device pointer
     *    passed directly (workspace, weights). A backend checks what it
     *    can (a replay whose calls differ from the recording is refused:
     *    graph_end returns 1), but a key that determines less than that
     *    gives wrong results wherever the check cannot see. */
    /* Opens a step. 1: the ops that follow are recorded or replayed and
     * their work is queued by graph_end; 0: they run as they are called. */
    int (*graph_begin)(void *ctx, uint64_t key);
    /* Closes the step. 0: its work is queued (or done, after a 0 from
     * graph_begin). 1: the calls since graph_begin did not match the
     * recording of that key; none of their work was done and the backend
     * dropped the recording; the caller makes the same calls again outside
     * a bracket. */
    int (*graph_end)(void *ctx);

    /* --- a prompt's prefill (optional: NULL where the backend has none) --
     * The engine calls bulk(ctx, R) before the ops of a prompt-prefill call
     * of R rows (one sequence; no states_out, no record), and bulk(ctx, 0)
     * after them. A nonzero answer says the backend takes faster paths for
     * that call's matmuls, equal to the exact ones up to rounding but not
     * bit for bit (the exactness contract holds for the rows that follow
     * the prefill, not for its own rows).
     * A backend answers from R alone, so the same prompt split the same way
     * gives the same bits, and a graph key (which fixes R) fixes the
     * answer; the ops in between may be bracketed by graph_begin/end. */
    int (*bulk)(void *ctx, int R);

    /* --- ops ------------------------------------------------------------ */
    /* y[r,:] = embed[ids[r], :] for r < R; embed [vocab, H]. ids: host. A
     * negative id gives a row of zeros (a tensor-parallel rank's embedding
     * holds a slice of the vocabulary; engine/shard.h). */
    void (*embed)(void *ctx, float *y, tdm_weight embed, const int32_t *ids, int R, int H);
    /* y [R,out] (+)= x [R,in] · wᵀ, w [out,in]; accumulate adds into y. */
    void (*matmul)(void *ctx, float *y, const float *x, tdm_weight w, int R, int in, int out,
                   int accumulate);
    /* Optional (NULL: the caller makes n matmul calls). ys[i] [R, outs[i]] =
     * x [R, in] · ws[i]ᵀ for i < n: bit for bit what n matmul calls without
     * accumulate give, for weights that share their input (a layer's
     * projections) in fewer launches. The arrays are host memory. */
    void (*matmul_n)(void *ctx, const float *x, int R, int in, int n, float *const *ys,
                     const tdm_weight *ws, const int *outs);
    /* Optional (NULL: the caller makes the two matmuls and silu_mul).
     * y [R, out] = silu(x · gateᵀ) ⊙ (x · upᵀ), gate and up [out, in]: bit
     * for bit what the two matmuls and silu_mul give (an MLP's first half,
     * in one launch where the backend can). */
    void (*matmul_silu)(void *ctx, float *y, const float *x, tdm_weight gate, tdm_weight up, int R,
                        int in, int out);
    /* Optional (NULL: the caller calls rmsnorm, then matmul_n or
     * matmul_silu). A norm and the projections that read it, in fewer
     * launches where the backend can: xn [R, in] = rmsnorm(x) as rmsnorm
     * (w, eps, zero_centred) writes it (xn is not x), then, with up NULL,
     * ys[i] = xn · ws[i]ᵀ for i < n as matmul_n gives them, or, with up
     * (n == 1), ys[0] = silu(xn · ws[0]ᵀ) ⊙ (xn · upᵀ) as matmul_silu gives
     * it. Bit for bit what those calls give. The arrays are host memory. */
    void (*norm_matmul)(void *ctx, float *xn, const float *x, const float *w, float eps,
                        int zero_centred, int R, int in, int n, float *const *ys,
                        const tdm_weight *ws, const tdm_weight *up, const int *outs);
    /* y = x / rms(x) * (zero_centred ? 1 + w : w), per row of n; w [n] f32. y may be x. */
    void (*rmsnorm)(void *ctx, float *y, const float *x, const float *w, int R, int n, float eps,
                    int zero_centred);
    /* Gated RMSNorm: y = w * x / rms(x) * silu(z), per row of n; w [n] f32. */
    void (*rmsnorm_gated)(void *ctx, float *y, const float *x, const float *z, const float *w,
                          int R, int n, float eps);
    /* An attention layer's rows between its projections and attention, for
     * the rows of segs (an attention call's segments, caches included; row
     * r indexes every array by row as in attention): q and gate [R, nH, D]
     * are each head's first and second D values of qg [R, nH, 2D]; q, and
     * k [R, nKV, D] (read only), are RMS-normed per head by q_norm and
     * k_norm [D] (zero-centred, eps), then rotated (rotate-half RoPE) on
     * their first rot_dim dims at positions[r] (host; inv_freq [rot_dim/2]
     * host); the rotated k rows and the v rows [R, nKV, D] go into each
     * segment's caches at rows n_past ... What split, rmsnorm, rope and a
     * copy into the caches give, in one call. */
    void (*attn_prep)(void *ctx, float *q, float *gate, const float *qg, const float *k,
                      const float *v, const float *q_norm, const float *k_norm, float eps,
                      const int32_t *positions, const float *inv_freq, int rot_dim,
                      const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D);
    /* Causal attention: out [R, nH, D] from q [R, nH, D] (roped) against each
     * segment's cache; GQA (kv head = h / (nH/nKV)), scale D^-0.5, fp32
     * softmax; then, where gate [R, nH, D] is given, out *= sigmoid(gate). */
    void (*attention)(void *ctx, float *out, const float *q, const float *gate,
                      const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D);
    /* y = silu(a) * b, n values. y may alias a. */
    void (*silu_mul)(void *ctx, float *y, const float *a, const float *b, size_t n);
    /* Depthwise causal conv of width K over pre-conv inputs x [R, C] with the
     * segment's state as left context, then SiLU: y [R, C]; w [C, K] f32,
     * w[c, K-1] multiplies the current row. */
    void (*conv_silu)(void *ctx, float *y, const float *x, const float *w, const tdm_conv_seg *segs,
                      int nseg, int C, int K);
    /* Recurrent gated delta rule per segment, from its state. q, k are rows
     * of qkv [R, qkv_stride] at offsets 0 and Hk*Dk ([Hk, Dk] each), v at
     * 2*Hk*Dk ([Hv, Dv]); q and k are l2-normalised (eps 1e-6) and q scaled
     * by Dk^-0.5 inside; v head j reads q/k head j / (Hv/Hk). The gates of
     * row r and v-head h come from the projections gt.a, gt.b [R, Hv]:
     * decay exp(g), g = -exp(A_log[h]) * softplus(a + dt_bias[h]) (torch's
     * softplus, threshold 20), and beta = sigmoid(b). out [R, Hv, Dv]. */
    void (*gdn_recurrent)(void *ctx, float *out, const float *qkv, int qkv_stride, tdm_gdn_gates gt,
                          const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk, int Dv);
    /* The replay strategy's commit: each segment's state advanced in place by
     * rows 0 .. nrows-1 of its record (inputs), with the arithmetic
     * gdn_recurrent used when it wrote them, so the state is bit for bit the
     * one gdn_recurrent would have left after those rows (row0, states_out,
     * and replayed are unused). Segments may belong to different
     * layers of one model. */
    void (*gdn_replay)(void *ctx, const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk,
                       int Dv);
    /* out[r] = argmax of x[r, 0..n) (first on ties); out host [R]. */
    void (*argmax)(void *ctx, int32_t *out, const float *x, int R, int n);
    /* --- drafting on the device (optional: both NULL, or both set) -------
     * Ops like the others (allowed inside a graph bracket; nothing comes
     * back to the host), so that a greedy drafter runs its k draft steps as
     * one launch, each step's argmax feeding the next step's embedding. */
    /* out[i] = argmax of x[rows[i], 0..n) (first on ties) for i < nrows,
     * or map[that argmax] when map is given (backend memory [n]: a draft
     * vocabulary's token ids); out backend memory [nrows], rows host. */
    void (*argmax_to)(void *ctx, int32_t *out, const float *x, const int32_t *rows, int nrows,
                      int n, const int32_t *map);
    /* Optional, with argmax_to (NULL: a sampled drafter draws on the host
     * step by step). For i < nrows, out[i] = the token sample would draw
     * from x[rows[i], 0..n) under srows[i] (map[that token] when map is
     * given), and for a row that does not sample greedily (temperature > 0,
     * top_k != 1) probs[i, 0..n) = the distribution it drew from:
     * tdm_sampling_probs' probabilities, 0 outside the support (a greedy
     * row's is left as it was). out and probs backend memory [nrows] and
     * [nrows, n]; rows and srows host. An op like argmax_to. */
    void (*sample_to)(void *ctx, int32_t *out, float *probs, const float *x, const int32_t *rows,
                      int nrows, int n, const int32_t *map, const tdm_sample_row *srows);
    /* y[r,:] = embed[ids[r], :] for r < R, ids backend memory [R] (written
     * by argmax_to or sample_to earlier in the same step); embed [vocab, H]. */
    void (*embed_dev)(void *ctx, float *y, tdm_weight embed, const int32_t *ids, int R, int H);
    /* In-place softmax per row of n (fp32). */
    void (*softmax)(void *ctx, float *x, int R, int n);
    /* Optional (NULL: the caller samples on the host). out[r] = the token
     * tdm_sampling_probs + tdm_sampling_draw would give (spec/sampling.h)
     * for the logits x[r, 0..n) under rows[r], up to rounding at the edges
     * of the draw. rows and out are host memory; out is written before the
     * call returns, so, like argmax, never between graph_begin and graph_end. */
    void (*sample)(void *ctx, int32_t *out, const float *x, int R, int n,
                   const tdm_sample_row *rows);
};

/* The CPU backend: fp32 compute, nthreads workers in a persistent pool
 * (0 = tdm_cpu_count()). Returns NULL when out of memory. The caller
 * destroys it with be->destroy(be). */
tdm_backend *tdm_backend_cpu_create(int nthreads);

/* The CPUs this process may run on: its affinity mask (taskset, a
 * container's cpuset, Kubernetes' static CPU manager), not the host's
 * count, or workers would take turns on the same cores. */
int tdm_cpu_count(void);

#endif
