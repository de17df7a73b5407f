/*
 * shard.c - the slices of a tensor-parallel rank (see shard.h).
 */
#include "shard.h"

static tdm_status need_multiple(const char *what, int n, int size, tdm_error *err)
{
    if (n % size == 0)
        return TDM_OK;
    return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                         "tensor_parallel %d: the model's %s (%d) is not a multiple of %d", size,
                         what, n, size);
}

tdm_status tdm_shard_config(const tdm_model_config *full, int rank, int size,
                            tdm_model_config *local, tdm_shard *shard, tdm_error *err)
{
    if (size < 1 || rank < 0 || rank >= size)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "tensor_parallel %d: rank %d is out of range", size, rank);
    if (full->tp_size != 1)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "a rank's config cannot be split again (tp_size %d)", full->tp_size);
    tdm_status rc;
    if ((rc = need_multiple("num_attention_heads", full->num_heads, size, err)) ||
        (rc = need_multiple("linear_num_key_heads", full->lin_k_heads, size, err)) ||
        (rc = need_multiple("linear_num_value_heads", full->lin_v_heads, size, err)) ||
        (rc = need_multiple("intermediate_size", full->intermediate_size, size, err)) ||
        (rc = need_multiple("vocab_size", full->vocab_size, size, err)))
        return rc;
    const int nkv = full->num_kv_heads;
    if (nkv % size != 0 && size % nkv != 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "tensor_parallel %d: the model's num_key_value_heads (%d) neither "
                             "divides into %d ranks nor replicates evenly over them",
                             size, nkv, size);
    *local = *full;
    local->tp_size = size;
    local->num_heads = full->num_heads / size;
    local->num_kv_heads = nkv % size == 0 ? nkv / size : 1;
    local->lin_k_heads = full->lin_k_heads / size;
    local->lin_v_heads = full->lin_v_heads / size;
    local->intermediate_size = full->intermediate_size / size;
    *shard = (tdm_shard){
        .rank = rank,
        .size = size,
        .q_head0 = rank * local->num_heads,
        /* replicated: rank r's query heads all read KV head r / (size / nkv) */
        .kv_head0 = nkv % size == 0 ? rank * local->num_kv_heads : rank / (size / nkv),
        .k_head0 = rank * local->lin_k_heads,
        .v_head0 = rank * local->lin_v_heads,
        .mlp0 = rank * local->intermediate_size,
        .vocab_n = full->vocab_size / size,
        .vocab0 = rank * (full->vocab_size / size),
    };
    return TDM_OK;
}
