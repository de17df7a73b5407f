/*
 * runtime.c - backend selection and model loading (see runtime.h).
 *
 * `cuda` asks for the CUDA backend and fails, naming why, when the build or
 * the machine cannot provide it. `auto` takes CUDA when the build has it and
 * a device is present, else the CPU, and records which and why.
 */
#include "runtime.h"
#include "alloc.h"

#include "log.h"
#include "token_list.h"

#ifdef TANDEM_HAVE_CUDA_BACKEND
#include "cuda_backend.h"
#endif
#ifdef TANDEM_HAVE_NCCL
#include "comm_nccl.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Picks and creates the backend; fills backend_name and why. */
static tdm_status runtime_backend(tdm_runtime *rt, const char *backend, int threads, tdm_error *err)
{
    const int kind = tdm_backend_kind_parse(backend);
    const int want_cuda = kind == TDM_BACKEND_CUDA, want_auto = strcmp(backend, "auto") == 0;
    if (kind < 0 && !want_auto)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "backend=%s: expected auto, cpu or cuda", backend);
    const char *cpu_why = "set explicitly";
#ifdef TANDEM_HAVE_CUDA_BACKEND
    char why[128];
    if (want_cuda || want_auto) {
        int n = tdm_cuda_device_count(why, sizeof(why));
        if (n == 0 && want_cuda)
            return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                                 "backend=cuda: %s; use backend=cpu or auto", why);
        if (n > 0) {
            tdm_error cerr;
            rt->backend = tdm_backend_cuda_create(0, &cerr);
            if (rt->backend) {
                snprintf(rt->backend_name, sizeof(rt->backend_name), "%s",
                         tdm_backend_kind_name(TDM_BACKEND_CUDA));
                tdm_cuda_device_uuid(0, rt->device_uuid, sizeof(rt->device_uuid));
                rt->device_mps = tdm_cuda_device_mps(0) == 1;
                snprintf(rt->why, sizeof(rt->why), "%s: CUDA device 0 of %d%s",
                         want_cuda ? "set explicitly" : "auto", n,
                         rt->device_mps ? ", through an MPS server" : "");
                return TDM_OK;
            }
            if (want_cuda)
                return tdm_error_set(err, cerr.code, "backend=cuda: %s", cerr.msg);
            snprintf(why, sizeof(why), "%.100s", cerr.msg);
        }
        cpu_why = why;
    }
    char auto_why[160];
    if (want_auto) {
        snprintf(auto_why, sizeof(auto_why), "auto: %s", cpu_why);
        cpu_why = auto_why;
    }
#else
    if (want_cuda)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "backend=cuda: this build has no CUDA backend; use backend=cpu");
    if (want_auto)
        cpu_why = "auto: no CUDA backend in this build";
#endif
    snprintf(rt->backend_name, sizeof(rt->backend_name), "%s",
             tdm_backend_kind_name(TDM_BACKEND_CPU));
    if (threads <= 0)
        threads = tdm_cpu_count();
    snprintf(rt->why, sizeof(rt->why), "%s; %d worker%s", cpu_why, threads,
             threads == 1 ? "" : "s");
    rt->backend = tdm_backend_cpu_create(threads);
    if (!rt->backend)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "cannot create the CPU backend");
    return TDM_OK;
}

tdm_status tdm_runtime_open(const char *model_dir, const char *backend, int threads,
                            tdm_runtime **out, tdm_error *err)
{
    *out = NULL;
    if (!backend || !backend[0])
        backend = "auto";
    tdm_runtime *rt = tdm_xcalloc(1, sizeof(*rt));
    rt->tp = 1;
    tdm_status rc = runtime_backend(rt, backend, threads, err);
    if (rc != TDM_OK) {
        free(rt);
        return rc;
    }
    rc = tdm_model_load(model_dir, rt->backend, &rt->model, err);
    if (rc != TDM_OK) {
        rt->backend->destroy(rt->backend);
        free(rt);
        return rc;
    }
    *out = rt;
    return TDM_OK;
}

/* Frees a tensor-parallel runtime's communicators and the backends of
 * ranks 1.. (rank 0's is rt->backend). */
static void ranks_free(tdm_runtime *rt)
{
    for (int r = 0; rt->comms && r < rt->tp; r++)
        if (rt->comms[r])
            rt->comms[r]->destroy(rt->comms[r]);
    for (int r = 1; rt->rank_backends && r < rt->tp; r++)
        if (rt->rank_backends[r])
            rt->rank_backends[r]->destroy(rt->rank_backends[r]);
    free(rt->comms);
    free(rt->rank_backends);
    rt->comms = NULL;
    rt->rank_backends = NULL;
}

void tdm_runtime_graph_stats_get(const tdm_runtime *rt, tdm_runtime_graph_stats *out)
{
    memset(out, 0, sizeof(*out));
#ifdef TANDEM_HAVE_CUDA_BACKEND
    if (rt && rt->backend && strcmp(rt->backend_name, "cuda") == 0) {
        tdm_cuda_graph_stats g;
        tdm_cuda_graph_stats_get(rt->backend, &g);
        *out = (tdm_runtime_graph_stats){.captured = g.captured,
                                         .replayed = g.replayed,
                                         .refused = g.refused,
                                         .eager = g.eager,
                                         .measured = g.measured,
                                         .evicted = g.evicted};
    }
#else
    (void)rt;
#endif
}

uint64_t tdm_runtime_graph_first_sights(const tdm_runtime *rt)
{
    tdm_runtime_graph_stats g;
    tdm_runtime_graph_stats_get(rt, &g);
    return g.captured + g.refused + g.measured;
}

void tdm_runtime_close(tdm_runtime *rt)
{
    if (!rt)
        return;
    tdm_mtp_destroy(rt->mtp);
    tdm_model_destroy(rt->model);
    ranks_free(rt);
    if (rt->backend)
        rt->backend->destroy(rt->backend);
    free(rt);
}

#if defined(TANDEM_HAVE_CUDA_BACKEND) && defined(TANDEM_HAVE_NCCL)
/* A rank's thread: its device current (the CUDA backend's ops need it). */
static void bind_device(int rank, void *ctx)
{
    (void)ctx;
    tdm_cuda_use_device(rank);
}
#endif

/* A model split over n ranks: rank 0 on the backend runtime_backend picks
 * (CUDA device 0, or the CPU), rank r on CUDA device r or a CPU backend of
 * its own; the cores are shared among CPU ranks. */
static tdm_status open_group(const char *model_dir, const char *backend, int n, tdm_runtime **out,
                             tdm_error *err)
{
    const int cores = tdm_cpu_count();
    const int threads = cores / n >= 1 ? cores / n : 1;
    tdm_runtime *rt = tdm_xcalloc(1, sizeof(*rt));
    rt->tp = n;
    tdm_status rc = runtime_backend(rt, backend, threads, err);
    if (rc != TDM_OK) {
        free(rt);
        return rc;
    }
    rt->rank_backends = tdm_xcalloc((size_t)n, sizeof(*rt->rank_backends));
    rt->comms = tdm_xcalloc((size_t)n, sizeof(*rt->comms));
    rt->rank_backends[0] = rt->backend;
    const int cuda = strcmp(rt->backend_name, tdm_backend_kind_name(TDM_BACKEND_CUDA)) == 0;
    void (*bind)(int, void *) = NULL;
    if (cuda) {
#if defined(TANDEM_HAVE_CUDA_BACKEND) && defined(TANDEM_HAVE_NCCL)
        const int devices = tdm_cuda_device_count(NULL, 0);
        if (devices < n) {
            rc = tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                               "tensor_parallel %d needs %d CUDA devices, one a rank; %d found", n,
                               n, devices);
        }
        for (int r = 1; rc == TDM_OK && r < n; r++) {
            rt->rank_backends[r] = tdm_backend_cuda_create(r, err);
            if (!rt->rank_backends[r])
                rc =
                    tdm_error_prefix(err, "tensor_parallel %d: rank %d on CUDA device %d", n, r, r);
        }
        tdm_cuda_use_device(0); /* creating them moved this thread's device */
        if (rc == TDM_OK)
            rc = tdm_comm_nccl_group(rt->rank_backends, n, rt->comms, err);
        bind = bind_device;
        snprintf(rt->why + strlen(rt->why), sizeof(rt->why) - strlen(rt->why),
                 "; tensor parallel over CUDA devices 0..%d (NCCL %d)", n - 1,
                 tdm_comm_nccl_version());
#else
        rc = tdm_error_set(err, TDM_ERR_UNIMPLEMENTED,
                           "tensor_parallel %d on the cuda backend needs NCCL, which this build "
                           "lacks",
                           n);
#endif
    } else {
        for (int r = 1; rc == TDM_OK && r < n; r++) {
            rt->rank_backends[r] = tdm_backend_cpu_create(threads);
            if (!rt->rank_backends[r])
                rc = tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED,
                                   "cannot create the CPU backend of rank %d", r);
        }
        if (rc == TDM_OK)
            rc = tdm_comm_local_group(n, rt->comms, err);
        snprintf(rt->why + strlen(rt->why), sizeof(rt->why) - strlen(rt->why),
                 "; tensor parallel over %d CPU ranks of %d threads", n, threads);
    }
    if (rc == TDM_OK)
        rc = tdm_model_load_group(model_dir, n, rt->rank_backends, rt->comms, bind, NULL,
                                  &rt->model, err);
    if (rc != TDM_OK) {
        tdm_runtime_close(rt);
        return rc;
    }
    *out = rt;
    return TDM_OK;
}

tdm_status tdm_runtime_open_cfg(const tdm_cfg *cfg, const char *component, tdm_runtime **out,
                                tdm_error *err)
{
    *out = NULL;
    const char *model = tdm_cfg_str(cfg, "model");
    const char *strategy = tdm_cfg_str(cfg, "state_strategy");
    int st = tdm_state_strategy_parse(strategy);
    if (st < 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "state_strategy %s is not supported by the engine", strategy);
    tdm_runtime *rt = NULL;
    const int tp =
        tdm_cfg_has(cfg, "tensor_parallel") ? (int)tdm_cfg_int(cfg, "tensor_parallel") : 1;
    tdm_status rc = tp > 1 ? open_group(model, tdm_cfg_str(cfg, "backend"), tp, &rt, err)
                           : tdm_runtime_open(model, tdm_cfg_str(cfg, "backend"), 0, &rt, err);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "model %s", model);
    tdm_model_set_graphs(rt->model, tdm_cfg_bool(cfg, "cuda_graphs"));
    rt->strategy = (tdm_state_strategy)st;
    tdm_log_info(component, "model %s on %s (%s), state strategy %s", model, rt->backend_name,
                 rt->why, strategy);
    *out = rt;
    return TDM_OK;
}

tdm_status tdm_runtime_open_mtp_cfg(const tdm_cfg *cfg, const char *component, tdm_runtime **out,
                                    tdm_error *err)
{
    *out = NULL;
    const char *model = tdm_cfg_str(cfg, "model");
    tdm_runtime *rt = tdm_xcalloc(1, sizeof(*rt));
    rt->tp = 1;
    tdm_status rc = runtime_backend(rt, tdm_cfg_str(cfg, "backend"), 0, err);
    if (rc != TDM_OK) {
        free(rt);
        return tdm_error_prefix(err, "model %s", model);
    }
    rc = tdm_mtp_open(model, rt->backend, &rt->mtp, err);
    if (rc != TDM_OK) {
        rt->backend->destroy(rt->backend);
        free(rt);
        return tdm_error_prefix(err,
                                "drafter_kind mtp drafts with the MTP head of model %s, which it "
                                "cannot load",
                                model);
    }
    tdm_mtp_set_graphs(rt->mtp, tdm_cfg_bool(cfg, "cuda_graphs"));
    if ((rc = tdm_runtime_set_draft_vocab(rt, tdm_cfg_str(cfg, "draft_vocab"), component, err)) !=
        TDM_OK) {
        tdm_runtime_close(rt);
        return rc;
    }
    tdm_log_info(component, "MTP head of %s on %s (%s): %zu bytes of its own weights", model,
                 rt->backend_name, rt->why, tdm_mtp_weight_bytes(rt->mtp));
    *out = rt;
    return TDM_OK;
}

/* What tdm_mtp_set_weights_fp8 did with the LM head, for the log. */
static const char *mtp_lm_head_name(const tdm_mtp_fp8 *r)
{
    switch (r->lm_head) {
    case TDM_MTP_FP8_HEAD_ROUNDED:
        return r->tied ? "rounded, with the embedding tied to it" : "rounded";
    case TDM_MTP_FP8_HEAD_KEPT:
        return "as stored (its rows are no whole steps of 64 values, or no scale covers its "
               "range)";
    case TDM_MTP_FP8_HEAD_TARGETS:
        break;
    }
    return "the target's";
}

static tdm_status mtp_set_weights_fp8(tdm_runtime *rt, const char *component, tdm_error *err)
{
    tdm_mtp_fp8 r;
    tdm_status rc = tdm_mtp_set_weights_fp8(rt->mtp, &r, err);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "weights fp8");
    tdm_log_info(component,
                 "weights fp8: %d matrices of the MTP head rounded to FP8 E4M3, %d as stored; "
                 "its own weights %.3f GB (%.3f as stored); the LM head: %s%s",
                 r.converted, r.kept, (double)r.after / 1e9, (double)r.before / 1e9,
                 mtp_lm_head_name(&r),
                 r.vocab_rows ? " (drafts read the draft vocabulary's rows, rounded)" : "");
    return TDM_OK;
}

tdm_status tdm_runtime_set_weights_fp8(tdm_runtime *rt, const char *component, tdm_error *err)
{
    if (rt->mtp)
        return mtp_set_weights_fp8(rt, component, err);
    const size_t before = tdm_model_weight_bytes(rt->model);
    int nc = 0, nk = 0;
    tdm_status rc = tdm_model_set_weights_fp8(rt->model, &nc, &nk, err);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "weights fp8");
    tdm_log_info(component,
                 "weights fp8: %d matrices rounded to FP8 E4M3, %d as stored; a step streams "
                 "%.3f GB of weights (%.3f as stored)",
                 nc, nk, (double)tdm_model_weight_bytes(rt->model) / 1e9, (double)before / 1e9);
    return TDM_OK;
}

tdm_status tdm_runtime_set_draft_vocab(tdm_runtime *rt, const char *path, const char *component,
                                       tdm_error *err)
{
    if (!path[0])
        return TDM_OK;
    const int V = rt->mtp ? tdm_mtp_get_config(rt->mtp)->vocab_size
                          : tdm_model_get_config(rt->model)->vocab_size;
    int32_t *ids = NULL;
    int n = 0;
    tdm_status rc = tdm_token_list_read(path, V, &ids, &n, err);
    if (rc == TDM_OK)
        rc = rt->mtp ? tdm_mtp_set_vocab(rt->mtp, ids, n, err)
                     : tdm_model_set_draft_vocab(rt->model, ids, n, err);
    free(ids);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "draft_vocab %s", path);
    tdm_log_info(component, "drafting from the %d tokens of %s (of %d)", n, path, V);
    return TDM_OK;
}
