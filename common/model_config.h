/*
 * model_config.h - config.json of a Qwen3.5 text model (model_type
 * qwen3_5_text, or qwen3_5 with a text_config), the one place that format is
 * read. Missing fields take the defaults of transformers' Qwen3_5TextConfig;
 * present fields of the wrong type or out of range are errors naming the
 * file and the field. The engine builds its model from it; services read the
 * vocabulary size and context length for their descriptors.
 */
#ifndef TANDEM_COMMON_MODEL_CONFIG_H
#define TANDEM_COMMON_MODEL_CONFIG_H

#include "status.h"

#include <stddef.h>

typedef enum tdm_layer_kind {
    TDM_LAYER_LINEAR_ATTENTION = 0, /* Gated DeltaNet */
    TDM_LAYER_FULL_ATTENTION = 1,   /* gated softmax attention */
} tdm_layer_kind;

#define TDM_MODEL_MAX_LAYERS 512

typedef struct tdm_model_config {
    int vocab_size, hidden_size, intermediate_size, num_layers;
    /* full attention */
    int num_heads, num_kv_heads, head_dim, rot_dim;
    double rope_theta, partial_rotary_factor;
    /* linear attention (Gated DeltaNet) */
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv_kernel;
    double rms_norm_eps;
    int tie_word_embeddings;
    int max_position_embeddings; /* the context the model was trained for */
    /* MTP layers (mtp_num_hidden_layers, or Qwen3-Next's num_nextn_predict_layers);
     * 0 when config.json names none. The engine reads the head from the
     * mtp.* tensors (engine/mtp.h). */
    int mtp_layers;
    /* Ranks the model is split over: 1 for the whole model (what parsing
     * gives); a tensor-parallel rank's config (engine/shard.h) has its
     * slice's head counts and intermediate size and the whole vocabulary. */
    int tp_size;
    tdm_layer_kind layer_types[TDM_MODEL_MAX_LAYERS];
} tdm_model_config;

/* Reads `dir`/config.json (model_type qwen3_5_text, or qwen3_5 with a
 * text_config) and checks it for consistency. */
tdm_status tdm_model_config_load(const char *dir, tdm_model_config *cfg, tdm_error *err);

/* The same from a buffer holding the JSON text (len bytes, need not end in
 * NUL); `origin` names the source in error messages (a path, "<buffer>"). */
tdm_status tdm_model_config_parse(const char *json, size_t len, const char *origin,
                                  tdm_model_config *cfg, tdm_error *err);

#endif
