/*
 * runtime.h - a model ready to run: a backend chosen by name and the model
 * loaded onto it. What the verifier, the drafter and the CLI open.
 *
 * Owns the backend and the model (or, for an MTP drafter, the checkpoint's
 * MTP head alone); tdm_runtime_close frees them.
 */
#ifndef TANDEM_ENGINE_RUNTIME_H
#define TANDEM_ENGINE_RUNTIME_H

#include "config.h"
#include "engine.h"
#include "mtp.h"
#include "status.h"

typedef struct tdm_runtime {
    tdm_backend *backend;
    tdm_model *model;            /* NULL when opened for the MTP head alone */
    tdm_mtp *mtp;                /* tdm_runtime_open_mtp_cfg: the head; else NULL */
    char backend_name[16];       /* the backend actually used: "cpu" or "cuda" */
    char why[160];               /* why that backend (for `auto`) */
    tdm_state_strategy strategy; /* tdm_runtime_open_cfg: how sequences commit */
    char device_uuid[48];        /* the GPU's UUID (tdm_cuda_device_uuid); "" on the CPU */
    bool device_mps; /* its work there goes through an MPS server (tdm_cuda_device_mps) */
    /* tensor_parallel > 1: the ranks' backends (backend is rank 0's) and
     * communicators; tp = 1 otherwise, with both NULL. */
    int tp;
    tdm_backend **rank_backends;
    tdm_comm **comms;
} tdm_runtime;

/* backend: "auto", "cpu" or "cuda". threads: CPU worker threads, 0 = one per
 * core it may run on (its affinity mask). A backend this build or machine
 * cannot provide is an error naming it, never a silent switch. */
tdm_status tdm_runtime_open(const char *model_dir, const char *backend, int threads,
                            tdm_runtime **out, tdm_error *err);
void tdm_runtime_close(tdm_runtime *rt);

/* A service's model from its effective configuration (the keys every
 * replica has: model, backend, cuda_graphs, state_strategy, resolved; and
 * the verifier's tensor_parallel): opens the runtime, sets graphs and
 * strategy, and logs what was loaded on which backend under `component`.
 * tensor_parallel N > 1 splits the model over N ranks (engine/shard.h): on
 * the cuda backend CUDA devices 0..N-1 joined by NCCL, on the cpu backend N
 * CPU backends sharing the cores, joined in-process; the model is a group
 * (tdm_model_load_group). Errors name the model directory. */
tdm_status tdm_runtime_open_cfg(const tdm_cfg *cfg, const char *component, tdm_runtime **out,
                                tdm_error *err);

/* The same for a drafter of drafter_kind mtp: the backend and the MTP head
 * of the checkpoint `model` (tdm_mtp_open: the head, the embedding, the
 * final norm and the LM head; no decoder layers). A checkpoint without the
 * head is an error naming the model directory and the missing tensor. */
tdm_status tdm_runtime_open_mtp_cfg(const tdm_cfg *cfg, const char *component, tdm_runtime **out,
                                    tdm_error *err);
/* What the CUDA backend's graph slots did since the runtime opened
 * (kernels/cuda/cuda_backend.h: tdm_cuda_graph_stats): steps captured,
 * replayed, refused (run again eagerly), run eagerly (measured: of those,
 * the runs of a new key), and graphs evicted.
 * All zeros on the CPU backend, with graphs off, or for rt NULL. */
typedef struct tdm_runtime_graph_stats {
    uint64_t captured, replayed, refused, eager, measured, evicted;
} tdm_runtime_graph_stats;
void tdm_runtime_graph_stats_get(const tdm_runtime *rt, tdm_runtime_graph_stats *out);
/* Steps that ran a shape for the first time (run eagerly to measure a new
 * key, or captured) or whose graph was refused: a count that moves when a
 * step's time is not what that shape costs from then on, so that timing
 * models skip it. (Keys given up on run eagerly every time: that is their
 * cost, and not counted.) */
uint64_t tdm_runtime_graph_first_sights(const tdm_runtime *rt);

/* A drafter's matrices rounded to FP8: its model's
 * (tdm_model_set_weights_fp8) or its MTP head's (tdm_mtp_set_weights_fp8),
 * a draft vocabulary's rows with them whether set before or after; what it
 * rounded is logged under component. */
tdm_status tdm_runtime_set_weights_fp8(tdm_runtime *rt, const char *component, tdm_error *err);

/* A drafter's draft vocabulary: the token ids of the file at path
 * (tdm_token_list_read) for its MTP head (tdm_mtp_set_vocab) or its model
 * (tdm_model_set_draft_vocab); "" leaves the whole vocabulary. Errors name
 * the file; the choice is logged under component. */
tdm_status tdm_runtime_set_draft_vocab(tdm_runtime *rt, const char *path, const char *component,
                                       tdm_error *err);

#endif
