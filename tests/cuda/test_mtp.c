/*
 * test_mtp.c - the MTP head (engine/mtp.h) on the CUDA backend, on tiny
 * random checkpoints written at run time (tied with a head; the release
 * layout, untied and sharded).
 *  - On the GPU alone, the row contract of tests/engine/mtp_steps.c: a prime
 *    in chunks = one prime, drafts in two calls = one call, rollback + prime
 *    = a fresh sequence, a head from tdm_mtp_open = one from the model, all
 *    to the bit.
 *  - GPU against the CPU backend: the primed rows' and the drafts' logits
 *    within normalised error 1e-5 (fp32 arithmetic over the same weights,
 *    the target's hidden states included), the same drafts.
 *  - Graphs (tdm_mtp_set_graphs): rounds of a verdict's prime and a draft
 *    chain of two sequences, with a draft vocabulary and without, replayed
 *    as CUDA graphs, give the drafts of the same rounds run eagerly.
 *  - All of it again with FP8 weights (the model's and the heads' matrices
 *    rounded: tdm_model_set_weights_fp8, tdm_mtp_set_weights_fp8).
 */
#include "bench_util.h"
#include "cuda_test.h"
#include "mtp_steps.h"

#include <stdlib.h>
#include <string.h>

static const bench_shape tiny = {"tiny", 64, 8, 96, 2, 1, 32, 2, 4, 16, 16, 320};

/* fp8: the model and both heads with their matrices rounded to FP8
 * (tdm_model_set_weights_fp8, tdm_mtp_set_weights_fp8). */
static void run(tdm_backend *be, const char *dir, const char *name, int fp8, mtp_steps_out *out)
{
    tdm_model *m;
    tdm_mtp *h, *h2;
    tdm_error err;
    CHECK(tdm_model_load(dir, be, &m, &err) == TDM_OK, "%s: %s", name, err.msg);
    CHECK(!fp8 || tdm_model_set_weights_fp8(m, NULL, NULL, &err) == TDM_OK, "%s: %s", name,
          err.msg);
    CHECK(tdm_mtp_create(m, &h, &err) == TDM_OK, "%s: %s", name, err.msg);
    CHECK(tdm_mtp_open(dir, be, &h2, &err) == TDM_OK, "%s: %s", name, err.msg);
    CHECK(!fp8 || (tdm_mtp_set_weights_fp8(h, NULL, &err) == TDM_OK &&
                   tdm_mtp_set_weights_fp8(h2, NULL, &err) == TDM_OK),
          "%s: %s", name, err.msg);
    mtp_steps_check(name, dir, m, h, h2, fp8, out);
    tdm_mtp_destroy(h2);
    tdm_mtp_destroy(h);
    tdm_model_destroy(m);
}

/* Rounds of prime (1-3 rows, no logits) and draft (k 2-4) on two sequences,
 * on a head with graphs and on one without: the same drafts every round.
 * fp8: the heads' matrices rounded to FP8. */
static void graphs(tdm_backend *gpu, const char *dir, int vocab, int fp8)
{
    tdm_error err;
    tdm_mtp *h[2];
    tdm_mtp_seq *q[2][2];
    enum { T = 24, ROUNDS = 12 };
    const int H = tiny.H;
    float *hid = malloc((size_t)T * (size_t)H * sizeof(float));
    int32_t next[T], ids[64];
    for (int i = 0; i < T * H; i++)
        hid[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int i = 0; i < T; i++)
        next[i] = (int32_t)((i * 29 + 5) % tiny.V);
    for (int i = 0; i < 64; i++)
        ids[i] = (int32_t)(i * 5);
    for (int b = 0; b < 2; b++) {
        CHECK(tdm_mtp_open(dir, gpu, &h[b], &err) == TDM_OK, "%s", err.msg);
        tdm_mtp_set_graphs(h[b], b);
        CHECK(!vocab || tdm_mtp_set_vocab(h[b], ids, 64, &err) == TDM_OK, "%s", err.msg);
        CHECK(!fp8 || tdm_mtp_set_weights_fp8(h[b], NULL, &err) == TDM_OK, "%s", err.msg);
        for (int i = 0; i < 2; i++) {
            CHECK(tdm_mtp_seq_create(h[b], 0, &q[b][i], &err) == TDM_OK, "%s", err.msg);
            CHECK(tdm_mtp_prime(q[b][i], hid, next, 8 + i, NULL, &err) == TDM_OK, "%s", err.msg);
        }
    }
    tdm_cuda_graph_stats g0, g1;
    tdm_cuda_graph_stats_get(gpu, &g0);
    for (int r = 0; r < ROUNDS; r++) {
        const int k[2] = {3, 2 + r % 3};
        int32_t d[2][2][4];
        for (int b = 0; b < 2; b++) {
            int32_t *dp[2] = {d[b][0], d[b][1]};
            CHECK(tdm_mtp_draft_n(q[b], 2, k, NULL, dp, NULL, &err) == TDM_OK, "%s", err.msg);
            for (int i = 0; i < 2; i++) {
                const int at = tdm_mtp_seq_length(q[b][i]) - (k[i] - 1);
                CHECK(tdm_mtp_rollback(q[b][i], at, &err) == TDM_OK, "%s", err.msg);
                const int n = 1 + (r + i) % 3, p = (at + r) % (T - 3);
                CHECK(tdm_mtp_prime(q[b][i], hid + (size_t)p * H, next + p, n, NULL, &err) ==
                          TDM_OK,
                      "%s", err.msg);
            }
        }
        for (int i = 0; i < 2; i++)
            CHECK(memcmp(d[0][i], d[1][i], (size_t)k[i] * sizeof(int32_t)) == 0,
                  "vocab %d fp8 %d, round %d, sequence %d: drafts with graphs differ from "
                  "eager ones",
                  vocab, fp8, r, i);
    }
    tdm_cuda_graph_stats_get(gpu, &g1);
    CHECK(g1.replayed > g0.replayed, "no MTP graph was replayed");
    printf("MTP graphs%s%s: %d rounds, drafts equal to eager ones; %llu graphs captured, %llu "
           "replayed\n",
           vocab ? " with a draft vocabulary" : "", fp8 ? ", FP8 weights" : "", ROUNDS,
           (unsigned long long)(g1.captured - g0.captured),
           (unsigned long long)(g1.replayed - g0.replayed));
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < 2; i++)
            tdm_mtp_seq_destroy(q[b][i]);
        tdm_mtp_destroy(h[b]);
    }
    free(hid);
}

int main(void)
{
    ct_require_gpu();
    tdm_backend *gpu = ct_gpu(), *cpu = ct_cpu();
    const struct {
        const char *name;
        int flags;
        size_t shard;
    } cases[] = {{"tied", BENCH_LAYOUT_MTP, 0}, {"release", BENCH_LAYOUT_RELEASE, 64 * 1024}};
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++) {
        char dir[] = "/tmp/tandem_cuda_mtp_XXXXXX", msg[512];
        CHECK(mkdtemp(dir), "mkdtemp failed");
        CHECK(bench_write_model_layout(dir, &tiny, cases[i].flags, cases[i].shard, msg,
                                       sizeof(msg)) == 0,
              "%s", msg);
        for (int fp8 = 0; fp8 < 2; fp8++) {
            mtp_steps_out g, c;
            run(gpu, dir, cases[i].name, fp8, &g);
            run(cpu, dir, cases[i].name, fp8, &c);
            const size_t V = (size_t)tiny.V;
            const double ep = ct_nerr(g.prime, c.prime, (size_t)g.rows * V);
            CHECK(memcmp(g.drafts, c.drafts, sizeof(g.drafts)) == 0,
                  "%s%s: GPU and CPU drafts differ", cases[i].name, fp8 ? " fp8" : "");
            const double ed = ct_nerr(g.draft, c.draft, MTP_STEPS_DRAFTS * V);
            printf("%s%s: GPU vs CPU MTP logits nerr %.3g (primed rows), %.3g (drafts); thr "
                   "1e-5\n",
                   cases[i].name, fp8 ? " fp8" : "", ep, ed);
            CHECK(ep <= 1e-5 && ed <= 1e-5, "%s%s: GPU MTP logits differ from the CPU backend's",
                  cases[i].name, fp8 ? " fp8" : "");
            mtp_steps_out_free(&g);
            mtp_steps_out_free(&c);
            graphs(gpu, dir, 0, fp8);
            graphs(gpu, dir, 1, fp8);
        }
        dir_remove(dir);
    }
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    printf("cuda mtp: ok\n");
    return 0;
}
