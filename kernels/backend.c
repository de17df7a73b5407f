/* backend.c - helpers shared by every backend (see backend.h). */
#include "backend.h"

#include <math.h>

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

uint8_t tdm_fp8_encode(float v, int e)
{
    const uint8_t sign = signbit(v) ? 0x80 : 0;
    const float a = fabsf(ldexpf(v, -e)); /* exact: v a normal float, a <= 448 */
    /* Below 2^-6 the codes step by 2^-9; from 2^E (E >= -6) by 2^(E-3),
     * and code = 8 (E + 7) + the steps past 2^E. Rounding a to its step
     * (rintf: ties to even) lands on the next binade's first code where it
     * carries, and a tie's even step is the even code. */
    if (a < 0x1p-6f)
        return (uint8_t)(sign | (int)rintf(a * 512.0f));
    int x;
    (void)frexpf(a, &x); /* a = f · 2^x, f in [0.5, 1): E = x - 1 */
    const int E = x - 1, q = (int)rintf(ldexpf(a, 3 - E)); /* 8 .. 16 */
    return (uint8_t)(sign | (8 * (E + 7) + q - 8));
}
