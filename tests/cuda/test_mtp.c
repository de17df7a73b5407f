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
 */
#include "bench_util.h"
#include "cuda_test.h"
#include "mtp_steps.h"

#include <stdlib.h>
#include <string.h>

static const bench_shape tiny = {"tiny", 64, 8, 96, 2, 1, 32, 2, 4, 16, 16, 320};

static void run(tdm_backend *be, const char *dir, const char *name, mtp_steps_out *out)
{
    tdm_model *m;
    tdm_mtp *h, *h2;
    tdm_error err;
    CHECK(tdm_model_load(dir, be, &m, &err) == TDM_OK, "%s: %s", name, err.msg);
    CHECK(tdm_mtp_create(m, &h, &err) == TDM_OK, "%s: %s", name, err.msg);
    CHECK(tdm_mtp_open(dir, be, &h2, &err) == TDM_OK, "%s: %s", name, err.msg);
    mtp_steps_check(name, m, h, h2, out);
    tdm_mtp_destroy(h2);
    tdm_mtp_destroy(h);
    tdm_model_destroy(m);
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
        mtp_steps_out g, c;
        run(gpu, dir, cases[i].name, &g);
        run(cpu, dir, cases[i].name, &c);
        const size_t V = (size_t)tiny.V;
        const double ep = ct_nerr(g.prime, c.prime, (size_t)g.rows * V);
        CHECK(memcmp(g.drafts, c.drafts, sizeof(g.drafts)) == 0, "%s: GPU and CPU drafts differ",
              cases[i].name);
        const double ed = ct_nerr(g.draft, c.draft, MTP_STEPS_DRAFTS * V);
        printf("%s: GPU vs CPU MTP logits nerr %.3g (primed rows), %.3g (drafts); thr 1e-5\n",
               cases[i].name, ep, ed);
        CHECK(ep <= 1e-5 && ed <= 1e-5, "%s: GPU MTP logits differ from the CPU backend's",
              cases[i].name);
        mtp_steps_out_free(&g);
        mtp_steps_out_free(&c);
        dir_remove(dir);
    }
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    printf("cuda mtp: ok\n");
    return 0;
}
