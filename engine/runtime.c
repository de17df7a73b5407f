#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tdm_status tdm_runtime_open(const char *model_dir, const char *backend, int threads,
                            tdm_runtime **out, tdm_error *err)
{
    *out = NULL;
    if (!backend || !backend[0])
        backend = "auto";
    tdm_runtime *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    if (strcmp(backend, "cuda") == 0) {
        free(rt);
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "backend=cuda: this build has no CUDA backend; use backend=cpu");
    }
    if (strcmp(backend, "auto") != 0 && strcmp(backend, "cpu") != 0) {
        free(rt);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "backend=%s: expected auto, cpu or cuda", backend);
    }
    snprintf(rt->backend_name, sizeof(rt->backend_name), "cpu");
    snprintf(rt->why, sizeof(rt->why), "%s",
             strcmp(backend, "cpu") == 0 ? "set explicitly"
                                         : "auto: no CUDA backend in this build");
    rt->backend = tdm_backend_cpu_create(threads);
    if (!rt->backend) {
        free(rt);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "cannot create the CPU backend");
    }
    tdm_status rc = tdm_model_load(model_dir, rt->backend, &rt->model, err);
    if (rc != TDM_OK) {
        rt->backend->destroy(rt->backend);
        free(rt);
        return rc;
    }
    *out = rt;
    return TDM_OK;
}

void tdm_runtime_close(tdm_runtime *rt)
{
    if (!rt)
        return;
    tdm_model_destroy(rt->model);
    if (rt->backend)
        rt->backend->destroy(rt->backend);
    free(rt);
}
