/*
 * test_mtp.c - the MTP head's contract (engine/mtp.h) on tiny random
 * checkpoints written at run time (bench_write_model_layout): tied with an
 * MTP head, and the release layout (untied, sharded).
 *
 * Loading: a checkpoint without mtp.* is refused naming mtp.fc.weight, an
 * incomplete head naming the missing tensor, more than one MTP layer as
 * unimplemented; the head's tensors do not count as the target's streamed
 * weights; a head opened from the folder computes the bits of one created
 * from the loaded model. FP8 weights (tdm_mtp_set_weights_fp8) round the
 * head's matrices of whole 64-value rows and an untied LM head of its own
 * load, and halve their bytes.
 *
 * Rows (mtp_steps.c, shared with the CUDA test): a prime in one call or in
 * chunks gives the same bits; the first draft is the last primed row's
 * argmax with its logits; drafts in two calls are the drafts of one call;
 * after a rollback to the primed prefix and a prime of the verified rows,
 * logits and drafts are those of a fresh sequence primed with every row at
 * once (the draft rows' KV entries are dead); all of it with FP8 weights
 * too. Misuse (prime over draft rows,
 * draft with nothing primed, a rollback past the end) is refused. The
 * numbers themselves are checked against an independent implementation by
 * mtp_check.py.
 *
 * The target's hidden states as a verifier streams them to an MTP drafter:
 * a prefill that wants hidden states alone (no LM head) gives the bits of
 * one that wants argmaxes too; a step's want_hidden brings back the rows of
 * the flagged sequences only, with the bits of a step that brings back all.
 */
#include "bench_util.h"
#include "capacity.h"
#include "mtp.h"
#include "mtp_steps.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    /* Memory: a sequence for 16 positions holds what capacity.c says. */
    tdm_mtp_seq *q;
    CHECK(tdm_mtp_seq_create(h, 16, &q, &err) == TDM_OK, "%s", err.msg);
    const tdm_model_config *c = tdm_model_get_config(m);
    CHECK(tdm_mtp_seq_bytes(q) == tdm_capacity_mtp_seq_bytes(c, 16) &&
              tdm_capacity_mtp_seq_bytes(c, 16) == (2 * 16 * KD + H) * sizeof(float),
          "%s: an MTP sequence of 16 positions holds %zu bytes", name, tdm_mtp_seq_bytes(q));
    tdm_mtp_seq_destroy(q);
    /* Resident: bf16 matrices, f32 norms (the stored bytes with vectors doubled). */
    CHECK(tdm_capacity_mtp_weight_bytes(c, 2) == want + 2 * (5 * H + 2 * D),
          "%s: tdm_capacity_mtp_weight_bytes %zu", name, tdm_capacity_mtp_weight_bytes(c, 2));
    mtp_steps_out o;
    mtp_steps_check(name, dir, m, h, h2, 0, &o);
    mtp_steps_out_free(&o);
    /* FP8 weights: the head's matrices whose rows are whole steps of 64
     * values (all but the MLP's down projection, I = 96 values a row) at a
     * byte each, the LM head of its own load with them (tied: the
     * embedding's table, which the head then embeds from); the row contract
     * holds as for bf16 (the target's matrices rounded too). */
    tdm_mtp_fp8 r1, r2;
    CHECK(tdm_model_set_weights_fp8(m, NULL, NULL, &err) == TDM_OK &&
              tdm_mtp_set_weights_fp8(h, &r1, &err) == TDM_OK &&
              tdm_mtp_set_weights_fp8(h2, &r2, &err) == TDM_OK,
          "%s: fp8: %s", name, err.msg);
    const int untied = flags & BENCH_LAYOUT_RELEASE;
    const size_t rounded = 2 * H * H + 2 * QD * H + 2 * KD * H + H * QD + 2 * I * H;
    CHECK(r1.converted == 8 && r1.kept == 1 && r1.before == want && r1.after == want - rounded &&
              r1.lm_head == TDM_MTP_FP8_HEAD_TARGETS,
          "%s: fp8 head from the model: %d rounded, %d kept, %zu -> %zu bytes, LM head %d", name,
          r1.converted, r1.kept, r1.before, r1.after, (int)r1.lm_head);
    CHECK(r2.converted == 9 && r2.kept == 1 && r2.after == want - rounded &&
              r2.lm_head == TDM_MTP_FP8_HEAD_ROUNDED && r2.tied == !untied,
          "%s: fp8 head of its own load: %d rounded, %d kept, %zu bytes, LM head %d, tied %d", name,
          r2.converted, r2.kept, r2.after, (int)r2.lm_head, r2.tied);
    CHECK(tdm_mtp_weight_bytes(h2) == want - rounded, "%s: fp8 head weights %zu bytes", name,
          tdm_mtp_weight_bytes(h2));
    CHECK(tdm_mtp_set_weights_fp8(h2, NULL, &err) == TDM_ERR_FAILED_PRECONDITION, "%s: fp8 twice",
          name);
    char fname[64];
    snprintf(fname, sizeof(fname), "%s fp8", name);
    mtp_steps_check(fname, dir, m, h, h2, 1, &o);
    mtp_steps_out_free(&o);
    tdm_mtp_destroy(h2);
    tdm_mtp_destroy(h);
    tdm_model_destroy(m);
    dir_remove(dir);
}

/* Two sequences stepped as a verifier would: 3 prompt tokens each, then
 * sequence 0 one plain row and sequence 1 a block of 3; hidden [4, H] of the
 * step, for the sequences want flags (NULL: all). */
static void step_hidden(tdm_model *m, const uint8_t *want, float *hidden, int32_t *am)
{
    tdm_seq_params p = {TDM_STATE_EXTRA_BUFFER, 4, 0};
    tdm_seq *s[2];
    tdm_error err;
    const int32_t prompt[2][3] = {{5, 17, 200}, {9, 3, 77}}, t0[] = {42}, t1[] = {7, 8, 9};
    for (int i = 0; i < 2; i++) {
        CHECK(tdm_seq_create(m, &p, &s[i], &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_prefill(s[i], prompt[i], 3, NULL, &err) == TDM_OK, "%s", err.msg);
    }
    const int32_t *toks[] = {t0, t1};
    const int n[] = {1, 3};
    const tdm_step_out o = {.argmax = am, .hidden = hidden, .want_hidden = want};
    CHECK(tdm_seq_step_out(s, 2, toks, n, &o, &err) == TDM_OK, "%s", err.msg);
    tdm_seq_destroy(s[0]);
    tdm_seq_destroy(s[1]);
}

static void hidden_rows(tdm_backend *be)
{
    char dir[] = "/tmp/tandem_mtp_hidden_XXXXXX";
    write_model(dir, BENCH_LAYOUT_MTP, 0);
    tdm_error err;
    tdm_model *m;
    CHECK(tdm_model_load(dir, be, &m, &err) == TDM_OK, "%s", err.msg);
    const size_t H = (size_t)tdm_model_get_config(m)->hidden_size;
    /* Prefill: hidden alone = hidden with argmaxes. */
    const int32_t toks[] = {1, 2, 3, 4, 5, 6, 7};
    float a[7 * 64], b[7 * 64];
    int32_t am[7];
    CHECK(H == 64, "tiny hidden size %zu", H);
    tdm_seq_params p = {TDM_STATE_EXTRA_BUFFER, 4, 0};
    for (int pass = 0; pass < 2; pass++) {
        tdm_seq *s;
        CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
        const tdm_step_out o = {.hidden = pass ? b : a, .argmax = pass ? am : NULL};
        CHECK(tdm_seq_prefill_out(s, toks, 7, &o, &err) == TDM_OK, "%s", err.msg);
        tdm_seq_destroy(s);
    }
    CHECK(memcmp(a, b, sizeof(a)) == 0, "a prefill for hidden states alone differs");
    /* A step: sequence 1's rows alone, to the bits of all rows. */
    float all[4 * 64], some[4 * 64];
    int32_t am_all[4], am_some[4];
    for (size_t i = 0; i < 4 * H; i++)
        some[i] = 12345.0f;
    step_hidden(m, NULL, all, am_all);
    const uint8_t want[] = {0, 1};
    step_hidden(m, want, some, am_some);
    CHECK(memcmp(some + H, all + H, 3 * H * sizeof(float)) == 0,
          "the wanted sequence's hidden rows differ");
    bool untouched = true;
    for (size_t i = 0; i < H; i++)
        untouched = untouched && some[i] == 12345.0f;
    CHECK(untouched, "an unwanted sequence's hidden row was written");
    CHECK(memcmp(am_all, am_some, sizeof(am_all)) == 0, "argmaxes differ");
    tdm_model_destroy(m);
    dir_remove(dir);
}

int main(void)
{
    tdm_backend *be = test_backend();
    loading_errors(be);
    heads(be, "tied", BENCH_LAYOUT_MTP, 0);
    heads(be, "release", BENCH_LAYOUT_RELEASE, 64 * 1024);
    hidden_rows(be);
    be->destroy(be);
    printf("engine_mtp: ok\n");
    return 0;
}
