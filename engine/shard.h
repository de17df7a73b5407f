/*
 * shard.h - what one rank of a tensor-parallel model holds.
 *
 * A model split over N ranks (tensor_parallel: N) gives each rank:
 *  - gated attention: num_heads / N query heads (with their gates); the KV
 *    heads split the same way when num_kv_heads is a multiple of N, and
 *    otherwise (N a multiple of num_kv_heads) each rank holds the one KV head
 *    its query heads read, replicated over N / num_kv_heads ranks;
 *  - Gated DeltaNet: lin_k_heads / N key heads and lin_v_heads / N value
 *    heads (so each value head keeps its key head), their rows of the conv,
 *    the projections and the gates, and their recurrent and conv state;
 *  - MLP: intermediate_size / N columns of gate and up, the same rows of down;
 *  - embedding and LM head: vocab_size / N consecutive tokens.
 * Norms are whole on every rank. Each rank's output projections (o_proj,
 * out_proj, down) give a partial sum of the residual update, summed over the
 * ranks by one all-reduce a sublayer (kernels/comm.h); the embedding is
 * summed the same way (a rank embeds its tokens, zeros for the others), and
 * the LM head's slices are gathered into whole rows of logits.
 *
 * Configuration arithmetic only (no weights): the services' offline checks
 * use it too.
 */
#ifndef TANDEM_ENGINE_SHARD_H
#define TANDEM_ENGINE_SHARD_H

#include "model_config.h"
#include "status.h"

#include <stdint.h>

/* Where rank `rank` of `size` finds its slices in the whole model's tensors. */
typedef struct tdm_shard {
    int rank, size;
    int q_head0;  /* first query head (num_heads / size of them) */
    int kv_head0; /* first KV head (the local config's num_kv_heads of them) */
    int k_head0;  /* first linear-attention key head */
    int v_head0;  /* first linear-attention value head */
    int mlp0;     /* first intermediate column */
    int vocab0;   /* first token of the embedding's and LM head's slice */
    int vocab_n;  /* tokens in the slice: vocab_size / size */
} tdm_shard;

/* The config rank `rank` of `size` computes with (*local: the head counts
 * and intermediate size of its slice, the whole vocabulary, tp_size = size)
 * and where its slices lie (*shard). INVALID_ARGUMENT naming the count that
 * does not divide when the model cannot be split that way. */
tdm_status tdm_shard_config(const tdm_model_config *full, int rank, int size,
                            tdm_model_config *local, tdm_shard *shard, tdm_error *err);

#endif
