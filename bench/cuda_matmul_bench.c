/*
 * cuda_matmul_bench.c - the CUDA backend's matmul against the memory floor
 * and against cuBLAS, at the matrix shapes of a Qwen3.5-4B step.
 *
 *   bench_cuda_matmul_bench [--rows 1,9,17,72] [--reps N] [--only NAME,NAME] [--hot]
 *
 * Per shape and row count: time per call of the backend's matmul (bf16
 * weights, fp32 activations, the path the engine uses; best of three
 * averages over back-to-back calls, as in a step), its weight-stream
 * bandwidth, and cuBLAS' bf16 GEMM (cublasGemmEx, bf16 activations, fp32
 * accumulation and output) on the same shape. Weights rotate over enough
 * copies (>= 256 MB) that no call finds its matrix in L2. The last line per
 * row count adds the shapes up as one 4B decode/verify step (24 linear
 * layers, 8 full, the LM head). A second table times the launches of
 * several weights the engine makes (matmul_n, matmul_silu). --only measures
 * just the named matrices or launches (for a profiler), and the step line
 * then adds only those. --hot keeps one copy of the weights, which then
 * stay in L2 between calls.
 */
#include "bench_util.h"
#include "engine.h"

#ifdef TANDEM_HAVE_CUDA_BACKEND
#include "cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TANDEM_HAVE_CUDA_BACKEND
int main(void)
{
    printf("cuda_matmul_bench: this build has no CUDA backend\n");
    return 0;
}
#else

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "cuda_matmul_bench: %s: %s\n", #x, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct mshape {
    const char *name;
    int in, out, per_step; /* times per 4B step */
} mshape;

static const mshape shapes[] = {
    {"in_qkv", 2560, 8192, 24},   {"in_z", 2560, 4096, 24},    {"in_a/in_b", 2560, 32, 48},
    {"out_proj", 4096, 2560, 24}, {"q_proj", 2560, 8192, 8},   {"k/v_proj", 2560, 1024, 16},
    {"o_proj", 4096, 2560, 8},    {"gate/up", 2560, 9216, 64}, {"down", 9216, 2560, 32},
    {"lm_head", 2560, 248320, 1},
};

/* The launches the engine makes of several weights at once: x shared by a
 * layer's input projections (matmul_n), and gate/up with SiLU
 * (matmul_silu). */
typedef struct mlaunch {
    const char *name;
    int in, n, outs[4], silu;
} mlaunch;

static const mlaunch launches[] = {
    {"in_proj", 2560, 4, {8192, 4096, 32, 32}, 0},
    {"q/k/v", 2560, 3, {8192, 1024, 1024}, 0},
    {"gate+up", 2560, 2, {9216, 9216}, 1},
};

/* Seconds per launch (best of three averages of `reps` back-to-back calls),
 * weights rotating over enough copies to miss L2 (one copy when hot). */
static double time_launch(tdm_backend *be, const mlaunch *l, int R, int reps, int hot,
                          size_t *bytes)
{
    size_t wb = 0;
    for (int j = 0; j < l->n; j++)
        wb += (size_t)l->outs[j] * (size_t)l->in * 2;
    int copies = (int)((256u << 20) / wb) + 1;
    if (copies > 16)
        copies = 16;
    if (hot)
        copies = 1;
    tdm_weight(*w)[4] = calloc((size_t)copies, sizeof(*w));
    float *y[4];
    float *xh = malloc((size_t)R * (size_t)l->in * 4);
    for (size_t i = 0; i < (size_t)R * (size_t)l->in; i++)
        xh[i] = bench_urand();
    for (int j = 0; j < l->n; j++) {
        const size_t nw = (size_t)l->outs[j] * (size_t)l->in;
        uint16_t *wh = malloc(nw * 2);
        for (size_t i = 0; i < nw; i++)
            wh[i] = bench_bf16(0.05f * bench_urand());
        for (int c = 0; c < copies; c++) {
            w[c][j] = (tdm_weight){be->alloc(be->ctx, nw * 2), TDM_DTYPE_BF16, 0};
            if (!w[c][j].data) {
                fprintf(stderr, "cuda_matmul_bench: out of device memory\n");
                exit(1);
            }
            be->upload(be->ctx, (void *)w[c][j].data, wh, nw * 2);
        }
        y[j] = be->alloc(be->ctx, (size_t)R * (size_t)l->outs[j] * 4);
        free(wh);
    }
    float *xd = be->alloc(be->ctx, (size_t)R * (size_t)l->in * 4);
    be->upload(be->ctx, xd, xh, (size_t)R * (size_t)l->in * 4);
    double best = 1e9;
    for (int round = 0; round < 4; round++) {
        const double t0 = bench_now();
        for (int it = 0; it < reps; it++) {
            const tdm_weight *wc = w[it % copies];
            if (l->silu)
                be->matmul_silu(be->ctx, y[0], xd, wc[0], wc[1], R, l->in, l->outs[0]);
            else
                be->matmul_n(be->ctx, xd, R, l->in, l->n, y, wc, l->outs);
        }
        be->sync(be->ctx);
        const double t = (bench_now() - t0) / reps;
        if (round > 0 && t < best)
            best = t;
    }
    for (int j = 0; j < l->n; j++) {
        for (int c = 0; c < copies; c++)
            be->free(be->ctx, (void *)w[c][j].data);
        be->free(be->ctx, y[j]);
    }
    be->free(be->ctx, xd);
    free(w);
    free(xh);
    *bytes = wb;
    return best;
}

int main(int argc, char **argv)
{
    int rows[8] = {1, 9, 17, 72}, nrows = 4, reps = 30;
    const char *only = NULL;
    int hot = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
            if ((nrows = bench_ints(argv[++i], rows, 8, 1, 4096)) < 0)
                return 2;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--hot") == 0) {
            hot = 1;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_cuda_matmul_bench [--rows 1,9,17,72] [--reps N] "
                            "[--only NAME,NAME] [--hot]\n");
            return 2;
        }
    }
    if (only) { /* every entry must name a matrix */
        int entries = 1, named = 0;
        for (const char *p = only; *p; p++)
            entries += *p == ',';
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
            named += bench_listed(only, shapes[si].name);
        for (size_t li = 0; li < sizeof(launches) / sizeof(launches[0]); li++)
            named += bench_listed(only, launches[li].name);
        if (named != entries) {
            fprintf(stderr, "bench_cuda_matmul_bench: --only \"%s\": an entry names no matrix (",
                    only);
            for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
                fprintf(stderr, "%s%s", si ? ", " : "", shapes[si].name);
            for (size_t li = 0; li < sizeof(launches) / sizeof(launches[0]); li++)
                fprintf(stderr, ", %s", launches[li].name);
            fprintf(stderr, ")\n");
            return 2;
        }
    }
    tdm_error err = {0};
    tdm_backend *be = tdm_backend_cuda_create(0, &err);
    if (!be) {
        printf("cuda_matmul_bench: %s\n", err.msg);
        return 0;
    }
    const double bw = tdm_cuda_copy_bandwidth(0, (size_t)1 << 30);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cuda_matmul_bench: cublasCreate failed\n");
        return 1;
    }
    printf("device copy bandwidth %.2f TB/s; per call: best of 3 averages over %d back-to-back "
           "calls\n",
           bw / 1e12, reps);
    printf("%-10s %6s %6s %4s | %9s %8s %6s | %9s %8s | %s\n", "matrix", "in", "out", "R",
           "tandem us", "GB/s", "xfloor", "cuBLAS us", "GB/s", "tandem/cuBLAS");
    for (int ri = 0; ri < nrows; ri++) {
        const int R = rows[ri];
        double step_t = 0, step_c = 0, step_floor = 0;
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            const mshape *s = &shapes[si];
            if (only && !bench_listed(only, s->name))
                continue;
            const size_t nw = (size_t)s->in * (size_t)s->out, wbytes = nw * 2;
            int copies = (int)((256u << 20) / wbytes) + 1;
            if (copies > 64)
                copies = 64;
            if (hot)
                copies = 1;
            uint16_t *wh = malloc(wbytes);
            float *xh = malloc((size_t)R * (size_t)s->in * 4);
            uint16_t *xb = malloc((size_t)R * (size_t)s->in * 2);
            for (size_t i = 0; i < nw; i++)
                wh[i] = bench_bf16(0.05f * bench_urand());
            for (size_t i = 0; i < (size_t)R * (size_t)s->in; i++) {
                xh[i] = bench_urand();
                xb[i] = bench_bf16(xh[i]);
            }
            void **wd = calloc((size_t)copies, sizeof(void *));
            for (int c = 0; c < copies; c++) {
                wd[c] = be->alloc(be->ctx, wbytes);
                if (!wd[c]) {
                    fprintf(stderr, "cuda_matmul_bench: out of device memory\n");
                    return 1;
                }
                be->upload(be->ctx, wd[c], wh, wbytes);
            }
            float *xd = be->alloc(be->ctx, (size_t)R * (size_t)s->in * 4);
            float *yd = be->alloc(be->ctx, (size_t)R * (size_t)s->out * 4);
            void *xbd = be->alloc(be->ctx, (size_t)R * (size_t)s->in * 2);
            be->upload(be->ctx, xd, xh, (size_t)R * (size_t)s->in * 4);
            be->upload(be->ctx, xbd, xb, (size_t)R * (size_t)s->in * 2);
            const float one = 1.0f, zero = 0.0f;
            double mt = 1e9, mc = 1e9;
            for (int round = 0; round < 4; round++) {
                /* round 0 warms up; then the best of three averages */
                double t0 = bench_now();
                for (int it = 0; it < reps; it++) {
                    tdm_weight w = {wd[it % copies], TDM_DTYPE_BF16, 0};
                    be->matmul(be->ctx, yd, xd, w, R, s->in, s->out, 0);
                }
                be->sync(be->ctx);
                double t = (bench_now() - t0) / reps;
                if (round > 0 && t < mt)
                    mt = t;
                t0 = bench_now();
                for (int it = 0; it < reps; it++) {
                    /* y [out, R] (col-major) = (W stored [out, in] = col-major [in, out])ᵀ · x */
                    cublasStatus_t st = cublasGemmEx(
                        h, CUBLAS_OP_T, CUBLAS_OP_N, s->out, R, s->in, &one, wd[it % copies],
                        CUDA_R_16BF, s->in, xbd, CUDA_R_16BF, s->in, &zero, yd, CUDA_R_32F, s->out,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                    if (st != CUBLAS_STATUS_SUCCESS) {
                        fprintf(stderr, "cuda_matmul_bench: cublasGemmEx failed (%d)\n", (int)st);
                        return 1;
                    }
                }
                CK(cudaDeviceSynchronize());
                t = (bench_now() - t0) / reps;
                if (round > 0 && t < mc)
                    mc = t;
            }
            const double floor_s = (double)wbytes / bw;
            printf("%-10s %6d %6d %4d | %9.1f %8.0f %6.2f | %9.1f %8.0f | %.2f\n", s->name, s->in,
                   s->out, R, 1e6 * mt, (double)wbytes / mt / 1e9, mt / floor_s, 1e6 * mc,
                   (double)wbytes / mc / 1e9, mt / mc);
            step_t += s->per_step * mt;
            step_c += s->per_step * mc;
            step_floor += s->per_step * floor_s;
            for (int c = 0; c < copies; c++)
                be->free(be->ctx, wd[c]);
            be->free(be->ctx, xd);
            be->free(be->ctx, yd);
            be->free(be->ctx, xbd);
            free(wd);
            free(wh);
            free(xh);
            free(xb);
        }
        printf("%-10s %6s %6s %4d | %9.1f %8s %6.2f | %9.1f %8s | %.2f\n", "4B step", "", "", R,
               1e6 * step_t, "", step_t / step_floor, 1e6 * step_c, "", step_t / step_c);
    }
    printf("\nlaunches of several weights, as the engine makes them\n");
    printf("%-10s %6s %6s %4s | %9s %8s %6s\n", "launch", "in", "n", "R", "tandem us", "GB/s",
           "xfloor");
    for (int ri = 0; ri < nrows; ri++)
        for (size_t li = 0; li < sizeof(launches) / sizeof(launches[0]); li++) {
            const mlaunch *l = &launches[li];
            if (only && !bench_listed(only, l->name))
                continue;
            size_t wb;
            const double t = time_launch(be, l, rows[ri], reps, hot, &wb);
            printf("%-10s %6d %6d %4d | %9.1f %8.0f %6.2f\n", l->name, l->in, l->n, rows[ri],
                   1e6 * t, (double)wb / t / 1e9, t / ((double)wb / bw));
        }
    cublasDestroy(h);
    be->destroy(be);
    return 0;
}
#endif
