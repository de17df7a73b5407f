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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_sort(double *v, int n)
{
    if (n > 1)
        qsort(v, (size_t)n, sizeof(*v), cmp_double);
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
    char name[160];
    int ndim;
    int64_t shape[5];
    float scale, offset; /* uniform in [offset - scale, offset + scale] */
} tens;

static size_t numel_of(const tens *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

typedef struct tens_list {
    tens *t;
    int n, cap;
} tens_list;

static void add(tens_list *l, const char *name, int ndim, const int64_t *shape, float scale,
                float offset)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        tens *nt = realloc(l->t, (size_t)l->cap * sizeof(tens));
        if (!nt) {
            fprintf(stderr, "bench: out of memory\n");
            exit(1);
        }
        l->t = nt;
    }
    tens *t = &l->t[l->n++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->scale = scale, t->offset = offset;
}

#define T(nm, sc, off, ...)                                                                        \
    do {                                                                                           \
        const int64_t sh_[] = {__VA_ARGS__};                                                       \
        add(l, nm, (int)(sizeof(sh_) / sizeof(sh_[0])), sh_, sc, off);                             \
    } while (0)

/* One full-attention decoder layer (self_attn + mlp) under `pre`. */
static void attn_layer(tens_list *l, const bench_shape *s, const char *pre)
{
    char nm[160];
    const float sh = 1.7f / sqrtf((float)s->H);
    const int QD = s->nH * s->D, KD = s->nKV * s->D;
#define NM(x) (snprintf(nm, sizeof(nm), "%s%s", pre, x), nm)
    T(NM("self_attn.q_proj.weight"), sh, 0, 2 * QD, s->H);
    T(NM("self_attn.k_proj.weight"), sh, 0, KD, s->H);
    T(NM("self_attn.v_proj.weight"), sh, 0, KD, s->H);
    T(NM("self_attn.o_proj.weight"), 1.7f / sqrtf((float)QD), 0, s->H, QD);
    T(NM("self_attn.q_norm.weight"), 0.1f, 0, s->D);
    T(NM("self_attn.k_norm.weight"), 0.1f, 0, s->D);
#undef NM
}

static void mlp_and_norms(tens_list *l, const bench_shape *s, const char *pre)
{
    char nm[160];
    const float sh = 1.7f / sqrtf((float)s->H);
#define NM(x) (snprintf(nm, sizeof(nm), "%s%s", pre, x), nm)
    T(NM("input_layernorm.weight"), 0.1f, 0, s->H);
    T(NM("post_attention_layernorm.weight"), 0.1f, 0, s->H);
    T(NM("mlp.gate_proj.weight"), sh, 0, s->I, s->H);
    T(NM("mlp.up_proj.weight"), sh, 0, s->I, s->H);
    T(NM("mlp.down_proj.weight"), 1.7f / sqrtf((float)s->I), 0, s->H, s->I);
#undef NM
}

/* The tensors of shape s, in file order. A release layout adds what a
 * Qwen3.5/3.6 checkpoint carries beside the text model: an untied LM head,
 * the vision tower (model.visual.*) and the MTP head (mtp.*). */
static void tensors(tens_list *l, const bench_shape *s, int flags)
{
    const int release = flags & BENCH_LAYOUT_RELEASE;
    const int K = 4, C = 2 * s->Hk * s->Dk + s->Hv * s->Dv;
    const char *pfx = release ? "model.language_model." : "model.";
    char nm[160], pre[160];
    const float sh = 1.7f / sqrtf((float)s->H);
#define NM(x) (snprintf(nm, sizeof(nm), "%s%s", pre, x), nm)
    snprintf(pre, sizeof(pre), "%s", pfx);
    T(NM("embed_tokens.weight"), 1.0f, 0, s->V, s->H);
    T(NM("norm.weight"), 0.1f, 0, s->H);
    for (int l_ = 0; l_ < s->L; l_++) {
        snprintf(pre, sizeof(pre), "%slayers.%d.", pfx, l_);
        mlp_and_norms(l, s, pre);
        if ((l_ + 1) % 4) {
            const int VD = s->Hv * s->Dv;
            T(NM("linear_attn.in_proj_qkv.weight"), sh, 0, C, s->H);
            T(NM("linear_attn.in_proj_z.weight"), sh, 0, VD, s->H);
            T(NM("linear_attn.in_proj_b.weight"), sh, 0, s->Hv, s->H);
            T(NM("linear_attn.in_proj_a.weight"), sh, 0, s->Hv, s->H);
            T(NM("linear_attn.out_proj.weight"), 1.7f / sqrtf((float)VD), 0, s->H, VD);
            T(NM("linear_attn.conv1d.weight"), 0.5f, 0, C, 1, K);
            T(NM("linear_attn.A_log"), 1.0f, -1.0f, s->Hv);
            T(NM("linear_attn.dt_bias"), 0.5f, 0, s->Hv);
            T(NM("linear_attn.norm.weight"), 0.2f, 1.0f, s->Dv);
        } else {
            attn_layer(l, s, pre);
        }
    }
    if (release)
        T("lm_head.weight", sh, 0, s->V, s->H);
    if (release || (flags & BENCH_LAYOUT_MTP)) {
        /* MTP head: norms of the next token's embedding and of the hidden
         * state, the projection of their concatenation, one full-attention
         * layer, a final norm (the LM head is shared). */
        T("mtp.pre_fc_norm_embedding.weight", 0.1f, 0, s->H);
        T("mtp.pre_fc_norm_hidden.weight", 0.1f, 0, s->H);
        T("mtp.fc.weight", 1.7f / sqrtf(2.0f * (float)s->H), 0, s->H, 2 * s->H);
        mlp_and_norms(l, s, "mtp.layers.0.");
        attn_layer(l, s, "mtp.layers.0.");
        T("mtp.norm.weight", 0.1f, 0, s->H);
    }
    if (!release)
        return;
    /* Vision tower (Qwen3.5's: 27 blocks of width 1152, patch 16, temporal
     * patch 2, a 2x2 merger into the text width); two narrow blocks beside a
     * test-sized text model. */
    const int tiny = s->H < 1024;
    const int VH = tiny ? 32 : 1152, VI = tiny ? 64 : 4304, depth = tiny ? 2 : 27;
    T("model.visual.patch_embed.proj.weight", 0.05f, 0, VH, 3, 2, 16, 16);
    T("model.visual.patch_embed.proj.bias", 0.05f, 0, VH);
    T("model.visual.pos_embed.weight", 0.05f, 0, tiny ? 16 : 2304, VH);
    for (int b = 0; b < depth; b++) {
        snprintf(pre, sizeof(pre), "model.visual.blocks.%d.", b);
        T(NM("norm1.weight"), 0.1f, 1.0f, VH);
        T(NM("norm1.bias"), 0.1f, 0, VH);
        T(NM("norm2.weight"), 0.1f, 1.0f, VH);
        T(NM("norm2.bias"), 0.1f, 0, VH);
        T(NM("attn.qkv.weight"), 0.03f, 0, 3 * VH, VH);
        T(NM("attn.qkv.bias"), 0.03f, 0, 3 * VH);
        T(NM("attn.proj.weight"), 0.03f, 0, VH, VH);
        T(NM("attn.proj.bias"), 0.03f, 0, VH);
        T(NM("mlp.linear_fc1.weight"), 0.03f, 0, VI, VH);
        T(NM("mlp.linear_fc1.bias"), 0.03f, 0, VI);
        T(NM("mlp.linear_fc2.weight"), 0.03f, 0, VH, VI);
        T(NM("mlp.linear_fc2.bias"), 0.03f, 0, VH);
    }
    T("model.visual.merger.norm.weight", 0.1f, 1.0f, VH);
    T("model.visual.merger.norm.bias", 0.1f, 0, VH);
    T("model.visual.merger.linear_fc1.weight", 0.03f, 0, 4 * VH, 4 * VH);
    T("model.visual.merger.linear_fc1.bias", 0.03f, 0, 4 * VH);
    T("model.visual.merger.linear_fc2.weight", 0.03f, 0, s->H, 4 * VH);
    T("model.visual.merger.linear_fc2.bias", 0.03f, 0, s->H);
#undef NM
}
#undef T

/* Writes tensors [a, b) of ts as one safetensors file at path. */
static int write_shard(const char *path, const tens *ts, int a, int b, const float *base,
                       uint16_t *buf, size_t B, char *err, size_t err_len)
{
    size_t cap = 4096 + (size_t)(b - a) * 256;
    char *hdr = malloc(cap);
    if (!hdr) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    /* Header: the bf16 tensors' offsets in order, padded to 8 bytes. */
    size_t len = 0, off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int i = a; i < b; i++) {
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[",
                                i > a ? "," : "", ts[i].name);
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
    int rc = -1;
    FILE *fw = fopen(path, "wb");
    if (!fw) {
        snprintf(err, err_len, "cannot write %s", path);
        goto out;
    }
    uint64_t hl = len;
    if (fwrite(&hl, 8, 1, fw) != 1 || fwrite(hdr, 1, len, fw) != len) {
        snprintf(err, err_len, "short write to %s", path);
        goto out;
    }
    for (int i = a; i < b; i++) {
        const size_t numel = numel_of(&ts[i]), first = numel < B ? numel : B;
        const size_t rot = (size_t)i * 7919 % B;
        for (size_t j = 0; j < first; j++)
            buf[j] = bench_bf16(ts[i].offset + ts[i].scale * base[(j + rot) % B]);
        for (size_t at = 0; at < numel; at += B) {
            const size_t cnt = numel - at < B ? numel - at : B;
            if (fwrite(buf, 2, cnt, fw) != cnt) {
                snprintf(err, err_len, "short write to %s", path);
                goto out;
            }
        }
    }
    rc = 0;
out:
    if (fw && fclose(fw) != 0 && rc == 0) {
        snprintf(err, err_len, "cannot finish %s", path);
        rc = -1;
    }
    free(hdr);
    return rc;
}

static int write_config(const char *dir, const bench_shape *s, int flags, char *err, size_t err_len)
{
    const int release = flags & BENCH_LAYOUT_RELEASE;
    char p[600];
    snprintf(p, sizeof(p), "%s/config.json", dir);
    FILE *fc = fopen(p, "w");
    if (!fc) {
        snprintf(err, err_len, "cannot write %s", p);
        return -1;
    }
    const char *tie = release ? "false" : "true";
    if (release)
        fprintf(fc, "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"],\n"
                    " \"model_type\": \"qwen3_5\", \"tie_word_embeddings\": false,\n"
                    " \"image_token_id\": 248056, \"video_token_id\": 248057,\n"
                    " \"vision_config\": {\"model_type\": \"qwen3_5\", \"depth\": 27,\n"
                    "  \"hidden_size\": 1152, \"intermediate_size\": 4304, \"num_heads\": 16,\n"
                    "  \"patch_size\": 16, \"temporal_patch_size\": 2,\n"
                    "  \"spatial_merge_size\": 2, \"in_channels\": 3},\n"
                    " \"text_config\": ");
    fprintf(fc,
            "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": %d, \"hidden_size\": %d,\n"
            " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,\n"
            " \"num_key_value_heads\": %d, \"head_dim\": %d, \"linear_num_key_heads\": %d,\n"
            " \"linear_num_value_heads\": %d, \"linear_key_head_dim\": %d,\n"
            " \"linear_value_head_dim\": %d, \"linear_conv_kernel_dim\": 4,\n"
            " \"full_attention_interval\": 4, \"tie_word_embeddings\": %s,\n"
            " \"max_position_embeddings\": 262144, \"mtp_num_hidden_layers\": %d,\n"
            " \"rms_norm_eps\": 1e-6, \"rope_parameters\": {\"rope_type\": \"default\",\n"
            " \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25}}%s\n",
            s->V, s->H, s->I, s->L, s->nH, s->nKV, s->D, s->Hk, s->Hv, s->Dk, s->Dv, tie,
            flags ? 1 : 0, release ? "}" : "");
    if (fclose(fc) != 0) {
        snprintf(err, err_len, "cannot finish %s", p);
        return -1;
    }
    return 0;
}

int bench_write_model_layout(const char *dir, const bench_shape *s, int flags, size_t shard_bytes,
                             char *err, size_t err_len)
{
    mkdir(dir, 0755);
    if (write_config(dir, s, flags, err, err_len) != 0)
        return -1;
    tens_list l = {0};
    tensors(&l, s, flags);
    const size_t B = 1u << 22;
    float *base = malloc(B * sizeof(float));
    uint16_t *buf = malloc(B * 2);
    int *shard_of = malloc((size_t)l.n * sizeof(int));
    int rc = -1;
    char p[700];
    if (!base || !buf || !shard_of) {
        snprintf(err, err_len, "out of memory");
        goto out;
    }
    /* The same values on every call: from the stream's start. */
    const uint64_t saved = rs;
    rs = 88172645463325252ull;
    for (size_t j = 0; j < B; j++)
        base[j] = bench_urand();
    rs = saved;
    /* Shards in file order, each up to shard_bytes (0: one file). */
    int nshards = 1;
    size_t in_shard = 0, total = 0;
    for (int i = 0; i < l.n; i++) {
        const size_t nb = 2 * numel_of(&l.t[i]);
        if (shard_bytes && in_shard > 0 && in_shard + nb > shard_bytes) {
            nshards++;
            in_shard = 0;
        }
        shard_of[i] = nshards - 1;
        in_shard += nb;
        total += nb;
    }
    if (nshards == 1 && !shard_bytes) {
        snprintf(p, sizeof(p), "%s/model.safetensors", dir);
        rc = write_shard(p, l.t, 0, l.n, base, buf, B, err, err_len);
        goto out;
    }
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
    FILE *fi = fopen(p, "w");
    if (!fi) {
        snprintf(err, err_len, "cannot write %s", p);
        goto out;
    }
    fprintf(fi, "{\"metadata\": {\"total_size\": %zu},\n \"weight_map\": {", total);
    for (int i = 0; i < l.n; i++)
        fprintf(fi, "%s\n  \"%s\": \"model-%05d-of-%05d.safetensors\"", i ? "," : "", l.t[i].name,
                shard_of[i] + 1, nshards);
    fprintf(fi, "\n }\n}\n");
    if (fclose(fi) != 0) {
        snprintf(err, err_len, "cannot finish %s", p);
        goto out;
    }
    for (int a = 0; a < l.n;) {
        int b = a;
        while (b < l.n && shard_of[b] == shard_of[a])
            b++;
        snprintf(p, sizeof(p), "%s/model-%05d-of-%05d.safetensors", dir, shard_of[a] + 1, nshards);
        if (write_shard(p, l.t, a, b, base, buf, B, err, err_len) != 0)
            goto out;
        a = b;
    }
    rc = 0;
out:
    free(shard_of);
    free(buf);
    free(base);
    free(l.t);
    return rc;
}

int bench_write_model(const char *dir, const bench_shape *s, char *err, size_t err_len)
{
    return bench_write_model_layout(dir, s, 0, 0, err, err_len);
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
    {"tiny", 64, 8, 96, 2, 1, 32, 2, 4, 16, 16, 320},
};

const bench_shape *bench_shape_find(const char *name)
{
    for (size_t i = 0; i < sizeof(bench_shapes) / sizeof(bench_shapes[0]); i++)
        if (!strcmp(bench_shapes[i].name, name))
            return &bench_shapes[i];
    return NULL;
}
