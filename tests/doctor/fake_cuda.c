/*
 * fake_cuda.c - a stand-in for the NVIDIA driver's libcuda.so.1, for testing
 * `tandem doctor` on machines without a GPU: the few entry points it calls,
 * answering from the environment.
 *
 *   FAKE_CUDA_DRIVER   cuDriverGetVersion (default 12080: CUDA 12.8)
 *   FAKE_CUDA_INIT     cuInit's result (default 0; 100 is CUDA_ERROR_NO_DEVICE)
 *   FAKE_CUDA_DEVICES  cuDeviceGetCount (default 1)
 *   FAKE_CUDA_CC       compute capability of every device (default "9.0")
 *   FAKE_CUDA_MPS      CU_DEVICE_ATTRIBUTE_MPS_ENABLED (unset: the attribute is
 *                      unknown, as to a driver older than CUDA 12.1)
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

int cuInit(unsigned flags);
int cuDriverGetVersion(int *v);
int cuDeviceGetCount(int *n);
int cuDeviceGet(int *dev, int ordinal);
int cuDeviceGetAttribute(int *v, int attr, int dev);
int cuDeviceGetName(char *name, int len, int dev);
int cuDeviceTotalMem_v2(size_t *bytes, int dev);
int cuGetErrorString(int error, const char **s);

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : def;
}

int cuInit(unsigned flags)
{
    (void)flags;
    return env_int("FAKE_CUDA_INIT", 0);
}

int cuDriverGetVersion(int *v)
{
    *v = env_int("FAKE_CUDA_DRIVER", 12080);
    return 0;
}

int cuDeviceGetCount(int *n)
{
    *n = env_int("FAKE_CUDA_DEVICES", 1);
    return 0;
}

int cuDeviceGet(int *dev, int ordinal)
{
    *dev = ordinal;
    return 0;
}

int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    (void)dev;
    const char *cc = getenv("FAKE_CUDA_CC");
    int major = 9, minor = 0;
    if (cc && cc[0])
        sscanf(cc, "%d.%d", &major, &minor);
    if (attr == 75) /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
        *v = major;
    else if (attr == 76) /* ..._MINOR */
        *v = minor;
    else if (attr == 133 && getenv("FAKE_CUDA_MPS")) /* ..._MPS_ENABLED */
        *v = env_int("FAKE_CUDA_MPS", 0);
    else
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    return 0;
}

int cuDeviceGetName(char *name, int len, int dev)
{
    snprintf(name, (size_t)len, "Fake GPU %d", dev);
    return 0;
}

int cuDeviceTotalMem_v2(size_t *bytes, int dev)
{
    (void)dev;
    *bytes = (size_t)80 << 30;
    return 0;
}

int cuGetErrorString(int error, const char **s)
{
    *s = error == 100 ? "no CUDA-capable device is detected" : "unknown error";
    return 0;
}
