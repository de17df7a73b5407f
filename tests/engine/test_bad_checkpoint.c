/*
 * test_bad_checkpoint.c - every kind of broken checkpoint gets a clear error
 * naming the file and the tensor or field at fault, never a crash.
 *
 * Each case copies a good fixture into a temporary folder, breaks one thing,
 * loads it and checks the status code and the words of the message.
 */
#include "util.h"

#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static tdm_backend *be;
static char tmp[256];

static void fresh(const char *fixture)
{
    dir_remove(tmp);
    char src[600];
    snprintf(src, sizeof(src), "%s/%s/model", TANDEM_ENGINE_FIXTURES, fixture);
    dir_copy(src, tmp);
}

static char *path_in(const char *file)
{
    static char p[600];
    snprintf(p, sizeof(p), "%s/%s", tmp, file);
    return p;
}

/* Replaces the first `from` (after `after`, when given) in a file by `to`,
 * which has the same length unless the file is JSON text. */
static void edit(const char *file, const char *after, const char *from, const char *to)
{
    size_t n;
    char *buf = (char *)file_read(path_in(file), &n);
    char *start = buf;
    if (after) {
        start = memmem(buf, n, after, strlen(after));
        CHECK(start, "test setup: '%s' not in %s", after, file);
    }
    char *at = memmem(start, n - (size_t)(start - buf), from, strlen(from));
    CHECK(at, "test setup: '%s' not in %s", from, file);
    size_t fl = strlen(from), tl = strlen(to);
    char *out = malloc(n - fl + tl);
    size_t pre = (size_t)(at - buf);
    memcpy(out, buf, pre);
    memcpy(out + pre, to, tl);
    memcpy(out + pre + tl, at + fl, n - pre - fl);
    file_write(path_in(file), out, n - fl + tl);
    free(out);
    free(buf);
}

static void expect(const char *what, tdm_status code, const char *w1, const char *w2)
{
    tdm_model *m = NULL;
    tdm_error err;
    memset(&err, 0, sizeof(err));
    tdm_status rc = tdm_model_load(tmp, be, &m, &err);
    CHECK(rc != TDM_OK && m == NULL, "%s: loaded a broken checkpoint", what);
    CHECK(rc == code, "%s: status %s, expected %s (%s)", what, tdm_status_name(rc),
          tdm_status_name(code), err.msg);
    CHECK(!w1 || strstr(err.msg, w1), "%s: message lacks '%s': %s", what, w1, err.msg);
    CHECK(!w2 || strstr(err.msg, w2), "%s: message lacks '%s': %s", what, w2, err.msg);
    printf("ok  %-28s %s: %s\n", what, tdm_status_name(rc), err.msg);
}

int main(void)
{
    be = test_backend();
    snprintf(tmp, sizeof(tmp), "/tmp/tandem-engine-bad-%d", (int)getpid());

    /* Sanity: the untouched copy loads. */
    fresh("f32_tied");
    tdm_model *m;
    tdm_error err;
    CHECK(tdm_model_load(tmp, be, &m, &err) == TDM_OK, "good copy: %s", err.msg);
    tdm_model_destroy(m);

    fresh("f32_tied");
    edit("model.safetensors", NULL, "\"model.norm.weight\"", "\"model.norX.weight\"");
    expect("missing tensor", TDM_ERR_NOT_FOUND, "norm.weight", tmp);

    fresh("f32_tied");
    edit("model.safetensors", "model.layers.1.linear_attn.A_log", "\"F32\"", "\"I32\"");
    expect("unsupported dtype", TDM_ERR_UNIMPLEMENTED, "model.layers.1.linear_attn.A_log",
           "model.safetensors");

    fresh("f32_tied");
    edit("model.safetensors", "model.layers.1.linear_attn.A_log", "\"F32\"", "\"F64\"");
    expect("byte count vs dtype", TDM_ERR_DATA_LOSS, "model.layers.1.linear_attn.A_log",
           "model.safetensors");

    fresh("f32_tied");
    edit("config.json", NULL, "\"intermediate_size\": 96", "\"intermediate_size\": 80");
    expect("wrong shape", TDM_ERR_INVALID_ARGUMENT, "mlp.gate_proj.weight", "[96, 48]");

    fresh("f32_tied");
    edit("config.json", NULL, "\"linear_num_value_heads\": 2", "\"linear_num_value_heads\": 4");
    expect("wrong shape (linear)", TDM_ERR_INVALID_ARGUMENT, "linear_attn", "model.safetensors");

    fresh("f32_tied");
    {
        size_t n;
        unsigned char *b = file_read(path_in("model.safetensors"), &n);
        file_write(path_in("model.safetensors"), b, n * 6 / 10);
        free(b);
    }
    expect("truncated file", TDM_ERR_DATA_LOSS, "model.safetensors", "outside");

    fresh("f32_tied");
    {
        size_t n;
        unsigned char *b = file_read(path_in("model.safetensors"), &n);
        file_write(path_in("model.safetensors"), b, 5);
        free(b);
    }
    expect("truncated header", TDM_ERR_DATA_LOSS, "model.safetensors", "truncated");

    fresh("f32_tied");
    {
        size_t n;
        unsigned char *b = file_read(path_in("model.safetensors"), &n);
        b[6] = 0x7f; /* header length ~ 2^55 */
        file_write(path_in("model.safetensors"), b, n);
        free(b);
    }
    expect("corrupt header length", TDM_ERR_DATA_LOSS, "model.safetensors", "header length");

    fresh("f32_tied");
    {
        size_t n;
        unsigned char *b = file_read(path_in("model.safetensors"), &n);
        b[8] = 'x'; /* the JSON's opening brace */
        file_write(path_in("model.safetensors"), b, n);
        free(b);
    }
    expect("corrupt header JSON", TDM_ERR_DATA_LOSS, "model.safetensors", "JSON");

    fresh("f32_tied");
    edit("model.safetensors", "model.layers.2.mlp.up_proj.weight", "\"data_offsets\":[",
         "\"data_offsets\":[1");
    /* The header grew by one byte but its length field did not: the JSON no
     * longer parses, or the offsets now point elsewhere. Either is DATA_LOSS. */
    expect("header lies (length)", TDM_ERR_DATA_LOSS, "model.safetensors", NULL);

    fresh("f32_tied");
    {
        /* Same-length lie: swap the start offset's first digit so the span no
         * longer matches shape x dtype. */
        size_t n;
        char *b = (char *)file_read(path_in("model.safetensors"), &n);
        char *e = memmem(b, n, "model.layers.2.mlp.up_proj.weight", 33);
        CHECK(e, "setup");
        char *o = strstr(e, "\"data_offsets\":[");
        CHECK(o, "setup");
        o += strlen("\"data_offsets\":[");
        *o = *o == '9' ? '1' : (char)(*o + 1);
        file_write(path_in("model.safetensors"), b, n);
        free(b);
    }
    expect("header lies (offsets)", TDM_ERR_DATA_LOSS, "model.layers.2.mlp.up_proj.weight",
           "data_offsets");

    fresh("f32_tied");
    edit("config.json", NULL, "\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3");
    expect("inconsistent heads", TDM_ERR_INVALID_ARGUMENT, "num_key_value_heads", "config.json");

    fresh("f32_tied");
    edit("config.json", NULL, "\"full_attention\",", "");
    expect("layer_types length", TDM_ERR_INVALID_ARGUMENT, "layer_types", "config.json");

    fresh("f32_tied");
    edit("config.json", NULL, "\"qwen3_5_text\"", "\"llama\"");
    expect("unknown model_type", TDM_ERR_UNIMPLEMENTED, "llama", "config.json");

    fresh("f32_tied");
    edit("config.json", NULL, "\"hidden_size\": 48", "\"hidden_size\": \"48\"");
    expect("field of wrong type", TDM_ERR_INVALID_ARGUMENT, "hidden_size", "config.json");

    fresh("f32_tied");
    edit("config.json", NULL, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    expect("untied without lm_head", TDM_ERR_NOT_FOUND, "lm_head.weight", NULL);

    fresh("f32_tied");
    unlink(path_in("config.json"));
    expect("no config.json", TDM_ERR_NOT_FOUND, "config.json", NULL);

    fresh("f32_tied");
    unlink(path_in("model.safetensors"));
    expect("no weights", TDM_ERR_NOT_FOUND, "model.safetensors", NULL);

    fresh("f32_sharded");
    unlink(path_in("model-00003-of-00005.safetensors"));
    expect("missing shard", TDM_ERR_NOT_FOUND, "model-00003-of-00005.safetensors", NULL);

    fresh("f32_sharded");
    edit("model.safetensors.index.json", "\"lm_head.weight\"", "model-00005-of-00005",
         "model-00001-of-00005");
    expect("index points at wrong shard", TDM_ERR_DATA_LOSS, "lm_head.weight",
           "model-00001-of-00005");

    fresh("f32_sharded");
    edit("model.safetensors.index.json", NULL, "\"weight_map\"", "\"weight_mop\"");
    expect("index without weight_map", TDM_ERR_DATA_LOSS, "index.json", "weight_map");

    /* The reader alone exposes names, dtypes and shapes. */
    fresh("bf16_alt");
    tdm_st_file *st;
    CHECK(tdm_st_open(tmp, &st, &err) == TDM_OK, "%s", err.msg);
    const tdm_st_tensor *t = tdm_st_find(st, "model.embed_tokens.weight");
    CHECK(t && t->dtype == TDM_ST_DTYPE_BF16 && t->ndim == 2 && t->shape[0] == 512 &&
              t->shape[1] == 96,
          "embed_tokens metadata");
    CHECK(tdm_st_count(st) == 53, "tensor count %zu", tdm_st_count(st));
    tdm_st_close(st);

    dir_remove(tmp);
    be->destroy(be);
    printf("engine bad checkpoints: all errors clear\n");
    return 0;
}
