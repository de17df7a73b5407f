/*
 * test_model.c - whole models on the CUDA backend.
 *
 * For each engine fixture (tests/fixtures/engine/, transformers 5.17 logits
 * of small random Qwen3.5 models): the same prefill / continuation / decode
 * calls run on the CPU and the CUDA backend.
 *  - GPU against transformers with exactly the tolerances of the CPU engine
 *    test (tests/engine/test_fixtures.c): fp32 path max|Δ| <= 1e-4·max|ref|
 *    and the same argmax everywhere; bf16 within the bf16-noise bound.
 *  - GPU against the CPU backend: normalised error <= 1e-5 (both fp32
 *    arithmetic over the same weights; see test_ops.c for why).
 *  - On the GPU alone: a verify block fully accepted gives the same bits as
 *    the prefill/decode path; extra_buffer and no_buffer give identical
 *    logits and greedy tokens through rounds of verify + partial commits,
 *    both equal to decoding the accepted tokens one by one; a batch of two
 *    sequences gives the bits of each run alone.
 */
#include "cuda_test.h"
#include "util.h"

#include <math.h>
#include <string.h>

static void check_references(const fixture *f, const float *ours, int V)
{
    size_t n = (size_t)f->total * (size_t)V;
    char p[700];
    int64_t rows, cols;
    snprintf(p, sizeof(p), "%s/cached.npy", f->dir);
    float *ref = npy_load2(p, &rows, &cols);
    CHECK(rows == f->total && cols == V, "%s: reference shape", f->dir);
    float *up = NULL, *f32ref = ref;
    if (strcmp(f->dtype, "bfloat16") == 0) {
        snprintf(p, sizeof(p), "%s/f32up.npy", f->dir);
        up = npy_load2(p, &rows, &cols);
        f32ref = up;
    }
    float scale = max_abs(f32ref, n), d32 = max_abs_diff(ours, f32ref, n), tol32 = 1e-4f * scale;
    int bad = 0;
    for (int r = 0; r < f->total; r++)
        bad += argmax_row(ours + (size_t)r * V, V) != argmax_row(f32ref + (size_t)r * V, V);
    printf("  vs transformers fp32 path: max|d|=%.3g tol=%.3g argmax mismatches=%d/%d\n",
           (double)d32, (double)tol32, bad, f->total);
    CHECK(d32 <= tol32 && bad == 0, "%s: GPU logits off the fp32 reference", f->dir);
    if (up) {
        float tolbf = max_abs_diff(up, ref, n) + tol32, dbf = max_abs_diff(ours, ref, n);
        int checked = 0, badbf = 0;
        for (int r = 0; r < f->total; r++) {
            const float *rr = ref + (size_t)r * V;
            int a = argmax_row(rr, V);
            float second = -INFINITY;
            for (int i = 0; i < V; i++)
                if (i != a && rr[i] > second)
                    second = rr[i];
            if (rr[a] - second > 2 * tolbf) {
                checked++;
                badbf += argmax_row(ours + (size_t)r * V, V) != a;
            }
        }
        printf(
            "  vs transformers bf16:      max|d|=%.3g tol=%.3g argmax checked=%d mismatches=%d\n",
            (double)dbf, (double)tolbf, checked, badbf);
        CHECK(dbf <= tolbf && badbf == 0, "%s: GPU logits off the bf16 reference", f->dir);
    }
    free(ref);
    free(up);
}

/* Rounds of speculation with made-up drafts and a varying number accepted:
 * extra_buffer (one verify call), no_buffer (the block in two appended
 * calls, as a drafter runs it) and replay (one call and two in turn) must
 * give identical logits and so identical greedy tokens, and a plain decoder
 * fed the accepted tokens one by one must see the same logits, round after
 * round (which also checks the states each commit leaves). */
static void check_strategies(tdm_model *m, const fixture *f)
{
    const int V = tdm_model_get_config(m)->vocab_size, K = 4, ROUNDS = 8;
    tdm_seq_params pe = {TDM_STATE_EXTRA_BUFFER, K, 0}, pn = {TDM_STATE_NO_BUFFER, K, 0};
    tdm_seq_params pr = {TDM_STATE_REPLAY, K, 0};
    tdm_seq *eb, *nb, *rp, *sq;
    tdm_error err;
    CHECK(tdm_seq_create(m, &pe, &eb, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_create(m, &pn, &nb, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_create(m, &pr, &rp, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_create(m, &pe, &sq, &err) == TDM_OK, "%s", err.msg);
    float *le = malloc((size_t)(K + 1) * V * 4), *ln = malloc((size_t)(K + 1) * V * 4);
    float *lr = malloc((size_t)(K + 1) * V * 4);
    float *ls = malloc((size_t)V * 4), *lp = malloc((size_t)f->ncall[0] * V * 4);
    tdm_seq *all[4] = {eb, nb, rp, sq};
    for (int i = 0; i < 4; i++)
        CHECK(tdm_seq_prefill(all[i], f->calls[0], f->ncall[0], lp, &err) == TDM_OK, "%s", err.msg);
    int32_t last = argmax_row(lp + (size_t)(f->ncall[0] - 1) * V, V);
    int tokens = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int32_t blk[8];
        blk[0] = last;
        for (int i = 1; i <= K; i++)
            blk[i] = (blk[i - 1] * 7 + 3 * round + i) % V;
        int n = K + 1, split = 1 + round % K, rest = n - split, acc = round % (K + 1);
        const int32_t *bp = blk, *bp2 = blk + split;
        CHECK(tdm_seq_verify(&eb, 1, &bp, &n, le, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_verify(&nb, 1, &bp, &split, ln, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_verify(&nb, 1, &bp2, &rest, ln + (size_t)split * V, &err) == TDM_OK, "%s",
              err.msg);
        CHECK(memcmp(le, ln, (size_t)n * V * 4) == 0,
              "%s: round %d: extra_buffer and no_buffer verify logits differ", f->dir, round);
        if (round % 2 == 0) {
            CHECK(tdm_seq_verify(&rp, 1, &bp, &n, lr, &err) == TDM_OK, "%s", err.msg);
        } else {
            CHECK(tdm_seq_verify(&rp, 1, &bp, &split, lr, &err) == TDM_OK, "%s", err.msg);
            CHECK(tdm_seq_verify(&rp, 1, &bp2, &rest, lr + (size_t)split * V, &err) == TDM_OK, "%s",
                  err.msg);
        }
        CHECK(memcmp(le, lr, (size_t)n * V * 4) == 0,
              "%s: round %d: extra_buffer and replay verify logits differ", f->dir, round);
        CHECK(tdm_seq_commit(eb, acc, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_commit(nb, acc, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_commit(rp, acc, &err) == TDM_OK, "%s", err.msg);
        for (int i = 0; i <= acc; i++) {
            CHECK(tdm_seq_decode(&sq, 1, &blk[i], ls, &err) == TDM_OK, "%s", err.msg);
            CHECK(memcmp(ls, le + (size_t)i * V, (size_t)V * 4) == 0,
                  "%s: round %d: verify row %d != sequential decode", f->dir, round, i);
        }
        last = argmax_row(le + (size_t)acc * V, V);
        CHECK(last == argmax_row(ln + (size_t)acc * V, V), "%s: tokens differ", f->dir);
        tokens += acc + 1;
    }
    CHECK(tdm_seq_length(eb) == tdm_seq_length(sq) && tdm_seq_length(nb) == tdm_seq_length(sq) &&
              tdm_seq_length(rp) == tdm_seq_length(sq),
          "%s: lengths differ", f->dir);
    /* the committed states themselves: one more decode on each */
    float *lx = malloc((size_t)4 * V * 4);
    for (int i = 0; i < 4; i++)
        CHECK(tdm_seq_decode(&all[i], 1, &last, lx + (size_t)i * V, &err) == TDM_OK, "%s", err.msg);
    for (int i = 1; i < 4; i++)
        CHECK(memcmp(lx, lx + (size_t)i * V, (size_t)V * 4) == 0,
              "%s: the states after the last commit differ (sequence %d)", f->dir, i);
    free(lx);
    printf("  extra_buffer / no_buffer / replay / sequential decode: %d rounds, %d tokens, "
           "identical\n",
           ROUNDS, tokens);
    free(lr);
    free(le);
    free(ln);
    free(ls);
    free(lp);
    for (int i = 0; i < 4; i++)
        tdm_seq_destroy(all[i]);
}

/* Two sequences decoded in one batch: each row the bits of running it alone. */
static void check_batch(tdm_model *m, const fixture *f)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    tdm_seq_params p = {TDM_STATE_EXTRA_BUFFER, 4, 0};
    tdm_seq *a, *b, *a1, *b1;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &a, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_create(m, &p, &b, &err) == TDM_OK, "%s", err.msg);
    int nb = f->ncall[0] / 2;
    CHECK(tdm_seq_prefill(a, f->calls[0], f->ncall[0], NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(b, f->calls[0], nb, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_fork(a, &a1, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_fork(b, &b1, &err) == TDM_OK, "%s", err.msg);
    float *lb = malloc((size_t)2 * V * 4), *l1 = malloc((size_t)2 * V * 4);
    for (int step = 0; step < 3; step++) {
        int32_t t[2] = {f->calls[1][step % f->ncall[1]], f->calls[0][step]};
        tdm_seq *pair[2] = {a, b};
        CHECK(tdm_seq_decode(pair, 2, t, lb, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_decode(&a1, 1, &t[0], l1, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_decode(&b1, 1, &t[1], l1 + V, &err) == TDM_OK, "%s", err.msg);
        CHECK(memcmp(lb, l1, (size_t)2 * V * 4) == 0, "%s: batched decode differs from single",
              f->dir);
    }
    printf("  batch of two == each alone (3 decode steps, forks): bit-identical\n");
    free(lb);
    free(l1);
    tdm_seq_destroy(a);
    tdm_seq_destroy(b);
    tdm_seq_destroy(a1);
    tdm_seq_destroy(b1);
}

int main(void)
{
    ct_require_gpu();
    tdm_backend *gpu = ct_gpu(), *cpu = ct_cpu();
    const char *names[] = {"f32_gqa",   "f32_tied", "f32_sharded",
                           "f16_store", "bf16_alt", "bf16_wrapped"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(names); i++) {
        fixture f;
        fixture_load(&f, names[i]);
        tdm_model *mg, *mc;
        tdm_error err;
        CHECK(tdm_model_load(f.model, gpu, &mg, &err) == TDM_OK, "%s: %s", names[i], err.msg);
        CHECK(tdm_model_load(f.model, cpu, &mc, &err) == TDM_OK, "%s: %s", names[i], err.msg);
        const int V = tdm_model_get_config(mg)->vocab_size;
        float *lg = fixture_run(mg, &f, TDM_STATE_EXTRA_BUFFER),
              *lc = fixture_run(mc, &f, TDM_STATE_EXTRA_BUFFER);
        size_t n = (size_t)f.total * (size_t)V;
        double e = ct_nerr(lg, lc, n);
        printf("%s (%s, %d positions): GPU vs CPU logits nerr=%.3g (thr 1e-5)\n", names[i], f.dtype,
               f.total, e);
        CHECK(e <= 1e-5, "%s: GPU logits differ from the CPU backend's", names[i]);
        check_references(&f, lg, V);
        fixture_check_verify_path(mg, &f, lg);
        printf("  verify block == prefill/decode path (both strategies): bit-identical\n");
        check_strategies(mg, &f);
        check_batch(mg, &f);
        free(lg);
        free(lc);
        tdm_model_destroy(mg);
        tdm_model_destroy(mc);
        fixture_free(&f);
    }
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    printf("cuda model: all fixtures match\n");
    return 0;
}
