/*
 * test_fp8.c - FP8 E4M3 weights (backend.h, TDM_DTYPE_FP8) on the CPU backend:
 *  - every code's value against the OCP E4M3 table written out here from the
 *    format's definition (a few landmarks by hand, the rest by its binades);
 *  - tdm_fp8_encode against a brute-force reference (the nearest of all 253
 *    finite magnitudes, ties to the even code) over random values of every
 *    binade, the midpoints between neighbouring codes and one float either
 *    side of each, at several scale exponents;
 *  - tdm_fp8_scale_exp: the least exponent that keeps the largest magnitude
 *    within 448, and refusals outside its range;
 *  - the CPU matmul on FP8 weights (every code but NaN among them) gives the
 *    bits of the same matmul on the f32 matrix of the values they stand for
 *    (decode rows, 4-row tiles, accumulate, scales from 2^-100 to 2^15), on
 *    the AVX2 and portable paths alike;
 *  - the embedding op on an FP8 table (a tied LM head rounded) gives each
 *    row's values by the table above, every code but NaN among them.
 */
#include "backend.h"
#include "check.h" /* tests/config */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint32_t rng = 4242;
static float urand(void) /* [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

/* The OCP E4M3 magnitudes by binade: codes 8b .. 8b + 7 are 2^(b-7) · (1 +
 * m/8) for b = 1..15, codes 0..7 are m · 2^-9; 0x7f is NaN. */
static double table_value(int c)
{
    const int b = c >> 3, m = c & 7;
    return b == 0 ? m * ldexp(1.0, -9) : ldexp(1.0 + m / 8.0, b - 7);
}

/* The nearest finite code to |a| (a scaled), ties to the even code. */
static int nearest_code(double a)
{
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const double d = fabs(table_value(c) - a), db = fabs(table_value(best) - a);
        if (d < db || (d == db && (c & 1) == 0 && (best & 1) != 0))
            best = c;
    }
    return best;
}

static void check_values(void)
{
    CHECK(tdm_fp8_value(0x00, 0) == 0.0f && !signbit(tdm_fp8_value(0x00, 0)), "+0");
    CHECK(tdm_fp8_value(0x80, 0) == 0.0f && signbit(tdm_fp8_value(0x80, 0)), "-0");
    CHECK(tdm_fp8_value(0x01, 0) == 0x1p-9f, "the smallest subnormal");
    CHECK(tdm_fp8_value(0x08, 0) == 0x1p-6f, "the smallest normal");
    CHECK(tdm_fp8_value(0x38, 0) == 1.0f, "one");
    CHECK(tdm_fp8_value(0x3c, 0) == 1.5f, "1.5");
    CHECK(tdm_fp8_value(0x7e, 0) == 448.0f, "the largest");
    CHECK(tdm_fp8_value(0xfe, 0) == -448.0f, "the most negative");
    CHECK(tdm_fp8_value(0x39, -12) == 0x1.2p-12f, "a scaled code");
    int bad = 0;
    for (int c = 0; c <= 0x7e; c++)
        for (int e = -100; e <= 15; e += 23) {
            const double want = ldexp(table_value(c), e);
            bad += (double)tdm_fp8_value((uint8_t)c, e) != want;
            bad += (double)tdm_fp8_value((uint8_t)(c | 0x80), e) != -want;
        }
    CHECK(bad == 0, "%d codes off the table", bad);
}

static void check_encode(void)
{
    const int exps[] = {0, -9, -14, -99, 7};
    int bad = 0, n = 0;
    for (size_t ei = 0; ei < sizeof(exps) / sizeof(exps[0]); ei++) {
        const int e = exps[ei];
        float vals[4096 + 4 * 127];
        int nv = 0;
        for (int i = 0; i < 4096; i++) /* every binade of the codes and below */
            vals[nv++] = ldexpf(urand(), e + (int)(i % 19) - 10);
        for (int c = 0; c < 0x7e; c++) { /* midpoints, one float either side */
            const float mid = (float)ldexp((table_value(c) + table_value(c + 1)) / 2, e);
            vals[nv++] = mid;
            vals[nv++] = nextafterf(mid, 0.0f);
            vals[nv++] = nextafterf(mid, INFINITY);
            vals[nv++] = -mid;
        }
        for (int i = 0; i < nv; i++) {
            const double a = fabs(ldexp((double)vals[i], -e));
            if (a > 448.0)
                continue;
            const int want = nearest_code(a) | (signbit(vals[i]) ? 0x80 : 0);
            const int got = tdm_fp8_encode(vals[i], e);
            if (got != want && bad++ < 5)
                fprintf(stderr, "  encode(%a, %d) = 0x%02x, the nearest is 0x%02x\n",
                        (double)vals[i], e, got, want);
            n++;
        }
    }
    CHECK(bad == 0, "%d of %d values rounded off the nearest code", bad, n);
    CHECK(n > 20000, "only %d values tried", n);
}

static void check_scale(void)
{
    int e = 99;
    CHECK(tdm_fp8_scale_exp(448.0f, &e) == 0 && e == 0, "448 fits 2^0 (e %d)", e);
    CHECK(tdm_fp8_scale_exp(449.0f, &e) == 0 && e == 1, "449 needs 2^1 (e %d)", e);
    CHECK(tdm_fp8_scale_exp(0.5f, &e) == 0 && e == -9, "0.5: 256 fits 2^-9 (e %d)", e);
    CHECK(tdm_fp8_scale_exp(0.0f, &e) == 0 && e == 0, "an all-zero matrix (e %d)", e);
    CHECK(tdm_fp8_scale_exp(INFINITY, &e) == -1, "inf");
    CHECK(tdm_fp8_scale_exp(NAN, &e) == -1, "NaN");
    CHECK(tdm_fp8_scale_exp(0x1p40f, &e) == -1, "beyond 2^15 · 448");
    CHECK(tdm_fp8_scale_exp(0x1p-115f, &e) == -1, "every weight would round to zero");
    CHECK(tdm_fp8_scale_exp(0x1p-100f, &e) == 0 && e == -100, "the smallest scale (e %d)", e);
    for (int i = 0; i < 1000; i++) { /* the least exponent that fits */
        const float a = ldexpf(fabsf(urand()) + 0.01f, (int)(urand() * 20));
        if (tdm_fp8_scale_exp(a, &e) != 0) {
            CHECK(0, "%a refused", (double)a);
            continue;
        }
        CHECK(ldexp((double)a, -e) <= 448.0 && ldexp((double)a, -(e - 1)) > 448.0,
              "%a: exponent %d is not the least", (double)a, e);
    }
}

static void check_matmul(void)
{
    const int shapes[][3] = {{1, 64, 40}, {2, 128, 33}, {4, 256, 9}, {7, 192, 70}, {13, 64, 5}};
    /* scales across the whole range (a code's value times 2^15 is past what
     * one float multiply from the code's bits can reach) */
    const int exps[] = {TDM_FP8_EXP_MIN, -11, 0, 8, TDM_FP8_EXP_MAX};
    for (int avx = 1; avx >= 0; avx--) {
        if (!avx)
            setenv("TANDEM_CPU_NO_SIMD", "1", 1);
        tdm_backend *be = tdm_backend_cpu_create(2);
        CHECK(be != NULL, "no CPU backend");
        if (!be)
            return;
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            const int R = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
            const size_t nw = (size_t)in * out;
            uint8_t *codes = be->alloc(be->ctx, nw);
            float *vals = be->alloc(be->ctx, nw * 4), *x = be->alloc(be->ctx, (size_t)R * in * 4);
            float *y8 = be->alloc(be->ctx, (size_t)R * out * 4),
                  *yf = be->alloc(be->ctx, (size_t)R * out * 4);
            const int e = exps[s % (sizeof(exps) / sizeof(exps[0]))];
            for (size_t i = 0; i < nw; i++) {
                codes[i] = tdm_fp8_encode(ldexpf(0.2f * urand(), e + 9), e);
                if (i % 3 == 0) /* every code but NaN, subnormals and zeros included */
                    codes[i] = (uint8_t)((i / 3) % 254 + ((i / 3) % 254 >= 0x7f));
                vals[i] = tdm_fp8_value(codes[i], e);
            }
            for (int i = 0; i < R * in; i++)
                x[i] = 2.0f * urand();
            for (int acc = 0; acc < 2; acc++) {
                for (int i = 0; i < R * out; i++)
                    y8[i] = yf[i] = (float)i;
                be->matmul(be->ctx, y8, x, (tdm_weight){codes, TDM_DTYPE_FP8, e}, R, in, out, acc);
                be->matmul(be->ctx, yf, x, (tdm_weight){vals, TDM_DTYPE_F32, 0}, R, in, out, acc);
                CHECK(memcmp(y8, yf, (size_t)R * out * 4) == 0,
                      "R=%d in=%d out=%d scale 2^%d%s%s: FP8 products differ from those of their "
                      "values",
                      R, in, out, e, acc ? " accumulate" : "", avx ? "" : " (portable)");
            }
            be->free(be->ctx, codes);
            be->free(be->ctx, vals);
            be->free(be->ctx, x);
            be->free(be->ctx, y8);
            be->free(be->ctx, yf);
        }
        be->destroy(be);
    }
}

static void check_embed(void)
{
    const int V = 40, H = 96, R = 5;
    const int exps[] = {TDM_FP8_EXP_MIN, -7, 0, TDM_FP8_EXP_MAX};
    tdm_backend *be = tdm_backend_cpu_create(1);
    CHECK(be != NULL, "no CPU backend");
    if (!be)
        return;
    uint8_t *codes = be->alloc(be->ctx, (size_t)V * H);
    float *y = be->alloc(be->ctx, (size_t)R * H * 4);
    for (size_t i = 0; i < (size_t)V * H; i++) /* every code but NaN */
        codes[i] = (uint8_t)(i % 254 + (i % 254 >= 0x7f));
    const int32_t ids[] = {0, 39, -1, 17, 3}; /* -1: a row of zeros */
    for (size_t k = 0; k < sizeof(exps) / sizeof(exps[0]); k++) {
        const int e = exps[k];
        be->embed(be->ctx, y, (tdm_weight){codes, TDM_DTYPE_FP8, e}, ids, R, H);
        int bad = 0;
        for (int r = 0; r < R; r++)
            for (int i = 0; i < H; i++) {
                const uint8_t c = ids[r] < 0 ? 0 : codes[(size_t)ids[r] * H + i];
                const double want = (c & 0x80 ? -1 : 1) * ldexp(table_value(c & 0x7f), e);
                bad += (double)y[(size_t)r * H + i] != want;
            }
        CHECK(bad == 0, "embed, scale 2^%d: %d of %d values are not the table's", e, bad, R * H);
    }
    be->free(be->ctx, codes);
    be->free(be->ctx, y);
    be->destroy(be);
}

int main(void)
{
    check_values();
    check_encode();
    check_scale();
    check_matmul();
    check_embed();
    printf("%s\n", g_failures ? "fp8: FAILED" : "fp8: all checks passed");
    return g_failures ? 1 : 0;
}
