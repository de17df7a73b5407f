/*
 * engine_bench.c - CPU speed of the hybrid-model engine.
 *
 *   bench_engine_bench [--model DIR] [--fixture DIR] [--threads N] [--steps N]
 *                      [--weights checkpoint|fp8]
 *   bench_engine_bench --generate DIR   (only write the random model)
 *
 * For each model: decode tokens/s at batch 1 and 8, and the time of one
 * verify step (1 + k tokens, then commit) for k = 4 and 8 under both state
 * strategies, beside the memory-bandwidth floor of a decode step: bytes of
 * weights streamed per step ÷ measured bandwidth (memcpy, and a read-only
 * sweep). Without --model it generates a random ~100M-parameter Qwen3.5-shaped
 * bf16 checkpoint (hidden 768, 12 layers 3:1, vocab 32000) in a temp folder.
 * --weights fp8 rounds the matrices to FP8 first (tdm_model_set_weights_fp8).
 */
#include "bench_util.h"
#include "engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what, const tdm_error *err)
{
    fprintf(stderr, "engine_bench: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

/* ---- memory bandwidth ------------------------------------------------------ */

typedef struct bw_arg {
    char *dst;
    const char *src;
    size_t n;
    int read_only;
    double sum;
} bw_arg;

static void *bw_worker(void *vp)
{
    bw_arg *a = vp;
    if (!a->read_only) {
        memcpy(a->dst, a->src, a->n);
    } else {
        const double *p = (const double *)a->src;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= a->n / 8; i += 4) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
        }
        a->sum = s0 + s1 + s2 + s3;
    }
    return NULL;
}

/* Bytes per second moved by nthreads workers over a 256 MiB buffer (best of 5). */
static double bandwidth(int nthreads, int read_only)
{
    const size_t N = 256u << 20;
    char *src = malloc(N), *dst = malloc(N);
    memset(src, 1, N);
    memset(dst, 2, N);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        bw_arg args[64];
        size_t per = N / (size_t)nthreads;
        double t0 = bench_now();
        for (int i = 0; i < nthreads; i++) {
            args[i] = (bw_arg){dst + (size_t)i * per, src + (size_t)i * per, per, read_only, 0};
            pthread_create(&th[i], NULL, bw_worker, &args[i]);
        }
        for (int i = 0; i < nthreads; i++)
            pthread_join(th[i], NULL);
        double bw = (double)N / (bench_now() - t0);
        if (bw > best)
            best = bw;
    }
    free(src);
    free(dst);
    return best;
}

/* The random ~100M-parameter model: hidden 768, 12 layers 3:1, vocab 32000. */
static const bench_shape random_shape = {"100m", 768, 12, 2048, 6, 2, 128, 6, 12, 64, 64, 32000};

static void gen_model(const char *dir)
{
    char err[700];
    if (bench_write_model(dir, &random_shape, err, sizeof(err)) != 0) {
        fprintf(stderr, "engine_bench: random model: %s\n", err);
        exit(1);
    }
}

/* ---- measurements ---------------------------------------------------------- */

/* Medians, because other processes on a small shared machine inflate some
 * steps a lot; the median step is what an undisturbed engine does. */
static double median(double *v, int n)
{
    bench_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static tdm_seq *seq_new(tdm_model *m, tdm_state_strategy s, int max_draft, int plen)
{
    tdm_seq_params p = {s, max_draft, 0};
    tdm_seq *q;
    tdm_error err;
    if (tdm_seq_create(m, &p, &q, &err) != TDM_OK)
        die("seq", &err);
    int32_t *prompt = malloc((size_t)plen * sizeof(int32_t));
    const int V = tdm_model_get_config(m)->vocab_size;
    for (int i = 0; i < plen; i++)
        prompt[i] = (int32_t)((i * 7919 + 13) % V);
    if (tdm_seq_prefill(q, prompt, plen, NULL, &err) != TDM_OK)
        die("prefill", &err);
    free(prompt);
    return q;
}

static int fp8;

static void bench_model(const char *label, const char *dir, int threads, int steps, double copy_bw,
                        double read_bw)
{
    tdm_backend *be = tdm_backend_cpu_create(threads);
    tdm_model *m;
    tdm_error err;
    if (tdm_model_load(dir, be, &m, &err) != TDM_OK)
        die(dir, &err);
    if (fp8 && tdm_model_set_weights_fp8(m, NULL, NULL, &err) != TDM_OK)
        die("--weights fp8", &err);
    const tdm_model_config *c = tdm_model_get_config(m);
    const int V = c->vocab_size;
    double wb = (double)tdm_model_weight_bytes(m);
    float *lg = malloc((size_t)16 * 9 * (size_t)V * sizeof(float));
    const int plen = 64;

    /* prefill of a 256-token prompt (two 128-row chunks) */
    double tp;
    {
        tdm_seq_params pp = {TDM_STATE_EXTRA_BUFFER, 0, 0};
        tdm_seq *ps;
        if (tdm_seq_create(m, &pp, &ps, &err) != TDM_OK)
            die("seq", &err);
        int32_t prompt[256];
        for (int i = 0; i < 256; i++)
            prompt[i] = (int32_t)((i * 7919 + 13) % V);
        double t0 = bench_now();
        if (tdm_seq_prefill(ps, prompt, 256, NULL, &err) != TDM_OK)
            die("prefill", &err);
        tp = bench_now() - t0;
        tdm_seq_destroy(ps);
    }

    /* batch 1 */
    tdm_seq *s = seq_new(m, TDM_STATE_EXTRA_BUFFER, 8, plen);
    int32_t t = 1;
    tdm_seq_decode(&s, 1, &t, lg, &err); /* warm-up */
    double *tim = malloc((size_t)steps * sizeof(double));
    for (int i = 0; i < steps; i++) {
        t = (int32_t)((i * 31 + 7) % V);
        double t0 = bench_now();
        if (tdm_seq_decode(&s, 1, &t, lg, &err) != TDM_OK)
            die("decode", &err);
        tim[i] = bench_now() - t0;
    }
    double dt1 = median(tim, steps);

    /* batch 8 */
    tdm_seq *b[8];
    for (int i = 0; i < 8; i++)
        b[i] = seq_new(m, TDM_STATE_EXTRA_BUFFER, 8, plen / 2 + 8 * i);
    int32_t tk[8];
    for (int i = 0; i < steps; i++) {
        for (int j = 0; j < 8; j++)
            tk[j] = (int32_t)((i * 17 + j * 3) % V);
        double t0 = bench_now();
        if (tdm_seq_decode(b, 8, tk, lg, &err) != TDM_OK)
            die("decode8", &err);
        tim[i] = bench_now() - t0;
    }
    double dt8 = median(tim, steps);

    printf("\n### %s\n\n", label);
    printf("layers %d, hidden %d, vocab %d; weights streamed per decode step %.1f MB\n\n",
           c->num_layers, c->hidden_size, V, wb / 1e6);
    printf("| measure | value |\n|---|---|\n");
    printf("| floor per step (weights / memcpy bw %.1f GB/s) | %.3f ms |\n", copy_bw / 1e9,
           1e3 * wb / copy_bw);
    printf("| floor per step (weights / read bw %.1f GB/s) | %.3f ms |\n", read_bw / 1e9,
           1e3 * wb / read_bw);
    printf(
        "| decode batch 1 (median step) | %.3f ms/step = %.1f tok/s (%.2fx the memcpy floor) |\n",
        1e3 * dt1, 1.0 / dt1, dt1 / (wb / copy_bw));
    printf("| prefill 256 tokens | %.1f ms = %.0f tok/s |\n", 1e3 * tp, 256.0 / tp);
    printf("| decode batch 8 (median step) | %.3f ms/step = %.1f tok/s |\n", 1e3 * dt8, 8.0 / dt8);

    for (int k = 4; k <= 8; k += 4) {
        for (int st = 0; st < 3; st++) { /* extra_buffer, no_buffer, replay */
            tdm_seq *v = seq_new(m, (tdm_state_strategy)st, 8, plen);
            int32_t blk[9];
            int nt = k + 1;
            int reps = steps / 2 > 3 ? steps / 2 : 3;
            double *tvs = malloc((size_t)reps * sizeof(double)),
                   *tcs = malloc((size_t)reps * sizeof(double));
            for (int r = 0; r < reps; r++) {
                for (int j = 0; j < nt; j++)
                    blk[j] = (int32_t)((r * 101 + j * 7) % V);
                const int32_t *bp = blk;
                double a = bench_now();
                if (tdm_seq_verify(&v, 1, &bp, &nt, lg, &err) != TDM_OK)
                    die("verify", &err);
                double bb = bench_now();
                /* half the drafts accepted: no_buffer then recomputes,
                 * replay replays k/2 + 1 positions */
                if (tdm_seq_commit(v, k / 2, &err) != TDM_OK)
                    die("commit", &err);
                tcs[r] = bench_now() - bb;
                tvs[r] = bb - a;
            }
            double tv = median(tvs, reps), tc = median(tcs, reps);
            free(tvs);
            free(tcs);
            tdm_seq_memory mem;
            tdm_seq_memory_usage(v, &mem);
            printf(
                "| verify k=%d %s | %.3f ms verify + %.3f ms commit (accept %d); state %.1f KiB + "
                "%.1f KiB strategy |\n",
                k, tdm_state_strategy_name((tdm_state_strategy)st), 1e3 * tv, 1e3 * tc, k / 2,
                (double)(mem.recurrent_bytes + mem.conv_bytes) / 1024,
                (double)mem.strategy_bytes / 1024);
            tdm_seq_destroy(v);
        }
    }
    tdm_seq_destroy(s);
    for (int i = 0; i < 8; i++)
        tdm_seq_destroy(b[i]);
    free(lg);
    free(tim);
    tdm_model_destroy(m);
    be->destroy(be);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *fixture = NULL;
    int threads = 0, steps = 32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(argv[i], "--fixture") == 0)
            fixture = argv[i + 1];
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--weights") == 0) {
            if (strcmp(argv[i + 1], "fp8") != 0 && strcmp(argv[i + 1], "checkpoint") != 0) {
                fprintf(stderr, "engine_bench: --weights takes checkpoint or fp8, not %s\n",
                        argv[i + 1]);
                return 2;
            }
            fp8 = strcmp(argv[i + 1], "fp8") == 0;
        } else if (strcmp(argv[i], "--generate") == 0) {
            gen_model(argv[i + 1]);
            printf("wrote a random ~100M-parameter bf16 model to %s\n", argv[i + 1]);
            return 0;
        }
    }
    if (threads <= 0)
        threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (steps < 4)
        steps = 4;
    double copy_bw = bandwidth(threads, 0), read_bw = bandwidth(threads, 1);
    printf("engine bench: %d threads; memcpy %.2f GB/s (bytes copied/s), read %.2f GB/s\n", threads,
           copy_bw / 1e9, read_bw / 1e9);
    if (fixture)
        bench_model(fixture, fixture, threads, steps * 4, copy_bw, read_bw);
    char tmp[256] = "";
    if (!model) {
        snprintf(tmp, sizeof(tmp), "/tmp/tandem-bench-model-%d", (int)getpid());
        double g = bench_now();
        gen_model(tmp);
        printf("generated a random ~100M-parameter bf16 model in %s (%.1f s)\n", tmp,
               bench_now() - g);
        model = tmp;
    }
    bench_model(tmp[0] ? "random Qwen3.5-shaped ~100M bf16 (hidden 768, 12 layers)" : model, model,
                threads, steps, copy_bw, read_bw);
    if (tmp[0]) {
        char p[300];
        snprintf(p, sizeof(p), "%s/model.safetensors", tmp);
        unlink(p);
        snprintf(p, sizeof(p), "%s/config.json", tmp);
        unlink(p);
        rmdir(tmp);
    }
    return 0;
}
