/*
 * test_tp.c - the tensor-parallel forward pass (engine/shard.h) on CUDA
 * backends joined by NCCL (kernels/cuda/comm_nccl.h).
 *
 *  1. One rank on device 0: a fixture loaded as rank 0 of 1 through an NCCL
 *     communicator runs the step script (tests/engine/steps.c) to the bits
 *     and final states of the whole model (the all-reduces and the gather
 *     of one rank move nothing, so any difference is the rank's own code
 *     path or the collectives' ordering on the stream), its steps recorded
 *     and replayed as CUDA graphs with the collectives in them.
 *  2. Every visible GPU the model splits over (two, where lent): one rank a
 *     device, each on its own thread; every rank's logits the same bits,
 *     within 1e-4 relative of the whole model's, the same argmax.
 *
 * One line per check. Without a GPU: "skipped: no CUDA device", exit 77;
 * part 2 says so and passes where only one device is visible.
 */
#include "comm_nccl.h"
#include "cuda_test.h"
#include "steps.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <string.h>

#define MAX_RANKS 8

static void part_one(const char *name)
{
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/%s/model", TANDEM_ENGINE_FIXTURES, name);
    tdm_backend *be = ct_gpu();
    tdm_error err;
    tdm_model *whole;
    CHECK(tdm_model_load(dir, be, &whole, &err) == TDM_OK, "%s: %s", name, err.msg);
    steps_run a;
    steps_run_script(whole, &a);

    tdm_backend *rb = ct_gpu();
    tdm_comm *comm;
    CHECK(tdm_comm_nccl_group(&rb, 1, &comm, &err) == TDM_OK, "%s", err.msg);
    tdm_model *rank;
    CHECK(tdm_model_load_rank(dir, rb, comm, &rank, &err) == TDM_OK, "%s: %s", name, err.msg);
    steps_run b;
    steps_run_script(rank, &b);
    CHECK(a.n == b.n && a.calls == b.calls, "%s: the runs differ in length", name);
    CHECK(memcmp(a.logits, b.logits, a.n * sizeof(float)) == 0,
          "%s: rank 0 of 1 gives other logits than the whole model", name);
    for (int i = 0; i < STEPS_NSEQ; i++)
        CHECK(steps_same_state(a.seqs[i], b.seqs[i]), "%s: sequence %d: states differ", name, i);
    /* the rank's steps, collectives and all, went through CUDA graphs */
    tdm_cuda_graph_stats gs;
    tdm_cuda_graph_stats_get(rb, &gs);
    CHECK(gs.captured > 0 && gs.replayed > 0,
          "%s: the rank's steps were not recorded as graphs "
          "(%llu captured, %llu replayed)",
          name, (unsigned long long)gs.captured, (unsigned long long)gs.replayed);
    printf("%-12s rank 0 of 1 over NCCL: %d calls (%llu steps captured as graphs, %llu "
           "replayed), logits and states identical to the whole model's\n",
           name, a.calls, (unsigned long long)gs.captured, (unsigned long long)gs.replayed);
    steps_run_free(&a);
    steps_run_free(&b);
    tdm_model_destroy(rank);
    comm->destroy(comm);
    rb->destroy(rb);
    tdm_model_destroy(whole);
    be->destroy(be);
}

typedef struct rank_job {
    const char *dir;
    int device;
    tdm_backend *be;
    tdm_comm *comm;
    steps_run run;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    CHECK(cudaSetDevice(j->device) == cudaSuccess, "cudaSetDevice(%d)", j->device);
    tdm_model *m;
    tdm_error err;
    CHECK(tdm_model_load_rank(j->dir, j->be, j->comm, &m, &err) == TDM_OK, "rank %d: %s",
          j->comm->rank, err.msg);
    steps_run_script(m, &j->run);
    for (int i = 0; i < STEPS_NSEQ; i++) { /* the logits outlive the model, the sequences not */
        tdm_seq_destroy(j->run.seqs[i]);
        j->run.seqs[i] = NULL;
    }
    tdm_model_destroy(m);
    return NULL;
}

static void part_two(const char *name)
{
    int n = tdm_cuda_device_count(NULL, 0);
    if (n > MAX_RANKS)
        n = MAX_RANKS;
    if (n < 2) {
        printf("%-12s split over GPUs: one device visible, not run\n", name);
        return;
    }
    n = 2; /* the fixtures split in two */
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/%s/model", TANDEM_ENGINE_FIXTURES, name);
    tdm_error err;
    tdm_backend *bes[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        bes[r] = tdm_backend_cuda_create(r, &err);
        CHECK(bes[r], "device %d: %s", r, err.msg);
    }
    tdm_comm *comms[MAX_RANKS];
    CHECK(tdm_comm_nccl_group(bes, n, comms, &err) == TDM_OK, "%s", err.msg);
    rank_job jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r] = (rank_job){.dir = dir, .device = r, .be = bes[r], .comm = comms[r]};
        CHECK(pthread_create(&th[r], NULL, rank_main, &jobs[r]) == 0, "pthread_create");
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
        CHECK(cudaSetDevice(r) == cudaSuccess, "cudaSetDevice(%d)", r);
        comms[r]->destroy(comms[r]);
        bes[r]->destroy(bes[r]);
    }
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    tdm_backend *be = ct_gpu();
    tdm_model *whole;
    CHECK(tdm_model_load(dir, be, &whole, &err) == TDM_OK, "%s: %s", name, err.msg);
    steps_run w;
    steps_run_script(whole, &w);
    for (int r = 1; r < n; r++)
        CHECK(jobs[r].run.n == jobs[0].run.n &&
                  memcmp(jobs[r].run.logits, jobs[0].run.logits, w.n * sizeof(float)) == 0,
              "%s: rank %d's logits differ from rank 0's", name, r);
    CHECK(jobs[0].run.n == w.n, "%s: the runs differ in length", name);
    const int V = tdm_model_get_config(whole)->vocab_size;
    const float scale = max_abs(w.logits, w.n), d = max_abs_diff(jobs[0].run.logits, w.logits, w.n);
    int bad = 0;
    for (size_t i = 0; i < w.n / (size_t)V; i++)
        bad += argmax_row(jobs[0].run.logits + i * (size_t)V, V) !=
               argmax_row(w.logits + i * (size_t)V, V);
    printf("%-12s split over %d GPUs: max|d| against whole = %.3g (tol %.3g), argmax "
           "mismatches %d\n",
           name, n, (double)d, (double)(1e-4f * scale), bad);
    CHECK(d <= 1e-4f * scale && bad == 0, "%s: the split model differs from the whole", name);
    for (int r = 0; r < n; r++)
        steps_run_free(&jobs[r].run);
    steps_run_free(&w);
    tdm_model_destroy(whole);
    be->destroy(be);
}

int main(void)
{
    ct_require_gpu();
    const char *names[] = {"f32_gqa", "bf16_alt", "f32_tied"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        part_one(names[i]);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        part_two(names[i]);
    printf("cuda tensor parallel: OK\n");
    return 0;
}
