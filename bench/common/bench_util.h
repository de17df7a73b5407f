/*
 * bench_util.h - what the benchmarks share: a clock, uniform random
 * numbers, bf16 rounding, and random checkpoints with the shape of a
 * Qwen3.5 model (engine_bench on the CPU, cuda_bench on the GPU).
 */
#ifndef TANDEM_BENCH_UTIL_H
#define TANDEM_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on the monotonic clock. */
double bench_now(void);
/* Sorts v[0..n) ascending (for medians and percentiles). */
void bench_sort(double *v, int n);

/* Uniform in [-1, 1) from a fixed-seed xorshift stream. */
float bench_urand(void);

/* f rounded to bf16 (nearest, ties to even). */
uint16_t bench_bf16(float f);

/* The comma-separated integers of list ("1,9,17") into out, at most max of
 * them, each in [lo, hi]: their count, or -1 (naming the bad entry on
 * stderr) for an entry that is not such an integer or one too many. */
int bench_ints(const char *list, int *out, int max, int lo, int hi);
/* 1 when `name` is one of the comma-separated entries of `list`. */
int bench_listed(const char *list, const char *name);

/* A Qwen3.5 text model's sizes (hybrid-model-notes.md): layers 3:1 linear:full
 * attention, tied embeddings, conv kernel 4. */
typedef struct bench_shape {
    const char *name;
    int H, L, I, nH, nKV, D, Hk, Hv, Dk, Dv, V;
} bench_shape;

/* The shapes of the released models the benchmarks use ("0.8b", "4b",
 * "27b"), a test-sized one ("tiny": hidden 64, 8 layers, vocabulary 320),
 * or NULL for another name. */
const bench_shape *bench_shape_find(const char *name);

/* Writes config.json and model.safetensors (bf16, uniform weights scaled per
 * tensor kind) into dir, created if missing. The values come from one random
 * block of 2^22 per tensor, rotated: timings do not depend on them, and
 * writing a 4B-shaped checkpoint stays disk-bound. 0, or -1 with a message
 * in err. */
int bench_write_model(const char *dir, const bench_shape *s, char *err, size_t err_len);
/* Layout flags of bench_write_model_layout. */
enum {
    /* As Qwen3.5/3.6 checkpoints ship: a qwen3_5 config with text_config and
     * vision_config, tensors under model.language_model., an untied
     * lm_head.weight, the vision tower's model.visual.* and the MTP head's
     * mtp.* tensors beside them. */
    BENCH_LAYOUT_RELEASE = 1,
    /* The MTP head's mtp.* tensors (and mtp_num_hidden_layers 1) in the
     * plain layout too: tied embeddings with an MTP head. */
    BENCH_LAYOUT_MTP = 2,
};

/* The same with a choice of layout (flags: BENCH_LAYOUT_*; 0 is the plain
 * layout). shard_bytes: 0 for one model.safetensors, else shards of at most
 * that many bytes (model-0000i-of-0000n.safetensors) named by
 * model.safetensors.index.json. The MTP head's values are random like the
 * rest (its norms zero-centred around 0, fc scaled for 2H inputs). */
int bench_write_model_layout(const char *dir, const bench_shape *s, int flags, size_t shard_bytes,
                             char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
