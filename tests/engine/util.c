/* util.c - see util.h. */
#include "util.h"

#include "npy.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

unsigned char *file_read(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    CHECK(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    CHECK(buf && fread(buf, 1, (size_t)n, fp) == (size_t)n, "cannot read %s", path);
    buf[n] = 0;
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

void file_write(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(data, 1, len, fp) == len, "cannot write %s", path);
    fclose(fp);
}

void dir_copy(const char *src, const char *dst)
{
    mkdir(dst, 0755);
    DIR *d = opendir(src);
    CHECK(d, "cannot list %s", src);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char a[1024], b[1024];
        snprintf(a, sizeof(a), "%s/%s", src, e->d_name);
        snprintf(b, sizeof(b), "%s/%s", dst, e->d_name);
        size_t n;
        unsigned char *buf = file_read(a, &n);
        file_write(b, buf, n);
        free(buf);
    }
    closedir(d);
}

void dir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char a[1024];
        snprintf(a, sizeof(a), "%s/%s", dir, e->d_name);
        unlink(a);
    }
    closedir(d);
    rmdir(dir);
}

void fixture_load(fixture *f, const char *name)
{
    memset(f, 0, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "%s/%s", TANDEM_ENGINE_FIXTURES, name);
    snprintf(f->model, sizeof(f->model), "%s/model", f->dir);
    char p[700];
    snprintf(p, sizeof(p), "%s/meta.json", f->dir);
    size_t n;
    char *text = (char *)file_read(p, &n);
    cJSON *root = cJSON_Parse(text);
    free(text);
    CHECK(root, "%s: bad JSON", p);
    const cJSON *dt = cJSON_GetObjectItem(root, "dtype");
    CHECK(cJSON_IsString(dt), "%s: no dtype", p);
    snprintf(f->dtype, sizeof(f->dtype), "%s", dt->valuestring);
    const cJSON *calls = cJSON_GetObjectItem(root, "calls");
    CHECK(cJSON_IsArray(calls) && cJSON_GetArraySize(calls) == 3, "%s: calls", p);
    f->ncalls = 3;
    int ci = 0;
    for (const cJSON *c = calls->child; c; c = c->next, ci++) {
        f->ncall[ci] = cJSON_GetArraySize(c);
        f->calls[ci] = malloc((size_t)f->ncall[ci] * sizeof(int32_t));
        int j = 0;
        for (const cJSON *t = c->child; t; t = t->next)
            f->calls[ci][j++] = (int32_t)t->valuedouble;
        f->total += f->ncall[ci];
    }
    cJSON_Delete(root);
}

tdm_model *fixture_model(const char *name, tdm_backend *be)
{
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/%s/model", TANDEM_ENGINE_FIXTURES, name);
    tdm_model *m;
    tdm_error err;
    CHECK(tdm_model_load(dir, be, &m, &err) == TDM_OK, "%s: %s", name, err.msg);
    return m;
}

void fixture_free(fixture *f)
{
    for (int i = 0; i < 3; i++)
        free(f->calls[i]);
}

float *npy_load2(const char *path, int64_t *rows, int64_t *cols)
{
    float *d;
    int nd;
    int64_t sh[4];
    tdm_error err;
    CHECK(tdm_npy_read_f32(path, &d, &nd, sh, &err) == TDM_OK, "%s", err.msg);
    CHECK(nd == 2, "%s: expected 2 dims", path);
    *rows = sh[0];
    *cols = sh[1];
    return d;
}

float max_abs(const float *x, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

float max_abs_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) /* NaN propagates as a failure */
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

int argmax_row(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

tdm_backend *test_backend(void)
{
    tdm_backend *be = tdm_backend_cpu_create(2);
    CHECK(be, "cannot create the CPU backend");
    return be;
}

float *fixture_run(tdm_model *m, const fixture *f, tdm_state_strategy strat)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    float *out = malloc((size_t)f->total * (size_t)V * sizeof(float));
    tdm_seq_params p = {strat, 8, 0};
    tdm_seq *s;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(s, f->calls[0], f->ncall[0], out, &err) == TDM_OK, "%s", err.msg);
    float *o1 = out + (size_t)f->ncall[0] * (size_t)V;
    CHECK(tdm_seq_prefill(s, f->calls[1], f->ncall[1], o1, &err) == TDM_OK, "%s", err.msg);
    float *o2 = o1 + (size_t)f->ncall[1] * (size_t)V;
    CHECK(tdm_seq_decode(&s, 1, f->calls[2], o2, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_length(s) == f->total, "length %d != %d", tdm_seq_length(s), f->total);
    tdm_seq_destroy(s);
    return out;
}

void fixture_check_verify_path(tdm_model *m, const fixture *f, const float *cached)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    int k = f->ncall[1] + f->ncall[2];
    int32_t *blk = malloc((size_t)k * sizeof(int32_t));
    memcpy(blk, f->calls[1], (size_t)f->ncall[1] * sizeof(int32_t));
    memcpy(blk + f->ncall[1], f->calls[2], (size_t)f->ncall[2] * sizeof(int32_t));
    for (int strat = 0; strat < 2; strat++) {
        tdm_seq_params p = {(tdm_state_strategy)strat, k, 0};
        tdm_seq *s;
        tdm_error err;
        CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_prefill(s, f->calls[0], f->ncall[0], NULL, &err) == TDM_OK, "%s", err.msg);
        float *lg = malloc((size_t)k * (size_t)V * sizeof(float));
        const int32_t *tp = blk;
        CHECK(tdm_seq_verify(&s, 1, &tp, &k, lg, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_commit(s, k - 1, &err) == TDM_OK, "%s", err.msg);
        CHECK(memcmp(lg, cached + (size_t)f->ncall[0] * (size_t)V, (size_t)k * (size_t)V * 4) == 0,
              "%s: verify logits differ from the prefill/decode path (%s)", f->dir,
              tdm_state_strategy_name((tdm_state_strategy)strat));
        free(lg);
        tdm_seq_destroy(s);
    }
    free(blk);
}

void tracked_make(tdm_model *m, tdm_state_strategy st, int max_draft, tracked *t)
{
    tdm_seq_params p = {st, max_draft, 0};
    tdm_error err;
    memset(t, 0, sizeof(*t));
    CHECK(tdm_seq_create(m, &p, &t->s, &err) == TDM_OK, "%s", err.msg);
}

void tracked_verify(tracked *t, const int32_t *blk, int nt, int acc, float *logits)
{
    tdm_error err;
    CHECK(tdm_seq_verify(&t->s, 1, &blk, &nt, logits, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_commit(t->s, acc, &err) == TDM_OK, "%s", err.msg);
    CHECK(t->n + acc + 1 <= (int)(sizeof(t->toks) / sizeof(t->toks[0])), "tracked: %d tokens",
          t->n + acc + 1);
    for (int i = 0; i <= acc; i++)
        t->toks[t->n++] = blk[i];
}

int32_t *every_third_ids(int V, int *n)
{
    int32_t *ids = malloc(((size_t)V / 3 + 2) * sizeof(int32_t));
    CHECK(ids, "out of memory for %d ids", V);
    *n = 0;
    for (int t = 0; t < V; t += 3)
        ids[(*n)++] = t;
    if (ids[*n - 1] != V - 1)
        ids[(*n)++] = V - 1;
    return ids;
}
