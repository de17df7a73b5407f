/* backend.c - helpers shared by every backend (see backend.h). */
#include "backend.h"

#include <math.h>
#include <string.h>

size_t tdm_dtype_size(tdm_dtype dt)
{
    return dt == TDM_DTYPE_F32 ? 4 : dt == TDM_DTYPE_FP8 ? 1 : 2;
}

const char *tdm_dtype_name(tdm_dtype dt)
{
    switch (dt) {
    case TDM_DTYPE_F32:
        return "f32";
    case TDM_DTYPE_BF16:
        return "bf16";
    case TDM_DTYPE_F16:
        return "f16";
    case TDM_DTYPE_FP8:
        return "fp8_e4m3";
    }
    return "?";
}

/* ---- FP8 E4M3 ----------------------------------------------------------
 *
 * Code s eeee mmm: (-1)^s · 2^(e-7) · (1 + m/8) for e >= 1, (-1)^s · 2^-6 ·
 * m/8 for e == 0; 0x7f and 0xff are NaN, never made. */

float tdm_fp8_value(uint8_t c, int e)
{
    const int ex = (c >> 3) & 15, m = c & 7;
    const float mag =
        ex ? ldexpf(1.0f + (float)m / 8.0f, ex - 7 + e) : ldexpf((float)m / 8.0f, -6 + e);
    return (c & 0x80) ? -mag : mag;
}

int tdm_fp8_scale_exp(float amax, int *e)
{
    if (!isfinite(amax) || amax < 0.0f)
        return -1;
    if (amax == 0.0f) {
        *e = 0;
        return 0;
    }
    int x = TDM_FP8_EXP_MIN;
    while (x <= TDM_FP8_EXP_MAX && ldexpf(amax, -x) > 448.0f)
        x++;
    /* the smallest code, 2^-9 · 2^x: a matrix all of whose values lie below
     * half of it would be all zeros */
    if (x > TDM_FP8_EXP_MAX || amax <= ldexpf(1.0f, TDM_FP8_EXP_MIN - 10))
        return -1;
    *e = x;
    return 0;
}

/* m >> s rounded to nearest, ties to even (0 < s < 32). */
static uint32_t rne_shift(uint32_t m, int s)
{
    const uint32_t r = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    return r + (rem > half || (rem == half && (r & 1u)));
}

uint8_t tdm_fp8_encode(float v, int e)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    const uint8_t sign = (u >> 31) ? 0x80 : 0;
    const int fe = (int)((u >> 23) & 0xff);
    if (fe == 0) /* zero, or a float subnormal: below 2^-126 · 2^-e, nothing */
        return sign;
    /* |v| · 2^-e = 1.m · 2^E with m the 23 fraction bits: the codes step by
     * 2^(E-3) from 2^E (E >= -6) and by 2^-9 below 2^-6, so the step count
     * is the 24-bit significand shifted right by 20, or by 20 + (-6 - E),
     * rounded to nearest even; code = 8 (E + 7) + steps - 8 above 2^-6, the
     * steps below (a carry lands on the next binade's first code either
     * way, and a tie's even step is the even code). */
    const int E = fe - 127 - e;
    const uint32_t m = (u & 0x7fffffu) | 0x800000u;
    if (E >= -6)
        return (uint8_t)(sign | (8 * (E + 7) + (int)rne_shift(m, 20) - 8));
    const int s = 20 + (-6 - E);
    return (uint8_t)(sign | (s >= 32 ? 0 : (int)rne_shift(m, s)));
}
