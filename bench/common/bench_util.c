/* bench_util.c - see bench_util.h. */
#include "bench_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 88172645463325252ull;

float bench_urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

uint16_t bench_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

int bench_ints(const char *list, int *out, int max, int lo, int hi)
{
    int n = 0;
    for (const char *p = list;; p++) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || (*end != ',' && *end != 0) || v < lo || v > hi || n == max) {
            fprintf(stderr,
                    "bench: \"%s\": expected at most %d integers in %d..%d, "
                    "comma-separated\n",
                    list, max, lo, hi);
            return -1;
        }
        out[n++] = (int)v;
        if (*end == 0)
            return n;
        p = end;
    }
}

typedef struct tens {
    char name[128];
    int ndim;
    int64_t shape[3];
    float scale, offset; /* uniform in [offset - scale, offset + scale] */
} tens;

static size_t numel_of(const tens *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

/* The tensors of shape s, in file order; *n set. */
static tens *tensors(const bench_shape *s, int *n_out)
{
    const int K = 4, C = 2 * s->Hk * s->Dk + s->Hv * s->Dv;
    tens *ts = calloc(16 * (size_t)s->L + 4, sizeof(tens));
    if (!ts)
        return NULL;
    int n = 0;
#define T(nm, nd, a, b, c, sc, off)                                                                \
    do {                                                                                           \
        snprintf(ts[n].name, sizeof(ts[n].name), "%s", nm);                                        \
        ts[n].ndim = nd, ts[n].shape[0] = a, ts[n].shape[1] = b, ts[n].shape[2] = c;               \
        ts[n].scale = sc, ts[n].offset = off;                                                      \
        n++;                                                                                       \
    } while (0)
    char nm[128];
    const float sh = 1.7f / sqrtf((float)s->H);
    T("model.embed_tokens.weight", 2, s->V, s->H, 0, 1.0f, 0);
    T("model.norm.weight", 1, s->H, 0, 0, 0.1f, 0);
    for (int l = 0; l < s->L; l++) {
#define NM(x) (snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, x), nm)
        T(NM("input_layernorm.weight"), 1, s->H, 0, 0, 0.1f, 0);
        T(NM("post_attention_layernorm.weight"), 1, s->H, 0, 0, 0.1f, 0);
        T(NM("mlp.gate_proj.weight"), 2, s->I, s->H, 0, sh, 0);
        T(NM("mlp.up_proj.weight"), 2, s->I, s->H, 0, sh, 0);
        T(NM("mlp.down_proj.weight"), 2, s->H, s->I, 0, 1.7f / sqrtf((float)s->I), 0);
        if ((l + 1) % 4) {
            const int VD = s->Hv * s->Dv;
            T(NM("linear_attn.in_proj_qkv.weight"), 2, C, s->H, 0, sh, 0);
            T(NM("linear_attn.in_proj_z.weight"), 2, VD, s->H, 0, sh, 0);
            T(NM("linear_attn.in_proj_b.weight"), 2, s->Hv, s->H, 0, sh, 0);
            T(NM("linear_attn.in_proj_a.weight"), 2, s->Hv, s->H, 0, sh, 0);
            T(NM("linear_attn.out_proj.weight"), 2, s->H, VD, 0, 1.7f / sqrtf((float)VD), 0);
            T(NM("linear_attn.conv1d.weight"), 3, C, 1, K, 0.5f, 0);
            T(NM("linear_attn.A_log"), 1, s->Hv, 0, 0, 1.0f, -1.0f);
            T(NM("linear_attn.dt_bias"), 1, s->Hv, 0, 0, 0.5f, 0);
            T(NM("linear_attn.norm.weight"), 1, s->Dv, 0, 0, 0.2f, 1.0f);
        } else {
            const int QD = s->nH * s->D, KD = s->nKV * s->D;
            T(NM("self_attn.q_proj.weight"), 2, 2 * QD, s->H, 0, sh, 0);
            T(NM("self_attn.k_proj.weight"), 2, KD, s->H, 0, sh, 0);
            T(NM("self_attn.v_proj.weight"), 2, KD, s->H, 0, sh, 0);
            T(NM("self_attn.o_proj.weight"), 2, s->H, QD, 0, 1.7f / sqrtf((float)QD), 0);
            T(NM("self_attn.q_norm.weight"), 1, s->D, 0, 0, 0.1f, 0);
            T(NM("self_attn.k_norm.weight"), 1, s->D, 0, 0, 0.1f, 0);
        }
#undef NM
    }
#undef T
    *n_out = n;
    return ts;
}

int bench_write_model(const char *dir, const bench_shape *s, char *err, size_t err_len)
{
    char p[600];
    mkdir(dir, 0755);
    snprintf(p, sizeof(p), "%s/config.json", dir);
    FILE *fc = fopen(p, "w");
    if (!fc) {
        snprintf(err, err_len, "cannot write %s", p);
        return -1;
    }
    fprintf(fc,
            "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": %d, \"hidden_size\": %d,\n"
            " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,\n"
            " \"num_key_value_heads\": %d, \"head_dim\": %d, \"linear_num_key_heads\": %d,\n"
            " \"linear_num_value_heads\": %d, \"linear_key_head_dim\": %d,\n"
            " \"linear_value_head_dim\": %d, \"linear_conv_kernel_dim\": 4,\n"
            " \"full_attention_interval\": 4, \"tie_word_embeddings\": true,\n"
            " \"rms_norm_eps\": 1e-6, \"rope_parameters\": {\"rope_type\": \"default\",\n"
            " \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25}}\n",
            s->V, s->H, s->I, s->L, s->nH, s->nKV, s->D, s->Hk, s->Hv, s->Dk, s->Dv);
    fclose(fc);
    int n = 0, rc = -1;
    tens *ts = tensors(s, &n);
    const size_t B = 1u << 22, cap = 1 << 20;
    char *hdr = malloc(cap);
    float *base = malloc(B * sizeof(float));
    uint16_t *buf = malloc(B * 2);
    FILE *fw = NULL;
    if (!ts || !hdr || !base || !buf) {
        snprintf(err, err_len, "out of memory");
        goto out;
    }
    /* Header: the bf16 tensors' offsets in order, padded to 8 bytes. */
    size_t len = 0, off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[",
                                i ? "," : "", ts[i].name);
        for (int d = 0; d < ts[i].ndim; d++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "",
                                    (long long)ts[i].shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off,
                                off + 2 * numel_of(&ts[i]));
        off += 2 * numel_of(&ts[i]);
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8)
        hdr[len++] = ' ';
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    fw = fopen(p, "wb");
    if (!fw) {
        snprintf(err, err_len, "cannot write %s", p);
        goto out;
    }
    uint64_t hl = len;
    fwrite(&hl, 8, 1, fw);
    fwrite(hdr, 1, len, fw);
    for (size_t j = 0; j < B; j++)
        base[j] = bench_urand();
    for (int i = 0; i < n; i++) {
        const size_t numel = numel_of(&ts[i]), first = numel < B ? numel : B;
        const size_t rot = (size_t)i * 7919 % B;
        for (size_t j = 0; j < first; j++)
            buf[j] = bench_bf16(ts[i].offset + ts[i].scale * base[(j + rot) % B]);
        for (size_t at = 0; at < numel; at += B) {
            const size_t cnt = numel - at < B ? numel - at : B;
            if (fwrite(buf, 2, cnt, fw) != cnt) {
                snprintf(err, err_len, "short write to %s", p);
                goto out;
            }
        }
    }
    rc = 0;
out:
    if (fw && fclose(fw) != 0 && rc == 0) {
        snprintf(err, err_len, "cannot finish %s", p);
        rc = -1;
    }
    free(buf);
    free(base);
    free(hdr);
    free(ts);
    return rc;
}

int bench_listed(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* hybrid-model-notes.md: Qwen3.5-0.8B, Qwen3.5-4B, Qwen3.6-27B. */
static const bench_shape bench_shapes[] = {
    {"0.8b", 1024, 24, 3584, 8, 2, 256, 16, 16, 128, 128, 248320},
    {"4b", 2560, 32, 9216, 16, 4, 256, 16, 32, 128, 128, 248320},
    {"27b", 5120, 64, 17408, 24, 4, 256, 16, 48, 128, 128, 248320},
};

const bench_shape *bench_shape_find(const char *name)
{
    for (size_t i = 0; i < sizeof(bench_shapes) / sizeof(bench_shapes[0]); i++)
        if (!strcmp(bench_shapes[i].name, name))
            return &bench_shapes[i];
    return NULL;
}
