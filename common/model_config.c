/*
 * model_config.c - config.json of a Qwen3.5 text model. Missing fields take the
 * defaults of transformers' Qwen3_5TextConfig; present fields of the wrong
 * type or out of range are errors naming the field.
 */
#include "model_config.h"
#include "file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tdm_status cfg_int(const char *path, const cJSON *o, const char *key, int def, int min,
                          int *out, tdm_error *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return TDM_OK;
    }
    if (!cJSON_IsNumber(j) || floor(j->valuedouble) != j->valuedouble || j->valuedouble < min ||
        j->valuedouble > 1e9)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: \"%s\" must be an integer >= %d",
                             path, key, min);
    *out = (int)j->valuedouble;
    return TDM_OK;
}

static tdm_status cfg_num(const char *path, const cJSON *o, const char *key, double def,
                          double *out, int *present, tdm_error *err)
{
    const cJSON *j = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    if (present)
        *present = 0;
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return TDM_OK;
    }
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble <= 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: \"%s\" must be a positive number",
                             path, key);
    *out = j->valuedouble;
    if (present)
        *present = 1;
    return TDM_OK;
}

static tdm_status cfg_parse(const char *path, const cJSON *root, tdm_model_config *c,
                            tdm_error *err)
{
    tdm_status rc;
    const cJSON *t = root;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: no \"model_type\"", path);
    if (strcmp(mt->valuestring, "qwen3_5") == 0) {
        t = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (!cJSON_IsObject(t))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "%s: model_type qwen3_5 needs a \"text_config\" object", path);
        const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(t, "model_type");
        if (tmt && (!cJSON_IsString(tmt) || strcmp(tmt->valuestring, "qwen3_5_text") != 0))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "%s: text_config.model_type is not qwen3_5_text", path);
    } else if (strcmp(mt->valuestring, "qwen3_5_text") != 0) {
        return tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                             "%s: model_type '%s' is not supported (qwen3_5_text or qwen3_5)", path,
                             mt->valuestring);
    }
    memset(c, 0, sizeof(*c));
    c->tp_size = 1;
    if ((rc = cfg_int(path, t, "vocab_size", 248320, 1, &c->vocab_size, err)) ||
        (rc = cfg_int(path, t, "hidden_size", 4096, 1, &c->hidden_size, err)) ||
        (rc = cfg_int(path, t, "intermediate_size", 12288, 1, &c->intermediate_size, err)) ||
        (rc = cfg_int(path, t, "num_hidden_layers", 32, 1, &c->num_layers, err)) ||
        (rc = cfg_int(path, t, "num_attention_heads", 16, 1, &c->num_heads, err)) ||
        (rc = cfg_int(path, t, "num_key_value_heads", 4, 1, &c->num_kv_heads, err)) ||
        (rc = cfg_int(path, t, "head_dim", c->hidden_size / c->num_heads, 1, &c->head_dim, err)) ||
        (rc = cfg_int(path, t, "linear_conv_kernel_dim", 4, 1, &c->conv_kernel, err)) ||
        (rc = cfg_int(path, t, "linear_key_head_dim", 128, 1, &c->lin_k_dim, err)) ||
        (rc = cfg_int(path, t, "linear_value_head_dim", 128, 1, &c->lin_v_dim, err)) ||
        (rc = cfg_int(path, t, "linear_num_key_heads", 16, 1, &c->lin_k_heads, err)) ||
        (rc = cfg_int(path, t, "linear_num_value_heads", 32, 1, &c->lin_v_heads, err)) ||
        (rc = cfg_int(path, t, "max_position_embeddings", 32768, 1, &c->max_position_embeddings,
                      err)) ||
        (rc = cfg_num(path, t, "rms_norm_eps", 1e-6, &c->rms_norm_eps, NULL, err)) ||
        (rc = cfg_int(path, t, "num_nextn_predict_layers", 0, 0, &c->mtp_layers, err)) ||
        (rc = cfg_int(path, t, "mtp_num_hidden_layers", c->mtp_layers, 0, &c->mtp_layers, err)))
        return rc;

    const cJSON *act = cJSON_GetObjectItemCaseSensitive(t, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        return tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                             "%s: hidden_act must be \"silu\" (the only one Qwen3.5 uses)", path);
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(t, "attention_bias");
    if (cJSON_IsTrue(bias))
        return tdm_error_set(err, TDM_ERR_UNIMPLEMENTED, "%s: attention_bias=true is not supported",
                             path);

    /* Tied embeddings. A qwen3_5 wrapper may say it at the top level and in
     * text_config; transformers versions differ in which one they read, so
     * the two must agree. */
    const cJSON *tie_top =
        t != root ? cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings") : NULL;
    const cJSON *tie_text = cJSON_GetObjectItemCaseSensitive(t, "tie_word_embeddings");
    const cJSON *ties[2] = {tie_top, tie_text};
    for (int i = 0; i < 2; i++)
        if (ties[i] && !cJSON_IsBool(ties[i]) && !cJSON_IsNull(ties[i]))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "%s: %s\"tie_word_embeddings\" must be true or false", path,
                                 i ? (t != root ? "text_config." : "") : "");
    if (cJSON_IsBool(tie_top) && cJSON_IsBool(tie_text) &&
        cJSON_IsTrue(tie_top) != cJSON_IsTrue(tie_text))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: inconsistent config: tie_word_embeddings is %s at the top level "
                             "but %s in text_config",
                             path, cJSON_IsTrue(tie_top) ? "true" : "false",
                             cJSON_IsTrue(tie_text) ? "true" : "false");
    c->tie_word_embeddings = cJSON_IsBool(tie_top) ? cJSON_IsTrue(tie_top) : cJSON_IsTrue(tie_text);

    /* RoPE: rope_parameters first, then the legacy top-level fields. */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(t, "rope_parameters");
    if (rp && !cJSON_IsObject(rp) && !cJSON_IsNull(rp))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: \"rope_parameters\" must be an object", path);
    if (!cJSON_IsObject(rp))
        rp = NULL;
    if (rp) {
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (rt && (!cJSON_IsString(rt) || strcmp(rt->valuestring, "default") != 0))
            return tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                                 "%s: rope_parameters.rope_type '%s' is not supported (default)",
                                 path, cJSON_IsString(rt) ? rt->valuestring : "?");
    }
    int have;
    double legacy_theta, legacy_prf;
    if ((rc = cfg_num(path, t, "rope_theta", 10000.0, &legacy_theta, NULL, err)) ||
        (rc = cfg_num(path, t, "partial_rotary_factor", 0.25, &legacy_prf, NULL, err)) ||
        (rc = cfg_num(path, rp, "rope_theta", legacy_theta, &c->rope_theta, &have, err)) ||
        (rc = cfg_num(path, rp, "partial_rotary_factor", legacy_prf, &c->partial_rotary_factor,
                      &have, err)))
        return rc;
    if (c->partial_rotary_factor > 1.0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: partial_rotary_factor %g is above 1", path,
                             c->partial_rotary_factor);
    c->rot_dim = (int)((double)c->head_dim * c->partial_rotary_factor);
    if (c->rot_dim % 2 != 0 || c->rot_dim < 2)
        return tdm_error_set(
            err, TDM_ERR_INVALID_ARGUMENT,
            "%s: head_dim %d x partial_rotary_factor %g gives rotary dim %d, which "
            "must be even and >= 2",
            path, c->head_dim, c->partial_rotary_factor, c->rot_dim);

    if (c->num_layers > TDM_MODEL_MAX_LAYERS)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: %d layers (at most %d supported)",
                             path, c->num_layers, TDM_MODEL_MAX_LAYERS);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(t, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->num_layers)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "%s: \"layer_types\" must list %d entries (num_hidden_layers)",
                                 path, c->num_layers);
        int i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            if (cJSON_IsString(e) && strcmp(e->valuestring, "linear_attention") == 0)
                c->layer_types[i] = TDM_LAYER_LINEAR_ATTENTION;
            else if (cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0)
                c->layer_types[i] = TDM_LAYER_FULL_ATTENTION;
            else
                return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                     "%s: layer_types[%d] is '%s' (expected linear_attention or "
                                     "full_attention)",
                                     path, i, cJSON_IsString(e) ? e->valuestring : "?");
        }
    } else {
        int interval;
        if ((rc = cfg_int(path, t, "full_attention_interval", 4, 1, &interval, err)))
            return rc;
        for (int i = 0; i < c->num_layers; i++)
            c->layer_types[i] =
                (i + 1) % interval ? TDM_LAYER_LINEAR_ATTENTION : TDM_LAYER_FULL_ATTENTION;
    }

    if (c->num_heads % c->num_kv_heads != 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: num_attention_heads %d is not a multiple of num_key_value_heads "
                             "%d",
                             path, c->num_heads, c->num_kv_heads);
    if (c->lin_v_heads % c->lin_k_heads != 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: linear_num_value_heads %d is not a multiple of "
                             "linear_num_key_heads %d",
                             path, c->lin_v_heads, c->lin_k_heads);
    if (c->lin_k_dim > 512 || c->lin_v_dim > 512 || c->conv_kernel > 64)
        return tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                             "%s: linear head dims above 512 or conv kernel above 64 are not "
                             "supported",
                             path);
    return TDM_OK;
}

static int cfg_cmp_key(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* A key that appears twice in one object of j (depth first), or NULL.
 * transformers reads config.json with Python's json, which keeps the last
 * of two equal keys where cJSON finds the first: such a file would give the
 * two different models, so it is refused. */
static const char *cfg_duplicate_key(const cJSON *j, int depth)
{
    if (depth > 64)
        return NULL; /* cJSON itself nests at most 1000 deep; configs are flat */
    size_t n = 0;
    for (const cJSON *c = j->child; c; c = c->next)
        n++;
    const char *dup = NULL;
    if (cJSON_IsObject(j) && n > 1) {
        const cJSON **keys = malloc(n * sizeof(*keys));
        if (keys) {
            size_t k = 0;
            for (const cJSON *c = j->child; c; c = c->next)
                keys[k++] = c;
            qsort(keys, n, sizeof(*keys), cfg_cmp_key);
            for (size_t i = 1; i < n && !dup; i++)
                if (strcmp(keys[i - 1]->string, keys[i]->string) == 0)
                    dup = keys[i]->string;
            free(keys);
        }
    }
    for (const cJSON *c = j->child; c && !dup; c = c->next)
        dup = cfg_duplicate_key(c, depth + 1);
    return dup;
}

tdm_status tdm_model_config_parse(const char *json, size_t len, const char *origin,
                                  tdm_model_config *cfg, tdm_error *err)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: not a JSON object", origin);
    }
    /* One JSON value and nothing after it but white space (Python's json
     * refuses the rest as "extra data"). */
    size_t at = (size_t)(end - json);
    while (at < len && (json[at] == ' ' || json[at] == '\t' || json[at] == '\n' ||
                        json[at] == '\r'))
        at++;
    if (at < len) {
        cJSON_Delete(root);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s: text after the JSON object (at byte %zu)", origin, at);
    }
    const char *dup = cfg_duplicate_key(root, 0);
    if (dup) {
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: key \"%s\" appears twice in one object",
                      origin, dup);
        cJSON_Delete(root);
        return TDM_ERR_INVALID_ARGUMENT;
    }
    tdm_status rc = cfg_parse(origin, root, cfg, err);
    cJSON_Delete(root);
    return rc;
}

tdm_status tdm_model_config_load(const char *dir, tdm_model_config *cfg, tdm_error *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    size_t len = 0;
    char *text = NULL;
    if (tdm_file_read(path, (size_t)16 << 20, &text, &len, err) != TDM_OK)
        return err ? err->code : TDM_ERR_NOT_FOUND;
    tdm_status rc = tdm_model_config_parse(text, len, path, cfg, err);
    free(text);
    return rc;
}
