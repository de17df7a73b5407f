/*
 * cli_gpu.c - see cli_gpu.h. Only the few entry points needed are declared
 * here, with CUDA's C types spelled as plain ints: the driver API's ABI for
 * them has been stable since CUDA 4 (cuDeviceTotalMem since the _v2 names of
 * CUDA 3.2).
 */
#include "cli_gpu.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* CUdevice_attribute values (cuda.h). */
#define CU_ATTR_CC_MAJOR 75
#define CU_ATTR_CC_MINOR 76
#define CU_ATTR_MPS_ENABLED 133

typedef int (*fn_int_ptr)(int *);
typedef int (*fn_cu_init)(unsigned);
typedef int (*fn_cu_device_get)(int *, int);
typedef int (*fn_cu_attr)(int *, int, int);
typedef int (*fn_cu_name)(char *, int, int);
typedef int (*fn_cu_total_mem)(size_t *, int);
typedef int (*fn_cu_error_string)(int, const char **);
typedef int (*fn_cublas_property)(int, int *);

/* dlsym into a function pointer without the object-to-function cast ISO C
 * leaves undefined. */
static bool sym(void *lib, const char *name, void *fn, size_t fn_size, cli_gpu_lib *l)
{
    void *p = dlsym(lib, name);
    if (!p) {
        snprintf(l->error, sizeof(l->error), "%s has no %s", l->soname, name);
        return false;
    }
    memcpy(fn, &p, fn_size);
    return true;
}

#define SYM(lib, name, fn, l) sym(lib, name, &(fn), sizeof(fn), l)

/* Opens the first of names that loads; records the names tried otherwise. */
static void *open_first(const char *const *names, size_t n, cli_gpu_lib *l)
{
    l->soname[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            l->found = true;
            snprintf(l->soname, sizeof(l->soname), "%s", names[i]);
            return h;
        }
        if (i == 0)
            snprintf(l->error, sizeof(l->error), "%s", dlerror());
        size_t len = strlen(l->soname);
        snprintf(l->soname + len, sizeof(l->soname) - len, "%s%s", len ? ", " : "", names[i]);
    }
    return NULL;
}

static void probe_driver(cli_gpu_probe *p)
{
    static const char *const names[] = {"libcuda.so.1", "libcuda.so"};
    cli_gpu_lib *l = &p->driver;
    void *h = open_first(names, sizeof(names) / sizeof(names[0]), l);
    if (!h)
        return;
    fn_cu_init cu_init;
    fn_int_ptr get_version, get_count;
    fn_cu_device_get device_get;
    fn_cu_attr get_attr;
    fn_cu_name get_name;
    fn_cu_error_string error_string = NULL;
    if (!SYM(h, "cuInit", cu_init, l) || !SYM(h, "cuDriverGetVersion", get_version, l) ||
        !SYM(h, "cuDeviceGetCount", get_count, l) || !SYM(h, "cuDeviceGet", device_get, l) ||
        !SYM(h, "cuDeviceGetAttribute", get_attr, l) || !SYM(h, "cuDeviceGetName", get_name, l)) {
        l->found = false;
        return;
    }
    fn_cu_total_mem total_mem = NULL;
    cli_gpu_lib ignore = {0};
    SYM(h, "cuDeviceTotalMem_v2", total_mem, &ignore); /* optional */
    SYM(h, "cuGetErrorString", error_string, &ignore);
    get_version(&l->version); /* needs no cuInit */
    p->init_status = cu_init(0);
    if (p->init_status != 0) {
        const char *why = NULL;
        if (error_string)
            error_string(p->init_status, &why);
        snprintf(l->error, sizeof(l->error), "cuInit failed with CUDA error %d (%s)",
                 p->init_status, why ? why : "no description");
        return;
    }
    int n = 0;
    if (get_count(&n) != 0)
        n = 0;
    p->device_count = n;
    for (int i = 0; i < n && i < CLI_GPU_MAX_DEVICES; i++) {
        cli_gpu_device *d = &p->devices[i];
        int dev = 0;
        if (device_get(&dev, i) != 0)
            continue;
        get_attr(&d->cc_major, CU_ATTR_CC_MAJOR, dev);
        get_attr(&d->cc_minor, CU_ATTR_CC_MINOR, dev);
        if (get_name(d->name, (int)sizeof(d->name), dev) != 0)
            snprintf(d->name, sizeof(d->name), "device %d", i);
        if (total_mem && total_mem(&d->total_mem, dev) != 0)
            d->total_mem = 0;
        if (get_attr(&d->mps, CU_ATTR_MPS_ENABLED, dev) != 0)
            d->mps = -1;
        else
            d->mps = d->mps != 0;
    }
}

static void probe_runtime(cli_gpu_probe *p)
{
    static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                        "libcudart.so.11.0"};
    cli_gpu_lib *l = &p->runtime;
    void *h = open_first(names, sizeof(names) / sizeof(names[0]), l);
    fn_int_ptr get_version;
    if (!h || !SYM(h, "cudaRuntimeGetVersion", get_version, l)) {
        l->found = false;
        return;
    }
    if (get_version(&l->version) != 0)
        l->version = 0;
}

static void probe_cublas(cli_gpu_probe *p)
{
    static const char *const names[] = {"libcublas.so", "libcublas.so.13", "libcublas.so.12",
                                        "libcublas.so.11"};
    cli_gpu_lib *l = &p->cublas;
    void *h = open_first(names, sizeof(names) / sizeof(names[0]), l);
    fn_cublas_property get_property;
    if (!h || !SYM(h, "cublasGetProperty", get_property, l)) {
        l->found = false;
        return;
    }
    /* libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2. */
    int major = 0, minor = 0, patch = 0;
    if (get_property(0, &major) == 0 && get_property(1, &minor) == 0 &&
        get_property(2, &patch) == 0)
        l->version = major * 10000 + minor * 100 + patch;
}

static void probe_nccl(cli_gpu_probe *p)
{
    static const char *const names[] = {"libnccl.so.2", "libnccl.so"};
    cli_gpu_lib *l = &p->nccl;
    void *h = open_first(names, sizeof(names) / sizeof(names[0]), l);
    fn_int_ptr get_version;
    if (!h || !SYM(h, "ncclGetVersion", get_version, l)) {
        l->found = false;
        return;
    }
    if (get_version(&l->version) != 0)
        l->version = 0;
}

void cli_gpu_probe_run(cli_gpu_probe *p)
{
    memset(p, 0, sizeof(*p));
    probe_driver(p);
    probe_runtime(p);
    probe_cublas(p);
    probe_nccl(p);
}

const char *cli_gpu_cuda_version_str(int v, char *buf, size_t len)
{
    snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10);
    return buf;
}

cli_gpu_arch cli_gpu_arch_support(const char *archs, int major, int minor, char *ptx,
                                  size_t ptx_len)
{
    int cc = major * 10 + minor;
    cli_gpu_arch best = CLI_GPU_ARCH_NONE;
    int best_ptx = 0; /* the newest PTX the device can compile wins */
    const char *p = archs;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[64];
        snprintf(item, sizeof(item), "%.*s", (int)(len < 63 ? len : 63), p);
        p = comma ? comma + 1 : p + len;
        int num = 0, n = 0;
        if (sscanf(item, "sm_%d%n", &num, &n) != 1)
            continue;
        const char *suffix = item + n;
        /* sm_90a, sm_100f: architecture-specific features, that device only. */
        if ((suffix[0] == 'a' || suffix[0] == 'f') && num != cc)
            continue;
        bool sass = strstr(suffix, "-virtual") == NULL;
        bool has_ptx = strstr(suffix, "-real") == NULL;
        if (sass && num / 10 == major && num <= cc) {
            best = CLI_GPU_ARCH_NATIVE;
        } else if (has_ptx && num <= cc && num > best_ptx && best != CLI_GPU_ARCH_NATIVE) {
            best = CLI_GPU_ARCH_PTX;
            best_ptx = num;
            snprintf(ptx, ptx_len, "compute_%d", num);
        }
    }
    return best;
}
