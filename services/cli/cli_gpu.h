/*
 * cli_gpu.h - what the machine offers for the CUDA backend, probed at run
 * time: the NVIDIA driver (libcuda.so.1) and its devices, the CUDA runtime
 * (libcudart), cuBLAS and NCCL. Every library is dlopen'ed, so neither the
 * build nor the start of `tandem` needs CUDA or a GPU; a missing library is
 * a field saying so (with dlerror's words), never a failure.
 *
 * Versions are CUDA's integers: 12080 is 12.8 (driver and runtime), cuBLAS
 * major*10000 + minor*100 + patch, NCCL as ncclGetVersion returns it.
 */
#ifndef TANDEM_CLI_GPU_H
#define TANDEM_CLI_GPU_H

#include <stdbool.h>
#include <stddef.h>

#define CLI_GPU_MAX_DEVICES 16

typedef struct cli_gpu_device {
    char name[256];
    int cc_major, cc_minor; /* compute capability */
    size_t total_mem;       /* bytes; 0 when unknown */
    int mps;                /* 1: this process's work here would go through an MPS server
                               (CU_DEVICE_ATTRIBUTE_MPS_ENABLED); 0: not; -1: unknown */
} cli_gpu_device;

typedef struct cli_gpu_lib {
    bool found;
    char soname[64]; /* the name that loaded, or the names tried */
    char error[512]; /* why it is not usable: dlerror, a missing symbol, a call's status */
    int version;     /* see the head of this file; 0 when unknown */
} cli_gpu_lib;

typedef struct cli_gpu_probe {
    cli_gpu_lib driver; /* libcuda.so.1: version is the CUDA version the driver supports */
    int init_status;    /* cuInit's result (0: CUDA_SUCCESS) */
    int device_count;   /* devices the driver shows (0 when cuInit failed) */
    cli_gpu_device devices[CLI_GPU_MAX_DEVICES];
    cli_gpu_lib runtime; /* libcudart */
    cli_gpu_lib cublas;
    cli_gpu_lib nccl;
} cli_gpu_probe;

/* Fills *p. Libraries stay loaded for the life of the process (unloading
 * the driver after cuInit is not supported). */
void cli_gpu_probe_run(cli_gpu_probe *p);

typedef enum cli_gpu_arch {
    CLI_GPU_ARCH_NONE = 0, /* no code this device can run */
    CLI_GPU_ARCH_PTX,      /* PTX the driver compiles at start-up */
    CLI_GPU_ARCH_NATIVE,   /* native code (SASS) for its architecture */
} cli_gpu_arch;

/* How a device of compute capability major.minor runs code built for
 * `archs`, as buildinfo lists them ("sm_80,sm_90"; CMake's suffixes kept:
 * "sm_90a" runs on 9.0 only, "sm_90-real" has no PTX, "sm_90-virtual" only
 * PTX). Native code runs on its major's later minors; PTX on any later
 * device. For CLI_GPU_ARCH_PTX, `ptx` gets the PTX's name ("compute_90"). */
cli_gpu_arch cli_gpu_arch_support(const char *archs, int major, int minor, char *ptx,
                                  size_t ptx_len);

/* "12.8" from 12080 into buf. */
const char *cli_gpu_cuda_version_str(int v, char *buf, size_t len);

#endif
