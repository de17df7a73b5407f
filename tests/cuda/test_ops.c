/*
 * test_ops.c - every op of the CUDA backend against the CPU backend.
 *
 * Each case makes fresh random inputs, runs the op through the backend
 * interface on both backends (outputs poisoned with NaN first, so an element
 * the GPU does not write fails the check), and compares by normalised error
 * ‖gpu − cpu‖ / ‖cpu‖ against a threshold per op:
 *  - exact (0): data movement — embedding rows, the gate and v rows of
 *    attn_prep, conv window states, argmax indices.
 *  - 1e-5: every arithmetic op. The GPU computes in fp32 like the CPU (fp32
 *    products of the stored weights, no bf16/tf32 tensor-core rounding); only
 *    the order of additions (lane/warp trees vs 8-lane SIMD), fused
 *    multiply-adds and libm vs CUDA expf/sinf differ. Each of those is a few
 *    ulp (1e-7) per value; summed over up to 1024 terms the normalised error
 *    stays near 1e-6, so 1e-5 leaves a margin of ~10 while any indexing or
 *    formula mistake gives O(1).
 *  - softmax is checked against a double-precision reference instead (the
 *    CPU's sequential fp32 sum over a 248320-entry row is off by ~1e-4).
 *  - sample: the CPU backend's token, exactly, except where u lies within
 *    1e-6 of a cumulative boundary (counted); plus a chi-square test of the
 *    GPU's draws against the distribution.
 *  - 3e-5: the gated delta rule over whole segments, where rounding
 *    differences of each position feed the state the next position reads.
 * fp16 weights: the CPU backend has no fp16 matmul or embedding, so the
 * reference gets the same values converted exactly to fp32. FP8 weights
 * (E4M3 codes of one scale) run on both backends, and on the GPU they must
 * give the bits of the bf16 matrix of the values they stand for, on every
 * path (test_fp8).
 * Batching: matmul, the norms, attention, conv and the delta rule must give
 * the same bits for rows run in one call as for each segment (or row) run
 * alone. That also pits the two attention kernels against each other (a
 * batch of many rows runs one block per row, a small call splits each
 * row's keys over a cluster), at up to 3000 keys. Kernels that load float4s
 * when the pointers allow must give the same bits from unaligned pointers.
 */
#include "cuda_test.h"

#include <math.h>
#include <string.h>
#include <time.h>

static tdm_backend *G, *CPU;
static int failures;

static void report(const char *op, const char *cas, double err, double thr)
{
    int ok = err <= thr;
    printf("%-14s %-44s nerr=%.3g thr=%.0e %s\n", op, cas, err, thr, ok ? "ok" : "FAIL");
    if (!ok)
        failures++;
}

/* A bit-identity check whose comparison the caller made (several buffers). */
static void report_identical(const char *op, const char *cas, int ok)
{
    printf("%-14s %-44s %s\n", op, cas, ok ? "bit-identical ok" : "FAIL (bits differ)");
    if (!ok)
        failures++;
}

static void report_same(const char *op, const char *cas, const void *a, const void *b, size_t n)
{
    report_identical(op, cas, memcmp(a, b, n) == 0);
}

/* A weight matrix in the given dtype from fp32 values; *ref gets the values
 * it actually holds, in fp32 (what the CPU reference multiplies by). FP8:
 * the codes, then their scale exponent as an int (put_weight). */
static void *make_weight(const float *v, size_t n, tdm_dtype dt, float *ref, size_t *bytes)
{
    *bytes = n * tdm_dtype_size(dt);
    if (dt == TDM_DTYPE_FP8) {
        float amax = 0.0f;
        for (size_t i = 0; i < n; i++)
            amax = fmaxf(amax, fabsf(v[i]));
        int e = 0;
        if (tdm_fp8_scale_exp(amax, &e) != 0)
            abort();
        unsigned char *h = malloc(n + sizeof(int));
        for (size_t i = 0; i < n; i++) {
            h[i] = tdm_fp8_encode(v[i], e);
            ref[i] = tdm_fp8_value(h[i], e);
        }
        memcpy(h + n, &e, sizeof(int));
        return h;
    }
    void *h = malloc(*bytes);
    for (size_t i = 0; i < n; i++) {
        if (dt == TDM_DTYPE_F32) {
            ((float *)h)[i] = v[i];
            ref[i] = v[i];
        } else if (dt == TDM_DTYPE_BF16) {
            uint16_t b = ct_f32_to_bf16(v[i]);
            ((uint16_t *)h)[i] = b;
            ref[i] = ct_bf16_to_f32(b);
        } else {
            uint16_t b = ct_f32_to_f16(v[i]);
            ((uint16_t *)h)[i] = b;
            ref[i] = ct_f16_to_f32(b);
        }
    }
    return h;
}

/* The weight as the CPU reference takes it: bf16 as is, fp16 as fp32. */
static tdm_weight put_weight(tdm_backend *be, const void *h, const float *ref, size_t n,
                             tdm_dtype dt, size_t bytes)
{
    if (be == CPU && dt == TDM_DTYPE_F16)
        return (tdm_weight){ct_put(be, ref, n * 4), TDM_DTYPE_F32, 0};
    int e = 0;
    if (dt == TDM_DTYPE_FP8)
        memcpy(&e, (const unsigned char *)h + n, sizeof(int));
    return (tdm_weight){ct_put(be, h, bytes), dt, e};
}

/* ---- matmul ----------------------------------------------------------- */

/* One matmul's inputs: x [R, in], a weight [out, in] in dtype dt (wh as
 * stored, wref the values it holds in fp32), y0 [R, out] for accumulate. */
typedef struct mm_case {
    int R, in, out;
    tdm_dtype dt;
    size_t wb;
    void *wh;
    float *wref, *x, *y0;
} mm_case;

static mm_case mm_case_make(int R, int in, int out, tdm_dtype dt)
{
    mm_case c = {R, in, out, dt, 0, NULL, NULL, NULL, NULL};
    const size_t nw = (size_t)out * in;
    float *wv = malloc(nw * 4);
    c.wref = malloc(nw * 4);
    c.x = malloc((size_t)R * in * 4);
    c.y0 = malloc((size_t)R * out * 4);
    ct_fill(wv, nw, 0.5f);
    ct_fill(c.x, (size_t)R * in, 1.0f);
    ct_fill(c.y0, (size_t)R * out, 1.0f);
    c.wh = make_weight(wv, nw, dt, c.wref, &c.wb);
    free(wv);
    return c;
}

static void mm_case_free(mm_case *c)
{
    free(c->wh);
    free(c->wref);
    free(c->x);
    free(c->y0);
}

/* "R=.. in=.. out=.. dtype[ accumulate]" */
static void mm_case_name(const mm_case *c, int acc, char *buf, size_t len)
{
    snprintf(buf, len, "R=%d in=%d out=%d %s%s", c->R, c->in, c->out, tdm_dtype_name(c->dt),
             acc ? " accumulate" : "");
}

/* The case's y on backend be (host copy; the caller frees): one call, or
 * (rowwise) one call a row. */
static float *run_matmul(tdm_backend *be, const mm_case *c, int acc, int rowwise)
{
    const int R = c->R, in = c->in, out = c->out;
    tdm_weight w = put_weight(be, c->wh, c->wref, (size_t)out * in, c->dt, c->wb);
    float *dx = ct_put(be, c->x, (size_t)R * in * 4);
    float *dy = ct_put(be, NULL, (size_t)R * out * 4);
    if (acc)
        be->upload(be->ctx, dy, c->y0, (size_t)R * out * 4);
    else
        ct_poison(be, dy, (size_t)R * out * 4);
    if (rowwise)
        for (int r = 0; r < R; r++)
            be->matmul(be->ctx, dy + (size_t)r * out, dx + (size_t)r * in, w, 1, in, out, acc);
    else
        be->matmul(be->ctx, dy, dx, w, R, in, out, acc);
    float *y = ct_get(be, dy, (size_t)R * out * 4);
    be->free(be->ctx, (void *)w.data);
    be->free(be->ctx, dx);
    be->free(be->ctx, dy);
    return y;
}

static void test_matmul(void)
{
    /* R covers the 2/8/16-row block variants and several chunks of the
     * CUDA-core path and the row groups of 2, 5 and 10 (one or several)
     * of the tensor-core path (bf16); in covers 1..8 k-warps, the scalar path (in % 8 != 0),
     * k tails of the 64-wide steps and split k (out small, in large); out is
     * not always a multiple of the 4 or 32 columns per block. */
    const int shapes[][3] = {{1, 64, 40},    {3, 256, 130},   {8, 1024, 520},   {13, 96, 33},
                             {1, 40, 7},     {5, 1100, 17},   {130, 64, 24},    {9, 2560, 64},
                             {4, 9216, 16},  {2, 3584, 70},   {16, 512, 36},    {17, 4096, 9},
                             {40, 1024, 66}, {1, 2560, 2560}, {17, 2560, 1024}, {9, 4096, 96},
                             {33, 520, 70},  {1, 9216, 64},   {24, 136, 300}};
    const tdm_dtype dts[] = {TDM_DTYPE_F32, TDM_DTYPE_BF16, TDM_DTYPE_F16, TDM_DTYPE_FP8};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
        for (size_t d = 0; d < TDM_ARRAY_LEN(dts); d++)
            for (int acc = 0; acc < 2; acc++) {
                if (dts[d] == TDM_DTYPE_FP8 && shapes[s][1] % 64)
                    continue; /* FP8 matrices have rows of whole 64-value steps */
                mm_case c = mm_case_make(shapes[s][0], shapes[s][1], shapes[s][2], dts[d]);
                const size_t n = (size_t)c.R * c.out;
                float *yc = run_matmul(CPU, &c, acc, 0);
                float *yg = run_matmul(G, &c, acc, 0);
                char cas[96];
                mm_case_name(&c, acc, cas, sizeof(cas));
                report("matmul", cas, ct_nerr(yg, yc, n), 1e-5);
                if (c.R > 1 && !acc) {
                    float *yr = run_matmul(G, &c, 0, 1);
                    report_same("matmul", "  rows one by one == batched", yr, yg, n * 4);
                    free(yr);
                }
                free(yc);
                free(yg);
                mm_case_free(&c);
            }
}

/* The fused products (matmul_n, matmul_silu) against the same backend's
 * separate ops, bit for bit (the slots' contract), and against the CPU
 * backend's separate ops; row by row == batched. A call: R rows of x
 * [R, in], n weights of outs[j] rows (dtype per weight). mode 0: fused, one
 * call; 1: fused, row by row; 2: the separate matmuls (and silu_mul). */
typedef struct fuse_case {
    int R, in, n, outs[4];
    tdm_dtype dt[4];
    int silu;
} fuse_case;

typedef struct fuse_in {
    const float *x;
    void *wh[4];
    float *wref[4];
    size_t wb[4];
} fuse_in;

/* Fresh random inputs of a case: x [R, in] of values up to xmax, each
 * weight (values up to 0.5 · wscale) as stored (wh) and as the values it
 * holds (wref). */
static fuse_in fuse_in_scaled(const fuse_case *fc, float xmax, float wscale)
{
    fuse_in fi = {0};
    float *x = malloc((size_t)fc->R * fc->in * 4);
    ct_fill(x, (size_t)fc->R * fc->in, xmax);
    fi.x = x;
    for (int j = 0; j < fc->n; j++) {
        const size_t nw = (size_t)fc->outs[j] * fc->in;
        float *wv = malloc(nw * 4);
        fi.wref[j] = malloc(nw * 4);
        ct_fill(wv, nw, 0.5f);
        for (size_t i = 0; i < nw; i++)
            wv[i] *= wscale;
        fi.wh[j] = make_weight(wv, nw, fc->dt[j], fi.wref[j], &fi.wb[j]);
        free(wv);
    }
    return fi;
}

static fuse_in fuse_in_make(const fuse_case *fc, float xmax)
{
    return fuse_in_scaled(fc, xmax, 1.0f);
}

static void fuse_in_free(const fuse_case *fc, fuse_in *fi)
{
    for (int j = 0; j < fc->n; j++) {
        free(fi->wh[j]);
        free(fi->wref[j]);
    }
    free((void *)fi->x);
}

/* y[j]: host copies of the outputs (caller frees). */
static void run_fused(tdm_backend *be, const fuse_case *fc, const fuse_in *fi, int mode, float **y)
{
    const int R = fc->R, in = fc->in, nout = fc->silu ? 1 : fc->n;
    tdm_weight w[4];
    for (int j = 0; j < fc->n; j++)
        w[j] =
            put_weight(be, fi->wh[j], fi->wref[j], (size_t)fc->outs[j] * in, fc->dt[j], fi->wb[j]);
    float *dx = ct_put(be, fi->x, (size_t)R * in * 4);
    float *dy[4], *du = NULL;
    for (int j = 0; j < nout; j++) {
        dy[j] = ct_put(be, NULL, (size_t)R * fc->outs[j] * 4);
        ct_poison(be, dy[j], (size_t)R * fc->outs[j] * 4);
    }
    if (mode < 2) {
        for (int r0 = 0; r0 < R; r0 += mode ? 1 : R) {
            const int nr = mode ? 1 : R;
            const float *xr = dx + (size_t)r0 * in;
            float *yr[4];
            for (int j = 0; j < nout; j++)
                yr[j] = dy[j] + (size_t)r0 * fc->outs[j];
            if (fc->silu)
                be->matmul_silu(be->ctx, yr[0], xr, w[0], w[1], nr, in, fc->outs[0]);
            else
                be->matmul_n(be->ctx, xr, nr, in, fc->n, yr, w, fc->outs);
        }
    } else {
        float *ys[4] = {dy[0], NULL, NULL, NULL};
        for (int j = 1; j < fc->n; j++)
            ys[j] = fc->silu ? (du = ct_put(be, NULL, (size_t)R * fc->outs[j] * 4)) : dy[j];
        for (int j = 0; j < fc->n; j++)
            be->matmul(be->ctx, ys[j], dx, w[j], R, in, fc->outs[j], 0);
        if (fc->silu)
            be->silu_mul(be->ctx, dy[0], dy[0], du, (size_t)R * fc->outs[0]);
    }
    for (int j = 0; j < nout; j++) {
        y[j] = ct_get(be, dy[j], (size_t)R * fc->outs[j] * 4);
        be->free(be->ctx, dy[j]);
    }
    for (int j = 0; j < fc->n; j++)
        be->free(be->ctx, (void *)w[j].data);
    be->free(be->ctx, dx);
    be->free(be->ctx, du);
}

static void test_fused_matmuls(void)
{
    const tdm_dtype B = TDM_DTYPE_BF16, F = TDM_DTYPE_F32;
    /* The 4B in_proj and gate+up shapes at decode (1, 2 rows: x through the
     * warps' rings), verify and batch rows (3+: split ahead); split k; out
     * not a multiple of the 16 (pair) or 32 outputs a block holds; fp32
     * weights alone and beside bf16 ones. */
    const fuse_case cases[] = {
        {1, 2560, 4, {8192, 4096, 32, 32}, {B, B, B, B}, 0},
        {9, 2560, 4, {8192, 4096, 32, 32}, {B, B, B, B}, 0},
        {4, 520, 3, {33, 20, 9}, {B, F, B}, 0},
        {1, 2560, 2, {9216, 9216}, {B, B}, 1},
        {2, 2560, 2, {9216, 9216}, {B, B}, 1},
        {9, 2560, 2, {9216, 9216}, {B, B}, 1},
        {72, 2560, 2, {1040, 1040}, {B, B}, 1},
        {3, 9216, 2, {16, 16}, {B, B}, 1},
        {17, 4096, 2, {40, 40}, {B, B}, 1},
        {2, 1024, 2, {33, 33}, {B, B}, 1},
        {5, 100, 2, {24, 24}, {B, B}, 1},
        {11, 520, 2, {70, 70}, {F, F}, 1},
    };
    for (size_t ci = 0; ci < TDM_ARRAY_LEN(cases); ci++) {
        const fuse_case *fc = &cases[ci];
        const int R = fc->R, in = fc->in, nout = fc->silu ? 1 : fc->n;
        fuse_in fi = fuse_in_make(fc, 2.0f);
        /* fused, row by row (GPU); separate ops (GPU, CPU) */
        float *yf[4], *yr[4], *ys[4], *yc[4];
        run_fused(G, fc, &fi, 0, yf);
        run_fused(G, fc, &fi, 1, yr);
        run_fused(G, fc, &fi, 2, ys);
        run_fused(CPU, fc, &fi, 2, yc);
        const char *op = fc->silu ? "matmul_silu" : "matmul_n";
        for (int j = 0; j < nout; j++) {
            const size_t ny = (size_t)R * fc->outs[j];
            char cas[96];
            snprintf(cas, sizeof(cas), "R=%d in=%d out=%d %s", R, in, fc->outs[j],
                     tdm_dtype_name(fc->dt[j]));
            report(op, cas, ct_nerr(yf[j], yc[j], ny), 1e-5);
            report_same(op, "  == separate ops", yf[j], ys[j], ny * 4);
            if (R > 1)
                report_same(op, "  rows one by one == batched", yr[j], yf[j], ny * 4);
            free(yf[j]);
            free(yr[j]);
            free(ys[j]);
            free(yc[j]);
        }
        fuse_in_free(fc, &fi);
    }
}

/* norm_matmul (a norm with the projections that read it) against the same
 * backend's rmsnorm and then matmul_n or matmul_silu, bit for bit in xn and
 * every output (one launch for decode rows on bf16 weights; other calls
 * take the separate ops), against the CPU backend's separate ops, and row
 * by row == batched. Fused: rows of up to 1024 values (one warp's in
 * norm.cu), a length not a multiple of 64, a plain (not zero-centred) norm;
 * the separate ops: longer rows (5, 8 and 18 warps a row), an fp32 weight
 * beside bf16 ones, a launch of several waves, verify and batch rows. */
typedef struct nm_case {
    fuse_case f;
    int zero_centred;
} nm_case;

/* mode 0: norm_matmul, one call; 1: norm_matmul row by row; 2: rmsnorm,
 * then matmul_n or matmul_silu. y[j] and *xn: host copies (caller frees). */
static void run_norm_matmul(tdm_backend *be, const nm_case *nc, const fuse_in *fi, const float *nw,
                            int mode, float **y, float **xn)
{
    const fuse_case *fc = &nc->f;
    const int R = fc->R, in = fc->in, nout = fc->silu ? 1 : fc->n;
    tdm_weight w[4];
    for (int j = 0; j < fc->n; j++)
        w[j] =
            put_weight(be, fi->wh[j], fi->wref[j], (size_t)fc->outs[j] * in, fc->dt[j], fi->wb[j]);
    float *dx = ct_put(be, fi->x, (size_t)R * in * 4), *dw = ct_put(be, nw, (size_t)in * 4);
    float *dn = ct_put(be, NULL, (size_t)R * in * 4), *dy[4], *du = NULL;
    ct_poison(be, dn, (size_t)R * in * 4);
    for (int j = 0; j < nout; j++) {
        dy[j] = ct_put(be, NULL, (size_t)R * fc->outs[j] * 4);
        ct_poison(be, dy[j], (size_t)R * fc->outs[j] * 4);
    }
    const float eps = 1e-6f;
    const int zc = nc->zero_centred;
    for (int r0 = 0; r0 < R; r0 += mode == 1 ? 1 : R) {
        const int nr = mode == 1 ? 1 : R;
        float *yr[4];
        for (int j = 0; j < nout; j++)
            yr[j] = dy[j] + (size_t)r0 * fc->outs[j];
        float *xr = dx + (size_t)r0 * in, *nr_ = dn + (size_t)r0 * in;
        if (mode < 2) {
            be->norm_matmul(be->ctx, nr_, xr, dw, eps, zc, nr, in, nout, yr, w,
                            fc->silu ? &w[1] : NULL, fc->outs);
        } else {
            be->rmsnorm(be->ctx, nr_, xr, dw, nr, in, eps, zc);
            if (fc->silu && be->matmul_silu) {
                be->matmul_silu(be->ctx, yr[0], nr_, w[0], w[1], nr, in, fc->outs[0]);
            } else if (fc->silu) { /* the CPU backend: the products, then silu_mul */
                du = ct_put(be, NULL, (size_t)R * fc->outs[1] * 4);
                be->matmul(be->ctx, yr[0], nr_, w[0], nr, in, fc->outs[0], 0);
                be->matmul(be->ctx, du, nr_, w[1], nr, in, fc->outs[1], 0);
                be->silu_mul(be->ctx, yr[0], yr[0], du, (size_t)nr * fc->outs[0]);
            } else {
                for (int j = 0; j < fc->n; j++)
                    be->matmul(be->ctx, yr[j], nr_, w[j], nr, in, fc->outs[j], 0);
            }
        }
    }
    for (int j = 0; j < nout; j++) {
        y[j] = ct_get(be, dy[j], (size_t)R * fc->outs[j] * 4);
        be->free(be->ctx, dy[j]);
    }
    *xn = ct_get(be, dn, (size_t)R * in * 4);
    for (int j = 0; j < fc->n; j++)
        be->free(be->ctx, (void *)w[j].data);
    be->free(be->ctx, dx);
    be->free(be->ctx, dw);
    be->free(be->ctx, dn);
    be->free(be->ctx, du);
}

static void test_norm_matmul(void)
{
    const tdm_dtype B = TDM_DTYPE_BF16, F = TDM_DTYPE_F32;
    const nm_case cases[] = {
        {{1, 1024, 4, {6144, 2048, 16, 16}, {B, B, B, B}, 0}, 1}, /* 0.8B in_proj */
        {{2, 1024, 4, {6144, 2048, 16, 16}, {B, B, B, B}, 0}, 1},
        {{1, 1024, 2, {3584, 3584}, {B, B}, 1}, 1},          /* 0.8B gate/up */
        {{1, 1024, 1, {16384}, {B}, 0}, 1},                  /* a draft vocabulary's head */
        {{1, 2560, 3, {8192, 1024, 1024}, {B, B, B}, 0}, 1}, /* 4B q, k, v */
        {{2, 2560, 2, {9216, 9216}, {B, B}, 1}, 1},
        {{2, 4096, 2, {100, 40}, {B, B}, 0}, 0},
        {{2, 9216, 2, {40, 40}, {B, B}, 1}, 1},
        {{2, 520, 2, {33, 20}, {B, B}, 0}, 1},
        {{1, 520, 3, {33, 20, 9}, {B, F, B}, 0}, 1},
        {{1, 1024, 1, {20000}, {B}, 0}, 1},         /* several waves: separate ops */
        {{3, 1024, 2, {3584, 3584}, {B, B}, 1}, 1}, /* verify rows: separate ops */
        {{9, 2560, 4, {8192, 4096, 32, 32}, {B, B, B, B}, 0}, 1},
    };
    for (size_t ci = 0; ci < TDM_ARRAY_LEN(cases); ci++) {
        const fuse_case *fc = &cases[ci].f;
        const int R = fc->R, in = fc->in, nout = fc->silu ? 1 : fc->n;
        fuse_in fi = fuse_in_make(fc, 2.0f);
        float *nw = malloc((size_t)in * 4);
        ct_fill(nw, (size_t)in, 0.5f);
        float *yf[4], *yr[4], *ys[4], *yc[4], *nf, *nr, *ns, *ncpu;
        run_norm_matmul(G, &cases[ci], &fi, nw, 0, yf, &nf);
        run_norm_matmul(G, &cases[ci], &fi, nw, 1, yr, &nr);
        run_norm_matmul(G, &cases[ci], &fi, nw, 2, ys, &ns);
        run_norm_matmul(CPU, &cases[ci], &fi, nw, 2, yc, &ncpu);
        char cas[96];
        snprintf(cas, sizeof(cas), "R=%d in=%d %s%s", R, in, fc->silu ? "gate/up" : "norm",
                 cases[ci].zero_centred ? "" : " (plain)");
        const size_t nx = (size_t)R * in;
        report("norm_matmul", cas, ct_nerr(nf, ncpu, nx), 1e-5);
        report_same("norm_matmul", "  xn == rmsnorm", nf, ns, nx * 4);
        if (R > 1)
            report_same("norm_matmul", "  xn rows one by one == batched", nr, nf, nx * 4);
        for (int j = 0; j < nout; j++) {
            const size_t ny = (size_t)R * fc->outs[j];
            snprintf(cas, sizeof(cas), "  R=%d in=%d out=%d %s", R, in, fc->outs[j],
                     tdm_dtype_name(fc->dt[j]));
            report("norm_matmul", cas, ct_nerr(yf[j], yc[j], ny), 1e-5);
            report_same("norm_matmul", "  == the separate ops", yf[j], ys[j], ny * 4);
            if (R > 1)
                report_same("norm_matmul", "  rows one by one == batched", yr[j], yf[j], ny * 4);
            free(yf[j]);
            free(yr[j]);
            free(ys[j]);
            free(yc[j]);
        }
        free(nf);
        free(nr);
        free(ns);
        free(ncpu);
        fuse_in_free(fc, &fi);
        free(nw);
    }
}

/* FP8 weights: on the GPU, the bits of the bf16 matrices of the values
 * they stand for, in every product slot and path (decode rows through the
 * warps, verify and batch rows split ahead, split k through clusters and
 * through memory, a gate/up pair, a norm fused in, several weights a launch,
 * FP8 beside bf16 weights), at scales near both ends of the exponent range;
 * against the CPU backend's FP8 products as every op is. */
static void test_fp8(void)
{
    const tdm_dtype B = TDM_DTYPE_BF16, E = TDM_DTYPE_FP8;
    const struct {
        nm_case c;
        float wscale;
    } cases[] = {
        {{{1, 1024, 4, {6144, 2048, 16, 16}, {E, E, E, E}, 0}, 1}, 1.0f}, /* 0.8B in_proj */
        {{{2, 1024, 4, {6144, 2048, 16, 16}, {E, E, E, E}, 0}, 1}, 1.0f},
        {{{5, 1024, 4, {6144, 2048, 16, 16}, {E, E, E, E}, 0}, 1}, 1.0f},
        {{{1, 1024, 2, {3584, 3584}, {E, E}, 1}, 1}, 1.0f}, /* 0.8B gate/up */
        {{{9, 1024, 2, {3584, 3584}, {E, E}, 1}, 1}, 1.0f},
        {{{1, 3584, 1, {1024}, {E}, 0}, 1}, 1.0f}, /* 0.8B down: split k */
        {{{3, 3584, 1, {1024}, {E}, 0}, 1}, 1.0f},
        {{{1, 1024, 1, {16384}, {E}, 0}, 1}, 1.0f}, /* a draft vocabulary's head */
        {{{17, 2048, 2, {1024, 40}, {E, E}, 0}, 0}, 1.0f},
        {{{40, 512, 3, {130, 64, 33}, {E, B, E}, 0}, 1}, 1.0f}, /* beside bf16 */
        {{{2, 1024, 3, {64, 200, 96}, {B, E, B}, 0}, 1}, 1.0f},
        {{{1, 1024, 2, {96, 96}, {E, E}, 0}, 1}, 0x1p-90f},
        {{{9, 1024, 2, {96, 96}, {E, E}, 1}, 1}, 0x1p-90f},
        {{{2, 1024, 2, {96, 96}, {E, E}, 0}, 1}, 0x1p20f},
    };
    for (size_t ci = 0; ci < TDM_ARRAY_LEN(cases); ci++) {
        const nm_case *n8 = &cases[ci].c;
        const fuse_case *fc = &n8->f;
        const int R = fc->R, in = fc->in, nout = fc->silu ? 1 : fc->n;
        fuse_in f8 = fuse_in_scaled(fc, 2.0f, cases[ci].wscale);
        /* the same values as bf16 matrices */
        nm_case nb = *n8;
        fuse_in fb = f8;
        int exact = 1;
        for (int j = 0; j < fc->n; j++) {
            const size_t nw = (size_t)fc->outs[j] * in;
            float *back = malloc(nw * 4);
            nb.f.dt[j] = B;
            fb.wh[j] = make_weight(f8.wref[j], nw, B, back, &fb.wb[j]);
            exact &= memcmp(back, f8.wref[j], nw * 4) == 0;
            free(back);
        }
        char cas[96];
        snprintf(cas, sizeof(cas), "R=%d in=%d n=%d%s scale %g", R, in, fc->n,
                 fc->silu ? " gate/up" : "", (double)cases[ci].wscale);
        report_identical("fp8", cas, exact); /* every FP8 value is a bf16 */
        float *y8[4], *yb[4], *s8[4], *sb[4], *yc[4], *xn8, *xnb, *xnc;
        for (int mode = 0; mode < 3; mode += 2) { /* fused, then the separate ops */
            run_fused(G, fc, &f8, mode, mode ? s8 : y8);
            run_fused(G, &nb.f, &fb, mode, mode ? sb : yb);
        }
        run_fused(CPU, fc, &f8, 2, yc);
        for (int j = 0; j < nout; j++) {
            const size_t ny = (size_t)R * fc->outs[j];
            snprintf(cas, sizeof(cas), "  out=%d %s", fc->outs[j], tdm_dtype_name(fc->dt[j]));
            report("fp8", cas, ct_nerr(y8[j], yc[j], ny), 1e-5);
            report_same("fp8",
                        fc->silu ? "  matmul_silu == on bf16 values"
                                 : "  matmul_n == on bf16 values",
                        y8[j], yb[j], ny * 4);
            report_same("fp8", "  matmul == on bf16 values", s8[j], sb[j], ny * 4);
            free(y8[j]);
            free(yb[j]);
            free(s8[j]);
            free(sb[j]);
            free(yc[j]);
        }
        if (R <= 2 || ci % 2 == 0) {
            float *nw = malloc((size_t)in * 4);
            ct_fill(nw, (size_t)in, 0.5f);
            run_norm_matmul(G, n8, &f8, nw, 0, y8, &xn8);
            run_norm_matmul(G, &nb, &fb, nw, 0, yb, &xnb);
            run_norm_matmul(CPU, n8, &f8, nw, 2, yc, &xnc);
            report_same("fp8", "  norm_matmul xn == on bf16 values", xn8, xnb, (size_t)R * in * 4);
            for (int j = 0; j < nout; j++) {
                const size_t ny = (size_t)R * fc->outs[j];
                report("fp8", "  norm_matmul vs the CPU", ct_nerr(y8[j], yc[j], ny), 1e-5);
                report_same("fp8", "  norm_matmul == on bf16 values", y8[j], yb[j], ny * 4);
                free(y8[j]);
                free(yb[j]);
                free(yc[j]);
            }
            free(xn8);
            free(xnb);
            free(xnc);
            free(nw);
        }
        for (int j = 0; j < fc->n; j++)
            free(fb.wh[j]);
        fuse_in_free(fc, &f8);
    }
}

/* A prompt prefill's matmuls (backend.h: bulk): inside a bulk call of 16
 * rows or more, bf16 matmuls of TDM_CUDA_BULK_MIN_WEIGHTS elements or more
 * take cuBLAS on x's exact bf16 parts. Against the CPU backend to fp32
 * rounding; the same inputs give the same bits twice; fewer rows are
 * refused; other weights (fp32, or bf16 below the size) stay on the exact
 * path, bit for bit; an output wider than one scratch slice (100000 columns
 * at 130 rows) is done in slices. */
static void test_bulk(void)
{
    const int shapes[][3] = {{16, 2560, 520}, {63, 1024, 1100}, {130, 64, 100000},
                             {96, 136, 7712}, {63, 1024, 66},   {96, 136, 300}};
    int took = G->bulk(G->ctx, 15);
    G->bulk(G->ctx, 0);
    printf("%-14s %-44s %s\n", "bulk", "15 rows: refused", took ? "FAIL (taken)" : "ok");
    failures += took != 0;
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
        for (int d = 0; d < 2; d++)
            for (int acc = 0; acc < 2; acc++) {
                mm_case c = mm_case_make(shapes[s][0], shapes[s][1], shapes[s][2],
                                         d ? TDM_DTYPE_F32 : TDM_DTYPE_BF16);
                const size_t n = (size_t)c.R * c.out;
                float *yc = run_matmul(CPU, &c, acc, 0);
                float *ye = run_matmul(G, &c, acc, 0);
                float *yb[2];
                for (int t = 0; t < 2; t++) {
                    if (!G->bulk(G->ctx, c.R)) {
                        printf("bulk           %d rows refused: FAIL\n", c.R);
                        failures++;
                    }
                    yb[t] = run_matmul(G, &c, acc, 0);
                    G->bulk(G->ctx, 0);
                }
                char cas[96];
                mm_case_name(&c, acc, cas, sizeof(cas));
                report("bulk matmul", cas, ct_nerr(yb[0], yc, n), 1e-5);
                report_same("bulk matmul", "  twice: the same bits", yb[0], yb[1], n * 4);
                if (c.dt != TDM_DTYPE_BF16)
                    report_same("bulk matmul", "  not bf16: the exact path", yb[0], ye, n * 4);
                else if ((size_t)c.in * (size_t)c.out < TDM_CUDA_BULK_MIN_WEIGHTS)
                    report_same("bulk matmul", "  a small weight: the exact path", yb[0], ye,
                                n * 4);
                free(yb[0]);
                free(yb[1]);
                free(yc);
                free(ye);
                mm_case_free(&c);
            }
    /* matmul_n over three bf16 weights and one fp32, and matmul_silu */
    const fuse_case cases[] = {
        {80,
         1024,
         4,
         {1040, 66, 64, 1030},
         {TDM_DTYPE_BF16, TDM_DTYPE_BF16, TDM_DTYPE_F32, TDM_DTYPE_BF16},
         0},
        {64, 2560, 2, {1040, 1040}, {TDM_DTYPE_BF16, TDM_DTYPE_BF16}, 1},
    };
    for (size_t k = 0; k < TDM_ARRAY_LEN(cases); k++) {
        const fuse_case *fc = &cases[k];
        fuse_in fi = fuse_in_make(fc, 1.0f);
        float *yc[4] = {0}, *yb[4] = {0};
        run_fused(CPU, fc, &fi, 2, yc);
        G->bulk(G->ctx, fc->R);
        run_fused(G, fc, &fi, 0, yb);
        G->bulk(G->ctx, 0);
        for (int j = 0; j < (fc->silu ? 1 : fc->n); j++) {
            char cas[96];
            snprintf(cas, sizeof(cas), "R=%d in=%d %s, output %d (%d)", fc->R, fc->in,
                     fc->silu ? "silu" : "n", j, fc->outs[j]);
            report(fc->silu ? "bulk silu" : "bulk matmul_n", cas,
                   ct_nerr(yb[j], yc[j], (size_t)fc->R * fc->outs[j]), 1e-5);
            free(yb[j]);
            free(yc[j]);
        }
        fuse_in_free(fc, &fi);
    }
}

/* A norm, the gated attention or a gate/up pair writing its output's bf16
 * parts as it writes the output, for the matmul that reads it next (three
 * rows or more): the same bits as the matmul splitting a copy of that
 * output itself. Rows as at a 4B verify block of k = 8. */
static void test_producer_split(void)
{
    const int R = 9, H = 2560, Hv = 32, Dv = 128, I = 1024, out = 1040;
    /* the gate/up pair's weights (kind 3) */
    float *gv = malloc((size_t)I * H * 4), *gref = malloc((size_t)I * H * 4);
    float *uv = malloc((size_t)I * H * 4), *uref = malloc((size_t)I * H * 4);
    ct_fill(gv, (size_t)I * H, 0.5f);
    ct_fill(uv, (size_t)I * H, 0.5f);
    size_t gb, ub;
    void *gh = make_weight(gv, (size_t)I * H, TDM_DTYPE_BF16, gref, &gb);
    void *uh = make_weight(uv, (size_t)I * H, TDM_DTYPE_BF16, uref, &ub);
    tdm_weight wg = put_weight(G, gh, gref, (size_t)I * H, TDM_DTYPE_BF16, gb);
    tdm_weight wu = put_weight(G, uh, uref, (size_t)I * H, TDM_DTYPE_BF16, ub);
    for (int kind = 0; kind < 4; kind++) {
        const int in = kind == 0 ? H : kind == 3 ? I : Hv * Dv;
        const size_t N = (size_t)R * in, XN = N > (size_t)R * H ? N : (size_t)R * H;
        float *x = malloc(XN * 4), *z = malloc(N * 4), *nw = malloc((size_t)in * 4);
        float *wv = malloc((size_t)out * in * 4), *wref = malloc((size_t)out * in * 4);
        ct_fill(x, XN, 3.0f);
        ct_fill(z, N, 2.0f);
        ct_fill(nw, (size_t)in, 1.0f);
        ct_fill(wv, (size_t)out * in, 0.5f);
        size_t wb;
        void *wh = make_weight(wv, (size_t)out * in, TDM_DTYPE_BF16, wref, &wb);
        tdm_weight w = put_weight(G, wh, wref, (size_t)out * in, TDM_DTYPE_BF16, wb);
        float *dx = ct_put(G, x, XN * 4), *dz = ct_put(G, z, N * 4);
        float *dn = ct_put(G, nw, (size_t)in * 4);
        float *dy = ct_put(G, NULL, N * 4), *dy2 = ct_put(G, NULL, N * 4), *res[2];
        const size_t cw = (size_t)(20 + R) * 4 * 256; /* caches of 20 + R positions */
        float *kv = malloc(cw * 4);
        ct_fill(kv, cw, 2.0f);
        tdm_attn_seg as = {0, R, 20, ct_put(G, kv, cw * 4), ct_put(G, kv, cw * 4)};
        free(kv);
        for (int v = 0; v < 2; v++) {
            float *dout = ct_put(G, NULL, (size_t)R * out * 4);
            G->copy(G->ctx, dy, dx, N * 4);
            if (kind == 3)
                G->matmul_silu(G->ctx, dy, dx, wg, wu, R, H, I);
            else if (kind == 0)
                G->rmsnorm(G->ctx, dy, dx, dn, R, H, 1e-6f, 1);
            else if (kind == 1)
                G->rmsnorm_gated(G->ctx, dy, dx, dz, dn, R * Hv, Dv, 1e-6f);
            else /* the 4B shape's gated attention: 16 heads of 256 over 4 kv heads */
                G->attention(G->ctx, dy, dx, dz, &as, 1, 16, 4, 256);
            const float *xin = dy;
            if (v == 1) { /* a copy: the matmul splits it itself */
                G->copy(G->ctx, dy2, dy, N * 4);
                xin = dy2;
            }
            G->matmul(G->ctx, dout, xin, w, R, in, out, 0);
            res[v] = ct_get(G, dout, (size_t)R * out * 4);
            G->free(G->ctx, dout);
        }
        G->free(G->ctx, as.k_cache);
        G->free(G->ctx, as.v_cache);
        static const char *names[] = {"rmsnorm", "rmsnorm_gated", "gated attention", "matmul_silu"};
        char cas[80];
        snprintf(cas, sizeof(cas), "R=%d in=%d: parts from %s == split by the matmul", R, in,
                 names[kind]);
        report_same("matmul", cas, res[0], res[1], (size_t)R * out * 4);
        free(res[0]);
        free(res[1]);
        G->free(G->ctx, dx);
        G->free(G->ctx, dz);
        G->free(G->ctx, dn);
        G->free(G->ctx, dy);
        G->free(G->ctx, dy2);
        G->free(G->ctx, (void *)w.data);
        free(wh);
        free(x);
        free(z);
        free(nw);
        free(wv);
        free(wref);
    }
    G->free(G->ctx, (void *)wg.data);
    G->free(G->ctx, (void *)wu.data);
    free(gh);
    free(uh);
    free(gv);
    free(gref);
    free(uv);
    free(uref);
}

/* ---- embedding ---------------------------------------------------------- */

/* Every dtype, FP8 among them (a tied LM head rounded: its table is the
 * embedding's), against the CPU backend and the table's own values. */
static void test_embed(void)
{
    const tdm_dtype dts[] = {TDM_DTYPE_F32, TDM_DTYPE_BF16, TDM_DTYPE_F16, TDM_DTYPE_FP8};
    const int V = 50, H = 72, R = 9;
    for (size_t d = 0; d < TDM_ARRAY_LEN(dts); d++) {
        float *ev = malloc((size_t)V * H * 4), *eref = malloc((size_t)V * H * 4);
        ct_fill(ev, (size_t)V * H, 2.0f);
        size_t eb;
        void *eh = make_weight(ev, (size_t)V * H, dts[d], eref, &eb);
        int32_t ids[9];
        for (int r = 0; r < R; r++)
            ids[r] = r == 0 ? V - 1 : ct_rand(V);
        float *out[2];
        tdm_backend *bes[2] = {CPU, G};
        for (int b = 0; b < 2; b++) {
            tdm_weight w = put_weight(bes[b], eh, eref, (size_t)V * H, dts[d], eb);
            float *dy = ct_put(bes[b], NULL, (size_t)R * H * 4);
            ct_poison(bes[b], dy, (size_t)R * H * 4);
            bes[b]->embed(bes[b]->ctx, dy, w, ids, R, H);
            out[b] = ct_get(bes[b], dy, (size_t)R * H * 4);
            bes[b]->free(bes[b]->ctx, (void *)w.data);
            bes[b]->free(bes[b]->ctx, dy);
        }
        char cas[64];
        snprintf(cas, sizeof(cas), "V=%d H=%d R=%d %s", V, H, R, tdm_dtype_name(dts[d]));
        report("embed", cas, ct_nerr(out[1], out[0], (size_t)R * H), 0);
        /* the rows of the values the table holds (FP8: tdm_fp8_value's) */
        int same = 1;
        for (int r = 0; r < R; r++)
            same &= memcmp(out[1] + (size_t)r * H, eref + (size_t)ids[r] * H,
                           (size_t)H * sizeof(float)) == 0;
        report_identical("embed", "  the table's values", same);
        free(out[0]);
        free(out[1]);
        free(eh);
        free(ev);
        free(eref);
    }
}

/* ---- norms and elementwise -------------------------------------------------- */

static void test_rmsnorm(void)
{
    /* 1 x 2560 and 72 x 2560: the 4B hidden size at decode and 8 x 9 rows;
     * 16 x 256: its q_norm; 1001 takes scalar loads, 40000 the long-row loop */
    const int shapes[][2] = {{5, 64},    {3, 1024}, {17, 16},  {2, 2560}, {24, 256}, {1, 2560},
                             {72, 2560}, {16, 256}, {4, 5120}, {3, 1001}, {2, 40000}};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
        for (int mode = 0; mode < 4; mode++) { /* zero_centred x in place */
            int R = shapes[s][0], n = shapes[s][1], zc = mode & 1, inplace = mode >> 1;
            float *x = malloc((size_t)R * n * 4), *w = malloc((size_t)n * 4);
            ct_fill(x, (size_t)R * n, 3.0f);
            ct_fill(w, (size_t)n, 1.0f);
            /* Over 40000 terms the CPU's sequential fp32 sum of squares is
             * itself off by ~5e-6; integer inputs make every sum exact. */
            if (n > 32768)
                for (size_t i = 0; i < (size_t)R * n; i++)
                    x[i] = roundf(x[i]);
            float *out[2];
            tdm_backend *bes[2] = {CPU, G};
            for (int b = 0; b < 2; b++) {
                tdm_backend *be = bes[b];
                float *dx = ct_put(be, x, (size_t)R * n * 4), *dw = ct_put(be, w, (size_t)n * 4);
                float *dy = inplace ? dx : ct_put(be, NULL, (size_t)R * n * 4);
                if (!inplace)
                    ct_poison(be, dy, (size_t)R * n * 4);
                be->rmsnorm(be->ctx, dy, dx, dw, R, n, 1e-6f, zc);
                out[b] = ct_get(be, dy, (size_t)R * n * 4);
                be->free(be->ctx, dx);
                be->free(be->ctx, dw);
                if (!inplace)
                    be->free(be->ctx, dy);
            }
            char cas[64];
            snprintf(cas, sizeof(cas), "R=%d n=%d%s%s", R, n, zc ? " zero-centred" : "",
                     inplace ? " in place" : "");
            report("rmsnorm", cas, ct_nerr(out[1], out[0], (size_t)R * n), 1e-5);
            free(out[0]);
            free(out[1]);
            free(x);
            free(w);
        }
}

static void test_rmsnorm_gated(void)
{
    /* 2304 x 128: the 4B shape's 8 x 9 rows of 32 value heads */
    const int shapes[][2] = {{7, 64}, {32, 128}, {3, 16}, {2304, 128}, {2, 1001}, {1, 2560}};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
        int R = shapes[s][0], n = shapes[s][1];
        size_t N = (size_t)R * n;
        float *x = malloc(N * 4), *z = malloc(N * 4), *w = malloc((size_t)n * 4);
        ct_fill(x, N, 2.0f);
        ct_fill(z, N, 4.0f);
        ct_fill(w, (size_t)n, 1.5f);
        float *out[2];
        tdm_backend *bes[2] = {CPU, G};
        for (int b = 0; b < 2; b++) {
            tdm_backend *be = bes[b];
            float *dx = ct_put(be, x, N * 4), *dz = ct_put(be, z, N * 4);
            float *dw = ct_put(be, w, (size_t)n * 4), *dy = ct_put(be, NULL, N * 4);
            ct_poison(be, dy, N * 4);
            be->rmsnorm_gated(be->ctx, dy, dx, dz, dw, R, n, 1e-6f);
            out[b] = ct_get(be, dy, N * 4);
            be->free(be->ctx, dx);
            be->free(be->ctx, dz);
            be->free(be->ctx, dw);
            be->free(be->ctx, dy);
        }
        char cas[64];
        snprintf(cas, sizeof(cas), "R=%d n=%d", R, n);
        report("rmsnorm_gated", cas, ct_nerr(out[1], out[0], N), 1e-5);
        free(out[0]);
        free(out[1]);
        free(x);
        free(z);
        free(w);
    }
}

/* A row's bits depend on n alone: not on the batch (rows one by one against
 * the batched call) nor on the alignment of the pointers (the batch one
 * float off alignment, which takes scalar instead of float4 loads). */
static void test_norm_invariance(void)
{
    const int ns[] = {16, 128, 256, 1000, 1001, 1024, 2560, 5120, 40000};
    const int R = 9;
    for (size_t s = 0; s < TDM_ARRAY_LEN(ns); s++)
        for (int gated = 0; gated < 2; gated++) {
            const int n = ns[s];
            const size_t N = (size_t)R * n;
            float *x = malloc(N * 4), *z = malloc(N * 4), *w = malloc((size_t)n * 4);
            ct_fill(x, N, 3.0f);
            ct_fill(z, N, 4.0f);
            ct_fill(w, (size_t)n, 1.0f);
            float *dw = ct_put(G, w, (size_t)n * 4), *out[3];
            for (int v = 0; v < 3; v++) { /* batched, rows one by one, unaligned */
                const int off = v == 2;
                float *bx = ct_put(G, NULL, (N + 4) * 4), *bz = ct_put(G, NULL, (N + 4) * 4);
                float *by = ct_put(G, NULL, (N + 4) * 4);
                float *dx = bx + off, *dz = bz + off, *dy = by + off;
                G->upload(G->ctx, dx, x, N * 4);
                G->upload(G->ctx, dz, z, N * 4);
                ct_poison(G, dy, N * 4);
                for (int r = 0; r < (v == 1 ? R : 1); r++) {
                    const size_t o = v == 1 ? (size_t)r * n : 0;
                    const int rows = v == 1 ? 1 : R;
                    if (gated)
                        G->rmsnorm_gated(G->ctx, dy + o, dx + o, dz + o, dw, rows, n, 1e-6f);
                    else
                        G->rmsnorm(G->ctx, dy + o, dx + o, dw, rows, n, 1e-6f, 1);
                }
                out[v] = ct_get(G, dy, N * 4);
                G->free(G->ctx, bx);
                G->free(G->ctx, bz);
                G->free(G->ctx, by);
            }
            char cas[64];
            snprintf(cas, sizeof(cas), "R=%d n=%d: rows one by one == batched", R, n);
            const char *op = gated ? "rmsnorm_gated" : "rmsnorm";
            report_same(op, cas, out[1], out[0], N * 4);
            snprintf(cas, sizeof(cas), "R=%d n=%d: unaligned == aligned", R, n);
            report_same(op, cas, out[2], out[0], N * 4);
            for (int v = 0; v < 3; v++)
                free(out[v]);
            G->free(G->ctx, dw);
            free(x);
            free(z);
            free(w);
        }
}

/* Segments of segs[i] = {nrows, n_past} rows in order, their caches
 * [cap[i], W] uploaded to be from kc[i] and vc[i]. */
static void segs_put(tdm_backend *be, tdm_attn_seg *as, const int (*segs)[2], int nseg,
                     float *const *kc, float *const *vc, const int *cap, int W)
{
    for (int i = 0, r = 0; i < nseg; i++) {
        as[i] = (tdm_attn_seg){r, segs[i][0], segs[i][1], ct_put(be, kc[i], (size_t)cap[i] * W * 4),
                               ct_put(be, vc[i], (size_t)cap[i] * W * 4)};
        r += segs[i][0];
    }
}

static void segs_free(tdm_backend *be, const tdm_attn_seg *as, int nseg)
{
    for (int i = 0; i < nseg; i++) {
        be->free(be->ctx, as[i].k_cache);
        be->free(be->ctx, as[i].v_cache);
    }
}

/* attn_prep against the CPU's split, norms, rotations and copies: q and the
 * caches' k rows by normalised error, gate and v rows exactly, cache rows
 * outside the segments' untouched; and the same bits with each segment run
 * alone. Head dims 16 .. 512 (every register layout), rot below and at D. */
static void test_attn_prep(void)
{
    /* nH, nKV, D, rot */
    const int shapes[][4] = {{8, 2, 256, 64}, {4, 4, 64, 16},   {6, 2, 32, 32},
                             {2, 1, 16, 8},   {4, 2, 512, 128}, {3, 3, 128, 0}};
    /* segments: nrows, n_past */
    const int segs[][2] = {{1, 0}, {4, 17}, {9, 40}, {1, 300}};
    enum { NSEG = 4 };
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
        const int nH = shapes[s][0], nKV = shapes[s][1], D = shapes[s][2], rot = shapes[s][3];
        const int W = nKV * D;
        int R = 0, cap[NSEG];
        for (int i = 0; i < NSEG; i++) {
            R += segs[i][0];
            cap[i] = segs[i][1] + segs[i][0] + 2; /* two rows past the segment's */
        }
        const size_t N = (size_t)R * nH * D, KN = (size_t)R * W;
        float *qg = malloc(2 * N * 4), *k = malloc(KN * 4), *v = malloc(KN * 4);
        float *qn = malloc((size_t)D * 4), *kn = malloc((size_t)D * 4);
        float *inv = malloc(((size_t)rot / 2 + 1) * 4), *cache[NSEG];
        int32_t pos[32];
        ct_fill(qg, 2 * N, 2.0f);
        ct_fill(k, KN, 2.0f);
        ct_fill(v, KN, 1.0f);
        ct_fill(qn, (size_t)D, 0.5f);
        ct_fill(kn, (size_t)D, 0.5f);
        for (int i = 0; i < rot / 2; i++)
            inv[i] = 1.0f / powf(10000000.0f, (float)(2 * i) / (float)rot);
        for (int r = 0; r < R; r++)
            pos[r] = r == 0 ? 0 : ct_rand(6000);
        for (int i = 0; i < NSEG; i++) {
            cache[i] = malloc((size_t)cap[i] * W * 4);
            ct_fill(cache[i], (size_t)cap[i] * W, 1.0f);
        }
        /* [CPU, GPU batched, GPU one segment at a time] */
        float *q[3], *gate[3], *kc[3][NSEG], *vc[3][NSEG];
        tdm_backend *bes[3] = {CPU, G, G};
        for (int b = 0; b < 3; b++) {
            tdm_backend *be = bes[b];
            float *dqg = ct_put(be, qg, 2 * N * 4), *dk = ct_put(be, k, KN * 4);
            float *dv = ct_put(be, v, KN * 4), *dqn = ct_put(be, qn, (size_t)D * 4);
            float *dkn = ct_put(be, kn, (size_t)D * 4);
            float *dq = ct_put(be, NULL, N * 4), *dg = ct_put(be, NULL, N * 4);
            ct_poison(be, dq, N * 4);
            ct_poison(be, dg, N * 4);
            tdm_attn_seg as[NSEG];
            segs_put(be, as, segs, NSEG, cache, cache, cap, W);
            if (b < 2)
                be->attn_prep(be->ctx, dq, dg, dqg, dk, dv, dqn, dkn, 1e-6f, pos, inv, rot, as,
                              NSEG, nH, nKV, D);
            else
                for (int i = 0; i < NSEG; i++)
                    be->attn_prep(be->ctx, dq, dg, dqg, dk, dv, dqn, dkn, 1e-6f, pos, inv, rot,
                                  &as[i], 1, nH, nKV, D);
            q[b] = ct_get(be, dq, N * 4);
            gate[b] = ct_get(be, dg, N * 4);
            for (int i = 0; i < NSEG; i++) {
                kc[b][i] = ct_get(be, as[i].k_cache, (size_t)cap[i] * W * 4);
                vc[b][i] = ct_get(be, as[i].v_cache, (size_t)cap[i] * W * 4);
            }
            segs_free(be, as, NSEG);
            void *bufs[] = {dqg, dk, dv, dqn, dkn, dq, dg};
            for (size_t j = 0; j < TDM_ARRAY_LEN(bufs); j++)
                be->free(be->ctx, bufs[j]);
        }
        char cas[96];
        snprintf(cas, sizeof(cas), "nH=%d nKV=%d D=%d rot=%d, 4 segments R=%d", nH, nKV, D, rot, R);
        report("attn_prep", cas, ct_nerr(q[1], q[0], N), 1e-5);
        /* the gate is a copy of qg's second halves */
        float *gw = malloc(N * 4);
        for (size_t i = 0; i < N; i++)
            gw[i] = qg[(i / (size_t)D) * 2 * (size_t)D + (size_t)D + i % (size_t)D];
        report_same("attn_prep", "  gate: qg's second halves", gate[1], gw, N * 4);
        free(gw);
        double kerr = 0;
        int same_v = 1, rest = 1;
        for (int i = 0; i < NSEG; i++) {
            const size_t at = (size_t)segs[i][1] * W, n = (size_t)segs[i][0] * W;
            kerr += ct_nerr(kc[1][i] + at, kc[0][i] + at, n);
            same_v &= memcmp(vc[1][i], vc[0][i], (size_t)cap[i] * W * 4) == 0;
            /* rows before and after the segment's: as uploaded */
            rest &= memcmp(kc[1][i], cache[i], at * 4) == 0 &&
                    memcmp(kc[1][i] + at + n, cache[i] + at + n, 2 * (size_t)W * 4) == 0;
        }
        report("attn_prep", "  k rows in the caches", kerr, 1e-5);
        report_identical("attn_prep", "  v rows in the caches, the rest untouched", same_v && rest);
        report_same("attn_prep", "  q: segments one by one == batched", q[2], q[1], N * 4);
        int seg_same = 1;
        for (int i = 0; i < NSEG; i++)
            seg_same &= memcmp(kc[2][i], kc[1][i], (size_t)cap[i] * W * 4) == 0;
        report_identical("attn_prep", "  caches: segments one by one == batched", seg_same);
        for (int b = 0; b < 3; b++) {
            free(q[b]);
            free(gate[b]);
            for (int i = 0; i < NSEG; i++) {
                free(kc[b][i]);
                free(vc[b][i]);
            }
        }
        for (int i = 0; i < NSEG; i++)
            free(cache[i]);
        free(qg);
        free(k);
        free(v);
        free(qn);
        free(kn);
        free(inv);
    }
}

/* copy_n against one copy per pair: sizes and offsets off 16 bytes. */
static void test_copy_n(void)
{
    enum { N = 5 };
    const size_t sizes[N] = {2u << 20, 3, 4096, 1000004, 17};
    const size_t offs[N] = {0, 1, 16, 4, 7};
    size_t total = 0;
    for (int i = 0; i < N; i++)
        total += sizes[i] + offs[i] + 16;
    unsigned char *h = malloc(total);
    for (size_t i = 0; i < total; i++)
        h[i] = (unsigned char)(i * 2654435761u >> 13);
    unsigned char *src = ct_put(G, h, total), *dst = ct_put(G, NULL, total);
    G->upload(G->ctx, dst, h + 1, total - 1);
    void *d[N];
    const void *sp[N];
    size_t at = 0;
    for (int i = 0; i < N; i++) {
        sp[i] = src + at + offs[i];
        d[i] = dst + at + (offs[i] + 3) % 16;
        at += sizes[i] + offs[i] + 16;
    }
    G->copy_n(G->ctx, N, d, sp, sizes);
    unsigned char *got = ct_get(G, dst, total);
    unsigned char *want = malloc(total);
    memcpy(want, h + 1, total - 1);
    want[total - 1] = got[total - 1]; /* never uploaded */
    at = 0;
    for (int i = 0; i < N; i++) {
        memcpy(want + at + (offs[i] + 3) % 16, h + at + offs[i], sizes[i]);
        at += sizes[i] + offs[i] + 16;
    }
    report_same("copy_n", "5 copies, 3 B .. 2 MB, unaligned", got, want, total);
    free(got);
    free(want);
    free(h);
    G->free(G->ctx, src);
    G->free(G->ctx, dst);
}

static void test_elementwise(void)
{
    const size_t N = 100003;
    float *a = malloc(N * 4), *bb = malloc(N * 4);
    ct_fill(a, N, 8.0f);
    ct_fill(bb, N, 3.0f);
    float *sm[2], *smi[2], *smu[2];
    tdm_backend *bes[2] = {CPU, G};
    for (int b = 0; b < 2; b++) {
        tdm_backend *be = bes[b];
        float *da = ct_put(be, a, N * 4), *db = ct_put(be, bb, N * 4);
        float *dy = ct_put(be, NULL, N * 4);
        ct_poison(be, dy, N * 4);
        be->silu_mul(be->ctx, dy, da, db, N);
        sm[b] = ct_get(be, dy, N * 4);
        /* one float off alignment: the scalar path */
        ct_poison(be, dy, N * 4);
        be->silu_mul(be->ctx, dy + 1, da + 1, db, N - 1);
        smu[b] = ct_get(be, dy + 1, (N - 1) * 4);
        be->silu_mul(be->ctx, da, da, db, N); /* y aliasing a */
        smi[b] = ct_get(be, da, N * 4);
        be->free(be->ctx, da);
        be->free(be->ctx, db);
        be->free(be->ctx, dy);
    }
    report("silu_mul", "n=100003", ct_nerr(sm[1], sm[0], N), 1e-5);
    report("silu_mul", "n=100003 y aliasing a", ct_nerr(smi[1], smi[0], N), 1e-5);
    report("silu_mul", "  unaligned pointers", ct_nerr(smu[1], smu[0], N - 1), 1e-5);
    for (int b = 0; b < 2; b++) {
        free(smu[b]);
        free(sm[b]);
        free(smi[b]);
    }
    free(a);
    free(bb);
}

/* out: CPU, GPU batched, GPU one segment at a time, n values each; freed. */
static void report_attention(const char *cas, float **out, size_t n)
{
    report("attention", cas, ct_nerr(out[1], out[0], n), 1e-5);
    report_same("attention", "  segments one by one == batched", out[2], out[1], n * 4);
    for (int b = 0; b < 3; b++)
        free(out[b]);
}

/* ---- attention ---------------------------------------------------------------- */

/* Gated, as the model runs it: out times sigmoid(gate). */
static void test_attention(void)
{
    /* nH, nKV, D */
    const int heads[][3] = {{8, 2, 256}, {4, 4, 64}, {6, 2, 16}, {16, 4, 128}};
    /* segments: nrows, n_past */
    const int segs[][2] = {{1, 0}, {4, 17}, {9, 40}, {1, 300}, {3, 0}};
    const int nseg = (int)TDM_ARRAY_LEN(segs);
    for (size_t hh = 0; hh < TDM_ARRAY_LEN(heads); hh++) {
        int nH = heads[hh][0], nKV = heads[hh][1], D = heads[hh][2], W = nKV * D;
        int R = 0, cap[8];
        for (int i = 0; i < nseg; i++) {
            R += segs[i][0];
            cap[i] = segs[i][1] + segs[i][0];
        }
        const size_t N = (size_t)R * nH * D;
        float *q = malloc(N * 4), *g = malloc(N * 4), *kc[8], *vc[8];
        ct_fill(q, N, 2.0f);
        ct_fill(g, N, 4.0f);
        for (int i = 0; i < nseg; i++) {
            kc[i] = malloc((size_t)cap[i] * W * 4);
            vc[i] = malloc((size_t)cap[i] * W * 4);
            ct_fill(kc[i], (size_t)cap[i] * W, 2.0f);
            ct_fill(vc[i], (size_t)cap[i] * W, 1.0f);
        }
        float *out[3];
        tdm_backend *bes[3] = {CPU, G, G};
        for (int b = 0; b < 3; b++) {
            tdm_backend *be = bes[b];
            float *dq = ct_put(be, q, N * 4), *dg = ct_put(be, g, N * 4);
            float *dout = ct_put(be, NULL, N * 4);
            ct_poison(be, dout, N * 4);
            tdm_attn_seg as[8];
            segs_put(be, as, segs, nseg, kc, vc, cap, W);
            if (b < 2) {
                be->attention(be->ctx, dout, dq, dg, as, nseg, nH, nKV, D);
            } else { /* each segment alone */
                for (int i = 0; i < nseg; i++)
                    be->attention(be->ctx, dout, dq, dg, &as[i], 1, nH, nKV, D);
            }
            out[b] = ct_get(be, dout, N * 4);
            segs_free(be, as, nseg);
            be->free(be->ctx, dq);
            be->free(be->ctx, dg);
            be->free(be->ctx, dout);
        }
        char cas[96];
        snprintf(cas, sizeof(cas), "gated, nH=%d nKV=%d D=%d, 5 segments R=%d", nH, nKV, D, R);
        report_attention(cas, out, N);
        for (int i = 0; i < nseg; i++) {
            free(kc[i]);
            free(vc[i]);
        }
        free(q);
        free(g);
    }
}

/* Long contexts (up to 3000 keys, so a row's keys are split over 8 blocks)
 * in a batch big enough (R·nKV >= 256) that the rows run one block each,
 * while each segment alone runs split over a cluster: the two kernels must
 * agree to the bit, which "segments one by one" checks. */
static void test_attention_long(void)
{
    /* nH, nKV, D: the 4B shape, 8 query heads per kv head, head dim 512 */
    const int heads[][3] = {{16, 4, 256}, {8, 1, 128}, {6, 2, 512}};
    /* segments: nrows, n_past */
    const int segs[][2] = {{1, 2999}, {9, 2000}, {17, 700}, {1, 0}, {60, 5}, {200, 40}};
    const int nseg = (int)TDM_ARRAY_LEN(segs);
    for (size_t hh = 0; hh < TDM_ARRAY_LEN(heads); hh++) {
        int nH = heads[hh][0], nKV = heads[hh][1], D = heads[hh][2], W = nKV * D;
        int R = 0, cap[8];
        for (int i = 0; i < nseg; i++) {
            R += segs[i][0];
            cap[i] = segs[i][1] + segs[i][0];
        }
        float *q = malloc((size_t)R * nH * D * 4), *kc[8], *vc[8];
        ct_fill(q, (size_t)R * nH * D, 2.0f);
        for (int i = 0; i < nseg; i++) {
            kc[i] = malloc((size_t)cap[i] * W * 4);
            vc[i] = malloc((size_t)cap[i] * W * 4);
            ct_fill(kc[i], (size_t)cap[i] * W, 2.0f);
            ct_fill(vc[i], (size_t)cap[i] * W, 1.0f);
        }
        float *out[3];
        tdm_backend *bes[3] = {CPU, G, G};
        for (int b = 0; b < 3; b++) {
            tdm_backend *be = bes[b];
            float *dq = ct_put(be, q, (size_t)R * nH * D * 4);
            float *dout = ct_put(be, NULL, (size_t)R * nH * D * 4);
            ct_poison(be, dout, (size_t)R * nH * D * 4);
            tdm_attn_seg as[8];
            segs_put(be, as, segs, nseg, kc, vc, cap, W);
            if (b < 2)
                be->attention(be->ctx, dout, dq, NULL, as, nseg, nH, nKV, D);
            else
                for (int i = 0; i < nseg; i++)
                    be->attention(be->ctx, dout, dq, NULL, &as[i], 1, nH, nKV, D);
            out[b] = ct_get(be, dout, (size_t)R * nH * D * 4);
            segs_free(be, as, nseg);
            be->free(be->ctx, dq);
            be->free(be->ctx, dout);
        }
        char cas[96];
        snprintf(cas, sizeof(cas), "nH=%d nKV=%d D=%d, up to 3000 keys R=%d", nH, nKV, D, R);
        report_attention(cas, out, (size_t)R * nH * D);
        for (int i = 0; i < nseg; i++) {
            free(kc[i]);
            free(vc[i]);
        }
        free(q);
    }
}

/* ---- conv and the gated delta rule ------------------------------------------- */

#define MAXSEG 8

/* Segments of one call: rows per segment, and whether the segment keeps
 * per-row states (states_out) instead of updating its state in place. */
typedef struct seg_set {
    const char *name;
    int n;
    int rows[MAXSEG], extra[MAXSEG];
} seg_set;

/* Mixed lengths and state modes, small. */
static const seg_set set_mixed = {"4 segments", 4, {1, 6, 3, 2}, {0, 1, 0, 1}};
/* Verify blocks (9, 17 rows, per-row states), a prompt chunk longer than the
 * conv's 16-row chunks (in place), decode rows, a segment shorter than the
 * conv window (its new window keeps old state). */
static const seg_set set_verify = {"verify-shaped", 5, {9, 17, 20, 1, 2}, {1, 1, 0, 0, 0}};
/* A batch of 8 decode rows. */
static const seg_set set_decode8 = {"8 x 1", 8, {1, 1, 1, 1, 1, 1, 1, 1}, {0}};

static int set_rows(const seg_set *ss)
{
    int R = 0;
    for (int i = 0; i < ss->n; i++)
        R += ss->rows[i];
    return R;
}

typedef struct conv_out {
    float *y, *state[MAXSEG], *sout[MAXSEG];
} conv_out;

static void run_conv(tdm_backend *be, const seg_set *ss, const float *x, const float *w,
                     float *const *st, int C, int K, int split, conv_out *o)
{
    const int S = K - 1, R = set_rows(ss);
    float *dx = ct_put(be, x, (size_t)R * C * 4), *dw = ct_put(be, w, (size_t)C * K * 4);
    float *dy = ct_put(be, NULL, (size_t)R * C * 4);
    ct_poison(be, dy, (size_t)R * C * 4);
    tdm_conv_seg cs[MAXSEG];
    for (int i = 0, r = 0; i < ss->n; i++) {
        float *ds = ct_put(be, st[i], (size_t)S * C * 4), *dso = NULL;
        if (ss->extra[i]) {
            dso = ct_put(be, NULL, (size_t)ss->rows[i] * S * C * 4);
            ct_poison(be, dso, (size_t)ss->rows[i] * S * C * 4);
        }
        cs[i] = (tdm_conv_seg){r, ss->rows[i], ds, dso};
        r += ss->rows[i];
    }
    if (split)
        for (int i = 0; i < ss->n; i++)
            be->conv_silu(be->ctx, dy, dx, dw, &cs[i], 1, C, K);
    else
        be->conv_silu(be->ctx, dy, dx, dw, cs, ss->n, C, K);
    o->y = ct_get(be, dy, (size_t)R * C * 4);
    for (int i = 0; i < ss->n; i++) {
        o->state[i] = ct_get(be, cs[i].state, (size_t)S * C * 4);
        o->sout[i] =
            ss->extra[i] ? ct_get(be, cs[i].states_out, (size_t)ss->rows[i] * S * C * 4) : NULL;
        be->free(be->ctx, cs[i].state);
        be->free(be->ctx, cs[i].states_out);
    }
    be->free(be->ctx, dx);
    be->free(be->ctx, dw);
    be->free(be->ctx, dy);
}

static void conv_out_free(const seg_set *ss, conv_out *o)
{
    free(o->y);
    for (int i = 0; i < ss->n; i++) {
        free(o->state[i]);
        free(o->sout[i]);
    }
}

static void test_conv(void)
{
    /* C, K; 8192 x 4 is the 4B shape */
    const int shapes[][2] = {{96, 4}, {6144, 4}, {40, 2}, {8192, 4}, {64, 3}};
    const seg_set *sets[] = {&set_mixed, &set_verify};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
        for (size_t k = 0; k < TDM_ARRAY_LEN(sets); k++) {
            const seg_set *ss = sets[k];
            int C = shapes[s][0], K = shapes[s][1], S = K - 1, R = set_rows(ss);
            float *x = malloc((size_t)R * C * 4), *w = malloc((size_t)C * K * 4), *st[MAXSEG];
            ct_fill(x, (size_t)R * C, 3.0f);
            ct_fill(w, (size_t)C * K, 1.0f);
            for (int i = 0; i < ss->n; i++) {
                st[i] = malloc((size_t)S * C * 4);
                ct_fill(st[i], (size_t)S * C, 3.0f);
            }
            conv_out oc, og, os;
            run_conv(CPU, ss, x, w, st, C, K, 0, &oc);
            run_conv(G, ss, x, w, st, C, K, 0, &og);
            run_conv(G, ss, x, w, st, C, K, 1, &os);
            char cas[96];
            snprintf(cas, sizeof(cas), "C=%d K=%d, %s R=%d", C, K, ss->name, R);
            report("conv_silu", cas, ct_nerr(og.y, oc.y, (size_t)R * C), 1e-5);
            double e = 0;
            for (int i = 0; i < ss->n; i++) {
                e += ct_nerr(og.state[i], oc.state[i], (size_t)S * C);
                if (ss->extra[i])
                    e += ct_nerr(og.sout[i], oc.sout[i], (size_t)ss->rows[i] * S * C);
            }
            report("conv_silu", "  window states (in place and per row)", e, 0);
            report_same("conv_silu", "  segments one by one == batched", os.y, og.y,
                        (size_t)R * C * 4);
            conv_out_free(ss, &oc);
            conv_out_free(ss, &og);
            conv_out_free(ss, &os);
            for (int i = 0; i < ss->n; i++)
                free(st[i]);
            free(x);
            free(w);
        }
}

typedef struct gdn_out {
    float *o, *state[MAXSEG], *sout[MAXSEG];
} gdn_out;

/* misalign: qkv one float past an aligned address, which takes the
 * kernel's scalar loads; the arithmetic must not change. */
/* The gates' inputs on the host: a, b [R, Hv], A_log, dt_bias [Hv]. */
typedef struct gdn_gate_in {
    const float *a, *b, *A_log, *dt_bias;
} gdn_gate_in;

static void run_gdn(tdm_backend *be, const seg_set *ss, const float *qkv, const gdn_gate_in *gi,
                    float *const *st, int Hk, int Hv, int Dk, int Dv, int split, int misalign,
                    gdn_out *o)
{
    const int stride = 2 * Hk * Dk + Hv * Dv, R = set_rows(ss);
    const size_t hs = (size_t)Hv * Dk * Dv;
    float *dqkv0 = ct_put(be, NULL, ((size_t)R * stride + 4) * 4), *dqkv = dqkv0 + misalign;
    be->upload(be->ctx, dqkv, qkv, (size_t)R * stride * 4);
    float *da = ct_put(be, gi->a, (size_t)R * Hv * 4), *db = ct_put(be, gi->b, (size_t)R * Hv * 4);
    float *dal = ct_put(be, gi->A_log, (size_t)Hv * 4),
          *ddt = ct_put(be, gi->dt_bias, (size_t)Hv * 4);
    const tdm_gdn_gates gt = {da, db, dal, ddt};
    float *dout = ct_put(be, NULL, (size_t)R * Hv * Dv * 4);
    ct_poison(be, dout, (size_t)R * Hv * Dv * 4);
    tdm_gdn_seg gs[MAXSEG];
    for (int i = 0, r = 0; i < ss->n; i++) {
        float *ds = ct_put(be, st[i], hs * 4), *dso = NULL;
        if (ss->extra[i]) {
            dso = ct_put(be, NULL, (size_t)ss->rows[i] * hs * 4);
            ct_poison(be, dso, (size_t)ss->rows[i] * hs * 4);
        }
        gs[i] = (tdm_gdn_seg){.row0 = r, .nrows = ss->rows[i], .state = ds, .states_out = dso};
        r += ss->rows[i];
    }
    if (split)
        for (int i = 0; i < ss->n; i++)
            be->gdn_recurrent(be->ctx, dout, dqkv, stride, gt, &gs[i], 1, Hk, Hv, Dk, Dv);
    else
        be->gdn_recurrent(be->ctx, dout, dqkv, stride, gt, gs, ss->n, Hk, Hv, Dk, Dv);
    o->o = ct_get(be, dout, (size_t)R * Hv * Dv * 4);
    for (int i = 0; i < ss->n; i++) {
        o->state[i] = ct_get(be, gs[i].state, hs * 4);
        o->sout[i] =
            ss->extra[i] ? ct_get(be, gs[i].states_out, (size_t)ss->rows[i] * hs * 4) : NULL;
        be->free(be->ctx, gs[i].state);
        be->free(be->ctx, gs[i].states_out);
    }
    be->free(be->ctx, dqkv0);
    be->free(be->ctx, da);
    be->free(be->ctx, db);
    be->free(be->ctx, dal);
    be->free(be->ctx, ddt);
    be->free(be->ctx, dout);
}

static void gdn_out_free(const seg_set *ss, gdn_out *o)
{
    free(o->o);
    for (int i = 0; i < ss->n; i++) {
        free(o->state[i]);
        free(o->sout[i]);
    }
}

static void test_gdn(void)
{
    /* Hk, Hv, Dk, Dv, which segment sets; 16/32/128/128 is the 4B shape,
     * Dk 24 and 40 leave parts of the lanes' key slices empty */
    const int shapes[][5] = {{2, 4, 64, 64, 1},     {2, 2, 128, 128, 3}, {1, 3, 256, 40, 1},
                             {4, 8, 16, 16, 1},     {2, 2, 24, 20, 1},   {1, 2, 40, 36, 1},
                             {16, 32, 128, 128, 7}, {1, 1, 512, 64, 1}};
    const seg_set *sets[] = {&set_mixed, &set_verify, &set_decode8};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
        for (size_t k = 0; k < TDM_ARRAY_LEN(sets); k++) {
            if (!(shapes[s][4] >> k & 1))
                continue;
            const seg_set *ss = sets[k];
            int Hk = shapes[s][0], Hv = shapes[s][1], Dk = shapes[s][2], Dv = shapes[s][3];
            int R = set_rows(ss);
            const int stride = 2 * Hk * Dk + Hv * Dv;
            const size_t hs = (size_t)Hv * Dk * Dv;
            float *qkv = malloc((size_t)R * stride * 4), *ga = malloc((size_t)R * Hv * 4);
            float *gb = malloc((size_t)R * Hv * 4), *al = malloc((size_t)Hv * 4);
            float *dt = malloc((size_t)Hv * 4), *st[MAXSEG];
            ct_fill(qkv, (size_t)R * stride, 1.0f);
            /* The gates: softplus(a + dt_bias) mostly in (0, 7), some rows
             * on either side of torch's threshold (u > 20 is taken as is);
             * exp(A_log) in (0.37, 1.6); beta = sigmoid(b) in (0, 1). */
            ct_fill(ga, (size_t)R * Hv, 6.0f);
            ct_fill(gb, (size_t)R * Hv, 6.0f);
            ct_fill(al, (size_t)Hv, 0.75f);
            ct_fill(dt, (size_t)Hv, 1.0f);
            for (size_t i = 0; i < (size_t)R * Hv; i++)
                ga[i] = i % 7 == 3 ? 20.0f + ga[i] / 12.0f : ga[i];
            for (int h = 0; h < Hv; h++)
                al[h] -= 0.25f;
            const gdn_gate_in gi = {ga, gb, al, dt};
            for (int i = 0; i < ss->n; i++) {
                st[i] = malloc(hs * 4);
                ct_fill(st[i], hs, 0.5f);
            }
            gdn_out oc, og, os, om;
            run_gdn(CPU, ss, qkv, &gi, st, Hk, Hv, Dk, Dv, 0, 0, &oc);
            run_gdn(G, ss, qkv, &gi, st, Hk, Hv, Dk, Dv, 0, 0, &og);
            run_gdn(G, ss, qkv, &gi, st, Hk, Hv, Dk, Dv, 1, 0, &os);
            run_gdn(G, ss, qkv, &gi, st, Hk, Hv, Dk, Dv, 0, 1, &om);
            char cas[96];
            snprintf(cas, sizeof(cas), "Hk=%d Hv=%d Dk=%d Dv=%d, %s R=%d", Hk, Hv, Dk, Dv, ss->name,
                     R);
            report("gdn_recurrent", cas, ct_nerr(og.o, oc.o, (size_t)R * Hv * Dv), 3e-5);
            double es = 0, eo = 0;
            for (int i = 0; i < ss->n; i++) {
                double e = ct_nerr(og.state[i], oc.state[i], hs);
                es = e > es ? e : es;
                if (ss->extra[i]) {
                    e = ct_nerr(og.sout[i], oc.sout[i], (size_t)ss->rows[i] * hs);
                    eo = e > eo ? e : eo;
                }
            }
            report("gdn_recurrent", "  final states in place (max over segments)", es, 3e-5);
            report("gdn_recurrent", "  per-row states_out (max over segments)", eo, 3e-5);
            report_same("gdn_recurrent", "  segments one by one == batched", os.o, og.o,
                        (size_t)R * Hv * Dv * 4);
            report_same("gdn_recurrent", "  unaligned qkv (scalar loads) == aligned", om.o, og.o,
                        (size_t)R * Hv * Dv * 4);
            gdn_out_free(ss, &oc);
            gdn_out_free(ss, &og);
            gdn_out_free(ss, &os);
            gdn_out_free(ss, &om);
            for (int i = 0; i < ss->n; i++)
                free(st[i]);
            free(qkv);
            free(ga);
            free(gb);
            free(al);
            free(dt);
        }
}

/* ---- argmax and softmax ------------------------------------------------------------ */

static void test_sample(void)
{
    const int shapes[][2] = {{5, 1000}, {3, 248320}, {1, 7}};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
        int R = shapes[s][0], n = shapes[s][1];
        size_t N = (size_t)R * n;
        float *x = malloc(N * 4);
        ct_fill(x, N, 10.0f);
        /* Plant ties: row r's maximum 20 at two places, the first one wins. */
        for (int r = 0; r < R; r++) {
            int a = ct_rand(n), b = ct_rand(n);
            x[(size_t)r * n + a] = 20.0f;
            x[(size_t)r * n + b] = 20.0f;
        }
        int32_t am[2][8];
        float *sm[2];
        tdm_backend *bes[2] = {CPU, G};
        for (int b = 0; b < 2; b++) {
            tdm_backend *be = bes[b];
            float *dx = ct_put(be, x, N * 4);
            be->argmax(be->ctx, am[b], dx, R, n);
            be->softmax(be->ctx, dx, R, n);
            sm[b] = ct_get(be, dx, N * 4);
            be->free(be->ctx, dx);
        }
        /* independent reference for argmax: first maximum by a plain scan */
        int bad = 0;
        for (int r = 0; r < R; r++) {
            int best = 0;
            for (int i = 1; i < n; i++)
                if (x[(size_t)r * n + i] > x[(size_t)r * n + best])
                    best = i;
            bad += am[1][r] != best || am[0][r] != best;
        }
        char cas[64];
        snprintf(cas, sizeof(cas), "R=%d n=%d (ties: first wins)", R, n);
        report("argmax", cas, bad, 0);
        /* softmax against a double-precision reference: over 248320 values
         * the CPU's sequential fp32 sum is itself off by ~1e-4 relative
         * (n·eps/2 at worst), more than the GPU's tree sum. */
        float *sd = malloc(N * 4);
        for (int r = 0; r < R; r++) {
            const float *xr = x + (size_t)r * n;
            double mx = -INFINITY, sum = 0;
            for (int i = 0; i < n; i++)
                mx = xr[i] > mx ? xr[i] : mx;
            for (int i = 0; i < n; i++)
                sum += exp((double)xr[i] - mx);
            for (int i = 0; i < n; i++)
                sd[(size_t)r * n + i] = (float)(exp((double)xr[i] - mx) / sum);
        }
        report("softmax", cas, ct_nerr(sm[1], sd, N), 1e-5);
        report("softmax", "  CPU backend vs the same reference (info)", ct_nerr(sm[0], sd, N),
               1e-3);
        free(sd);
        free(sm[0]);
        free(sm[1]);
        free(x);
    }
}

/* ---- sample ------------------------------------------------------------------------ */

/* splitmix64: the test's uniform draws, independent of the fill generator. */
static double draw_uniform(uint64_t *st)
{
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* The GPU and the CPU backend accumulate the draw's running sums in different
 * orders (and the GPU's double exp may differ from libm's in the last bit),
 * so their tokens may differ when u lies this close to a cumulative
 * boundary: the CPU backend draws both tokens within u ± SAMPLE_EPS. */
#define SAMPLE_EPS 1e-6

/* The CPU backend's token for rows[r] with u moved by du. */
static int32_t cpu_token(const float *xr, int n, tdm_sample_row row, double du)
{
    row.u += du;
    float *dx = ct_put(CPU, xr, (size_t)n * 4);
    int32_t t = -1;
    CPU->sample(CPU->ctx, &t, dx, 1, n, &row);
    CPU->free(CPU->ctx, dx);
    return t;
}

static void test_sampling(void)
{
    const float temps[] = {0.0f, 0.5f, 1.0f, 2.0f};
    const float top_ps[] = {0.0f, 0.5f, 0.9f, 0.999f};
    /* {n, R, calls}: odd vocabularies, the model's 248320, and one whose
     * slices do not fit in shared memory (scratch in global memory). */
    const int shapes[][3] = {{248320, 1, 12}, {248320, 9, 6}, {248320, 17, 6}, {1000, 9, 30},
                             {7, 17, 10},     {50021, 17, 4}, {600000, 3, 2}};
    uint64_t ust = 42;
    int rowno = 0;
    for (size_t sh = 0; sh < TDM_ARRAY_LEN(shapes); sh++) {
        const int n = shapes[sh][0], R = shapes[sh][1], calls = shapes[sh][2];
        const uint32_t top_ks[] = {0, 1, 5, 50, (uint32_t)n};
        int exact = 0, near = 0, bad = 0, near_u = 0, batch_bad = 0;
        for (int call = 0; call < calls; call++) {
            const size_t N = (size_t)R * n;
            float *x = malloc(N * 4);
            ct_fill(x, N, 8.0f);
            /* Every other call: logits on a grid of 0.5, so most tokens tie
             * with others and equal probabilities straddle every cut. */
            if (call & 1)
                for (size_t i = 0; i < N; i++)
                    x[i] = roundf(x[i] * 2.0f) / 2.0f;
            tdm_sample_row *rows = malloc(sizeof(*rows) * (size_t)R);
            for (int r = 0; r < R; r++, rowno++) {
                const int set = rowno % 80, um = (rowno / 80 + r) % 3;
                rows[r] = (tdm_sample_row){temps[set % 4], top_ps[(set / 4) % 4],
                                           top_ks[(set / 16) % 5], 0, draw_uniform(&ust)};
                if (um == 1)
                    rows[r].u = 0.0;
                else if (um == 2)
                    rows[r].u = nextafter(1.0, 0.0);
            }
            int32_t *want = malloc(sizeof(int32_t) * (size_t)R);
            int32_t *got = malloc(sizeof(int32_t) * (size_t)R);
            int32_t *alone = malloc(sizeof(int32_t) * (size_t)R);
            for (int r = 0; r < R; r++)
                want[r] = got[r] = alone[r] = -7;
            float *dc = ct_put(CPU, x, N * 4);
            CPU->sample(CPU->ctx, want, dc, R, n, rows);
            CPU->free(CPU->ctx, dc);
            float *dg = ct_put(G, x, N * 4);
            G->sample(G->ctx, got, dg, R, n, rows);
            for (int r = 0; r < R; r++)
                G->sample(G->ctx, &alone[r], dg + (size_t)r * n, 1, n, &rows[r]);
            G->free(G->ctx, dg);
            for (int r = 0; r < R; r++) {
                const float *xr = x + (size_t)r * n;
                batch_bad += alone[r] != got[r];
                const int32_t lo = cpu_token(xr, n, rows[r], -SAMPLE_EPS);
                const int32_t hi = cpu_token(xr, n, rows[r], SAMPLE_EPS);
                near_u += lo != hi;
                if (got[r] == want[r]) {
                    exact++;
                    continue;
                }
                const int ok = lo != hi && got[r] >= lo && got[r] <= hi;
                near += ok;
                bad += !ok;
                printf("  sample n=%d T=%g top_k=%u top_p=%g u=%.17g: gpu %d, cpu %d (%s)\n", n,
                       (double)rows[r].temperature, rows[r].top_k, (double)rows[r].top_p, rows[r].u,
                       got[r], want[r], ok ? "u within 1e-6 of a boundary" : "NOT near a boundary");
            }
            free(alone);
            free(got);
            free(want);
            free(rows);
            free(x);
        }
        char cas[96];
        snprintf(cas, sizeof(cas), "n=%d R=%d: %d equal, %d at a boundary (%d u near one)", n, R,
                 exact, near, near_u);
        report("sample", cas, bad, 0);
        snprintf(cas, sizeof(cas), "n=%d R=%d: rows alone == batched", n, R);
        report("sample", cas, batch_bad, 0);
    }
}

/* The GPU's draws for one row follow the distribution: T = 1, top-k 50 over
 * 248320 logits, 4000 draws with u at random, chi-square against the
 * softmax of the 50 largest logits computed here in double. */
static void test_sampling_chi2(void)
{
    enum { N = 248320, K = 50, RB = 8, DRAWS = 4000 };
    float *x = malloc((size_t)N * RB * 4);
    ct_fill(x, N, 4.0f);
    for (int r = 1; r < RB; r++)
        memcpy(x + (size_t)r * N, x, (size_t)N * 4);
    /* The K largest logits, by selection (random floats: no ties). */
    int top[K];
    double p[K], sum = 0;
    unsigned char *taken = calloc(N, 1);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int i = 0; i < N; i++)
            if (!taken[i] && (best < 0 || x[i] > x[best]))
                best = i;
        top[k] = best;
        taken[best] = 1;
    }
    free(taken);
    for (int k = 0; k < K; k++)
        sum += p[k] = exp((double)x[top[k]] - (double)x[top[0]]);
    for (int k = 0; k < K; k++)
        p[k] /= sum;
    float *dx = ct_put(G, x, (size_t)N * RB * 4);
    long count[K] = {0}, outside = 0;
    uint64_t ust = 7;
    for (int d = 0; d < DRAWS; d += RB) {
        tdm_sample_row rows[RB];
        int32_t got[RB];
        for (int r = 0; r < RB; r++)
            rows[r] = (tdm_sample_row){1.0f, 0.0f, K, 0, draw_uniform(&ust)};
        G->sample(G->ctx, got, dx, RB, N, rows);
        for (int r = 0; r < RB; r++) {
            int k = 0;
            while (k < K && top[k] != got[r])
                k++;
            if (k == K)
                outside++;
            else
                count[k]++;
        }
    }
    G->free(G->ctx, dx);
    /* Cells with an expected count under 5 are pooled into one. */
    double chi2 = 0, pool_e = 0, pool_o = 0;
    int cells = 0;
    for (int k = 0; k < K; k++) {
        double e = DRAWS * p[k];
        if (e < 5) {
            pool_e += e;
            pool_o += (double)count[k];
            continue;
        }
        chi2 += ((double)count[k] - e) * ((double)count[k] - e) / e;
        cells++;
    }
    if (pool_e > 0) {
        chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    /* Critical value at p = 1e-4 (Wilson-Hilferty, z = 3.719). */
    const double df = cells - 1, h = 2.0 / (9.0 * df);
    const double crit = df * pow(1.0 - h + 3.719 * sqrt(h), 3.0);
    char cas[96];
    snprintf(cas, sizeof(cas), "chi2 top-k 50, %d draws: %.1f (df %.0f, crit %.1f)", DRAWS, chi2,
             df, crit);
    report("sample", cas, chi2 > crit || outside ? 1 : 0, 0);
    /* Time per call (R = 1, top-p 0.9), ids back on the host. */
    tdm_sample_row row = {1.0f, 0.9f, 0, 0, 0.5};
    int32_t t;
    dx = ct_put(G, x, (size_t)N * 4);
    G->sample(G->ctx, &t, dx, 1, N, &row);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 100; i++)
        G->sample(G->ctx, &t, dx, 1, N, &row);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    G->free(G->ctx, dx);
    printf("%-14s n=%d R=1 top-p 0.9: %.1f us per call (info)\n", "sample", N,
           ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 100 / 1e3);
    free(x);
}

int main(void)
{
    ct_require_gpu();
    G = ct_gpu();
    CPU = ct_cpu();
    test_matmul();
    test_fused_matmuls();
    test_norm_matmul();
    test_fp8();
    test_bulk();
    test_producer_split();
    test_copy_n();
    test_embed();
    test_rmsnorm();
    test_rmsnorm_gated();
    test_norm_invariance();
    test_attn_prep();
    test_elementwise();
    test_attention();
    test_attention_long();
    test_conv();
    test_gdn();
    test_sample();
    test_sampling();
    test_sampling_chi2();
    G->destroy(G);
    CPU->destroy(CPU);
    if (failures) {
        printf("cuda ops: %d FAILED\n", failures);
        return 1;
    }
    printf("cuda ops: all match the CPU backend\n");
    return 0;
}
