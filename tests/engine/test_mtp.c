/*
 * test_mtp.c - the MTP head's contract (engine/mtp.h) on tiny random
 * checkpoints written at run time (bench_write_model_layout): tied with an
 * MTP head, and the release layout (untied, sharded).
 *
 * Loading: a checkpoint without mtp.* is refused naming mtp.fc.weight, an
 * incomplete head naming the missing tensor, more than one MTP layer as
 * unimplemented; the head's tensors do not count as the target's streamed
 * weights; a head opened from the folder computes the bits of one created
 * from the loaded model.
 *
 * Rows: a prime in one call or in chunks gives the same bits; the first
 * draft is the last primed row's argmax with its logits; drafts in two
 * calls are the drafts of one call; after a rollback to the primed prefix
 * and a prime of the verified rows, logits and drafts are those of a fresh
 * sequence primed with every row at once (the draft rows' KV entries are
 * dead). Misuse (prime over draft rows, draft with nothing primed, a
 * rollback past the end) is refused. The numbers themselves are checked
 * against an independent implementation by mtp_check.py.
 */
#include "bench_util.h"
#include "mtp.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T0 10 /* prompt */
#define K 4   /* drafts */

static const bench_shape tiny = {"tiny", 64, 8, 96, 2, 1, 32, 2, 4, 16, 16, 320};

static void write_model(char *dir, int flags, size_t shard)
{
    char msg[512];
    CHECK(mkdtemp(dir), "mkdtemp failed");
    CHECK(bench_write_model_layout(dir, &tiny, flags, shard, msg, sizeof(msg)) == 0, "%s", msg);
}

/* Replaces the first `from` in dir/file by `to` (same length). */
static void patch(const char *dir, const char *file, const char *from, const char *to)
{
    char p[700];
    snprintf(p, sizeof(p), "%s/%s", dir, file);
    size_t n;
    unsigned char *b = file_read(p, &n);
    unsigned char *at = memmem(b, n, from, strlen(from));
    CHECK(at && strlen(from) == strlen(to), "%s: no '%s'", p, from);
    memcpy(at, to, strlen(to));
    file_write(p, b, n);
    free(b);
}

static void loading_errors(tdm_backend *be)
{
    tdm_error err;
    tdm_model *m;
    tdm_mtp *h = NULL;
    /* No head at all. */
    char plain[] = "/tmp/tandem_mtp_plain_XXXXXX";
    write_model(plain, 0, 0);
    CHECK(tdm_model_load(plain, be, &m, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_mtp_create(m, &h, &err) == TDM_ERR_NOT_FOUND && !h, "no head: accepted");
    CHECK(strstr(err.msg, "mtp.fc.weight") && strstr(err.msg, "no MTP head"), "no head: %s",
          err.msg);
    printf("no head: %s\n", err.msg);
    tdm_model_destroy(m);
    CHECK(tdm_mtp_check(plain, &err) == TDM_ERR_NOT_FOUND && strstr(err.msg, "mtp.fc.weight"),
          "check, no head: %s", err.msg);
    CHECK(tdm_mtp_open(plain, be, &h, &err) == TDM_ERR_NOT_FOUND && !h, "open, no head: %s",
          err.msg);
    dir_remove(plain);

    /* A head without its final norm (renamed in the header). */
    char part[] = "/tmp/tandem_mtp_part_XXXXXX";
    write_model(part, BENCH_LAYOUT_MTP, 0);
    CHECK(tdm_mtp_check(part, &err) == TDM_OK, "complete head: %s", err.msg);
    patch(part, "model.safetensors", "\"mtp.norm.weight\"", "\"mtp.norX.weight\"");
    CHECK(tdm_model_load(part, be, &m, &err) == TDM_OK, "the target still loads: %s", err.msg);
    CHECK(tdm_mtp_create(m, &h, &err) == TDM_ERR_NOT_FOUND, "incomplete head accepted");
    CHECK(strstr(err.msg, "'mtp.norm.weight'") && strstr(err.msg, "MTP head"),
          "incomplete head: %s", err.msg);
    printf("incomplete head: %s\n", err.msg);
    tdm_model_destroy(m);
    CHECK(tdm_mtp_check(part, &err) == TDM_ERR_NOT_FOUND, "check, incomplete head");

    /* Two MTP layers. */
    patch(part, "config.json", "\"mtp_num_hidden_layers\": 1", "\"mtp_num_hidden_layers\": 2");
    CHECK(tdm_mtp_check(part, &err) == TDM_ERR_UNIMPLEMENTED && strstr(err.msg, "2"),
          "two MTP layers: %s", err.msg);
    dir_remove(part);
}

/* A target run over toks: hidden states after the final norm [n, H] and the
 * argmax of the last position. */
static float *target_hidden(tdm_model *m, const int32_t *toks, int n, int32_t *next)
{
    const int H = tdm_model_get_config(m)->hidden_size;
    tdm_seq_params p = {TDM_STATE_EXTRA_BUFFER, 4, 0};
    tdm_seq *s;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    float *hid = malloc((size_t)n * (size_t)H * sizeof(float));
    int32_t *am = malloc((size_t)n * sizeof(int32_t));
    const tdm_step_out o = {.hidden = hid, .argmax = am};
    CHECK(tdm_seq_prefill_out(s, toks, n, &o, &err) == TDM_OK, "%s", err.msg);
    *next = am[n - 1];
    free(am);
    tdm_seq_destroy(s);
    return hid;
}

static tdm_mtp_seq *mseq(tdm_mtp *h, int max_positions)
{
    tdm_mtp_seq *s;
    tdm_error err;
    CHECK(tdm_mtp_seq_create(h, max_positions, &s, &err) == TDM_OK, "%s", err.msg);
    return s;
}

static void prime(tdm_mtp_seq *s, const float *hid, const int32_t *next, int n, float *logits)
{
    tdm_error err;
    CHECK(tdm_mtp_prime(s, hid, next, n, logits, &err) == TDM_OK, "%s", err.msg);
}

static void draft(tdm_mtp_seq *s, int k, int32_t *d, float *logits)
{
    tdm_error err;
    CHECK(tdm_mtp_draft(s, k, d, logits, &err) == TDM_OK, "%s", err.msg);
}

static void rows(const char *name, tdm_model *m, tdm_mtp *h, tdm_mtp *h2)
{
    const tdm_model_config *c = tdm_model_get_config(m);
    const size_t H = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    tdm_error err;
    /* The target's tokens: a prompt, then 3 more positions "verified". */
    int32_t toks[T0 + 4];
    for (int i = 0; i < T0 + 4; i++)
        toks[i] = (int32_t)((i * 37 + 11) % c->vocab_size);
    int32_t x_n;
    float *hid = target_hidden(m, toks, T0 + 3, &x_n); /* [T0 + 3, H] */
    int32_t next[T0 + 3];                              /* next[p]: the token at p + 1 */
    for (int p = 0; p < T0 + 2; p++)
        next[p] = toks[p + 1];
    next[T0 + 2] = x_n;

    /* One prime against chunks of 4 and 6. */
    float *la = malloc(T0 * V * 4), *lb = malloc((T0 + 3) * V * 4);
    tdm_mtp_seq *a = mseq(h, 0), *b = mseq(h, T0 + K);
    prime(a, hid, next, T0, la);
    prime(b, hid, next, 4, lb);
    prime(b, hid + 4 * H, next + 4, T0 - 4, lb + 4 * V);
    CHECK(memcmp(la, lb, T0 * V * 4) == 0, "%s: a prime in chunks differs", name);
    CHECK(tdm_mtp_seq_length(a) == T0, "length %d", tdm_mtp_seq_length(a));

    /* The first draft is the last primed row's argmax; two calls = one. */
    int32_t da[K], db[K];
    float *dla = malloc(K * V * 4), *dlb = malloc(K * V * 4);
    draft(a, K, da, dla);
    CHECK(memcmp(dla, la + (T0 - 1) * V, V * 4) == 0, "%s: draft 1's logits", name);
    CHECK(da[0] == argmax_row(la + (T0 - 1) * V, (int)V), "%s: draft 1 is not the argmax", name);
    CHECK(tdm_mtp_seq_length(a) == T0 + K - 1, "after drafting: length %d", tdm_mtp_seq_length(a));
    draft(b, 2, db, dlb);
    draft(b, K - 2, db + 2, dlb + 2 * V);
    CHECK(memcmp(da, db, sizeof(da)) == 0 && memcmp(dla, dlb, K * V * 4) == 0,
          "%s: drafts in two calls differ from one call", name);

    /* Misuse. */
    CHECK(tdm_mtp_prime(a, hid, next, 1, NULL, &err) == TDM_ERR_FAILED_PRECONDITION &&
              strstr(err.msg, "roll back"),
          "%s: a prime over draft rows: %s", name, err.msg);
    CHECK(tdm_mtp_rollback(a, T0 + K, &err) == TDM_ERR_INVALID_ARGUMENT, "rollback past the end");

    /* The target accepts 2 of the drafts and brings 3 rows (positions T0 ..
     * T0+2): roll back to the primed prefix and prime them. The same as a
     * fresh sequence primed with all T0 + 3 rows. */
    CHECK(tdm_mtp_rollback(a, T0, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_mtp_draft(a, 1, da, NULL, &err) == TDM_ERR_FAILED_PRECONDITION,
          "a draft with nothing primed since the rollback");
    float *l3 = malloc(3 * V * 4), *lf = malloc((T0 + 3) * V * 4);
    prime(a, hid + T0 * H, next + T0, 3, l3);
    tdm_mtp_seq *f = mseq(h, 0);
    prime(f, hid, next, T0 + 3, lf);
    CHECK(memcmp(l3, lf + T0 * V, 3 * V * 4) == 0, "%s: rows primed after a rollback differ", name);
    int32_t dfr[K];
    draft(a, K, da, dla);
    draft(f, K, dfr, dlb);
    CHECK(memcmp(da, dfr, sizeof(da)) == 0 && memcmp(dla, dlb, K * V * 4) == 0,
          "%s: drafts after a rollback differ from a fresh sequence's", name);

    /* A head opened from the folder: the same bits. */
    tdm_mtp_seq *o = mseq(h2, 0);
    prime(o, hid, next, T0 + 3, lb);
    CHECK(memcmp(lb, lf, (T0 + 3) * V * 4) == 0, "%s: tdm_mtp_open's head differs", name);
    draft(o, K, dfr, dlb);
    CHECK(memcmp(dla, dlb, K * V * 4) == 0, "%s: tdm_mtp_open's drafts differ", name);
    printf("%s: drafts %d %d %d %d, max|logit| %.3f\n", name, da[0], da[1], da[2], da[3],
           (double)max_abs(lf, (T0 + 3) * V));
    CHECK(max_abs(lf, (T0 + 3) * V) > 0, "all-zero logits");

    tdm_mtp_seq_destroy(a);
    tdm_mtp_seq_destroy(b);
    tdm_mtp_seq_destroy(f);
    tdm_mtp_seq_destroy(o);
    free(hid);
    free(la);
    free(lb);
    free(dla);
    free(dlb);
    free(l3);
    free(lf);
}

static void heads(tdm_backend *be, const char *name, int flags, size_t shard)
{
    char dir[] = "/tmp/tandem_mtp_head_XXXXXX";
    write_model(dir, flags, shard);
    tdm_error err;
    tdm_model *m;
    tdm_mtp *h, *h2;
    CHECK(tdm_model_load(dir, be, &m, &err) == TDM_OK, "%s", err.msg);
    const size_t target_bytes = tdm_model_weight_bytes(m);
    CHECK(tdm_mtp_create(m, &h, &err) == TDM_OK, "%s: %s", name, err.msg);
    CHECK(tdm_mtp_open(dir, be, &h2, &err) == TDM_OK, "%s: %s", name, err.msg);
    CHECK(tdm_model_weight_bytes(m) == target_bytes, "%s: the head counted as the target's", name);
    /* bf16: fc [H, 2H], three norms, the layer (attention, MLP, its norms). */
    const size_t H = (size_t)tiny.H, I = (size_t)tiny.I, D = (size_t)tiny.D;
    const size_t QD = (size_t)tiny.nH * D, KD = (size_t)tiny.nKV * D;
    const size_t want =
        2 * (2 * H * H + 3 * H + 2 * H + 3 * H * I + 2 * QD * H + 2 * KD * H + H * QD + 2 * D);
    CHECK(tdm_mtp_weight_bytes(h) == want && tdm_mtp_weight_bytes(h2) == want,
          "%s: head weights %zu bytes, expected %zu", name, tdm_mtp_weight_bytes(h), want);
    rows(name, m, h, h2);
    tdm_mtp_destroy(h2);
    tdm_mtp_destroy(h);
    tdm_model_destroy(m);
    dir_remove(dir);
}

int main(void)
{
    tdm_backend *be = test_backend();
    loading_errors(be);
    heads(be, "tied", BENCH_LAYOUT_MTP, 0);
    heads(be, "release", BENCH_LAYOUT_RELEASE, 64 * 1024);
    be->destroy(be);
    printf("engine_mtp: ok\n");
    return 0;
}
