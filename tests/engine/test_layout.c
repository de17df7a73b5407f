/*
 * test_layout.c - a checkpoint laid out as Qwen3.5/3.6 releases ship it
 * loads, and reads the same as the plain layout of the same weights.
 *
 * The release layout (bench_write_model_layout): a qwen3_5 config with
 * text_config and vision_config, tensors under model.language_model., an
 * untied lm_head.weight, the vision tower (model.visual.*) and the MTP head
 * (mtp.*) beside the text model, and many shards named by
 * model.safetensors.index.json. The same tensors in one model.safetensors
 * must give the same logits to the bit, the vision and MTP tensors must not
 * be placed on the backend (the weights a step streams are the text
 * model's), and a shard missing from the folder must be named.
 */
#include "util.h"

#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Logits of a 6-token prefill and one decode step. */
static float *run(tdm_model *m, int V)
{
    tdm_seq_params p = {TDM_STATE_REPLAY, 4, 0};
    tdm_seq *s;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    int32_t prompt[6] = {3, 1, 4, 1, 5, 9};
    float *out = malloc((size_t)7 * V * sizeof(float));
    CHECK(tdm_seq_prefill(s, prompt, 6, out, &err) == TDM_OK, "%s", err.msg);
    const int32_t next = 2;
    CHECK(tdm_seq_decode(&s, 1, &next, out + (size_t)6 * V, &err) == TDM_OK, "%s", err.msg);
    tdm_seq_destroy(s);
    return out;
}

int main(void)
{
    const bench_shape sh = {"tiny", 64, 8, 96, 2, 1, 32, 2, 4, 16, 16, 320};
    char one[] = "/tmp/tandem_layout_one_XXXXXX", many[] = "/tmp/tandem_layout_many_XXXXXX";
    char msg[512];
    CHECK(mkdtemp(one) && mkdtemp(many), "mkdtemp failed");
    CHECK(bench_write_model_layout(one, &sh, BENCH_LAYOUT_RELEASE, 0, msg, sizeof(msg)) == 0, "%s",
          msg);
    CHECK(bench_write_model_layout(many, &sh, BENCH_LAYOUT_RELEASE, 64 * 1024, msg, sizeof(msg)) ==
              0,
          "%s", msg);
    char p[700];
    struct stat st;
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", many);
    CHECK(stat(p, &st) == 0, "no index in %s", many);
    snprintf(p, sizeof(p), "%s/model.safetensors", one);
    CHECK(stat(p, &st) == 0, "no model.safetensors in %s", one);

    tdm_backend *be = test_backend();
    tdm_model *m1, *m2;
    tdm_error err;
    CHECK(tdm_model_load(one, be, &m1, &err) == TDM_OK, "one file: %s", err.msg);
    CHECK(tdm_model_load(many, be, &m2, &err) == TDM_OK, "shards: %s", err.msg);
    const tdm_model_config *c = tdm_model_get_config(m2);
    CHECK(c->hidden_size == sh.H && c->num_layers == sh.L && c->vocab_size == sh.V,
          "config read from text_config: hidden %d layers %d vocab %d", c->hidden_size,
          c->num_layers, c->vocab_size);
    CHECK(!c->tie_word_embeddings, "release layout is untied");

    /* What a step streams: every layer, the final norm and the LM head, as
     * bf16 (the text model only). */
    const size_t H = (size_t)sh.H, I = (size_t)sh.I;
    const size_t C = 2 * (size_t)sh.Hk * sh.Dk + (size_t)sh.Hv * sh.Dv, VD = (size_t)sh.Hv * sh.Dv;
    const size_t QD = (size_t)sh.nH * sh.D, KD = (size_t)sh.nKV * sh.D;
    size_t expect = H + (size_t)sh.V * H;
    for (int l = 0; l < sh.L; l++) {
        expect += 2 * H + 3 * H * I;
        if ((l + 1) % 4)
            expect += C * H + VD * H + 2 * (size_t)sh.Hv * H + H * VD + C * 4 + 2 * (size_t)sh.Hv +
                      (size_t)sh.Dv;
        else
            expect += 2 * QD * H + 2 * KD * H + H * QD + 2 * (size_t)sh.D;
    }
    const size_t w1 = tdm_model_weight_bytes(m1), w2 = tdm_model_weight_bytes(m2);
    CHECK(w1 == w2, "weights streamed: one file %zu bytes, shards %zu", w1, w2);
    /* Vectors become f32 on the backend; matrices stay bf16: bounds. */
    CHECK(w2 >= 2 * expect && w2 <= 4 * expect,
          "weights streamed %zu bytes, the text model is %zu bf16 values (vision or MTP "
          "tensors placed?)",
          w2, expect);

    const int V = sh.V;
    float *a = run(m1, V), *b = run(m2, V);
    CHECK(memcmp(a, b, (size_t)7 * V * sizeof(float)) == 0,
          "sharded release layout reads differently from one file (max diff %g)",
          (double)max_abs_diff(a, b, (size_t)7 * V));
    CHECK(max_abs(a, (size_t)7 * V) > 0, "logits are all zero");
    free(a);
    free(b);
    tdm_model_destroy(m1);
    tdm_model_destroy(m2);

    /* A shard named by the index but missing from the folder. */
    char victim[700] = "";
    for (int n = 2; n < 10000 && !victim[0]; n++) {
        char f[700];
        snprintf(f, sizeof(f), "%s/model-00002-of-%05d.safetensors", many, n);
        if (access(f, F_OK) == 0)
            snprintf(victim, sizeof(victim), "%s", f);
    }
    CHECK(victim[0], "the sharded layout has no second shard");
    CHECK(unlink(victim) == 0, "unlink %s", victim);
    tdm_model *m3 = NULL;
    CHECK(tdm_model_load(many, be, &m3, &err) != TDM_OK, "a missing shard was not noticed");
    const char *base = strrchr(victim, '/') + 1;
    CHECK(strstr(err.msg, base), "the error does not name the missing shard %s: %s", base, err.msg);
    printf("missing shard: %s\n", err.msg);

    dir_remove(one);
    dir_remove(many);
    rmdir(one);
    rmdir(many);
    be->destroy(be);
    printf("engine_layout: release layout (%d-layer tiny shape, sharded and not) loads and "
           "matches\n",
           sh.L);
    return 0;
}
