/*
 * test_config.c - the equivalent spellings of a config.json give the same
 * model, and each field is really read.
 *
 * Starting from fixture f32_gqa (rope_parameters + layer_types), we write
 * variants into a temporary folder: legacy top-level rope fields only,
 * full_attention_interval instead of layer_types, a qwen3_5 wrapper with
 * text_config. Each must give logits bit-identical to the original. Changing
 * rope_theta, the rotary factor or the tie flag must change them; a wrapper
 * whose two tie flags disagree is refused.
 */
#include "model_config.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static tdm_backend *be;
static char tmp[256];
static fixture fx;

static float *logits_of(const char *dir, int *ok)
{
    tdm_model *m;
    tdm_error err;
    *ok = 0;
    if (tdm_model_load(dir, be, &m, &err) != TDM_OK) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        return NULL;
    }
    const int V = tdm_model_get_config(m)->vocab_size;
    tdm_seq_params p = {TDM_STATE_EXTRA_BUFFER, 0, 0};
    tdm_seq *s;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    float *out = malloc((size_t)fx.ncall[0] * (size_t)V * sizeof(float));
    CHECK(tdm_seq_prefill(s, fx.calls[0], fx.ncall[0], out, &err) == TDM_OK, "%s", err.msg);
    tdm_seq_destroy(s);
    tdm_model_destroy(m);
    *ok = 1;
    return out;
}

static cJSON *read_config(void)
{
    char p[700];
    snprintf(p, sizeof(p), "%s/config.json", fx.model);
    size_t n;
    char *text = (char *)file_read(p, &n);
    cJSON *c = cJSON_Parse(text);
    free(text);
    CHECK(c, "config.json");
    return c;
}

static void write_config(cJSON *c)
{
    dir_remove(tmp);
    dir_copy(fx.model, tmp);
    char p[300];
    snprintf(p, sizeof(p), "%s/config.json", tmp);
    char *text = cJSON_Print(c);
    file_write(p, text, strlen(text));
    free(text);
}

int main(void)
{
    be = test_backend();
    fixture_load(&fx, "f32_gqa");
    snprintf(tmp, sizeof(tmp), "/tmp/tandem-engine-config-%d", (int)getpid());
    int ok;
    float *ref = logits_of(fx.model, &ok);
    CHECK(ok, "original fixture");
    size_t n = (size_t)fx.ncall[0] * 384 * sizeof(float);

    /* Legacy: no rope_parameters, top-level rope_theta + partial_rotary_factor. */
    cJSON *c = read_config();
    cJSON_DeleteItemFromObject(c, "rope_parameters");
    cJSON_DeleteItemFromObject(c, "partial_rotary_factor");
    cJSON_AddNumberToObject(c, "rope_theta", 10000.0);
    cJSON_AddNumberToObject(c, "partial_rotary_factor", 0.5);
    write_config(c);
    float *v = logits_of(tmp, &ok);
    CHECK(ok && memcmp(v, ref, n) == 0, "legacy rope fields give other logits");
    free(v);
    /* ... and they are read: another theta, another factor, other logits. */
    cJSON_ReplaceItemInObject(c, "rope_theta", cJSON_CreateNumber(500.0));
    write_config(c);
    v = logits_of(tmp, &ok);
    CHECK(ok && memcmp(v, ref, n) != 0, "rope_theta is ignored");
    free(v);
    cJSON_ReplaceItemInObject(c, "rope_theta", cJSON_CreateNumber(10000.0));
    cJSON_ReplaceItemInObject(c, "partial_rotary_factor", cJSON_CreateNumber(0.25));
    write_config(c);
    v = logits_of(tmp, &ok);
    CHECK(ok && memcmp(v, ref, n) != 0, "partial_rotary_factor is ignored");
    free(v);
    cJSON_Delete(c);

    /* full_attention_interval 4 instead of layer_types (the fixture is 3:1). */
    c = read_config();
    cJSON_DeleteItemFromObject(c, "layer_types");
    cJSON_AddNumberToObject(c, "full_attention_interval", 4);
    write_config(c);
    v = logits_of(tmp, &ok);
    CHECK(ok && memcmp(v, ref, n) == 0, "full_attention_interval gives other logits");
    free(v);
    /* interval 2 makes layer 1 an attention layer, whose tensors are absent. */
    cJSON_ReplaceItemInObject(c, "full_attention_interval", cJSON_CreateNumber(2));
    write_config(c);
    tdm_model *m;
    tdm_error err;
    CHECK(tdm_model_load(tmp, be, &m, &err) == TDM_ERR_NOT_FOUND &&
              strstr(err.msg, "layers.1.self_attn"),
          "interval 2: %s", err.msg);
    cJSON_Delete(c);

    /* The qwen3_5 wrapper around the same text config. */
    c = read_config();
    cJSON *top = cJSON_CreateObject();
    cJSON_AddStringToObject(top, "model_type", "qwen3_5");
    cJSON_AddItemToObject(top, "text_config", c);
    write_config(top);
    v = logits_of(tmp, &ok);
    CHECK(ok && memcmp(v, ref, n) == 0, "qwen3_5 wrapper gives other logits");
    free(v);
    /* A wrapper whose two tie_word_embeddings disagree is refused, naming both. */
    cJSON_AddBoolToObject(top, "tie_word_embeddings", 1);
    write_config(top);
    CHECK(tdm_model_load(tmp, be, &m, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "tie_word_embeddings") && strstr(err.msg, "text_config"),
          "disagreeing tie_word_embeddings: %s", err.msg);
    /* Agreeing (both true): the embedding becomes the head, the logits change. */
    cJSON_ReplaceItemInObject(c, "tie_word_embeddings", cJSON_CreateTrue());
    write_config(top);
    v = logits_of(tmp, &ok);
    CHECK(ok && memcmp(v, ref, n) != 0, "tie_word_embeddings is ignored");
    free(v);
    cJSON_Delete(top);

    /* JSON that Python's json would read otherwise is refused: a key twice
     * (Python keeps the last, cJSON finds the first) and text after the
     * object ("extra data"). */
    tdm_model_config mc;
    static const char dup[] = "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 4096, "
                              "\"vocab_size\": 8}";
    CHECK(tdm_model_config_parse(dup, sizeof(dup) - 1, "dup", &mc, &err) ==
                  TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "\"vocab_size\" appears twice"),
          "duplicate key: %s", err.msg);
    static const char extra[] = "{\"model_type\": \"qwen3_5_text\"}\n{\"vocab_size\": 8}\n";
    CHECK(tdm_model_config_parse(extra, sizeof(extra) - 1, "extra", &mc, &err) ==
                  TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "text after the JSON object"),
          "extra data: %s", err.msg);
    static const char ws[] = "{\"model_type\": \"qwen3_5_text\"}\r\n\t ";
    CHECK(tdm_model_config_parse(ws, sizeof(ws) - 1, "ws", &mc, &err) == TDM_OK,
          "white space after the object: %s", err.msg);

    dir_remove(tmp);
    free(ref);
    fixture_free(&fx);
    be->destroy(be);
    printf("engine config variants: legacy rope fields, full_attention_interval, qwen3_5 "
           "wrapper all read as transformers does\n");
    return 0;
}
