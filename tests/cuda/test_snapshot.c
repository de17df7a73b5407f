/*
 * test_snapshot.c - state snapshots (engine/snapshot.h) on the CUDA backend.
 *
 * A sequence on the GPU, taken after a prefill and rounds of verify and
 * partial commits, imported
 *  - on the GPU under another strategy: the continuation has the bits of the
 *    original's (the same backend);
 *  - on the CPU backend: the continuation is as close to the original's as
 *    the two backends are (normalised error per row <= 1e-5, the bound of
 *    test_model.c), and so is a CPU snapshot imported on the GPU.
 */
#include "cuda_test.h"
#include "snapshot.h"

#include <string.h>

#define MAXK 4
#define FP "fp-cuda-test"

/* Random verify blocks with partial commits on every sequence of ts alike;
 * the logits of ts[i] (i >= 1) must agree with those of ts[0] to the bit
 * (tol[i] < 0) or within normalised error tol[i]. */
static void run_same(tracked *const *ts, const double *tol, int n, int V, int rounds,
                     const char *const *what)
{
    float *l[4];
    for (int j = 0; j < n; j++)
        l[j] = malloc((size_t)(MAXK + 1) * V * 4);
    double worst[4] = {0};
    for (int r = 0; r < rounds; r++) {
        int32_t blk[MAXK + 1];
        int nt = 1 + ct_rand(MAXK + 1), acc = ct_rand(nt);
        for (int i = 0; i < nt; i++)
            blk[i] = ct_rand(V);
        for (int j = 0; j < n; j++) {
            tracked *t = ts[j];
            tracked_verify(t, blk, nt, acc, l[j]);
        }
        for (int j = 1; j < n; j++)
            for (int i = 0; i < nt; i++) {
                const float *x = l[j] + (size_t)i * V, *y = l[0] + (size_t)i * V;
                if (tol[j] < 0) {
                    CHECK(memcmp(x, y, (size_t)V * 4) == 0, "%s: round %d row %d: bits differ",
                          what[j], r, i);
                    continue;
                }
                double e = ct_nerr(x, y, (size_t)V);
                worst[j] = e > worst[j] ? e : worst[j];
                CHECK(e <= tol[j], "%s: round %d row %d: normalised error %.3g > %.3g", what[j], r,
                      i, e, tol[j]);
            }
    }
    for (int j = 1; j < n; j++) {
        printf("  %-44s ", what[j]);
        if (tol[j] < 0)
            printf("identical bits\n");
        else
            printf("worst normalised error %.3g (bound %.0e)\n", worst[j], tol[j]);
    }
    for (int j = 0; j < n; j++)
        free(l[j]);
}

static void move(tracked *src, tdm_model *to, tdm_state_strategy st, tracked *dst)
{
    tdm_snap_layout l;
    uint8_t *payload;
    tdm_error err;
    CHECK(tdm_seq_snapshot(src->s, FP, src->toks, src->n, &l, &payload, &err) == TDM_OK, "%s",
          err.msg);
    memset(dst, 0, sizeof(*dst));
    tdm_seq_params p = {st, MAXK, 0};
    CHECK(tdm_seq_from_snapshot(to, &p, FP, &l, payload, &dst->s, &err) == TDM_OK, "%s", err.msg);
    memcpy(dst->toks, src->toks, (size_t)src->n * sizeof(int32_t));
    dst->n = src->n;
    tdm_snap_layout_free(&l);
    free(payload);
}

static void fixture_case(const char *name, tdm_backend *gpu, tdm_backend *cpu)
{
    tdm_model *mg = fixture_model(name, gpu), *mc = fixture_model(name, cpu);
    const int V = tdm_model_get_config(mg)->vocab_size;
    tdm_error err;
    printf("%s\n", name);
    tracked g, c;
    tracked_make(mg, TDM_STATE_REPLAY, MAXK, &g);
    tracked_make(mc, TDM_STATE_REPLAY, MAXK, &c);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = ct_rand(V);
    CHECK(tdm_seq_prefill(g.s, prompt, 40, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(c.s, prompt, 40, NULL, &err) == TDM_OK, "%s", err.msg);
    memcpy(g.toks, prompt, sizeof(prompt));
    memcpy(c.toks, prompt, sizeof(prompt));
    g.n = c.n = 40;
    tracked *warm[2] = {&g, &c};
    const double wt[2] = {0, 1e-5};
    const char *ww[2] = {"", "before the snapshots: GPU against CPU"};
    run_same(warm, wt, 2, V, 6, ww);

    tracked g2, gc, cg;
    move(&g, mg, TDM_STATE_EXTRA_BUFFER, &g2);
    move(&g, mc, TDM_STATE_NO_BUFFER, &gc);
    move(&c, mg, TDM_STATE_EXTRA_BUFFER, &cg);
    tracked *from_gpu[3] = {&g, &g2, &gc};
    const double tg[3] = {0, -1, 1e-5};
    const char *wg[3] = {"", "GPU replay -> GPU extra_buffer", "GPU replay -> CPU no_buffer"};
    run_same(from_gpu, tg, 3, V, 10, wg);
    tracked *from_cpu[2] = {&c, &cg};
    const double tc[2] = {0, 1e-5};
    const char *wc[2] = {"", "CPU replay -> GPU extra_buffer"};
    run_same(from_cpu, tc, 2, V, 10, wc);
    tdm_seq *all[] = {g.s, c.s, g2.s, gc.s, cg.s};
    for (size_t i = 0; i < TDM_ARRAY_LEN(all); i++)
        tdm_seq_destroy(all[i]);
    tdm_model_destroy(mg);
    tdm_model_destroy(mc);
}

int main(void)
{
    ct_require_gpu();
    tdm_backend *gpu = ct_gpu(), *cpu = ct_cpu();
    fixture_case("f32_gqa", gpu, cpu);
    fixture_case("bf16_alt", gpu, cpu);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    printf("cuda snapshot: ok\n");
    return 0;
}
