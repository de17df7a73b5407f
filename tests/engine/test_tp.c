/*
 * test_tp.c - a model split over ranks (tensor parallel, engine/shard.h),
 * each rank a CPU backend on its own thread joined by the in-process
 * communicator (kernels/comm.h), against the whole model and transformers.
 *
 *  - Fixtures split in two: rank 0's logits of the fixture's calls against
 *    transformers' with test_fixtures.c's tolerances, and the verify path
 *    giving the cached path's bits.
 *  - The step script (steps.c: prompt chunks, decode past the KV growth,
 *    verify and commit under all three strategies, drafting, changing
 *    batches): every rank's logits the same bits as every other rank's,
 *    and within 1e-4 relative of the whole model's (the partial sums add up
 *    in another order) with the same argmax on every row.
 *  - The demo target split in 2 and in 4 (4 ranks: its 2 KV heads
 *    replicated over pairs of ranks), and as rank 0 of 1 (the whole
 *    model's bits).
 *  - Splits the model's counts do not allow are refused, naming the count.
 *  - A rank reads only its slices: its weight bytes are the whole model's
 *    divided by the ranks (the norms excepted).
 */
#include "alloc.h"
#include "comm.h"
#include "shard.h"
#include "snapshot.h"
#include "steps.h"
#include "util.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 8

typedef struct rank_job {
    const char *dir;
    tdm_comm *comm;
    const fixture *f; /* NULL: the step script only */
    steps_run run;
    float *fixture_logits; /* the fixture's calls (extra_buffer) */
    size_t weight_bytes;
    int vocab;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    tdm_backend *be = tdm_backend_cpu_create(1);
    CHECK(be, "cannot create the CPU backend");
    tdm_model *m;
    tdm_error err;
    CHECK(tdm_model_load_rank(j->dir, be, j->comm, &m, &err) == TDM_OK, "rank %d of %s: %s",
          j->comm->rank, j->dir, err.msg);
    const tdm_model_config *c = tdm_model_get_config(m);
    CHECK(c->tp_size == j->comm->size, "rank config: tp_size %d", c->tp_size);
    j->vocab = c->vocab_size;
    j->weight_bytes = tdm_model_weight_bytes(m);
    if (j->f) {
        j->fixture_logits = fixture_run(m, j->f, TDM_STATE_EXTRA_BUFFER);
        fixture_check_verify_path(m, j->f, j->fixture_logits);
    }
    steps_run_script(m, &j->run);
    for (int i = 0; i < STEPS_NSEQ; i++) { /* the logits outlive the model, the sequences not */
        tdm_seq_destroy(j->run.seqs[i]);
        j->run.seqs[i] = NULL;
    }
    tdm_model_destroy(m);
    be->destroy(be);
    return NULL;
}

/* Runs every rank of `dir` split in n; jobs[r] holds rank r's results. */
static void run_ranks(const char *dir, int n, const fixture *f, rank_job *jobs)
{
    tdm_comm *comms[MAX_RANKS];
    tdm_error err;
    CHECK(tdm_comm_local_group(n, comms, &err) == TDM_OK, "%s", err.msg);
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r] = (rank_job){.dir = dir, .comm = comms[r], .f = f};
        CHECK(pthread_create(&th[r], NULL, rank_main, &jobs[r]) == 0, "pthread_create");
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        comms[r]->destroy(comms[r]);
}

static void jobs_free(rank_job *jobs, int n)
{
    for (int r = 0; r < n; r++) {
        steps_run_free(&jobs[r].run);
        free(jobs[r].fixture_logits);
    }
}

/* The whole model's step script, and its weight bytes. */
static void run_whole(const char *dir, steps_run *run, size_t *weight_bytes)
{
    tdm_backend *be = tdm_backend_cpu_create(1);
    CHECK(be, "cannot create the CPU backend");
    tdm_model *m;
    tdm_error err;
    CHECK(tdm_model_load(dir, be, &m, &err) == TDM_OK, "%s: %s", dir, err.msg);
    *weight_bytes = tdm_model_weight_bytes(m);
    steps_run_script(m, run);
    for (int i = 0; i < STEPS_NSEQ; i++) {
        tdm_seq_destroy(run->seqs[i]);
        run->seqs[i] = NULL;
    }
    tdm_model_destroy(m);
    be->destroy(be);
}

/* The ranks' step scripts against each other (bits) and the whole model's. */
static void check_against_whole(const char *name, const char *dir, int n, rank_job *jobs)
{
    steps_run whole;
    size_t whole_bytes;
    run_whole(dir, &whole, &whole_bytes);
    for (int r = 1; r < n; r++) {
        CHECK(jobs[r].run.n == jobs[0].run.n, "%s/%d: rank %d made %zu logits, rank 0 %zu", name, n,
              r, jobs[r].run.n, jobs[0].run.n);
        CHECK(memcmp(jobs[r].run.logits, jobs[0].run.logits, jobs[0].run.n * sizeof(float)) == 0,
              "%s/%d: rank %d's logits differ from rank 0's", name, n, r);
    }
    CHECK(jobs[0].run.n == whole.n, "%s/%d: %zu logits against the whole model's %zu", name, n,
          jobs[0].run.n, whole.n);
    /* A rank of one adds its update in place and sums over itself: the
     * whole model's bits. */
    CHECK(n > 1 || memcmp(jobs[0].run.logits, whole.logits, whole.n * sizeof(float)) == 0,
          "%s: rank 0 of 1 differs from the whole model", name);
    const int V = jobs[0].vocab;
    const float scale = max_abs(whole.logits, whole.n);
    const float d = max_abs_diff(jobs[0].run.logits, whole.logits, whole.n);
    int bad = 0;
    const size_t rows = whole.n / (size_t)V;
    for (size_t i = 0; i < rows; i++)
        bad += argmax_row(jobs[0].run.logits + i * (size_t)V, V) !=
               argmax_row(whole.logits + i * (size_t)V, V);
    printf("%-14s tp %d: step script %zu rows, max|d| against whole = %.3g (tol %.3g), argmax "
           "mismatches %d\n",
           name, n, rows, (double)d, (double)(1e-4f * scale), bad);
    CHECK(d <= 1e-4f * scale, "%s/%d: max|tp - whole| = %g > 1e-4 x %g", name, n, (double)d,
          (double)scale);
    CHECK(bad == 0, "%s/%d: argmax differs from the whole model's on %d rows", name, n, bad);
    /* A rank reads only its slices: every matrix splits in n (the norms,
     * A_log and dt_bias vectors aside, which are ~1/H of a layer). */
    size_t sum = 0;
    for (int r = 0; r < n; r++)
        sum += jobs[r].weight_bytes;
    CHECK(jobs[0].weight_bytes < whole_bytes / (size_t)n + whole_bytes / 20,
          "%s/%d: rank 0 holds %zu of the whole model's %zu weight bytes", name, n,
          jobs[0].weight_bytes, whole_bytes);
    CHECK(sum >= whole_bytes, "%s/%d: the ranks hold %zu bytes, less than the whole %zu", name, n,
          sum, whole_bytes);
    steps_run_free(&whole);
}

/* One decode step of token t on s: its logits (malloc). */
static float *decode_one(tdm_seq *s, int V, int32_t t)
{
    float *lg = tdm_xmalloc((size_t)V * sizeof(float));
    tdm_error err;
    tdm_seq *one[1] = {s};
    CHECK(tdm_seq_decode(one, 1, &t, lg, &err) == TDM_OK, "decode: %s", err.msg);
    return lg;
}

static tdm_seq *imported(tdm_model *m, const tdm_snap_layout *l, const uint8_t *payload)
{
    tdm_seq_params p = {TDM_STATE_EXTRA_BUFFER, 4, 0};
    tdm_seq *s;
    tdm_error err;
    CHECK(tdm_seq_from_snapshot(m, &p, "fp", l, payload, &s, &err) == TDM_OK, "import: %s",
          err.msg);
    CHECK(tdm_seq_length(s) == (int)l->committed, "import: length %d, not %u", tdm_seq_length(s),
          l->committed);
    return s;
}

/* Snapshots of a split model are in the whole model's layout, so they move
 * between it and the whole model both ways: a group's sequence taken and put
 * back into the group decodes to the same bits, and into the whole model (or
 * the whole model's into the group) within the split's rounding. */
static void check_snapshots(const char *name, const char *dir, tdm_model *gm, tdm_seq *gs)
{
    tdm_backend *be = tdm_backend_cpu_create(1);
    tdm_model *wm;
    tdm_error err;
    CHECK(tdm_model_load(dir, be, &wm, &err) == TDM_OK, "%s", err.msg);
    const int V = tdm_model_get_config(wm)->vocab_size, n = tdm_seq_length(gs);
    int32_t *toks = tdm_xcalloc((size_t)n + 1, sizeof(int32_t));
    tdm_snap_layout l;
    uint8_t *payload;
    CHECK(tdm_seq_snapshot(gs, "fp", toks, n, &l, &payload, &err) == TDM_OK, "%s: %s", name,
          err.msg);
    tdm_seq *back = imported(gm, &l, payload), *whole = imported(wm, &l, payload);
    const int32_t t = 7 % V;
    float *a = decode_one(gs, V, t), *b = decode_one(back, V, t), *c = decode_one(whole, V, t);
    CHECK(memcmp(a, b, (size_t)V * sizeof(float)) == 0,
          "%s: a group's snapshot put back decodes to other logits", name);
    const float tol = 1e-4f * max_abs(c, (size_t)V);
    CHECK(max_abs_diff(a, c, (size_t)V) <= tol && argmax_row(a, V) == argmax_row(c, V),
          "%s: the group's snapshot in the whole model: max|d| %g > %g", name,
          (double)max_abs_diff(a, c, (size_t)V), (double)tol);
    /* the whole model's snapshot into the group */
    tdm_snap_layout l2;
    uint8_t *p2;
    CHECK(tdm_seq_snapshot(whole, "fp", toks, n, &l2, &p2, &err) != TDM_OK,
          "%s: a snapshot needs all the committed tokens", name);
    int32_t *toks2 = tdm_xcalloc((size_t)n + 2, sizeof(int32_t));
    CHECK(tdm_seq_snapshot(whole, "fp", toks2, n + 1, &l2, &p2, &err) == TDM_OK, "%s", err.msg);
    tdm_seq *into = imported(gm, &l2, p2);
    float *d = decode_one(whole, V, t), *e = decode_one(into, V, t);
    CHECK(max_abs_diff(d, e, (size_t)V) <= 1e-4f * max_abs(d, (size_t)V) &&
              argmax_row(d, V) == argmax_row(e, V),
          "%s: the whole model's snapshot in the group: max|d| %g", name,
          (double)max_abs_diff(d, e, (size_t)V));
    printf("%-14s tp %d: snapshots %u positions, %llu bytes: group -> group the same bits, "
           "group <-> whole max|d| %.3g / %.3g\n",
           name, tdm_model_get_config(gm)->tp_size, l.committed, (unsigned long long)l.total_bytes,
           (double)max_abs_diff(a, c, (size_t)V), (double)max_abs_diff(d, e, (size_t)V));
    free(a), free(b), free(c), free(d), free(e);
    free(toks), free(toks2);
    free(payload), free(p2);
    tdm_snap_layout_free(&l);
    tdm_snap_layout_free(&l2);
    tdm_seq_destroy(back);
    tdm_seq_destroy(into);
    tdm_seq_destroy(whole);
    tdm_model_destroy(wm);
    be->destroy(be);
}

/* The same split behind one model's API (tdm_model_load_group), driven
 * from this thread: the step script's logits are the bits the ranks made on
 * their own threads; what a group cannot do yet is refused. */
static void check_group(const char *name, const char *dir, int n, const rank_job *jobs)
{
    tdm_comm *comms[MAX_RANKS];
    tdm_backend *bes[MAX_RANKS];
    tdm_error err;
    CHECK(tdm_comm_local_group(n, comms, &err) == TDM_OK, "%s", err.msg);
    for (int r = 0; r < n; r++)
        bes[r] = tdm_backend_cpu_create(1);
    tdm_model *m;
    CHECK(tdm_model_load_group(dir, n, bes, comms, NULL, NULL, &m, &err) == TDM_OK, "%s: %s", name,
          err.msg);
    CHECK(tdm_model_get_config(m)->tp_size == n, "%s: the group's config is not a rank's", name);
    CHECK(tdm_model_weight_bytes(m) == jobs[0].weight_bytes,
          "%s: the group's weight bytes are not a rank's", name);
    steps_run g;
    steps_run_script(m, &g);
    CHECK(g.n == jobs[0].run.n && g.calls == jobs[0].run.calls &&
              memcmp(g.logits, jobs[0].run.logits, g.n * sizeof(float)) == 0,
          "%s/%d: the group's logits differ from the ranks' own", name, n);
    tdm_seq_memory mem;
    tdm_seq_memory_usage(g.seqs[0], &mem);
    CHECK(mem.recurrent_bytes > 0 && mem.kv_bytes > 0, "%s: a group sequence's memory", name);
    check_snapshots(name, dir, m, g.seqs[0]);
    /* a refused call leaves the group usable */
    int32_t bad = 1 << 30;
    tdm_seq *s1[1] = {g.seqs[0]};
    CHECK(tdm_seq_decode(s1, 1, &bad, NULL, &err) == TDM_ERR_INVALID_ARGUMENT,
          "%s: a bad token id is not refused", name);
    int32_t ok = 1;
    CHECK(tdm_seq_decode(s1, 1, &ok, NULL, &err) == TDM_OK, "%s: %s", name, err.msg);
    printf("%-14s tp %d: the group's step script matches the ranks' bits\n", name, n);
    steps_run_free(&g);
    tdm_model_destroy(m);
    for (int r = 0; r < n; r++) {
        comms[r]->destroy(comms[r]);
        bes[r]->destroy(bes[r]);
    }
}

static void check_fixture(const char *name)
{
    fixture f;
    fixture_load(&f, name);
    rank_job jobs[2];
    run_ranks(f.model, 2, &f, jobs);
    const int V = jobs[0].vocab;
    const size_t n = (size_t)f.total * (size_t)V;
    char p[700];
    int64_t rows, cols;
    /* fp32 arithmetic: against the fp32 reference (f32up for bf16). */
    snprintf(p, sizeof(p), "%s/%s.npy", f.dir,
             strcmp(f.dtype, "bfloat16") == 0 ? "f32up" : "cached");
    float *ref = npy_load2(p, &rows, &cols);
    CHECK(rows == f.total && cols == V, "%s: reference shape", name);
    const float scale = max_abs(ref, n), d = max_abs_diff(jobs[0].fixture_logits, ref, n);
    int bad = 0;
    for (int r = 0; r < f.total; r++)
        bad += argmax_row(jobs[0].fixture_logits + (size_t)r * V, V) !=
               argmax_row(ref + (size_t)r * V, V);
    printf("%-14s tp 2: against transformers max|d|=%.3g tol=%.3g argmax mismatches=%d/%d\n", name,
           (double)d, (double)(1e-4f * scale), bad, f.total);
    CHECK(d <= 1e-4f * scale, "%s: max|tp - transformers| = %g > %g", name, (double)d,
          (double)(1e-4f * scale));
    CHECK(bad == 0, "%s: argmax differs from transformers at %d positions", name, bad);
    CHECK(memcmp(jobs[1].fixture_logits, jobs[0].fixture_logits, n * sizeof(float)) == 0,
          "%s: rank 1's fixture logits differ from rank 0's", name);
    free(ref);
    check_against_whole(name, f.model, 2, jobs);
    check_group(name, f.model, 2, jobs);
    jobs_free(jobs, 2);
    fixture_free(&f);
}

static void check_refused(const char *dir, int n, const char *names)
{
    tdm_comm *comms[MAX_RANKS];
    tdm_error err;
    CHECK(tdm_comm_local_group(n, comms, &err) == TDM_OK, "%s", err.msg);
    tdm_backend *be = tdm_backend_cpu_create(1);
    tdm_model *m = NULL;
    /* The refusal comes from the config, before any collective. */
    tdm_status rc = tdm_model_load_rank(dir, be, comms[0], &m, &err);
    CHECK(rc == TDM_ERR_INVALID_ARGUMENT && m == NULL, "%s split in %d: not refused", dir, n);
    CHECK(strstr(err.msg, names) != NULL, "%s split in %d: '%s' does not name %s", dir, n, err.msg,
          names);
    printf("refused: %s\n", err.msg);
    be->destroy(be);
    for (int r = 0; r < n; r++)
        comms[r]->destroy(comms[r]);
}

/* The split of the released shapes the services would run at scale
 * (hybrid-model-notes.md): Qwen3.5-4B and Qwen3.6-27B over 2, 4 and 8 ranks,
 * the slices every rank gets, and the counts that refuse. */
static void check_shapes(void)
{
    tdm_model_config c27 = {.vocab_size = 248320,
                            .hidden_size = 5120,
                            .intermediate_size = 17408,
                            .num_layers = 64,
                            .num_heads = 24,
                            .num_kv_heads = 4,
                            .head_dim = 256,
                            .lin_k_heads = 16,
                            .lin_v_heads = 48,
                            .lin_k_dim = 128,
                            .lin_v_dim = 128,
                            .conv_kernel = 4,
                            .tp_size = 1};
    tdm_model_config c4 = c27;
    c4.hidden_size = 2560, c4.intermediate_size = 9216, c4.num_layers = 32;
    c4.num_heads = 16, c4.lin_v_heads = 32;
    const struct {
        const tdm_model_config *c;
        int n, heads, kv, k, v, mlp, vocab;
    } want[] = {
        {&c27, 2, 12, 2, 8, 24, 8704, 124160}, {&c27, 4, 6, 1, 4, 12, 4352, 62080},
        {&c27, 8, 3, 1, 2, 6, 2176, 31040},    {&c4, 2, 8, 2, 8, 16, 4608, 124160},
        {&c4, 8, 2, 1, 2, 4, 1152, 31040},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        for (int r = 0; r < want[i].n; r++) {
            tdm_model_config l;
            tdm_shard sh;
            tdm_error err;
            CHECK(tdm_shard_config(want[i].c, r, want[i].n, &l, &sh, &err) == TDM_OK, "%s",
                  err.msg);
            CHECK(l.num_heads == want[i].heads && l.num_kv_heads == want[i].kv &&
                      l.lin_k_heads == want[i].k && l.lin_v_heads == want[i].v &&
                      l.intermediate_size == want[i].mlp && sh.vocab_n == want[i].vocab &&
                      l.tp_size == want[i].n && l.vocab_size == want[i].c->vocab_size,
                  "shape %zu rank %d of %d: heads %d kv %d k %d v %d mlp %d vocab %d", i, r,
                  want[i].n, l.num_heads, l.num_kv_heads, l.lin_k_heads, l.lin_v_heads,
                  l.intermediate_size, sh.vocab_n);
            /* each rank's slices start where the ranks before it end; a
             * replicated KV head is the one its query heads read */
            const int nkv = want[i].c->num_kv_heads;
            CHECK(sh.q_head0 == r * l.num_heads && sh.k_head0 == r * l.lin_k_heads &&
                      sh.v_head0 == r * l.lin_v_heads && sh.mlp0 == r * l.intermediate_size &&
                      sh.vocab0 == r * sh.vocab_n &&
                      sh.kv_head0 == sh.q_head0 / (want[i].c->num_heads / nkv),
                  "shape %zu rank %d of %d: slice starts q %d kv %d k %d v %d mlp %d vocab %d", i,
                  r, want[i].n, sh.q_head0, sh.kv_head0, sh.k_head0, sh.v_head0, sh.mlp0,
                  sh.vocab0);
        }
    }
    tdm_model_config l;
    tdm_shard sh;
    tdm_error err;
    CHECK(tdm_shard_config(&c27, 0, 3, &l, &sh, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "linear_num_key_heads (16) is not a multiple of 3"),
          "27B over 3 ranks: %s", err.msg);
    CHECK(tdm_shard_config(&c27, 0, 16, &l, &sh, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "num_attention_heads (24) is not a multiple of 16"),
          "27B over 16 ranks: %s", err.msg);
    printf("released shapes: 4B and 27B split over 2, 4 and 8 ranks as expected\n");
}

int main(void)
{
    check_shapes();
    const char *fixtures[] = {"f32_gqa",     "f32_tied", "f32_odd",
                              "f32_sharded", "bf16_alt", "f16_store"};
    for (size_t i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++)
        check_fixture(fixtures[i]);
    for (int n = 1; n <= 4; n *= 2) {
        rank_job jobs[4];
        run_ranks(TANDEM_DEMO_MODEL, n, NULL, jobs);
        check_against_whole("demo-target", TANDEM_DEMO_MODEL, n, jobs);
        check_group("demo-target", TANDEM_DEMO_MODEL, n, jobs);
        jobs_free(jobs, n);
    }
    char p[600];
    snprintf(p, sizeof(p), "%s/f32_gqa/model", TANDEM_ENGINE_FIXTURES);
    check_refused(p, 4, "linear_num_key_heads (2)");
    check_refused(TANDEM_DEMO_MODEL, 3, "num_attention_heads (4)");
    snprintf(p, sizeof(p), "%s/bf16_alt/model", TANDEM_ENGINE_FIXTURES);
    check_refused(p, 3, "num_attention_heads (2)");
    printf("tensor parallel: OK\n");
    return 0;
}
