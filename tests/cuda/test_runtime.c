/*
 * test_runtime.c - backend selection (engine/runtime.c) in a build with the
 * CUDA backend, with or without a GPU: `cpu` is the CPU; `cuda` is the GPU or
 * an error naming why (never a silent CPU); `auto` is the GPU when one is
 * present, else the CPU, and says why; anything else is refused. cuBLAS is
 * not loaded with the process (its initializers cost 0.4 s of CPU at every
 * start), only when opened for a prompt prefill, and it resolves.
 */
#include "cuda_test.h"
#include "runtime.h"
#include "util.h"

#include <string.h>

/* Whether a library whose path holds `name` is mapped in this process. */
static bool mapped(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, name) != NULL;
    fclose(f);
    return found;
}

static tdm_status open_rt(const char *backend, tdm_runtime **rt, tdm_error *err)
{
    char model[700];
    snprintf(model, sizeof(model), "%s/f32_tied/model", TANDEM_ENGINE_FIXTURES);
    return tdm_runtime_open(model, backend, 2, rt, err);
}

int main(void)
{
    CHECK(!mapped("libcublas"), "cuBLAS is loaded before anything opened it");
    char why[160];
    const int gpus = tdm_cuda_device_count(why, sizeof(why));
    tdm_runtime *rt;
    tdm_error err;

    CHECK(open_rt("cpu", &rt, &err) == TDM_OK, "cpu: %s", err.msg);
    CHECK(strcmp(rt->backend_name, "cpu") == 0 && strcmp(rt->backend->name, "cpu") == 0,
          "cpu gave %s", rt->backend_name);
    printf("backend=cpu  -> %s (%s)\n", rt->backend_name, rt->why);
    tdm_runtime_close(rt);

    tdm_status rc = open_rt("cuda", &rt, &err);
    if (gpus > 0) {
        CHECK(rc == TDM_OK, "cuda with %d GPU(s): %s", gpus, err.msg);
        CHECK(strcmp(rt->backend_name, "cuda") == 0 && strcmp(rt->backend->name, "cuda") == 0,
              "cuda gave %s", rt->backend_name);
        printf("backend=cuda -> %s (%s)\n", rt->backend_name, rt->why);
        tdm_runtime_close(rt);
    } else {
        CHECK(rc == TDM_ERR_FAILED_PRECONDITION && !rt, "cuda without a GPU: rc %d", (int)rc);
        CHECK(strstr(err.msg, "backend=cuda") && strstr(err.msg, "CUDA"),
              "the error should name the backend and why: %s", err.msg);
        printf("backend=cuda -> error: %s\n", err.msg);
    }

    CHECK(open_rt("auto", &rt, &err) == TDM_OK, "auto: %s", err.msg);
    CHECK(strcmp(rt->backend_name, gpus > 0 ? "cuda" : "cpu") == 0, "auto gave %s with %d GPU(s)",
          rt->backend_name, gpus);
    CHECK(strncmp(rt->why, "auto: ", 6) == 0 && strlen(rt->why) > 10, "auto's reason: '%s'",
          rt->why);
    printf("backend=auto -> %s (%s)\n", rt->backend_name, rt->why);
    tdm_runtime_close(rt);

    CHECK(open_rt("gpu", &rt, &err) == TDM_ERR_INVALID_ARGUMENT && strstr(err.msg, "gpu"),
          "an unknown backend must be refused by name: %s", err.msg);
    printf("backend=gpu  -> error: %s\n", err.msg);
    /* The toolkit this build's headers came from has the library. */
    char cb_why[256];
    CHECK(tdm_cuda_cublas_open(cb_why, sizeof(cb_why)) == 0, "cuBLAS: %s", cb_why);
    CHECK(mapped("libcublas.so"), "cuBLAS opened but not mapped");
    CHECK(tdm_cuda_cublas_open(NULL, 0) == 0, "cuBLAS opened a second time");
    printf("cuBLAS: opened at first use\n");
    printf("cuda runtime: backend selection as documented (%d GPU(s))\n", gpus);
    return 0;
}
