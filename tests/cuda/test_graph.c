/*
 * test_graph.c - forward steps as CUDA graphs (backend.h graph_begin /
 * graph_end, kernels/cuda/graph.cu) against eager execution, to the bit.
 *
 *  1. The step script of tests/engine/steps.c (prompt chunks, decode across
 *     the KV growth at 64, verify + commit under extra_buffer, no_buffer and replay,
 *     verify blocks beside decode rows, appended one-token verifies, batches
 *     whose members and order change) with graphs off, then twice with
 *     graphs on: every logit and the final states identical; graphs were
 *     captured and replayed and no step was refused.
 *  2. The script on the same GPU behind a backend that gives every step one
 *     key: captures and replays of steps of another shape than the one
 *     measured or captured are refused (graph_end 1), the engine runs them
 *     eagerly, and every logit and state still matches.
 *  3. The slots directly: a key's first step runs eagerly, the second is
 *     captured, the third replays with new staged arguments (embed ids,
 *     attn_prep's segments) and gives their results; a replay of another
 *     shape returns 1 with its output untouched; a key that keeps
 *     mismatching stays eager.
 *  4. An outgrown graph: a matmul's step captured, then a larger matmul run
 *     eagerly replaces the scratch the graph names; the step's next replay
 *     is refused (graph_end 1) and the key is measured and captured again.
 *     Twice in a row with no good replay between, and the key still does not
 *     stay eager (outgrown is not a mismatch); the eager result's bits every
 *     time.
 *  5. TANDEM_CUDA_OPSTATS=1 leaves the graph slots NULL.
 *
 * One line per check. Without a GPU: "skipped: no CUDA device", exit 77.
 */
#include "cuda_test.h"
#include "draft_sampled_steps.h"
#include "draft_vocab_steps.h"
#include "steps.h"
#include "util.h"

#include <string.h>

static tdm_cuda_graph_stats stats_of(tdm_backend *be)
{
    tdm_cuda_graph_stats s;
    tdm_cuda_graph_stats_get(be, &s);
    return s;
}

static void same_run(const char *name, const char *what, const steps_run *a, const steps_run *b)
{
    CHECK(a->n == b->n && a->calls == b->calls, "%s: %s: the runs differ in length", name, what);
    CHECK(memcmp(a->logits, b->logits, a->n * sizeof(float)) == 0,
          "%s: %s: logits differ from the eager run's", name, what);
    for (int i = 0; i < STEPS_NSEQ; i++)
        CHECK(steps_same_state(a->seqs[i], b->seqs[i]), "%s: %s: sequence %d: states differ", name,
              what, i);
}

/* 1. eager: the script with graphs off, kept for 2. */
static void check_script(tdm_backend *gpu, tdm_model *m, const char *name, steps_run *eager)
{
    tdm_model_set_graphs(m, 0);
    const tdm_cuda_graph_stats s0 = stats_of(gpu);
    steps_run_script(m, eager);
    const tdm_cuda_graph_stats s1 = stats_of(gpu);
    CHECK(s1.captured == s0.captured && s1.replayed == s0.replayed && s1.eager == s0.eager,
          "%s: graphs off, yet the graph slots ran", name);
    tdm_model_set_graphs(m, 1);
    for (int pass = 0; pass < 2; pass++) {
        steps_run on;
        const tdm_cuda_graph_stats a = stats_of(gpu);
        steps_run_script(m, &on);
        const tdm_cuda_graph_stats b = stats_of(gpu);
        same_run(name, pass ? "graphs on, second pass" : "graphs on", eager, &on);
        CHECK(b.refused == a.refused, "%s: %llu steps refused", name,
              (unsigned long long)(b.refused - a.refused));
        CHECK(b.replayed > a.replayed, "%s: nothing was replayed", name);
        printf("PASS %s: graphs on (pass %d): %d calls, %llu captured, %llu replayed, %llu "
               "eager: logits and states bit-identical to graphs off\n",
               name, pass + 1, on.calls, (unsigned long long)(b.captured - a.captured),
               (unsigned long long)(b.replayed - a.replayed),
               (unsigned long long)(b.eager - a.eager));
        steps_run_free(&on);
    }
}

/* 2. The GPU backend, every step under one key (another for each fixture:
 * a key that keeps mismatching stays eager). */
static int (*real_begin)(void *ctx, uint64_t key);
static uint64_t the_key;

static int one_key_begin(void *ctx, uint64_t key)
{
    (void)key;
    return real_begin(ctx, the_key);
}

static void check_one_key(tdm_backend *gpu, const char *name, uint64_t key, const steps_run *eager)
{
    tdm_backend colliding = *gpu;
    colliding.destroy = NULL; /* gpu owns the context */
    real_begin = gpu->graph_begin;
    the_key = key;
    colliding.graph_begin = one_key_begin;
    tdm_model *m = fixture_model(name, &colliding);
    const tdm_cuda_graph_stats a = stats_of(gpu);
    steps_run on;
    steps_run_script(m, &on);
    const tdm_cuda_graph_stats b = stats_of(gpu);
    same_run(name, "one key for every step", eager, &on);
    CHECK(b.refused > a.refused, "%s: one key for every shape, yet nothing refused", name);
    printf("PASS %s: one key for every step: %llu refused steps ran eagerly, %llu captured, "
           "%llu replayed: logits and states bit-identical\n",
           name, (unsigned long long)(b.refused - a.refused),
           (unsigned long long)(b.captured - a.captured),
           (unsigned long long)(b.replayed - a.replayed));
    steps_run_free(&on);
    tdm_model_destroy(m);
}

/* 3. */
#define T_V 16
#define T_H 64

static float *fetch_rows(tdm_backend *g, const float *dev, int rows)
{
    g->sync(g->ctx);
    return ct_get(g, dev, (size_t)rows * T_H * sizeof(float));
}

/* y rows equal table rows ids[0..R). */
static int rows_are(tdm_backend *g, const float *y, const float *table, const int32_t *ids, int R)
{
    float *h = fetch_rows(g, y, R);
    int ok = 1;
    for (int r = 0; r < R; r++)
        ok &= memcmp(h + (size_t)r * T_H, table + (size_t)ids[r] * T_H, T_H * sizeof(float)) == 0;
    free(h);
    return ok;
}

static void check_slots(tdm_backend *g)
{
    void *x = g->ctx;
    const uint64_t K = 0x1234;
    float table[T_V * T_H];
    ct_fill(table, T_V * T_H, 1.0f);
    tdm_weight e = {ct_put(g, table, sizeof(table)), TDM_DTYPE_F32, 0};
    float *y = ct_put(g, NULL, 2 * T_H * sizeof(float));
    const tdm_cuda_graph_stats s0 = stats_of(g);

    const int32_t ids1[2] = {1, 2}, ids2[2] = {3, 4}, ids3[2] = {5, 6}, ids4[1] = {7};
    CHECK(g->graph_begin(x, K) == 0, "first sight of a key is not eager");
    g->embed(x, y, e, ids1, 2, T_H);
    CHECK(g->graph_end(x) == 0, "an eager step was refused");
    CHECK(rows_are(g, y, table, ids1, 2), "eager step: wrong rows");
    CHECK(g->graph_begin(x, K) == 1, "second sight is not captured");
    g->embed(x, y, e, ids2, 2, T_H);
    CHECK(g->graph_end(x) == 0, "a capture was refused");
    CHECK(rows_are(g, y, table, ids2, 2), "captured step: wrong rows");
    CHECK(g->graph_begin(x, K) == 1, "third sight does not replay");
    g->embed(x, y, e, ids3, 2, T_H);
    CHECK(g->graph_end(x) == 0, "a matching replay was refused");
    CHECK(rows_are(g, y, table, ids3, 2), "replayed step: not the new ids' rows");
    printf("PASS slots: eager, captured, replayed with new staged ids: right rows each time\n");

    /* Another shape under the same key: refused, nothing run. */
    ct_poison(g, y, 2 * T_H * sizeof(float));
    CHECK(g->graph_begin(x, K) == 1, "fourth sight does not replay");
    g->embed(x, y, e, ids4, 1, T_H);
    CHECK(g->graph_end(x) == 1, "a replay of another shape was not refused");
    float *h = fetch_rows(g, y, 2);
    for (int i = 0; i < 2 * T_H; i++)
        CHECK(h[i] != h[i], "a refused replay wrote its output (element %d)", i);
    free(h);
    g->embed(x, y, e, ids4, 1, T_H);
    CHECK(rows_are(g, y, table, ids4, 1), "eager run after a refused replay: wrong rows");
    printf("PASS slots: replay of another shape refused (graph_end 1), output untouched, eager "
           "rerun right\n");

    /* The dropped key is measured and captured again; mismatching once
     * more, it stays eager. */
    CHECK(g->graph_begin(x, K) == 0, "a dropped key is not measured again");
    g->embed(x, y, e, ids1, 2, T_H);
    CHECK(g->graph_end(x) == 0, "eager step refused");
    CHECK(g->graph_begin(x, K) == 1, "a dropped key is not captured again");
    g->embed(x, y, e, ids2, 2, T_H);
    CHECK(g->graph_end(x) == 0, "capture refused");
    CHECK(g->graph_begin(x, K) == 1, "no replay");
    g->embed(x, y, e, ids4, 1, T_H);
    CHECK(g->graph_end(x) == 1, "second mismatch not refused");
    for (int i = 0; i < 3; i++) {
        CHECK(g->graph_begin(x, K) == 0, "a key that keeps mismatching is captured again");
        g->embed(x, y, e, ids3, 2, T_H);
        CHECK(g->graph_end(x) == 0, "eager step refused");
        CHECK(rows_are(g, y, table, ids3, 2), "eager step: wrong rows");
    }
    printf("PASS slots: a key mismatching twice in a row stays eager\n");

    /* attn_prep: the segments (cache pointers and rows) are staged. One head
     * of 32 for q and for k: its v rows land as they are, its k rows as the
     * eager step's (the same values and positions). */
    enum { W = 32, NR = 3 };
    const uint64_t K2 = 0x5678;
    float kh[NR * W], vh[NR * W], qgh[2 * NR * W], nh[W], inv[8];
    const int32_t pos[NR] = {3, 4, 5};
    ct_fill(kh, NR * W, 1.0f);
    ct_fill(vh, NR * W, 1.0f);
    ct_fill(qgh, 2 * NR * W, 1.0f);
    ct_fill(nh, W, 0.5f);
    for (int i = 0; i < 8; i++)
        inv[i] = 1.0f / (float)(1 + i);
    float *k = ct_put(g, kh, sizeof(kh)), *v = ct_put(g, vh, sizeof(vh));
    float *qg = ct_put(g, qgh, sizeof(qgh)), *nw = ct_put(g, nh, sizeof(nh));
    float *q = ct_put(g, NULL, sizeof(kh)), *gate = ct_put(g, NULL, sizeof(kh));
    const size_t cbytes = 16 * (size_t)W * sizeof(float);
    float *kc[3], *vc[3], *k0 = NULL;
    const int at[3] = {0, 5, 11};
    for (int i = 0; i < 3; i++) {
        kc[i] = ct_put(g, NULL, cbytes);
        vc[i] = ct_put(g, NULL, cbytes);
        const tdm_attn_seg as = {0, NR, at[i], kc[i], vc[i]};
        CHECK(g->graph_begin(x, K2) == (i > 0), "attn_prep step %d: wrong mode", i);
        g->attn_prep(x, q, gate, qg, k, v, nw, nw, 1e-6f, pos, inv, 16, &as, 1, 1, 1, W);
        CHECK(g->graph_end(x) == 0, "attn_prep step %d refused", i);
        g->sync(x);
        float *hk = ct_get(g, kc[i], cbytes), *hv = ct_get(g, vc[i], cbytes);
        if (i == 0) {
            k0 = malloc(sizeof(kh));
            memcpy(k0, hk, sizeof(kh));
        }
        CHECK(memcmp(hk + (size_t)at[i] * W, k0, sizeof(kh)) == 0 &&
                  memcmp(hv + (size_t)at[i] * W, vh, sizeof(vh)) == 0,
              "attn_prep step %d (%s): rows not at %d of its own caches", i,
              i == 0   ? "eager"
              : i == 1 ? "captured"
                       : "replayed",
              at[i]);
        free(hk);
        free(hv);
    }
    free(k0);
    printf("PASS slots: attn_prep eager, captured, replayed into other caches at another row\n");

    const tdm_cuda_graph_stats s1 = stats_of(g);
    CHECK(s1.captured - s0.captured == 3 && s1.replayed - s0.replayed == 2 &&
              s1.refused - s0.refused == 2,
          "counters: %llu captured, %llu replayed, %llu refused",
          (unsigned long long)(s1.captured - s0.captured),
          (unsigned long long)(s1.replayed - s0.replayed),
          (unsigned long long)(s1.refused - s0.refused));
    printf("PASS slots: counters 3 captured, 2 replayed, 2 refused\n");
    for (int i = 0; i < 3; i++) {
        g->free(x, kc[i]);
        g->free(x, vc[i]);
    }
    void *bufs[] = {k, v, qg, nw, q, gate, y};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bufs); i++)
        g->free(x, bufs[i]);
    g->free(x, (void *)e.data);
}

/* 4. */
static void check_opstats(void)
{
    setenv("TANDEM_CUDA_OPSTATS", "1", 1);
    tdm_backend *g = ct_gpu();
    unsetenv("TANDEM_CUDA_OPSTATS");
    CHECK(!g->graph_begin && !g->graph_end, "TANDEM_CUDA_OPSTATS=1 leaves graphs on");
    g->destroy(g);
    printf("PASS TANDEM_CUDA_OPSTATS=1: no graph slots\n");
}

/* Device drafting (tdm_seq_draft as one launch, argmax_to feeding
 * embed_dev) gives what drafting by verify calls with host argmaxes gives. */
static void check_draft_forms(tdm_backend *gpu, const char *name, const steps_run *eager)
{
    CHECK(gpu->argmax_to && gpu->embed_dev, "the CUDA backend has no device drafting slots");
    tdm_backend calls = *gpu;
    calls.destroy = NULL;
    calls.argmax_to = NULL;
    calls.embed_dev = NULL;
    tdm_model *m = fixture_model(name, &calls);
    tdm_model_set_graphs(m, 0);
    steps_run r;
    steps_run_script(m, &r);
    same_run(name, "drafting by verify calls", eager, &r);
    printf("PASS %s: device drafting equals drafting by verify calls (drafts, logits, states)\n",
           name);
    steps_run_free(&r);
    tdm_model_destroy(m);
}

/* 4. */
static void check_outgrown(tdm_backend *g)
{
    void *x = g->ctx;
    const uint64_t K = 0x9abc;
    enum { R = 8, IN = 128, OUT = T_H, BR = 10, BOUT = 64 };
    /* each needs more split-x scratch than any step before (3.9 and 15.7 MB; the
     * fixtures above need well under 1 MB) */
    const int big_in[2] = {65536, 262144};
    const size_t wmax = (size_t)big_in[1] * BOUT;
    float *wf = malloc(wmax * sizeof(float)), *xh = malloc((size_t)BR * big_in[1] * sizeof(float));
    uint16_t *wb = malloc(wmax * sizeof(uint16_t));
    ct_fill(wf, wmax, 0.05f);
    ct_fill(xh, (size_t)BR * big_in[1], 1.0f);
    for (size_t i = 0; i < wmax; i++)
        wb[i] = ct_f32_to_bf16(wf[i]);
    const tdm_weight ws = {ct_put(g, wb, (size_t)IN * OUT * sizeof(uint16_t)), TDM_DTYPE_BF16, 0};
    const tdm_weight wl = {ct_put(g, wb, wmax * sizeof(uint16_t)), TDM_DTYPE_BF16, 0};
    const float *xd = ct_put(g, xh, (size_t)BR * big_in[1] * sizeof(float));
    float *y = ct_put(g, NULL, (size_t)R * OUT * sizeof(float));
    float *yl = ct_put(g, NULL, (size_t)BR * BOUT * sizeof(float));
    g->matmul(x, y, xd, ws, R, IN, OUT, 0); /* the eager bits, outside any step */
    float *ref = fetch_rows(g, y, R);       /* OUT == T_H: R rows of it */
    const tdm_cuda_graph_stats s0 = stats_of(g);
    for (int round = 0; round < 3; round++) {
        static const char *const sight[3] = {"measured", "captured", "replayed"};
        /* measured and captured; replayed only after the last outgrowing,
         * so the two are one after the other with no good replay between */
        for (int k = 0; k < (round == 2 ? 3 : 2); k++) {
            ct_poison(g, y, (size_t)R * OUT * sizeof(float));
            CHECK(g->graph_begin(x, K) == (k > 0), "round %d: the step is not %s", round, sight[k]);
            g->matmul(x, y, xd, ws, R, IN, OUT, 0);
            CHECK(g->graph_end(x) == 0, "round %d: the %s step was refused", round, sight[k]);
            float *h = fetch_rows(g, y, R);
            CHECK(memcmp(h, ref, (size_t)R * OUT * sizeof(float)) == 0,
                  "round %d: the %s step's bits are not the eager ones", round, sight[k]);
            free(h);
        }
        if (round == 2)
            break;
        /* A larger matmul, eagerly: it replaces the split-x scratch. */
        g->matmul(x, yl, xd, wl, BR, big_in[round], BOUT, 0);
        ct_poison(g, y, (size_t)R * OUT * sizeof(float));
        CHECK(g->graph_begin(x, K) == 1, "round %d: no replay after the larger step", round);
        g->matmul(x, y, xd, ws, R, IN, OUT, 0);
        CHECK(g->graph_end(x) == 1,
              "round %d: a replay naming replaced scratch was not refused (did the %d-wide "
              "matmul grow nothing?)",
              round, big_in[round]);
        g->matmul(x, y, xd, ws, R, IN, OUT, 0);
        float *h = fetch_rows(g, y, R);
        CHECK(memcmp(h, ref, (size_t)R * OUT * sizeof(float)) == 0,
              "round %d: the eager rerun's bits differ", round);
        free(h);
    }
    const tdm_cuda_graph_stats s1 = stats_of(g);
    CHECK(s1.refused - s0.refused == 2 && s1.captured - s0.captured == 3,
          "outgrown twice: %llu refused, %llu captured (want 2 and 3)",
          (unsigned long long)(s1.refused - s0.refused),
          (unsigned long long)(s1.captured - s0.captured));
    printf("PASS outgrown: a graph outgrown by a larger step is refused and captured again, twice "
           "in a row with no replay between, bits equal to eager\n");
    free(ref);
    free(wf);
    free(xh);
    free(wb);
}

int main(void)
{
    ct_require_gpu();
    tdm_backend *gpu = ct_gpu();
    CHECK(gpu->graph_begin && gpu->graph_end, "the CUDA backend has no graph slots");
    const char *names[] = {"f32_gqa", "bf16_alt", "bf16_realdims"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(names); i++) {
        tdm_model *m = fixture_model(names[i], gpu);
        steps_run eager;
        check_script(gpu, m, names[i], &eager);
        check_one_key(gpu, names[i], 0x5eed0000ull + i, &eager);
        check_draft_forms(gpu, names[i], &eager);
        draft_vocab_check(names[i], gpu);
        if (tdm_model_get_config(m)->hidden_size % 64 == 0) /* FP8 rows: whole 64-value steps */
            draft_vocab_fp8_check(names[i], gpu);
        draft_sampled_check(names[i], gpu);
        steps_run_free(&eager);
        tdm_model_destroy(m);
    }
    check_slots(gpu);
    check_outgrown(gpu);
    gpu->destroy(gpu);
    check_opstats();
    printf("cuda graph: all checks passed\n");
    return 0;
}
