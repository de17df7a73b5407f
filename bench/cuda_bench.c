/*
 * cuda_bench.c - speed of the engine on the CUDA backend.
 *
 *   bench_cuda_bench [--shape 0.8b|4b] [--batch 1,8] [--k 0,4,8,16] [--steps N]
 *                    [--dir TMP] [--stats] [--graphs on|off] [--out logits|argmax|logits,argmax]
 *                    [--variants "K=V K=V;K=V"] [--strategy extra_buffer|no_buffer|replay]
 *                    [--context N] [--model DIR] [--tp N] [--draft 2,4] [--draft-lead 1,2]
 *                    [--draft-vocab N] [--between DIR] [--weights fp8]
 *                    [--prefill 64,512]
 *
 * Writes a random bf16 checkpoint with the shape of Qwen3.5-0.8B or -4B
 * (vocab 248320, tied embeddings, layers 3:1 linear:full; shapes from
 * hybrid-model-notes.md) into TMP, loads it on the GPU and measures, per
 * batch size: the decode step (one token per sequence, logits to the host)
 * and the verify step of 1 + k tokens (k = 4, 8, 16) followed by a full
 * commit, median of N steps after a short prefill. Beside them the floor:
 * bytes of weights one step streams ÷ the device's copy bandwidth (read +
 * write bytes per second of a 1 GiB device-to-device copy). --stats then
 * reloads the model with TANDEM_CUDA_OPSTATS=1 and prints GPU time per op
 * kind over batch-1 decode steps, then over batch-1 verify k=8 steps.
 * --graphs (default on) runs each step as a CUDA graph, or launches every
 * kernel one by one; the two warm-up steps of each row are a key's first
 * (eager) and second (captured) sight, so the measured steps replay. Logits
 * land in page-locked memory (tdm_model_host_alloc), as in the services.
 * --out argmax brings back only each row's argmax (tdm_seq_step_out), what
 * the verifier asks for greedy requests, instead of every row's logits. --k
 * picks the steps (0 is decode). --variants runs the table once per
 * ';'-separated environment (KEY=VALUE pairs set before the backend is
 * created, e.g. TANDEM_CUDA_OPSTATS), each on a freshly loaded model.
 * --strategy (default extra_buffer) is the sequences' state strategy; every
 * verify commits all its drafts, so no_buffer never recomputes here.
 * Without --context, each row's steps continue its sequences from a 32-token
 * prompt, so a verify k=8 row, which commits 9 positions a step, runs at a
 * longer context than the decode row. --context N instead starts every
 * timed step from the same N positions: a fork of sequences prefilled once
 * (tdm_seq_fork), the device idle when the clock starts and the clock
 * stopped when the device has finished the step and its commit; decode and
 * verify then compare at one context. N needs room for 1 + k positions
 * below the KV cache's next power of two (the bench stops otherwise, since
 * a step that grows the cache would time the copy). --model DIR loads an
 * existing checkpoint (bench_make_model's, any layout) instead of writing
 * one; its load time and read rate are printed, and it is left in place.
 * --draft K,... adds, per batch size, a drafter's round: a greedy draft
 * chain of K tokens after one lead token (tdm_seq_draft: on the device, one
 * graph) and the commit of all its rows, what a drafter runs for a block
 * that was accepted whole. --draft-lead 1,2 times each chain after one lead
 * row and again after two (both rows of the first step), as a drafter's chain does after
 * a verdict that accepted the whole block before it: the block's last draft,
 * which no step has run yet, and the verifier's bonus token (the catch-up
 * folded into the next block's first step); that is the drafter's part of an
 * a = 1.0 round. --draft-vocab N makes the model draft from the
 * token ids 0..N-1 alone (tdm_model_set_draft_vocab: every step's LM head
 * reads N rows), as a drafter with draft_vocab does. --between DIR loads a
 * second checkpoint (a target: bench_make_model's) on the same device and,
 * before each timed chain, runs its verify step of 1 + k tokens on one
 * sequence and commits it, untimed: the chain then starts as a drafter's does
 * in the services, on a device whose caches the verifier's step has just
 * swept, and its row reads "after a verify" beside the row timed back to back.
 * --weights fp8 rounds the model's matrices to FP8 (tdm_model_set_weights_fp8),
 * as a drafter with `weights fp8` does (the --between target stays as it is).
 * --prefill N,... adds, before each variant's rows, a request's life on one
 * sequence: its creation, the prefill of an N-token prompt with nothing
 * brought back (as the verifier prefills), and its destruction, each timed
 * to an idle device (median of --steps).
 * --tp N splits the model over CUDA devices 0..N-1 (tensor parallel, one
 * rank a device, NCCL between them; tdm_model_load_group): the floor is then
 * a rank's weight bytes ÷ one device's bandwidth, and after the table the
 * NCCL all-reduce of a step's residual (rows x hidden floats) is timed on
 * its own, beside the bus bandwidth it reaches. N = 1 runs the group
 * machinery on one device (a rank of one), against which plain runs show
 * its overhead.
 */
#include "bench_util.h"
#include "engine.h"

#ifdef TANDEM_HAVE_CUDA_BACKEND
#include "cuda_backend.h"
#endif
#ifdef TANDEM_HAVE_NCCL
#include "comm_nccl.h"
#include <pthread.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef TANDEM_HAVE_CUDA_BACKEND
int main(void)
{
    printf("cuda_bench: this build has no CUDA backend\n");
    return 0;
}
#else

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "cuda_bench: %s%s%s\n", what, msg ? ": " : "", msg ? msg : "");
    exit(1);
}

/* ---- timing ----------------------------------------------------------------- */

static double median(double *v, int n)
{
    bench_sort(v, n);
    return v[n / 2];
}

static tdm_state_strategy strategy = TDM_STATE_EXTRA_BUFFER; /* --strategy */

/* A drafter's round (--draft): median ms of a greedy chain of k drafts after
 * nlead lead tokens, and the commit of its nlead + k - 1 rows, for `batch`
 * sequences continuing from a 32-token prompt. Where `target` is set
 * (--between), each chain follows a verify step of 1 + k tokens on one
 * sequence of it and that step's commit, run to an idle device and not timed. */
static double time_draft(tdm_model *m, tdm_model *target, int batch, int nlead, int k, int steps)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    tdm_seq_params p = {strategy, k, 0};
    tdm_seq *seqs[64];
    tdm_error err;
    int32_t prompt[32];
    for (int i = 0; i < 32; i++)
        prompt[i] = (i * 7919 + 13) % V;
    for (int b = 0; b < batch; b++)
        if (tdm_seq_create(m, &p, &seqs[b], &err) != TDM_OK ||
            tdm_seq_prefill(seqs[b], prompt, 32, NULL, &err) != TDM_OK)
            die("prefill", err.msg);
    tdm_seq *ts = NULL;
    if (target) {
        const int TV = tdm_model_get_config(target)->vocab_size;
        tdm_seq_params tpar = {strategy, k, 0};
        int32_t tprompt[32];
        for (int i = 0; i < 32; i++)
            tprompt[i] = (i * 7919 + 13) % TV;
        if (tdm_seq_create(target, &tpar, &ts, &err) != TDM_OK ||
            tdm_seq_prefill(ts, tprompt, 32, NULL, &err) != TDM_OK)
            die("the target's prefill", err.msg);
    }
    int32_t lead[64][2], drafts[64][16];
    const int32_t *lp[64];
    int32_t *dp[64];
    int nl[64], ks[64];
    double *t = malloc((size_t)(steps + 2) * sizeof(double));
    for (int s = 0; s < steps + 2; s++) { /* two warm-up rounds */
        for (int b = 0; b < batch; b++) {
            for (int j = 0; j < nlead; j++)
                lead[b][j] = (s * 31 + b * 17 + j * 7 + 1) % V;
            lp[b] = lead[b];
            dp[b] = drafts[b];
            nl[b] = nlead;
            ks[b] = k;
        }
        if (ts) {
            int32_t vt[17], ids[17];
            for (int j = 0; j <= k; j++)
                vt[j] = (s * 29 + j * 11 + 3) % tdm_model_get_config(target)->vocab_size;
            const int32_t *vp = vt;
            const int nv = k + 1;
            const tdm_step_out o = {.argmax = ids};
            if (tdm_seq_step_out(&ts, 1, &vp, &nv, &o, &err) != TDM_OK ||
                tdm_seq_commit(ts, k, &err) != TDM_OK)
                die("the target's verify", err.msg);
            tdm_model_backend(target)->sync(tdm_model_backend(target)->ctx);
        }
        double t0 = bench_now();
        if (tdm_seq_draft(seqs, batch, lp, nl, ks, NULL, dp, &err) != TDM_OK)
            die("draft", err.msg);
        for (int b = 0; b < batch; b++)
            if (tdm_seq_commit(seqs[b], nlead + k - 2, &err) != TDM_OK)
                die("commit", err.msg);
        tdm_model_backend(m)->sync(tdm_model_backend(m)->ctx);
        if (s >= 2)
            t[s - 2] = (bench_now() - t0) * 1e3;
    }
    double med = median(t, steps);
    free(t);
    for (int b = 0; b < batch; b++)
        tdm_seq_destroy(seqs[b]);
    if (ts)
        tdm_seq_destroy(ts);
    return med;
}

/* --prefill: medians of a fresh sequence's creation, an n-token prompt's
 * prefill (nothing brought back: the verifier's prefill leaves the prompt's
 * last token to the first step) and its destruction, each timed from an idle
 * device to an idle device. */
static void time_prefill(tdm_backend *be, tdm_model *m, int n, int steps, const char *vname)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    tdm_seq_params p = {strategy, 8, 0};
    tdm_error err;
    int32_t *prompt = malloc((size_t)n * sizeof(int32_t));
    double *t = malloc((size_t)(steps + 2) * 3 * sizeof(double));
    if (!prompt || !t)
        die("out of host memory for the prompt", NULL);
    for (int s = 0; s < steps + 2; s++) { /* two warm-up requests */
        for (int i = 0; i < n; i++)
            prompt[i] = (i * 7919 + s * 104729 + 13) % V;
        tdm_seq *q;
        be->sync(be->ctx);
        double t0 = bench_now();
        if (tdm_seq_create(m, &p, &q, &err) != TDM_OK)
            die("create", err.msg);
        be->sync(be->ctx);
        double t1 = bench_now();
        if (tdm_seq_prefill(q, prompt, n, NULL, &err) != TDM_OK)
            die("prefill", err.msg);
        be->sync(be->ctx);
        double t2 = bench_now();
        tdm_seq_destroy(q);
        be->sync(be->ctx);
        double t3 = bench_now();
        if (s >= 2) {
            t[s - 2] = (t1 - t0) * 1e3;
            t[steps + s - 2] = (t2 - t1) * 1e3;
            t[2 * steps + s - 2] = (t3 - t2) * 1e3;
        }
    }
    const double c = median(t, steps), f = median(t + steps, steps),
                 d = median(t + 2 * steps, steps);
    printf("%s: a request of %d prompt tokens on one sequence: create %.3f ms, prefill %.3f ms "
           "(%.0f tokens/s), destroy %.3f ms\n",
           vname, n, c, f, n / f * 1e3, d);
    fflush(stdout);
    free(t);
    free(prompt);
}

/* --context: 0, every step continues the sequences (a verify commits 1 + k
 * positions, so its steps reach further into the cache than decode's); N,
 * every timed step starts from the same N positions. */
static int context = 0;

/* Median ms of a decode step (k = 0) or a verify step of 1 + k tokens plus
 * commit, for `batch` sequences after a prefill of 32 tokens each, or
 * (--context N) each timed step on forks of sequences prefilled with N
 * tokens, timed from an idle device until the device is done with the
 * commit. */
static double time_step(tdm_backend *be, tdm_model *m, int batch, int k, int steps, int argmax_only)
{
    const int V = tdm_model_get_config(m)->vocab_size, P = context ? context : 32;
    tdm_seq_params p = {strategy, k > 0 ? k : 1, 0};
    tdm_seq *seqs[64], *run[64];
    tdm_error err;
    int32_t *prompt = malloc((size_t)P * sizeof(int32_t));
    if (!prompt)
        die("out of host memory for the prompt", NULL);
    for (int i = 0; i < P; i++)
        prompt[i] = (i * 7919 + 13) % V;
    for (int b = 0; b < batch; b++) {
        if (tdm_seq_create(m, &p, &seqs[b], &err) != TDM_OK ||
            tdm_seq_prefill(seqs[b], prompt, P, NULL, &err) != TDM_OK)
            die("prefill", err.msg);
        run[b] = seqs[b];
    }
    free(prompt);
    float *logits =
        tdm_model_host_alloc(m, (size_t)batch * (size_t)(k + 1) * (size_t)V * sizeof(float));
    if (!logits)
        die("out of host memory for logits", NULL);
    int32_t toks[64][17];
    const int32_t *tp[64];
    int nt[64];
    double *t = malloc((size_t)(steps + 2) * sizeof(double));
    for (int s = 0; s < steps + 2; s++) { /* two warm-up steps */
        for (int b = 0; b < batch; b++) {
            for (int j = 0; j <= k; j++)
                toks[b][j] = (s * 31 + b * 17 + j * 5 + 1) % V;
            tp[b] = toks[b];
            nt[b] = k + 1;
        }
        tdm_seq_memory mem0, mem1;
        if (context) {
            for (int b = 0; b < batch; b++)
                if (tdm_seq_fork(seqs[b], &run[b], &err) != TDM_OK)
                    die("fork", err.msg);
            tdm_seq_memory_usage(run[0], &mem0);
            be->sync(be->ctx);
        }
        double t0 = bench_now();
        if (argmax_only) {
            /* decode rows (k = 0) commit at once; verify blocks commit below */
            int32_t ids[64 * 17];
            const tdm_step_out o = {.argmax = ids};
            if (tdm_seq_step_out(run, batch, tp, nt, &o, &err) != TDM_OK)
                die("step", err.msg);
            for (int b = 0; k > 0 && b < batch; b++)
                if (tdm_seq_commit(run[b], k, &err) != TDM_OK)
                    die("commit", err.msg);
        } else if (k == 0) {
            int32_t one[64];
            for (int b = 0; b < batch; b++)
                one[b] = toks[b][0];
            if (tdm_seq_decode(run, batch, one, logits, &err) != TDM_OK)
                die("decode", err.msg);
        } else {
            if (tdm_seq_verify(run, batch, tp, nt, logits, &err) != TDM_OK)
                die("verify", err.msg);
            for (int b = 0; b < batch; b++)
                if (tdm_seq_commit(run[b], k, &err) != TDM_OK)
                    die("commit", err.msg);
        }
        if (context)
            be->sync(be->ctx);
        if (s >= 2)
            t[s - 2] = (bench_now() - t0) * 1e3;
        if (context) {
            tdm_seq_memory_usage(run[0], &mem1);
            if (mem1.kv_bytes != mem0.kv_bytes)
                die("the step grew the KV cache (its time would include the copy); pick a "
                    "--context with room for 1 + k more positions below the next power of two",
                    NULL);
            for (int b = 0; b < batch; b++)
                tdm_seq_destroy(run[b]);
        }
    }
    double med = median(t, steps);
    free(t);
    tdm_model_host_free(m, logits);
    for (int b = 0; b < batch; b++)
        tdm_seq_destroy(seqs[b]);
    return med;
}

#ifdef TANDEM_HAVE_NCCL
/* --tp: the group's backends and communicators. */
static int tp;
static tdm_backend *tp_bes[8];
static tdm_comm *tp_comms[8];

static void bind_device(int rank, void *ctx)
{
    (void)ctx;
    tdm_cuda_use_device(rank);
}

typedef struct ar_job {
    int rank, n, iters;
    double ms; /* wall ms per call */
} ar_job;

/* One rank's share of the all-reduce timing: warm-up, then iters calls. */
static void *ar_rank(void *arg)
{
    ar_job *j = arg;
    tdm_cuda_use_device(j->rank);
    tdm_backend *be = tp_bes[j->rank];
    float *buf = be->alloc(be->ctx, (size_t)j->n * sizeof(float));
    if (!buf)
        die("all-reduce buffer", "out of device memory");
    for (int i = 0; i < 5; i++)
        tp_comms[j->rank]->all_reduce_sum(tp_comms[j->rank]->ctx, buf, (size_t)j->n);
    be->sync(be->ctx);
    double t0 = bench_now();
    for (int i = 0; i < j->iters; i++)
        tp_comms[j->rank]->all_reduce_sum(tp_comms[j->rank]->ctx, buf, (size_t)j->n);
    be->sync(be->ctx);
    j->ms = (bench_now() - t0) * 1e3 / j->iters;
    be->free(be->ctx, buf);
    return NULL;
}

/* The all-reduce of a step's residual (rows x hidden floats), each rank on
 * its thread; NCCL's bus bandwidth convention: 2 (N-1)/N x bytes / time. */
static void time_all_reduce(int hidden, const int *rows, int nrows)
{
    printf("\nNCCL all-reduce of a step's residual over %d rank(s) (a step makes one a "
           "sublayer and one for the embedding):\n\n| rows | floats | µs a call | bus GB/s "
           "|\n|---|---|---|---|\n",
           tp);
    for (int i = 0; i < nrows; i++) {
        const int n = rows[i] * hidden;
        ar_job jobs[8];
        pthread_t th[8];
        for (int r = 0; r < tp; r++) {
            jobs[r] = (ar_job){r, n, 200, 0};
            pthread_create(&th[r], NULL, ar_rank, &jobs[r]);
        }
        double ms = 0;
        for (int r = 0; r < tp; r++) {
            pthread_join(th[r], NULL);
            ms = jobs[r].ms > ms ? jobs[r].ms : ms;
        }
        const double bytes = (double)n * sizeof(float) * 2.0 * (tp - 1) / tp;
        printf("| %d | %d | %.1f | %.1f |\n", rows[i], n, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
    }
    tdm_cuda_use_device(0);
}
#endif

/* Sets the environment of one variant: space-separated KEY=VALUE pairs. */
static void set_variant(const char *v)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", v);
    for (char *save = NULL, *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv)
            die("a variant is KEY=VALUE pairs, not", kv);
        *eq = 0;
        setenv(kv, eq + 1, 1);
    }
}

int main(int argc, char **argv)
{
    const char *sh = "0.8b", *dir = "/tmp/tandem_cuda_bench", *batches = "1,8",
               *ks_arg = "0,4,8,16", *drafts_arg = "", *prefill_arg = "";
    const char *outs = "logits", *variants = "", *model_dir = NULL;
    const char *leads_arg = "1", *between = NULL;
    int steps = 20, stats = 0, graphs = 1, draft_vocab = 0, header = 0, fp8 = 0;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--stats")) {
            stats = 1;
            i--;
            continue;
        }
        if (i + 1 >= argc)
            die("missing value for", argv[i]);
        if (!strcmp(argv[i], "--shape"))
            sh = argv[i + 1];
        else if (!strcmp(argv[i], "--dir"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--model"))
            model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--batch"))
            batches = argv[i + 1];
        else if (!strcmp(argv[i], "--draft"))
            drafts_arg = argv[i + 1];
        else if (!strcmp(argv[i], "--draft-lead"))
            leads_arg = argv[i + 1];
        else if (!strcmp(argv[i], "--between"))
            between = argv[i + 1];
        else if (!strcmp(argv[i], "--draft-vocab"))
            draft_vocab = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--weights")) {
            if (strcmp(argv[i + 1], "fp8") != 0 && strcmp(argv[i + 1], "checkpoint") != 0)
                die("--weights takes checkpoint or fp8, not", argv[i + 1]);
            fp8 = !strcmp(argv[i + 1], "fp8");
        } else if (!strcmp(argv[i], "--k"))
            ks_arg = argv[i + 1];
        else if (!strcmp(argv[i], "--prefill"))
            prefill_arg = argv[i + 1];
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--context")) {
            context = atoi(argv[i + 1]);
            if (context < 1 || context > 1 << 20)
                die("--context takes positions from 1 to 1048576, not", argv[i + 1]);
        } else if (!strcmp(argv[i], "--variants"))
            variants = argv[i + 1];
        else if (!strcmp(argv[i], "--strategy")) {
            const int st = tdm_state_strategy_parse(argv[i + 1]);
            if (st < 0)
                die("--strategy takes extra_buffer, no_buffer or replay, not", argv[i + 1]);
            strategy = (tdm_state_strategy)st;
        } else if (!strcmp(argv[i], "--graphs")) {
            if (strcmp(argv[i + 1], "on") != 0 && strcmp(argv[i + 1], "off") != 0)
                die("--graphs takes on or off, not", argv[i + 1]);
            graphs = !strcmp(argv[i + 1], "on");
        } else if (!strcmp(argv[i], "--tp")) {
#ifdef TANDEM_HAVE_NCCL
            tp = atoi(argv[i + 1]);
            if (tp < 1 || tp > 8)
                die("--tp takes 1 to 8 ranks, not", argv[i + 1]);
#else
            die("--tp needs a build with NCCL", NULL);
#endif
        } else if (!strcmp(argv[i], "--out")) {
            if (strcmp(argv[i + 1], "logits") != 0 && strcmp(argv[i + 1], "argmax") != 0 &&
                strcmp(argv[i + 1], "logits,argmax") != 0)
                die("--out takes logits, argmax or logits,argmax, not", argv[i + 1]);
            outs = argv[i + 1];
        } else
            die("unknown option", argv[i]);
    }
#ifdef TANDEM_HAVE_NCCL
    if (tp > 0 && variants[0])
        die("--tp runs one configuration: drop --variants", NULL);
#endif
    int ks[8], bs[8], dks[8];
    const int nks = bench_ints(ks_arg, ks, 8, 0, 16), nbs = bench_ints(batches, bs, 8, 1, 64);
    const int ndk = drafts_arg[0] ? bench_ints(drafts_arg, dks, 8, 1, 16) : 0;
    int leads[2];
    const int nlead = bench_ints(leads_arg, leads, 2, 1, 2);
    if (nlead < 0)
        die("--draft-lead takes 1 or 2 lead rows (a list: 1,2), not", leads_arg);
    int pns[8];
    const int npn = prefill_arg[0] ? bench_ints(prefill_arg, pns, 8, 1, 65536) : 0;
    if (nks < 0 || nbs < 0 || ndk < 0 || npn < 0)
        die("--k takes 0 (decode) to 16, --draft 1 to 16, --batch 1 to 64, --prefill 1 to 65536",
            NULL);
    const bench_shape *s = NULL;
    s = bench_shape_find(sh);
    if (!s)
        die("unknown --shape (0.8b, 4b or 27b)", sh);
    if (steps < 1)
        steps = 1;
    char why[160];
    if (tdm_cuda_device_count(why, sizeof(why)) == 0) {
        printf("cuda_bench: skipped: %s\n", why);
        return 0;
    }
    double t0 = bench_now();
    char werr[700];
    if (model_dir) {
        dir = model_dir;
        printf("checkpoint %s (the %s shape's name in the table)\n", dir, s->name);
    } else {
        if (bench_write_model(dir, s, werr, sizeof(werr)) != 0)
            die("random checkpoint", werr);
        printf("random Qwen3.5-%s-shaped bf16 checkpoint written in %.1f s\n", s->name,
               bench_now() - t0);
    }
    tdm_error err;
    tdm_backend *be = NULL;
    tdm_model *m = NULL, *target = NULL;
    double floor_ms = 0;
    /* Variants: ';'-separated environments, each loaded afresh (the
     * backend reads its environment when created); "" is the default. */
    char vbuf[2048];
    snprintf(vbuf, sizeof(vbuf), "%s", variants);
    char *vsave = NULL, *variant = strtok_r(vbuf, ";", &vsave);
    const char *vname = variant ? variant : "default";
    do {
        if (variant)
            set_variant(variant);
        if (!(be = tdm_backend_cuda_create(0, &err)))
            die("CUDA backend", err.msg);
        t0 = bench_now();
#ifdef TANDEM_HAVE_NCCL
        if (tp > 0) { /* a group: rank r on device r */
            if (tdm_cuda_device_count(NULL, 0) < tp)
                die("--tp: fewer CUDA devices than ranks", NULL);
            tp_bes[0] = be;
            for (int r = 1; r < tp; r++)
                if (!(tp_bes[r] = tdm_backend_cuda_create(r, &err)))
                    die("CUDA backend of a rank", err.msg);
            tdm_cuda_use_device(0);
            if (tdm_comm_nccl_group(tp_bes, tp, tp_comms, &err) != TDM_OK ||
                tdm_model_load_group(dir, tp, tp_bes, tp_comms, bind_device, NULL, &m, &err) !=
                    TDM_OK)
                die("tensor-parallel group", err.msg);
            printf("tensor parallel over %d CUDA device(s), NCCL %d\n", tp,
                   tdm_comm_nccl_version());
        } else
#endif
            if (tdm_model_load(dir, be, &m, &err) != TDM_OK)
            die("load", err.msg);
        tdm_model_set_graphs(m, graphs);
        if (fp8) {
            int nc = 0, nk = 0;
            if (tdm_model_set_weights_fp8(m, &nc, &nk, &err) != TDM_OK)
                die("--weights fp8", err.msg);
            if (floor_ms == 0)
                printf("FP8 weights: %d matrices rounded, %d kept\n", nc, nk);
        }
        if (between && ndk > 0) { /* only the draft rows run it */
            if (tdm_model_load(between, be, &target, &err) != TDM_OK)
                die("--between", err.msg);
            tdm_model_set_graphs(target, graphs);
            if (floor_ms == 0)
                printf("each chain's row again after a verify step of %s's (%.3f GB of weights)\n",
                       between, (double)tdm_model_weight_bytes(target) / 1e9);
        }
        if (draft_vocab > 0) {
            const int V = tdm_model_get_config(m)->vocab_size;
            int32_t *ids = malloc((size_t)V * sizeof(int32_t));
            for (int t = 0; t < V; t++)
                ids[t] = t;
            if (tdm_model_set_draft_vocab(m, ids, draft_vocab, &err) != TDM_OK)
                die("--draft-vocab", err.msg);
            free(ids);
            if (floor_ms == 0)
                printf("drafting from the token ids 0..%d (of %d): the LM head streams %d rows\n",
                       draft_vocab - 1, V, draft_vocab);
        }
        if (floor_ms == 0) {
            const double load_s = bench_now() - t0;
            printf("loaded onto the GPU in %.1f s (%.2f GB/s of weights); CUDA graphs %s\n", load_s,
                   (double)tdm_model_weight_bytes(m) / load_s / 1e9, graphs ? "on" : "off");
            double bw = tdm_cuda_copy_bandwidth(0, (size_t)1 << 30);
            double wb = (double)tdm_model_weight_bytes(m);
            floor_ms = wb / bw * 1e3;
            printf("weights streamed per step: %.3f GB; device copy bandwidth %.0f GB/s "
                   "(read+write); floor %.3f ms; state strategy %s\n",
                   wb / 1e9, bw / 1e9, floor_ms, tdm_state_strategy_name(strategy));
            if (context)
                printf("every timed step starts from %d positions (forks of prefilled "
                       "sequences), timed from an idle device to the end of its commit\n",
                       context);
        }
        for (int i = 0; i < npn; i++)
            time_prefill(be, m, pns[i], steps, vname);
        if (!header) {
            header = 1;
            printf("\n| variant | to host | shape | batch | step | median ms | x floor | tokens/s "
                   "(rows) |\n|---|---|---|---|---|---|---|---|\n");
        }
        for (int argmax_only = 0; argmax_only < 2; argmax_only++) {
            if (!strstr(outs, argmax_only ? "argmax" : "logits"))
                continue;
            for (int bi = 0; bi < nbs; bi++) {
                const int batch = bs[bi];
                for (int i = 0; i < nks; i++) {
                    double ms = time_step(be, m, batch, ks[i], steps, argmax_only);
                    char step[32];
                    if (ks[i] == 0)
                        snprintf(step, sizeof(step), "decode");
                    else
                        snprintf(step, sizeof(step), "verify k=%d", ks[i]);
                    printf("| %s | %s | %s | %d | %s | %.3f | %.2f | %.0f |\n", vname,
                           argmax_only ? "argmax" : "logits", s->name, batch, step, ms,
                           ms / floor_ms, batch * (ks[i] + 1) / ms * 1e3);
                    fflush(stdout);
                }
                for (int i = 0; argmax_only && i < ndk * nlead * (target ? 2 : 1); i++) {
                    const int j = i % (ndk * nlead), dk = dks[j / nlead], nl = leads[j % nlead];
                    tdm_model *tm = i >= ndk * nlead ? target : NULL;
                    double ms = time_draft(m, tm, batch, nl, dk, steps);
                    char lead[48] = "";
                    snprintf(lead, sizeof(lead), "%s%s", nl > 1 ? " after 2" : "",
                             tm ? ", after a verify" : "");
                    printf(
                        "| %s | drafts | %s | %d | draft k=%d%s + commit | %.3f (%.3f a draft) | "
                        "%.2f a draft | %.0f |\n",
                        vname, s->name, batch, dk, lead, ms, ms / dk, ms / dk / floor_ms,
                        batch * dk / ms * 1e3);
                    fflush(stdout);
                }
            }
        }
        variant = strtok_r(NULL, ";", &vsave);
        if (variant) {
            vname = variant;
            if (target)
                tdm_model_destroy(target);
            target = NULL;
            tdm_model_destroy(m);
            be->destroy(be);
        }
    } while (variant);
#ifdef TANDEM_HAVE_NCCL
    if (tp > 0) {
        const int rows[] = {1, 8, 9, 72, 128};
        time_all_reduce(s->H, rows, 5);
    }
#endif
    tdm_cuda_graph_stats gs;
    tdm_cuda_graph_stats_get(be, &gs);
    printf("\ngraphs: %llu captured, %llu replayed, %llu refused (ran eagerly), %llu eager "
           "steps, %llu evicted\n",
           (unsigned long long)gs.captured, (unsigned long long)gs.replayed,
           (unsigned long long)gs.refused, (unsigned long long)gs.eager,
           (unsigned long long)gs.evicted);
    if (target)
        tdm_model_destroy(target);
    tdm_model_destroy(m);
#ifdef TANDEM_HAVE_NCCL
    for (int r = 0; r < tp; r++) { /* a rank's communicator before its backend */
        tp_comms[r]->destroy(tp_comms[r]);
        if (r > 0)
            tp_bes[r]->destroy(tp_bes[r]);
    }
#endif
    be->destroy(be);
    if (stats) {
        /* Where a batch-1 step's time goes: GPU time per op kind over a
         * 32-token prefill and `steps` decode steps, then the same with
         * verify k=8 steps (printed on each destroy; the prefill is the
         * same in both, so the difference is the steps'). */
        setenv("TANDEM_CUDA_OPSTATS", "1", 1);
        for (int k = 0; k <= 8; k += 8) {
            if (!(be = tdm_backend_cuda_create(0, &err)) ||
                tdm_model_load(dir, be, &m, &err) != TDM_OK)
                die("stats run", err.msg);
            double ms = time_step(be, m, 1, k, steps, 0);
            printf("\nop-stats run: batch-1 %s %.3f ms wall per step (events add a little)\n",
                   k ? "verify k=8" : "decode", ms);
            fflush(stdout);
            tdm_model_destroy(m);
            be->destroy(be);
            fflush(stderr);
        }
    }
    if (model_dir)
        return 0;
    char p[700];
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
    return 0;
}
#endif
