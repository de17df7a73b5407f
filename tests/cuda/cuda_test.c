/* cuda_test.c - see cuda_test.h. */
#include "cuda_test.h"

#include <math.h>
#include <string.h>

static uint64_t ct_state = 0x2545f4914f6cdd1dull;

static uint64_t ct_next(void)
{
    ct_state ^= ct_state << 13;
    ct_state ^= ct_state >> 7;
    ct_state ^= ct_state << 17;
    return ct_state;
}

int ct_rand(int n)
{
    return (int)(ct_next() % (uint64_t)n);
}

void ct_fill(float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        x[i] = a * (2.0f * (float)(ct_next() >> 40) / (float)(1ull << 24) - 1.0f);
}

void ct_require_gpu(void)
{
    char why[160];
    if (tdm_cuda_device_count(why, sizeof(why)) == 0) {
        printf("skipped: no CUDA device (%s)\n", why);
        exit(CT_SKIP);
    }
}

tdm_backend *ct_gpu(void)
{
    tdm_error err;
    tdm_backend *be = tdm_backend_cuda_create(0, &err);
    CHECK(be, "cannot create the CUDA backend: %s", err.msg);
    return be;
}

tdm_backend *ct_cpu(void)
{
    tdm_backend *be = tdm_backend_cpu_create(2);
    CHECK(be, "cannot create the CPU backend");
    return be;
}

uint16_t ct_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ct_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ct_f32_to_f16(float f)
{
    /* Via the exact decomposition f = m · 2^e; inputs here are normal
     * numbers well inside the half range, or zero. */
    if (f == 0.0f)
        return 0;
    uint16_t sign = f < 0 ? 0x8000 : 0;
    float a = fabsf(f);
    int e;
    float m = frexpf(a, &e); /* a = m · 2^e, m in [0.5, 1) */
    int ex = e - 1 + 15;     /* biased exponent of 1.m form */
    if (ex <= 0) {           /* subnormal half */
        float q = nearbyintf(ldexpf(a, 24));
        return (uint16_t)(sign | (uint16_t)q);
    }
    float mant = nearbyintf(ldexpf(m, 11)); /* 1024..2048 */
    if (mant >= 2048.0f) {
        mant = 1024.0f;
        ex++;
    }
    return (uint16_t)(sign | (uint16_t)(ex << 10) | ((uint16_t)mant & 0x3ff));
}

float ct_f16_to_f32(uint16_t h)
{
    int ex = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v = ex == 0 ? ldexpf((float)man, -24) : ldexpf((float)(man | 0x400), ex - 25);
    return (h & 0x8000) ? -v : v;
}

void *ct_put(tdm_backend *be, const void *host, size_t nbytes)
{
    void *d = be->alloc(be->ctx, nbytes);
    CHECK(d, "%s backend: alloc of %zu bytes failed", be->name, nbytes);
    if (host)
        be->upload(be->ctx, d, host, nbytes);
    return d;
}

void *ct_get(tdm_backend *be, const void *dev, size_t nbytes)
{
    void *h = malloc(nbytes ? nbytes : 1);
    CHECK(h, "out of memory");
    be->download(be->ctx, h, dev, nbytes);
    return h;
}

void ct_poison(tdm_backend *be, void *dev, size_t nbytes)
{
    void *h = malloc(nbytes ? nbytes : 1);
    CHECK(h, "out of memory");
    memset(h, 0xff, nbytes);
    be->upload(be->ctx, dev, h, nbytes);
    free(h);
}

double ct_nerr(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]))
            return INFINITY;
        double e = (double)a[i] - (double)b[i];
        d += e * e;
        r += (double)b[i] * (double)b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}
