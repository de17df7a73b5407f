/*
 * fuzz_model_config.c - config.json of a Qwen3.5 model, parsed as the
 * engine and the services read it (tdm_model_config_parse). An accepted
 * configuration must hold what the engine builds on: positive sizes,
 * at most TDM_MODEL_MAX_LAYERS layers of known kinds, heads that divide,
 * an even rotary dimension no larger than a head.
 */
#include "fuzz.h"

#include "model_config.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm_model_config c;
    tdm_error err;
    if (tdm_model_config_parse((const char *)data, size, "<fuzz>/config.json", &c, &err) !=
        TDM_OK) {
        FUZZ_CHECK(err.msg[0] != '\0', "a refusal without a message");
        return 0;
    }
    FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0, "sizes");
    FUZZ_CHECK(c.num_layers > 0 && c.num_layers <= TDM_MODEL_MAX_LAYERS, "%d layers", c.num_layers);
    FUZZ_CHECK(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
               "heads %d / %d", c.num_heads, c.num_kv_heads);
    FUZZ_CHECK(c.lin_k_heads > 0 && c.lin_v_heads % c.lin_k_heads == 0, "linear heads");
    FUZZ_CHECK(c.head_dim > 0 && c.rot_dim >= 2 && c.rot_dim % 2 == 0 && c.rot_dim <= c.head_dim,
               "rotary dim %d of head_dim %d", c.rot_dim, c.head_dim);
    FUZZ_CHECK(c.lin_k_dim > 0 && c.lin_k_dim <= 512 && c.lin_v_dim > 0 && c.lin_v_dim <= 512,
               "linear head dims");
    FUZZ_CHECK(c.conv_kernel > 0 && c.conv_kernel <= 64, "conv kernel %d", c.conv_kernel);
    FUZZ_CHECK(c.max_position_embeddings > 0, "context %d", c.max_position_embeddings);
    FUZZ_CHECK(isfinite(c.rope_theta) && c.rope_theta > 0, "rope_theta %g", c.rope_theta);
    FUZZ_CHECK(isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0, "rms_norm_eps %g", c.rms_norm_eps);
    FUZZ_CHECK(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1, "rotary factor %g",
               c.partial_rotary_factor);
    for (int i = 0; i < c.num_layers; i++)
        FUZZ_CHECK(c.layer_types[i] == TDM_LAYER_LINEAR_ATTENTION ||
                       c.layer_types[i] == TDM_LAYER_FULL_ATTENTION,
                   "layer %d kind %d", i, (int)c.layer_types[i]);
    return 0;
}
