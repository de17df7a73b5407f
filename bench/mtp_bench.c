/*
 * mtp_bench.c - the MTP head's own steps (engine/mtp.h), as the drafter runs
 * them each round, without the services around them.
 *
 *   bench_mtp_bench --model DIR [--vocab 0,32768,16384] [--k 3] [--rows 3]
 *                   [--iters 50] [--backend cuda|cpu] [--graphs on|off]
 *                   [--weights checkpoint|fp8]
 *
 * DIR is a checkpoint with an MTP head (bench_make_model --mtp). The head is
 * opened as the drafter opens it (tdm_mtp_open: the head, the embedding and
 * the LM head), once per --vocab entry (0: the whole vocabulary; N: the draft
 * vocabulary of the N lowest ids, tdm_mtp_set_vocab). A sequence is primed
 * with a 64-row prompt of random hidden states; then, --iters times: roll
 * back to the prompt, prime --rows rows (a verdict's accepted tokens and its
 * bonus), and draft --k tokens without logits (on the device where the
 * backend drafts there). Printed: the median wall time of the prime and of
 * the draft call (each ends by waiting for the device), and the draft per
 * token. --graphs (default on) runs a draft's steps after its first as one
 * CUDA graph (tdm_mtp_set_graphs), or launches every kernel one by one.
 * --weights fp8 rounds the head's matrices to FP8 as a drafter with weights
 * fp8 does (tdm_mtp_set_weights_fp8). Beside them the bytes a draft step
 * streams: the head's own weights and the LM head's rows.
 */
#include "bench_util.h"
#include "engine.h"
#include "mtp.h"

#ifdef TANDEM_HAVE_CUDA_BACKEND
#include "cuda_backend.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "mtp_bench: %s: %s\n", what, msg ? msg : "");
    exit(1);
}

static double median(double *v, int n)
{
    bench_sort(v, n);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *vocabs = "0,32768", *backend = "cuda";
    int k = 3, rows = 3, iters = 50, graphs = 1, fp8 = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            die("option without a value", argv[i]);
        if (!strcmp(argv[i], "--model"))
            dir = argv[++i];
        else if (!strcmp(argv[i], "--vocab"))
            vocabs = argv[++i];
        else if (!strcmp(argv[i], "--k"))
            k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows"))
            rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--backend"))
            backend = argv[++i];
        else if (!strcmp(argv[i], "--graphs"))
            graphs = !strcmp(argv[++i], "on");
        else if (!strcmp(argv[i], "--weights")) {
            fp8 = !strcmp(argv[++i], "fp8");
            if (!fp8 && strcmp(argv[i], "checkpoint") != 0)
                die("--weights", "checkpoint or fp8");
        } else
            die("unknown option", argv[i]);
    }
    if (!dir || k < 1 || k > 16 || rows < 1 || rows > 17 || iters < 1)
        die("usage", "--model DIR [--vocab 0,32768] [--k 1..16] [--rows 1..17] [--iters N]");
    int nv[8];
    const int nvocab = bench_ints(vocabs, nv, 8, 0, 1 << 30);
    if (nvocab < 1)
        die("--vocab", "a list of draft vocabulary sizes (0: the whole vocabulary)");
    tdm_error err;
    tdm_backend *be = NULL;
    if (!strcmp(backend, "cpu")) {
        be = tdm_backend_cpu_create(0);
    } else {
#ifdef TANDEM_HAVE_CUDA_BACKEND
        char why[160];
        if (tdm_cuda_device_count(why, sizeof(why)) == 0) {
            printf("mtp_bench: skipped: %s\n", why);
            return 0;
        }
        if (!(be = tdm_backend_cuda_create(0, &err)))
            die("CUDA backend", err.msg);
#else
        printf("mtp_bench: this build has no CUDA backend (--backend cpu runs on the CPU)\n");
        return 0;
#endif
    }
    const int T0 = 64;
    for (int v = 0; v < nvocab; v++) {
        tdm_mtp *h = NULL;
        if (tdm_mtp_open(dir, be, &h, &err) != TDM_OK)
            die("MTP head", err.msg);
        tdm_mtp_set_graphs(h, graphs);
        const tdm_model_config *c = tdm_mtp_get_config(h);
        const int H = c->hidden_size, V = c->vocab_size;
        if (nv[v] > V)
            die("--vocab", "larger than the model's vocabulary");
        if (nv[v] > 0) {
            int32_t *ids = malloc((size_t)nv[v] * sizeof(int32_t));
            for (int i = 0; i < nv[v]; i++)
                ids[i] = i;
            if (tdm_mtp_set_vocab(h, ids, nv[v], &err) != TDM_OK)
                die("draft vocabulary", err.msg);
            free(ids);
        }
        tdm_mtp_fp8 r8 = {0};
        if (fp8 && tdm_mtp_set_weights_fp8(h, &r8, &err) != TDM_OK)
            die("--weights fp8", err.msg);
        /* bytes an LM head row's value takes: FP8 where rounded */
        const size_t es = fp8 && (nv[v] || r8.lm_head == TDM_MTP_FP8_HEAD_ROUNDED) ? 1 : 2;
        const int n = T0 + rows;
        float *hid = malloc((size_t)n * (size_t)H * sizeof(float));
        int32_t *next = malloc((size_t)n * sizeof(int32_t));
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < (size_t)n * (size_t)H; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            hid[i] = (float)((double)(x >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
        }
        for (int i = 0; i < n; i++)
            next[i] = (int32_t)((i * 7919 + 13) % (nv[v] ? nv[v] : V));
        tdm_mtp_seq *s = NULL;
        if (tdm_mtp_seq_create(h, 0, &s, &err) != TDM_OK ||
            tdm_mtp_prime(s, hid, next, T0, NULL, &err) != TDM_OK)
            die("prompt", err.msg);
        double *tp = malloc((size_t)iters * sizeof(double)),
               *td = malloc((size_t)iters * sizeof(double));
        int32_t drafts[16];
        for (int it = -3; it < iters; it++) { /* three warm-up rounds */
            if (tdm_mtp_rollback(s, T0, &err) != TDM_OK)
                die("rollback", err.msg);
            const double t0 = bench_now();
            if (tdm_mtp_prime(s, hid + (size_t)T0 * (size_t)H, next + T0, rows, NULL, &err) !=
                TDM_OK)
                die("prime", err.msg);
            const double t1 = bench_now();
            if (tdm_mtp_draft(s, k, drafts, NULL, &err) != TDM_OK)
                die("draft", err.msg);
            const double t2 = bench_now();
            if (it >= 0) {
                tp[it] = (t1 - t0) * 1e6;
                td[it] = (t2 - t1) * 1e6;
            }
        }
        const double mp = median(tp, iters), md = median(td, iters);
        const double lm_mb = (double)(nv[v] ? (size_t)nv[v] : (size_t)V) * (size_t)H * es / 1e6;
        /* the head's own weights count the vocabulary's rows it copied */
        const double head_mb = (double)tdm_mtp_weight_bytes(h) / 1e6 - (nv[v] ? lm_mb : 0);
        printf("%sgraphs %s, vocab %6d: prime %d rows %7.1f us, draft k=%d %7.1f us (%6.1f a "
               "token); a draft step streams %.0f MB of head layer and fc + %.0f MB of LM head "
               "rows; prime + draft %.1f us\n",
               fp8 ? "fp8, " : "", graphs ? "on" : "off", nv[v] ? nv[v] : V, rows, mp, k, md,
               md / k, head_mb, lm_mb, mp + md);
        fflush(stdout);
        tdm_mtp_seq_destroy(s);
        tdm_mtp_destroy(h);
        free(hid);
        free(next);
        free(tp);
        free(td);
    }
    be->destroy(be);
    return 0;
}
