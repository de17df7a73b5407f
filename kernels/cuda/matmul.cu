/*
 * matmul.cu - y [R, out] (+)= x [R, in] · wᵀ with w [out, in] in bf16, fp16 or fp32 and x, y in
 * fp32, all row-major and dense (row strides in and out); fp32 accumulation of the exact weight
 * values. matmul_n runs several weights that share x in one launch; matmul_silu makes
 * y = silu(x · gateᵀ) ⊙ (x · upᵀ); norm_matmul applies the RMSNorm ahead of them as x is read
 * (decode rows). bf16 weights take the tensor cores (mmt_kernel): each x is split exactly into
 * bf16 parts hi + mid + lo (mmt_split), so every product of a weight with a part is exact in
 * fp32 and no activation is rounded. FP8 weights (backend.h) take the same kernels: a lane
 * loads a step's 16 codes a row in one 16-byte load and turns them into the bf16 values they
 * stand for (mmt_f8), so they give the bits of the bf16 matrix of those values on every path.
 * Other weights take CUDA cores (mm_kernel).
 *
 * Invariants a change must keep (the GPU tests check each to the bit):
 *  - Batch invariance (backend.h): a row's bits depend on its own x, on w and on (in, out)
 *    only, never on R, on the other rows, or on the row group, block or launch it falls in.
 *  - A fixed order of additions, from (in, out) alone. Tensor cores: k in steps of 64 (MMT_K);
 *    k-block kb (of KB = mmt_kblocks(in, out)) owns steps [kb·steps/KB, (kb+1)·steps/KB), warp
 *    w of its block adds steps s0 + w, s0 + w + 4, ... in that order into its mma accumulators
 *    (one sum per output and part); then, per part, the 4 warps in order (mmt_cell), then
 *    hi + mid + lo, then the k-blocks in order from zero. CUDA cores: lane l of warp w takes
 *    the 8-element groups 32w + l, + 32·KW, ... (KW = mm_kwarps(in)) in increasing k by fmaf,
 *    then a butterfly over the lanes, then the warps in order.
 *  - Strategies that give the same bits and must go on doing so: weights as the mma's A operand
 *    (groups of 2 rows) or as its B operand (groups of 5 or 10); split-k sums through a cluster
 *    or through global memory; x parts from the producer (cuda_xs_put4) or from the matmul's own
 *    split kernel; matmul_n and matmul_silu against separate matmuls and silu_mul;
 *    norm_matmul (a norm applied as x is split) against rmsnorm then the products; the launch
 *    bounds (MINB), which may change registers but never the arithmetic.
 *  - The path depends on w's dtype, `in` and the 16-byte alignment of w and x, never on R.
 *    FP8 weights come with in % 64 == 0 and aligned x (the engine makes no others).
 *  - Weights are finite: past `in` (in % 64 != 0) a lane rereads its row's last chunk, whose
 *    products with the zero x parts there must add nothing.
 *
 * Layout: the vector paths need in % 8 == 0 and w, x 16-byte aligned; otherwise mm_kernel with
 * scalar loads in the same order. From three rows on x reaches the tensor cores as parts in
 * cuda_xs_put4's layout (matmul.cuh: 96 words per 64 values, `in` rounded up to whole steps).
 *
 * Work split. mmt_kernel: a block of 4 warps per (32 output features, or 16 gate and 16 up rows
 * of a pair; a k-block; a row group of mmt_group_rows(R) = 2, 5 or 10 rows), each warp streaming
 * its steps through a ring of MMT_D stages. mm_kernel: a block per (MM_COLS columns, 2, 8 or 16
 * rows) with KW warps over k. Designs measured and dropped, and why these: NOTES.md.
 */
#include "matmul.cuh"
#include "elementwise.cuh"
#include "norm.cuh"

#include <cooperative_groups.h>
#include <type_traits>

#include <string.h>

#define MM_COLS 4   /* columns per block: each x load serves 4 columns */
#define MM_KWARPS 8 /* at most this many warps split k */

/* 8 consecutive weights from element i (vector path: i multiple of 8, aligned). */
__device__ __forceinline__ void mm_load8(const void *w, tdm_dtype dt, size_t i, float *f)
{
    if (dt == TDM_DTYPE_F32) {
        float4 a = __ldg((const float4 *)((const float *)w + i));
        float4 b = __ldg((const float4 *)((const float *)w + i + 4));
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
        f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
        return;
    }
    uint4 u = __ldg((const uint4 *)((const uint16_t *)w + i));
    const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (dt == TDM_DTYPE_BF16) {
            f[2 * j] = __uint_as_float(p[j] << 16);
            f[2 * j + 1] = __uint_as_float(p[j] & 0xffff0000u);
        } else {
            f[2 * j] = __half2float(__ushort_as_half((unsigned short)(p[j] & 0xffffu)));
            f[2 * j + 1] = __half2float(__ushort_as_half((unsigned short)(p[j] >> 16)));
        }
    }
}

/* acc[c][r] += the 8 products of group k of row r and column c, in k order. */
template <int MM_ROWS>
__device__ __forceinline__ void mm_group(float (*acc)[MM_ROWS], float (*wv)[8], const float *xb,
                                         int in, int k, int nr)
{
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        if (r < nr) {
            const float4 *xp = (const float4 *)(xb + (size_t)r * (size_t)in + k);
            const float4 a = __ldg(xp), b = __ldg(xp + 1);
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int c = 0; c < MM_COLS; c++) {
                float s = acc[c][r];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    s = fmaf(wv[c][j], xv[j], s);
                acc[c][r] = s;
            }
        }
    }
}

/* Warps that split k: each lane gets at least two 8-element groups; a
 * function of `in` alone, so the order of additions is too. */
static int mm_kwarps(int in)
{
    int kw = (in + 7) / 8 / 64;
    return kw < 1 ? 1 : kw > MM_KWARPS ? MM_KWARPS : kw;
}

/* Block: KW warps x 32 lanes over k, MM_COLS columns, up to MM_ROWS rows.
 * Linear block index = column block * row chunks + row chunk, so the blocks
 * that share columns run next to each other (weights reused from L2). */
template <int MM_ROWS>
__global__ void __launch_bounds__(MM_KWARPS * 32)
    mm_kernel(float *__restrict__ y, const float *__restrict__ x, const void *w, tdm_dtype dt,
              int R, int in, int out, int accumulate, int vec, int nchunks)
{
    cuda_kernel_begin();
    __shared__ float red[MM_KWARPS][MM_COLS][MM_ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kw = blockDim.x >> 5;
    const int o0 = (int)(blockIdx.x / (unsigned)nchunks) * MM_COLS;
    const int r0 = (int)(blockIdx.x % (unsigned)nchunks) * MM_ROWS;
    const int nr = min(MM_ROWS, R - r0), nc = min(MM_COLS, out - o0);
    const float *xb = x + (size_t)r0 * (size_t)in;
    float acc[MM_COLS][MM_ROWS];
#pragma unroll
    for (int c = 0; c < MM_COLS; c++)
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++)
            acc[c][r] = 0.0f;
    const int ngroups = (in + 7) / 8, step = 32 * kw;
    int g = warp * 32 + lane;
    if (vec) {
        /* Two groups of every column in flight per lane, then the rest one by
         * one; the order of additions per lane is increasing k either way. */
        for (; g + step < ngroups; g += 2 * step) {
            float wv[2][MM_COLS][8];
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int c = 0; c < MM_COLS; c++) {
                    if (c < nc)
                        mm_load8(w, dt, (size_t)(o0 + c) * (size_t)in + (size_t)(g + step * u) * 8,
                                 wv[u][c]);
                    else
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            wv[u][c][j] = 0.0f;
                }
#pragma unroll
            for (int u = 0; u < 2; u++)
                mm_group<MM_ROWS>(acc, wv[u], xb, in, (g + step * u) * 8, nr);
        }
        for (; g < ngroups; g += step) {
            float wv[MM_COLS][8];
#pragma unroll
            for (int c = 0; c < MM_COLS; c++) {
                if (c < nc)
                    mm_load8(w, dt, (size_t)(o0 + c) * (size_t)in + (size_t)g * 8, wv[c]);
                else
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        wv[c][j] = 0.0f;
            }
            mm_group<MM_ROWS>(acc, wv, xb, in, g * 8, nr);
        }
    } else {
        /* Unaligned or odd sizes: the same groups and order, scalar loads. */
        for (; g < ngroups; g += step) {
            const int k0 = g * 8, k1 = min(k0 + 8, in);
            for (int k = k0; k < k1; k++) {
#pragma unroll
                for (int c = 0; c < MM_COLS; c++) {
                    if (c < nc) {
                        const float wk = cuda_wload(w, dt, (size_t)(o0 + c) * (size_t)in + k);
#pragma unroll
                        for (int r = 0; r < MM_ROWS; r++)
                            if (r < nr)
                                acc[c][r] = fmaf(wk, xb[(size_t)r * (size_t)in + k], acc[c][r]);
                    }
                }
            }
        }
    }
    /* Lanes by butterfly, then warps in warp order. */
#pragma unroll
    for (int c = 0; c < MM_COLS; c++)
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++) {
            const float s = cuda_warp_sum(acc[c][r]);
            if (lane == 0)
                red[warp][c][r] = s;
        }
    __syncthreads();
    for (int t = threadIdx.x; t < MM_COLS * MM_ROWS; t += blockDim.x) {
        const int c = t / MM_ROWS, r = t % MM_ROWS;
        if (c < nc && r < nr) {
            float s = red[0][c][r];
            for (int i = 1; i < kw; i++)
                s += red[i][c][r];
            float *yp = y + (size_t)(r0 + r) * (size_t)out + (size_t)(o0 + c);
            *yp = accumulate ? *yp + s : s;
        }
    }
}

/* ---- tensor-core path (bf16 weights) ------------------------------------ */

#define MMT_WARPS 4
#define MMT_M 32          /* output features per block */
#define MMT_K 64          /* k per step */
#define MMT_BLOCKS 256    /* blocks a call should have at least, when k allows */
#define MMT_D 2           /* steps in a warp's ring */
#define MMT_CLUSTER_MAX 8 /* k-blocks a tile may add through a cluster */
#define MMT_PRB 128       /* bytes of a part-row's step in shared memory */

/* Shared-memory byte offset of chunk c of part-row pr: chunk c sits at
 * position c ^ (pr % 8), so the 8 part-rows an ldmatrix reads fall in 8
 * bank groups. (Padding each part-row to 144 bytes spreads them too, but
 * takes 47 KB of shared memory a block at 10 rows and was much slower:
 * NOTES.md.) */
__device__ __forceinline__ unsigned mmt_pos(int pr, int c)
{
    return (unsigned)(pr * MMT_PRB + ((c ^ (pr & 7)) << 4));
}

/* A row group: G rows, whose 3 parts make the sums of 3G columns (part c % 3
 * of row c / 3). G = 2 (decode rows and pairs): x in fp32, split in the
 * warp; the weights are the mma's A operand and the parts its 8 columns.
 * G = 5, 10 (verify blocks, batches): x as parts split ahead; the parts are
 * the A operand's part-rows (MT m-tiles of 16) and the weights its columns. */
template <int G> struct mmt_group {
    static constexpr bool SPLIT = G <= 2;
    static constexpr int MT = G > 5 ? 2 : 1;
    static constexpr int PR = SPLIT ? 8 : 16 * MT; /* columns of the sums */
};

/* Rows of a row group for a call of R rows. */
static int mmt_group_rows(int R)
{
    return R <= 2 ? 2 : R <= 5 ? 5 : 10;
}

__device__ __forceinline__ void mmt_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Four 8x8 bf16 matrices from shared memory; lane i gives the address of
 * row i % 8 of matrix i / 8. */
__device__ __forceinline__ void mmt_ldsm(uint32_t (&a)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
}

/* The k order. Inside a step of 64, mma j's k-slots 2t, 2t + 1 are
 * elements 16t + 4j, + 1 and its k-slots 2t + 8, 2t + 9 are 16t + 4j + 2,
 * + 3, for w and x alike: lane (g, t) loads elements 16t .. 16t + 15 of its
 * four weight rows (two 16-byte chunks each), and word 2j, 2j + 1 of them
 * are its fragment words of mma j in either role. */
struct mmt_wfrag {
    uint4 v[4][2];
};

/* A lane's four weight rows, from element 16t: one weight w0, rows o0,
 * o0 + 8, o0 + 16, o0 + 24; a gate/up pair (PAIR), rows o0, o0 + 8 of the
 * gate w0 and of the up w1. Loads need no bounds checks: a row past `out`
 * reads row out - 1 instead (its sums are never written), and a chunk past
 * `in` (only when in % 64 != 0) reads the row's last chunk, whose products
 * meet x parts that are zero there (a finite weight times zero adds
 * nothing; the sums are the same bits). A separate kernel instance for
 * pairs keeps the one-weight kernel's registers as they were: folding both
 * into one cost verify blocks 5 %. */
template <bool F8> struct mmt_wrows {
    const typename std::conditional<F8, uint8_t, uint16_t>::type *row[4]; /* F8: codes */
    int lim;         /* the last chunk of a row, from element 16t */
    uint32_t mul[4]; /* F8: each row's scale (mmt_f8) */
};

template <bool PAIR, bool F8>
__device__ __forceinline__ mmt_wrows<F8> mmt_wrows_of(const void *w0, const void *w1, uint32_t mul0,
                                                      uint32_t mul1, int o0, int out, int in, int t)
{
    typedef typename std::conditional<F8, uint8_t, uint16_t>::type elem;
    mmt_wrows<F8> wr;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int o = PAIR ? o0 + 8 * (i & 1) : o0 + 8 * i;
        wr.row[i] = (const elem *)(PAIR && i >= 2 ? w1 : w0) +
                    (size_t)(o < out ? o : out - 1) * (size_t)in + 16 * t;
        wr.mul[i] = PAIR && i >= 2 ? mul1 : mul0;
    }
    wr.lim = in - 8 - 16 * t;
    return wr;
}

/* Step s's weights (in % 8 == 0, so a chunk from k < in lies within the row).
 * F8 (in % 64 == 0): the step's 16 codes a row in v[i][0], expanded by
 * mmt_f8 when the step computes. */
template <bool F8>
__device__ __forceinline__ void mmt_wstep(mmt_wfrag *f, const mmt_wrows<F8> &wr, int s)
{
    const int k0 = min(s * MMT_K, wr.lim), k1 = min(s * MMT_K + 8, wr.lim);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (F8) {
            f->v[i][0] = __ldg((const uint4 *)(wr.row[i] + s * MMT_K));
        } else {
            f->v[i][0] = __ldg((const uint4 *)(wr.row[i] + k0));
            f->v[i][1] = __ldg((const uint4 *)(wr.row[i] + k1));
        }
    }
}

/* Two E4M3 codes (the low and high byte of c) as the bf16 pair of their
 * values times the row's scale: cvt gives their f16 values exactly (every
 * E4M3 value is a normal f16); moving the f16 exponent and top mantissa bits
 * down by 3 makes the bf16 of value · 2^-112 (normal: f16 exponents are
 * 2^-14 and up), and mul, by the bf16 2^(112 + e), lands exactly on value ·
 * 2^e (normal for TDM_FP8_EXP_MIN <= e <= TDM_FP8_EXP_MAX). Zero stays
 * zero, with its sign. */
__device__ __forceinline__ void mmt_f8x4(uint32_t c, uint32_t mul, uint32_t *lo, uint32_t *hi)
{
    uint32_t h0, h1;
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\t"
        "cvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
        : "=r"(h0), "=r"(h1)
        : "r"(c));
    const uint32_t b0 = (h0 & 0x80008000u) | ((h0 >> 3) & 0x0fff0fffu);
    const uint32_t b1 = (h1 & 0x80008000u) | ((h1 >> 3) & 0x0fff0fffu);
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(*lo) : "r"(b0), "r"(mul));
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(*hi) : "r"(b1), "r"(mul));
}

/* A step's F8 codes (mmt_wstep) as the bf16 fragment words of their values. */
__device__ __forceinline__ mmt_wfrag mmt_f8(const mmt_wfrag &r, const mmt_wrows<true> &wr)
{
    mmt_wfrag f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 c = r.v[i][0];
        mmt_f8x4(c.x, wr.mul[i], &f.v[i][0].x, &f.v[i][0].y);
        mmt_f8x4(c.y, wr.mul[i], &f.v[i][0].z, &f.v[i][0].w);
        mmt_f8x4(c.z, wr.mul[i], &f.v[i][1].x, &f.v[i][1].y);
        mmt_f8x4(c.w, wr.mul[i], &f.v[i][1].z, &f.v[i][1].w);
    }
    return f;
}

__device__ __forceinline__ uint32_t mmt_word(const uint4 *c, int i)
{
    const uint4 q = c[i >> 2];
    const int j = i & 3;
    return j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w;
}

/* ---- x through shared memory --------------------------------------------
 *
 * A step's x is used by one warp only (the warps of a block take different
 * steps), by every lane: each warp keeps its own ring of steps' x in shared
 * memory, copied there by cp.async as the step's weights are requested (no
 * registers held while in flight).
 *
 * G = 2: the fp32 values of the rows, split by the warp when the step
 * computes (each lane one pair per row) into part words [rr][t][p][j][word]
 * (mmt_sword: the lane of column c = 3·rr + p and quad t reads 8
 * consecutive words, its B fragments of the four mmas), the weights' words
 * moved into A fragments in registers.
 *
 * G >= 5: the pre-split words as part-rows (3·rr + p) of 128 bytes, chunks
 * swizzled (mmt_pos); a part-row's chunk c (words 4c .. 4c + 3) holds the values of mma c / 2's
 * k-half c % 2 (word t: elements 16t + 2c, + 1 of its step's 64, c = 2j +
 * half), one matrix row, so the A fragments come by ldmatrix and the
 * weights' words are B fragments as loaded: no register moves at all (with
 * the weights as A, nine rows cost ~128 moves a step). */

__device__ __forceinline__ size_t mmt_sword(size_t rr, int t, int p)
{
    return ((rr * 4 + (size_t)t) * 3 + (size_t)p) * 8;
}

/* Step s's x rows r0 .. r0 + G - 1 into raw[G][64], zero outside x. */
template <int G>
__device__ __forceinline__ void mmt_xcopy(float *raw, const float *x, int r0, int R, int s, int in,
                                          int lane)
{
#pragma unroll
    for (int i = 0; i < (G * 16 + 31) / 32; i++) {
        const int c = lane + 32 * i; /* 16-byte chunk: row c / 16, values 4 (c % 16) .. */
        if (c < G * 16) {
            const int rr = c >> 4, k = s * MMT_K + 4 * (c & 15), r = r0 + rr;
            const bool ok = r < R && k < in;
            const float *src = ok ? x + (size_t)r * (size_t)in + (size_t)k : x;
            const unsigned dst = (unsigned)__cvta_generic_to_shared(raw + 4 * c);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                         "r"(ok ? 16 : 0)
                         : "memory");
        }
    }
}

__device__ __forceinline__ void mmt_commit(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> __device__ __forceinline__ void mmt_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* A norm applied to x as the matmul reads it (mmt_norm): where a step's x
 * is split, its pair of values per row is first normalized as cuda_rmsnorm
 * would (inv: the rows' 1 / rms; w: the norm's weights at the pair), and
 * written out as cuda_rmsnorm writes y (xn: row r0's pair, NULL: this block
 * does not write it). */
struct mmt_nstep {
    const float *inv;
    float2 w;
    int zero_centred;
    float *xn;    /* at row r0, element k of the pair */
    int in, rows; /* rows of the group that exist */
};

/* raw[G][64] split into part words (mmt_sword): lane l splits the pair
 * 2l, 2l + 1 of every row, normalized first where ns is given. */
template <int G>
__device__ __forceinline__ void mmt_xsplit(uint32_t *spl, const float *raw, int lane,
                                           const mmt_nstep *ns)
{
    const int t = lane >> 3, j = (lane & 7) >> 1, wd = lane & 1;
#pragma unroll
    for (int rr = 0; rr < G; rr++) {
        float2 v = *(const float2 *)(raw + rr * MMT_K + 2 * lane);
        if (ns) {
            v.x = cuda_norm_one(v.x, ns->inv[rr], ns->w.x, ns->zero_centred);
            v.y = cuda_norm_one(v.y, ns->inv[rr], ns->w.y, ns->zero_centred);
            if (ns->xn && rr < ns->rows)
                *(float2 *)(ns->xn + (size_t)rr * (size_t)ns->in) = v;
        }
        uint32_t w3[3];
        mmt_split(v.x, v.y, &w3[0], &w3[1], &w3[2]);
#pragma unroll
        for (int p = 0; p < 3; p++)
            spl[mmt_sword(rr, t, p) + 2 * j + wd] = w3[p];
    }
}

/* G = 2: acc[mt] += the step's products, weights f (A: rows g, g + 8 of
 * m-tile mt), the columns' parts spl (B). */
__device__ __forceinline__ void mmt_step_cols(float (*acc)[4], const mmt_wfrag *f,
                                              const uint32_t *spl, int g, int t)
{
    const int rr = g / 3, p = g - 3 * rr;
    uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
    if (rr < 2) {
        const uint4 *q = (const uint4 *)(spl + mmt_sword(rr, t, p));
        v0 = q[0];
        v1 = q[1];
    }
    const uint32_t b[4][2] = {{v0.x, v0.y}, {v0.z, v0.w}, {v1.x, v1.y}, {v1.z, v1.w}};
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
            mmt_mma(acc[mt], mmt_word(f->v[2 * mt], 2 * j), mmt_word(f->v[2 * mt + 1], 2 * j),
                    mmt_word(f->v[2 * mt], 2 * j + 1), mmt_word(f->v[2 * mt + 1], 2 * j + 1),
                    b[j][0], b[j][1]);
}

/* The 16 x values of row r a lane's split takes at element k (zero outside
 * x). */
__device__ __forceinline__ void mmt_xload(float *xv, const float *x, int r, int k, int in)
{
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
        if (k + 4 * h < in)
            q = __ldg((const float4 *)(x + (size_t)r * (size_t)in + (size_t)k + 4 * h));
        xv[4 * h] = q.x, xv[4 * h + 1] = q.y, xv[4 * h + 2] = q.z, xv[4 * h + 3] = q.w;
    }
}

/* x split ahead (three rows or more, when the kernel that wrote x did not
 * leave its parts; splitting in the warps' rings was measured slower there,
 * NOTES.md), in cuda_xs_put4's layout with `in` rounded up to whole steps
 * (zeros past it): thread (r, s, t) takes the values 16t .. 16t + 15 of row
 * r's step s. */
__global__ void mmt_presplit_kernel(uint32_t *xs, const float *x, int R, int in, int steps)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* (r, s, t) */
    if (i >= (size_t)R * (size_t)steps * 4)
        return;
    const int t = (int)(i % 4), s = (int)(i / 4 % (size_t)steps), r = (int)(i / 4 / (size_t)steps);
    float xv[16];
    mmt_xload(xv, x, r, s * MMT_K + 16 * t, in);
    /* (r, s, t) holds what a 64-aligned x keeps from flat index 16 i */
#pragma unroll
    for (int j = 0; j < 4; j++)
        cuda_xs_put4(xs, 16 * i + 4 * (size_t)j,
                     make_float4(xv[4 * j], xv[4 * j + 1], xv[4 * j + 2], xv[4 * j + 3]));
}

/* Step s's pre-split words of rows r0 .. r0 + G - 1 into a warp's ring
 * stage by cp.async, zero for rows past R. A row's step is 384 contiguous
 * bytes of xs (part p's chunk c at 16 (8p + c)): lanes 0..23 copy chunk
 * `lane` of every row, so each copy instruction takes whole sectors, its
 * source is a lane's base plus a row stride and its destination a lane's
 * base plus 3 part-rows. */
template <int G>
__device__ __forceinline__ void mmt_xscopy(unsigned stage, const uint32_t *xs, int r0, int R, int s,
                                           int steps, int lane)
{
    if (lane >= 24)
        return;
    const size_t rs = (size_t)steps * 96; /* words from a row's step to the next row's */
    /* row r0 < R; rows past R read nothing (size 0) at the last row's address */
    const uint32_t *src = xs + ((size_t)r0 * (size_t)steps + (size_t)s) * 96 + 4 * lane;
#pragma unroll
    for (int rr = 0; rr < G; rr++) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                         stage + mmt_pos(3 * rr + (lane >> 3), lane & 7)),
                     "l"(src), "r"(r0 + rr < R ? 16 : 0)
                     : "memory");
        if (r0 + rr + 1 < R)
            src += rs;
    }
}

/* G >= 5: acc[mt][nb] += the step's products, the part-rows at the shared
 * address `stage` (A), weights f (B: n-block nb is weight row nb of the
 * lane). Lane i reads row i % 8 of matrix i / 8 (part-rows 0-7 and 8-15 of
 * the m-tile, k-halves 0 and 1): `rowoff` is its part-row of m-tile 0 and
 * k-half in bytes. */
template <int MT>
__device__ __forceinline__ void mmt_step_rows(float (*acc)[4][4], const mmt_wfrag *f,
                                              unsigned stage, unsigned rowoff, int half, int sw)
{
    uint32_t a[4][MT][4];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            mmt_ldsm(a[j][mt], stage + rowoff + (unsigned)(mt * 16 * MMT_PRB) +
                                   (unsigned)(((2 * j + half) ^ sw) << 4));
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nb = 0; nb < 4; nb++) {
                const uint4 &w = f->v[nb][j >> 1];
                mmt_mma(acc[mt][nb], a[j][mt][0], a[j][mt][1], a[j][mt][2], a[j][mt][3],
                        (j & 1) ? w.z : w.x, (j & 1) ? w.w : w.y);
            }
}

/* One weight of a call: several weights that share x (the projections of a
 * layer) run as one launch, each with the tiling it would have alone. */
#define MMT_MAXJOBS 4

typedef struct mmt_job {
    float *y;
    const void *w;        /* bf16, or F8 codes (the launch's weights all one or all the other) */
    const void *w_up;     /* non-NULL: y = silu(x·wᵀ) ⊙ (x·w_upᵀ), 16 outputs a block */
    float *part;          /* split k: [KB][R][out] ([KB][R][2·out] for a pair) */
    unsigned *count;      /* split k: [mblocks][rgroups] */
    uint32_t *ys;         /* non-NULL (a pair): y's bf16 parts for the matmul after */
    int out, KB, block0, accumulate;
} mmt_job;

typedef struct mmt_jobs {
    mmt_job j[MMT_MAXJOBS];
    int n;
    int cluster; /* > 1: every job's KB; a tile's k-blocks are one cluster */
} mmt_jobs;
/* Passed by value: no padding bytes (graph replays compare argument bytes). */
static_assert(sizeof(mmt_jobs) == MMT_MAXJOBS * sizeof(mmt_job) + 2 * sizeof(int),
              "mmt_jobs is packed");

/* F8 launches: each job's mmt_f8 scale words (of w and w_up), an argument of
 * the F8 kernels alone, so that the bf16 kernels' arguments stay what they
 * were (an unused argument cost a 4B decode step 0.5 %, below). */
typedef struct mmt_scales {
    uint32_t mul[MMT_MAXJOBS], mul_up[MMT_MAXJOBS];
} mmt_scales;

/* An RMSNorm of x before the products (rows of one group of 2, in % 8 == 0,
 * rows that norm.cu gives one warp: in <= 1024): every block works out its
 * rows' 1 / rms as norm.cu does (the same sums in the same order),
 * normalizes each step's x as it splits it, and the blocks of the first
 * weight's first m-block (one per k-block) write the normalized rows to xn,
 * as cuda_rmsnorm would have. */
typedef struct mmt_norm {
    float *xn;
    const float *w; /* [in] */
    float eps;
    int zero_centred;
} mmt_norm;
static_assert(sizeof(mmt_norm) == 2 * sizeof(void *) + 2 * sizeof(int), "mmt_norm is packed");

/* The norm's weights at lane's pair of step s (zeros past in). */
__device__ __forceinline__ float2 mmt_nload(const float *w, int s, int in, int lane)
{
    const int k = s * MMT_K + 2 * lane;
    return k < in ? __ldg((const float2 *)(w + k)) : make_float2(0.0f, 0.0f);
}

/* inv[rr] = 1 / rms of row r0 + rr (G rows; 0 for rows past R), with
 * norm.cu's sums for a row of one warp: warp rr takes row r0 + rr, its lane
 * l the groups of 4 l, l + 32, ... (at most 8). Every thread of the block
 * calls it (one barrier). */
template <int G>
__device__ __forceinline__ void mmt_norm_inv(float *inv, const float *x, int r0, int R, int in,
                                             float eps, int warp, int lane)
{
    static_assert(G <= MMT_WARPS, "a warp a row");
    __shared__ float nsum[G];
    const int ng = in / 4, rows = min(G, R - r0);
    if (warp < rows) {
        const float4 *xr = (const float4 *)(x + (size_t)(r0 + warp) * (size_t)in);
        float4 v[8];
#pragma unroll
        for (int q = 0; q < 8; q++)
            v[q] = lane + 32 * q < ng ? __ldcg(xr + lane + 32 * q)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float ss = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; q++)
            if (lane + 32 * q < ng)
                ss = cuda_norm_sq4(v[q], ss);
        ss = cuda_warp_sum(ss);
        if (lane == 0)
            nsum[warp] = ss;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < G; rr++)
        inv[rr] = rr < rows ? cuda_norm_inv(nsum[rr], in, eps) : 0.0f; /* rows past R: zeros */
}

/* Output m, group row rr: each part's column summed over warps in order,
 * then the parts hi + mid + lo. */
template <int G>
__device__ __forceinline__ float mmt_cell(float (*red)[MMT_M][mmt_group<G>::PR], int m, int rr)
{
    float v[3];
#pragma unroll
    for (int p = 0; p < 3; p++) {
        const int c = 3 * rr + p;
        v[p] = ((red[0][m][c] + red[1][m][c]) + red[2][m][c]) + red[3][m][c];
    }
    return (v[0] + v[1]) + v[2];
}

/* A pair's outputs of this block (16 a row, from m0) as bf16 parts for the
 * matmul that reads y next (down), once the block has written them. */
template <int G>
__device__ __forceinline__ void mmt_pair_parts(const mmt_job &jb, int m0, int r0, int R)
{
    __syncthreads();
    for (int i = threadIdx.x; i < 4 * G; i += blockDim.x) {
        const int o = m0 + 4 * (i / G), r = r0 + i % G;
        if (o < jb.out && r < R) {
            const size_t f = (size_t)r * (size_t)jb.out + (size_t)o;
            cuda_xs_put4(jb.ys, f, *(const float4 *)(jb.y + f));
        }
    }
}

/* Block (linear index within its job) = ((m-block · KB) + kb) · rgroups +
 * rgroup: the blocks that read the same weights are adjacent (L2 reuse
 * across row groups). MINB (blocks a multiprocessor must hold) only sets
 * the registers per thread, never the arithmetic. A call whose blocks all
 * fit at once at 3 a multiprocessor runs best with the registers the
 * kernel likes (more loads in flight per block); a longer one (the LM head,
 * gate + up, verify blocks of several row groups) with at most 128, so that
 * 4 fit, unless its waves are fuller at 3 (mmt_fill; groups of 2 rows use
 * fewer than 128 registers either way, so 4 fit whatever MINB says).
 * Measurements in NOTES.md. */
template <int G, bool PAIR, bool NORM, bool F8>
__device__ __forceinline__ void mmt_body(const mmt_jobs &jobs, const mmt_norm &nm,
                                         const mmt_scales &sc, const float *__restrict__ x,
                                         const uint32_t *xs, int R, int in, int rgroups)
{
    static_assert(!NORM || G == 2, "a norm is fused only where the warps split x");
    constexpr int D = MMT_D, MT = mmt_group<G>::MT, PR = mmt_group<G>::PR;
    constexpr bool SPLIT = mmt_group<G>::SPLIT; /* else x comes split ahead in xs */
    /* bytes: a warp's ring stage (fp32 rows, or part-rows), its split words */
    constexpr int STAGE = SPLIT ? G * MMT_K * 4 : PR * MMT_PRB, SPL = SPLIT ? G * 96 * 4 : 0;
    constexpr int RING = MMT_WARPS * D * STAGE / 4; /* floats */
    constexpr int RED = MMT_WARPS * MMT_M * PR;     /* floats: red, after the loop */
    __shared__ __align__(16) float sm[(RING > RED ? RING : RED) + MMT_WARPS * SPL / 4];
    __shared__ int last;
    float(*red)[MMT_M][PR] = (float(*)[MMT_M][PR])sm;
    int ji = 0;
    while (ji + 1 < jobs.n && (int)blockIdx.x >= jobs.j[ji + 1].block0)
        ji++;
    const mmt_job &jb = jobs.j[ji];
    constexpr bool pair = PAIR; /* every job of the launch a gate/up pair */
    const int out = jb.out, KB = jb.KB, bi = (int)blockIdx.x - jb.block0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int rg = bi % rgroups, kb = bi / rgroups % KB, mb = bi / rgroups / KB;
    /* Clusters come with one row group: a tile's k-blocks are side by side,
     * cluster rank kb. */
    const bool clus = jobs.cluster > 1;
    const int m0 = mb * (pair ? MMT_M / 2 : MMT_M), r0 = rg * G;
    /* the job's scale words (F8), by selects: indexing the argument with ji
     * would copy it to local memory */
    uint32_t mul = 0, mul_up = 0;
    if constexpr (F8) {
#pragma unroll
        for (int i = 0; i < MMT_MAXJOBS; i++)
            if (ji == i) {
                mul = sc.mul[i];
                mul_up = sc.mul_up[i];
            }
    }
    const mmt_wrows<F8> wr = mmt_wrows_of<PAIR, F8>(jb.w, jb.w_up, mul, mul_up, m0 + g, out, in, t);
    const int steps = (in + MMT_K - 1) / MMT_K;
    const int s0 = (int)((long long)kb * steps / KB), s1 = (int)((long long)(kb + 1) * steps / KB);
    unsigned char *ring = (unsigned char *)sm + warp * D * STAGE;
    uint32_t *spl = (uint32_t *)(sm + (RING > RED ? RING : RED)) + warp * SPL / 4;
    const unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);
    if constexpr (!SPLIT) {
        /* The part-rows no copy writes (3G and on) are zero for good. */
        for (int i = lane; i < D * (PR - 3 * G) * 8; i += 32) {
            const int st = i / ((PR - 3 * G) * 8), ch = i % ((PR - 3 * G) * 8);
            *(uint4 *)(ring + st * STAGE + mmt_pos(3 * G + ch / 8, ch % 8)) =
                make_uint4(0, 0, 0, 0);
        }
    }
    /* Lane i reads row i % 8 of ldmatrix matrix i / 8: part-row
     * 8 (i / 8 % 2) + i % 8 of an m-tile, k-half i / 16. */
    const unsigned rowoff = (unsigned)((8 * ((lane >> 3) & 1) + (lane & 7)) * MMT_PRB);
    const int khalf = lane >> 4, sw = lane & 7;
    /* A ring of D steps per warp (steps s0 + warp, + 4, ...): D - 1 in
     * flight while one computes. Weights never change, so the first D - 1
     * are requested before waiting for the kernel before this one
     * (programmatic dependent launch); x is copied once it is readable. */
    mmt_wfrag f[D];
    float2 nwv[D]; /* NORM: the norm's weights at the lane's pair of each stage's step */
    int s = s0 + warp;
#pragma unroll
    for (int u = 0; u < D - 1; u++)
        if (s + MMT_WARPS * u < s1) {
            mmt_wstep<F8>(&f[u], wr, s + MMT_WARPS * u);
            if constexpr (NORM)
                nwv[u] = mmt_nload(nm.w, s + MMT_WARPS * u, in, lane);
        }
    cuda_kernel_begin();
#pragma unroll
    for (int u = 0; u < D - 1; u++) {
        if (s + MMT_WARPS * u < s1) {
            if constexpr (SPLIT)
                mmt_xcopy<G>((float *)(ring + u * STAGE), x, r0, R, s + MMT_WARPS * u, in, lane);
            else
                mmt_xscopy<G>(ring_s + u * STAGE, xs, r0, R, s + MMT_WARPS * u, steps, lane);
        }
        mmt_commit();
    }
    /* NORM: the rows' 1 / rms while the first steps' x arrive; this block
     * writes the normalized rows where it is the first weight's first
     * m-block. */
    float ninv[G];
    float *nxn = NULL;
    if constexpr (NORM) {
        mmt_norm_inv<G>(ninv, x, r0, R, in, nm.eps, warp, lane);
        if (ji == 0 && mb == 0)
            nxn = nm.xn + (size_t)r0 * (size_t)in;
    }
    /* SPLIT: acc[mt][0][e], rows 16 mt + g + 8 (e / 2) (features), column
     * 2t + e % 2; else acc[mt][nb][e], part-row 16 mt + g + 8 (e / 2),
     * feature 8 nb + 2t + e % 2. */
    constexpr int A0 = SPLIT ? 2 : MT, A1 = SPLIT ? 1 : 4;
    float acc[A0][A1][4];
#pragma unroll
    for (int i = 0; i < A0; i++)
#pragma unroll
        for (int n = 0; n < A1; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][n][e] = 0.0f;
    for (; s < s1; s += MMT_WARPS * D) {
#pragma unroll
        for (int u = 0; u < D; u++) {
            const int sc = s + MMT_WARPS * u, sl = sc + MMT_WARPS * (D - 1);
            if (sc < s1) {
                const int il = (u + D - 1) % D;
                if (sl < s1) {
                    mmt_wstep<F8>(&f[il], wr, sl);
                    if constexpr (NORM)
                        nwv[il] = mmt_nload(nm.w, sl, in, lane);
                    if constexpr (SPLIT)
                        mmt_xcopy<G>((float *)(ring + il * STAGE), x, r0, R, sl, in, lane);
                    else
                        mmt_xscopy<G>(ring_s + il * STAGE, xs, r0, R, sl, steps, lane);
                }
                mmt_commit(); /* one group per step, empty or not */
                mmt_wait<D - 1>();
                __syncwarp();
                mmt_wfrag fx;
                const mmt_wfrag *fu = &f[u];
                if constexpr (F8) {
                    fx = mmt_f8(f[u], wr);
                    fu = &fx;
                }
                if constexpr (SPLIT) {
                    if constexpr (NORM) {
                        const int k = sc * MMT_K + 2 * lane;
                        const mmt_nstep ns = {
                            ninv, nwv[u], nm.zero_centred, nxn && k < in ? nxn + k : NULL,
                            in,   R - r0};
                        mmt_xsplit<G>(spl, (const float *)(ring + u * STAGE), lane, &ns);
                    } else {
                        mmt_xsplit<G>(spl, (const float *)(ring + u * STAGE), lane, NULL);
                    }
                    __syncwarp();
                    mmt_step_cols((float(*)[4])acc, fu, spl, g, t);
                } else {
                    mmt_step_rows<MT>(acc, fu, ring_s + u * STAGE, rowoff, khalf, sw);
                }
                __syncwarp(); /* the stage (and spl) is rewritten by a later step */
            }
        }
    }
    mmt_wait<0>();
    __syncthreads(); /* red reuses the x ring */
#pragma unroll
    for (int i = 0; i < A0; i++)
#pragma unroll
        for (int n = 0; n < A1; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int a = 16 * i + g + 8 * (e >> 1), b = 8 * n + 2 * t + (e & 1);
                if constexpr (SPLIT)
                    red[warp][a][b] = acc[i][n][e];
                else
                    red[warp][b][a] = acc[i][n][e];
            }
    __syncthreads();
    /* Then (split k) the k-blocks in order. A pair's block holds 16 gate
     * (cells m < 16) and 16 up outputs (m + 16) of outputs m0 + m; its
     * partials are [KB][R][gate out | up out]. */
    float *y = jb.y;
    const int pw = pair ? 2 * out : out; /* a partial row */
    if (KB == 1) {
        for (int i = threadIdx.x; i < (pair ? 16 : MMT_M) * G; i += blockDim.x) {
            const int m = i / G, rr = i % G, o = m0 + m, r = r0 + rr;
            if (o < out && r < R) {
                float *yp = y + (size_t)r * (size_t)out + (size_t)o;
                if (pair)
                    *yp = cuda_silu(mmt_cell<G>(red, m, rr)) * mmt_cell<G>(red, m + 16, rr);
                else
                    *yp = jb.accumulate ? *yp + mmt_cell<G>(red, m, rr) : mmt_cell<G>(red, m, rr);
            }
        }
        if (pair && jb.ys)
            mmt_pair_parts<G>(jb, m0, r0, R);
        return;
    }
    if (clus) {
        /* Split k in a cluster: each k-block's cells into block 0's shared
         * memory, then block 0 adds them in k-block order (the same sums as
         * through global memory below). */
        __shared__ float csum[MMT_CLUSTER_MAX * MMT_M * G];
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        float *dst = cl.map_shared_rank(csum, 0) + kb * MMT_M * G;
        for (int i = threadIdx.x; i < MMT_M * G; i += blockDim.x)
            dst[i] = mmt_cell<G>(red, i / G, i % G);
        cl.sync();
        if (kb != 0)
            return;
        for (int i = threadIdx.x; i < (pair ? 16 : MMT_M) * G; i += blockDim.x) {
            const int m = i / G, rr = i % G, o = m0 + m, r = r0 + rr;
            if (o < out && r < R) {
                float v = 0.0f, u = 0.0f;
                for (int b = 0; b < KB; b++) {
                    v += csum[b * MMT_M * G + i];
                    if (pair)
                        u += csum[b * MMT_M * G + i + 16 * G];
                }
                float *yp = y + (size_t)r * (size_t)out + (size_t)o;
                *yp = pair ? cuda_silu(v) * u : jb.accumulate ? *yp + v : v;
            }
        }
        if (pair && jb.ys)
            mmt_pair_parts<G>(jb, m0, r0, R);
        return;
    }
    /* Split k: the last block of the tile adds the KB partials in order. */
    float *part = jb.part;
    for (int i = threadIdx.x; i < MMT_M * G; i += blockDim.x) {
        const int m = i / G, rr = i % G, r = r0 + rr;
        const int o = pair ? m0 + (m & 15) : m0 + m, po = pair && m >= 16 ? out + o : o;
        if (o < out && r < R)
            part[((size_t)kb * (size_t)R + (size_t)r) * (size_t)pw + (size_t)po] =
                mmt_cell<G>(red, m, rr);
    }
    __threadfence();
    __syncthreads();
    unsigned *cnt = jb.count + (size_t)mb * (size_t)rgroups + (size_t)rg;
    if (threadIdx.x == 0)
        last = atomicAdd(cnt, 1u) == (unsigned)KB - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    for (int i = threadIdx.x; i < (pair ? 16 : MMT_M) * G; i += blockDim.x) {
        const int m = i / G, rr = i % G, o = m0 + m, r = r0 + rr;
        if (o < out && r < R) {
            float v = 0.0f, u = 0.0f;
            for (int b = 0; b < KB; b++) {
                const float *pp = part + ((size_t)b * (size_t)R + (size_t)r) * (size_t)pw + o;
                v += __ldcg(pp);
                if (pair)
                    u += __ldcg(pp + out);
            }
            float *yp = y + (size_t)r * (size_t)out + (size_t)o;
            *yp = pair ? cuda_silu(v) * u : jb.accumulate ? *yp + v : v;
        }
    }
    if (pair && jb.ys)
        mmt_pair_parts<G>(jb, m0, r0, R);
    if (threadIdx.x == 0)
        *cnt = 0; /* ready for the next call */
}

/* The kernels: without a norm, the arguments they always had; with one
 * (rows of one group of 2), the norm's too. (With an unused mmt_norm
 * argument in every launch the 4B decode step measured 0.5 % slower than the
 * tree before, H100, three interleaved pairs, where the instructions of
 * every kernel it runs were the same: only the argument differed. These
 * kernels' PTX is the tree before's again.) */
template <int G, int MINB, bool PAIR>
__global__ void __launch_bounds__(MMT_WARPS * 32, MINB)
    mmt_kernel(const mmt_jobs jobs, const float *__restrict__ x, const uint32_t *xs, int R, int in,
               int rgroups)
{
    mmt_body<G, PAIR, false, false>(jobs, mmt_norm{}, mmt_scales{}, x, xs, R, in, rgroups);
}

template <int MINB, bool PAIR>
__global__ void __launch_bounds__(MMT_WARPS * 32, MINB)
    mmt_norm_kernel(const mmt_jobs jobs, const mmt_norm nm, const float *__restrict__ x, int R,
                    int in)
{
    mmt_body<2, PAIR, true, false>(jobs, nm, mmt_scales{}, x, NULL, R, in, 1);
}

/* The same for FP8 weights. */
template <int G, int MINB, bool PAIR>
__global__ void __launch_bounds__(MMT_WARPS * 32, MINB)
    mmt_f8_kernel(const mmt_jobs jobs, const mmt_scales sc, const float *__restrict__ x,
                  const uint32_t *xs, int R, int in, int rgroups)
{
    mmt_body<G, PAIR, false, true>(jobs, mmt_norm{}, sc, x, xs, R, in, rgroups);
}

template <int MINB, bool PAIR>
__global__ void __launch_bounds__(MMT_WARPS * 32, MINB)
    mmt_f8_norm_kernel(const mmt_jobs jobs, const mmt_norm nm, const mmt_scales sc,
                       const float *__restrict__ x, int R, int in)
{
    mmt_body<2, PAIR, true, true>(jobs, nm, sc, x, NULL, R, in, 1);
}

/* How full a call's waves are when `slots` blocks run at once: blocks over
 * the slots of its whole waves (1: the last wave as full as the others). A
 * call of many waves whose last one runs a few blocks streams most of a
 * block's time below the bandwidth (the Qwen3.6-27B gate/up pair, 1088
 * blocks: 2.06 waves at 4 a multiprocessor, 2.75 at 3). */
static double mmt_fill(size_t blocks, int slots)
{
    const size_t waves = (blocks + (size_t)slots - 1) / (size_t)slots;
    return (double)blocks / ((double)waves * (double)slots);
}

/* k-blocks: enough blocks to fill the GPU when `out` is small, each warp
 * keeping at least two steps; a function of (in, out) alone. */
static int mmt_kblocks(int in, int out)
{
    const int mblocks = (out + MMT_M - 1) / MMT_M, steps = (in + MMT_K - 1) / MMT_K;
    int kb = (MMT_BLOCKS + mblocks - 1) / mblocks;
    const int maxkb = steps / (2 * MMT_WARPS);
    if (kb > maxkb)
        kb = maxkb;
    return kb < 1 ? 1 : kb;
}

/* m-blocks of a weight of `out` rows (a gate/up pair: 16 outputs a block). */
static int mmt_mblocks(int out, bool pair)
{
    const int bm = pair ? MMT_M / 2 : MMT_M;
    return (out + bm - 1) / bm;
}

/* Blocks of mmt_matmul's launch for one group of rows (R <= 2). */
static size_t mmt_blocks_one_group(int in, int n, const int *outs, bool pair)
{
    size_t blocks = 0;
    for (int i = 0; i < n; i++)
        blocks += (size_t)mmt_mblocks(outs[i], pair) * (size_t)mmt_kblocks(in, outs[i]);
    return blocks;
}

/* mmt_f8's scale word of an F8 weight: the bf16 2^(112 + e), twice. */
static uint32_t mmt_f8_mul(tdm_weight w)
{
    if (w.dtype != TDM_DTYPE_FP8)
        return 0;
    TDM_ASSERT(w.scale_exp >= TDM_FP8_EXP_MIN && w.scale_exp <= TDM_FP8_EXP_MAX);
    const uint32_t b = (uint32_t)(127 + 112 + w.scale_exp) << 7;
    return b | b << 16;
}

/* Whether the tensor cores take w (bf16 or F8, 16-byte aligned). */
static bool mmt_takes(tdm_weight w)
{
    return (w.dtype == TDM_DTYPE_BF16 || w.dtype == TDM_DTYPE_FP8) && (uintptr_t)w.data % 16 == 0;
}

/* ys[i] [R, outs[i]] (+)= x · ws[i]ᵀ for i < n (n <= MMT_MAXJOBS), one launch;
 * where ups (NULL: none) has ups[i], ys[i] = silu(x · ws[i]ᵀ) ⊙ (x · ups[i]ᵀ).
 * Every weight of a launch has one dtype (mmt_takes). norm (NULL: none;
 * rows in one group of 2): x normalized first (mmt_norm). */
static void mmt_matmul(cuda_ctx *c, const float *x, int R, int in, int n, float *const *ys,
                       const tdm_weight *ws, const tdm_weight *ups, const int *outs, int accumulate,
                       const mmt_norm *norm)
{
    const bool f8 = ws[0].dtype == TDM_DTYPE_FP8;
    for (int i = 0; i < n; i++)
        TDM_ASSERT(mmt_takes(ws[i]) && (ws[i].dtype == TDM_DTYPE_FP8) == f8 &&
                   (!ups || !ups[i].data || ups[i].dtype == ws[i].dtype));
    TDM_ASSERT(!f8 || (in % MMT_K == 0 && (uintptr_t)x % 16 == 0));
    const int G = mmt_group_rows(R), rgroups = (R + G - 1) / G;
    TDM_ASSERT(!norm || G == 2);
    mmt_jobs jobs;
    memset(&jobs, 0, sizeof(jobs));
    mmt_scales sc;
    memset(&sc, 0, sizeof(sc));
    jobs.n = n;
    size_t blocks = 0, part_floats = 0, counters = 0;
    int mblocks[MMT_MAXJOBS], kbs[MMT_MAXJOBS] = {0};
    TDM_ASSERT(n >= 1 && n <= MMT_MAXJOBS);
    for (int i = 0; i < n; i++)
        kbs[i] = mmt_kblocks(in, outs[i]); /* a pair splits k as its gate alone would */
    /* A launch of one row group whose jobs all split k the same way
     * (2 .. MMT_CLUSTER_MAX k-blocks) adds the k-blocks through clusters;
     * other launches through global memory, the same sums in the same
     * order. With several row groups clusters were slower (NOTES.md). */
    jobs.cluster = rgroups == 1 ? kbs[0] : 1;
    for (int i = 1; i < n; i++)
        if (kbs[i] != jobs.cluster)
            jobs.cluster = 1;
    if (jobs.cluster > MMT_CLUSTER_MAX)
        jobs.cluster = 1;
    for (int i = 0; i < n; i++) {
        const void *up = ups ? ups[i].data : NULL;
        const int KB = kbs[i];
        TDM_ASSERT(!up || !accumulate);
        mblocks[i] = mmt_mblocks(outs[i], up != NULL);
        jobs.j[i] = (mmt_job){ys[i], ws[i].data, up, NULL,        NULL,
                              NULL,  outs[i],    KB, (int)blocks, accumulate};
        sc.mul[i] = mmt_f8_mul(ws[i]);
        sc.mul_up[i] = up ? mmt_f8_mul(ups[i]) : 0u;
        blocks += (size_t)mblocks[i] * (size_t)KB * (size_t)rgroups;
        if (KB > 1 && jobs.cluster == 1) {
            part_floats += (size_t)KB * (size_t)R * (size_t)outs[i] * (up ? 2 : 1);
            counters += (size_t)mblocks[i] * (size_t)rgroups;
        }
    }
    TDM_ASSERT(blocks < (1u << 31));
    if (part_floats) {
        /* counters return to zero after every call (the last block resets its own) */
        float *part = (float *)cuda_grow(c, (void **)&c->mm_part, &c->mm_part_cap,
                                         part_floats * sizeof(float));
        unsigned *count = (unsigned *)cuda_grow(c, (void **)&c->mm_count, &c->mm_count_cap,
                                                counters * sizeof(unsigned));
        for (int i = 0; i < n; i++)
            if (jobs.j[i].KB > 1 && jobs.cluster == 1) {
                jobs.j[i].part = part;
                jobs.j[i].count = count;
                part += (size_t)jobs.j[i].KB * (size_t)R * (size_t)outs[i] *
                        (ups && ups[i].data ? 2 : 1);
                count += (size_t)mblocks[i] * (size_t)rgroups;
            }
    }
    uint32_t *xs = NULL;
    if (cuda_xs_rows(R)) {
        const int steps = (in + MMT_K - 1) / MMT_K;
        const size_t nx = (size_t)R * (size_t)steps * 4;
        if (c->xs_src == x && c->xs_launch == c->nlaunch && in % MMT_K == 0 &&
            (size_t)R * (size_t)in <= c->xs_n) {
            xs = c->xs_parts; /* the kernel that wrote x wrote its parts */
        } else {
            xs = (uint32_t *)cuda_grow(c, (void **)&c->mm_xs, &c->mm_xs_cap,
                                       nx * 24 * sizeof(uint32_t));
            cuda_launch(c, mmt_presplit_kernel, cuda_blocks(nx, 128), 128, 0, xs, x, R, in, steps);
        }
    }
    /* A gate/up pair leaves y's parts for the down projection (its own
     * buffer: this launch reads mm_xs). */
    const bool yparts = ups && ups[0].data && n == 1 && outs[0] % MMT_K == 0 && cuda_xs_rows(R) &&
                        (uintptr_t)ys[0] % 16 == 0;
    if (yparts)
        jobs.j[0].ys = (uint32_t *)cuda_grow(c, (void **)&c->mm_ys, &c->mm_ys_cap,
                                             (size_t)R * (size_t)outs[0] / 16 * 24 * 4);
    const bool one_wave = blocks <= (size_t)3 * (size_t)c->sm_count;
    const bool three =
        one_wave || mmt_fill(blocks, 3 * c->sm_count) > mmt_fill(blocks, 4 * c->sm_count);
    const bool pair = ups && ups[0].data;
    for (int i = 0; i < n; i++)
        TDM_ASSERT(!ups || !ups[i].data == !pair); /* pairs launch apart from single weights */
#define MMT_LAUNCH(G, MINB)                                                                        \
    (f8 ? cuda_launch_cluster(c,                                                                   \
                              pair ? mmt_f8_kernel<G, MINB, true> : mmt_f8_kernel<G, MINB, false>, \
                              (unsigned)blocks, MMT_WARPS * 32, 0, (unsigned)jobs.cluster, jobs,   \
                              sc, x, (const uint32_t *)xs, R, in, rgroups)                         \
        : cuda_launch_cluster(c, pair ? mmt_kernel<G, MINB, true> : mmt_kernel<G, MINB, false>,    \
                              (unsigned)blocks, MMT_WARPS * 32, 0, (unsigned)jobs.cluster, jobs,   \
                              x, (const uint32_t *)xs, R, in, rgroups))
#define MMT_LAUNCH_NORM(MINB)                                                                      \
    (f8 ? cuda_launch_cluster(                                                                     \
              c, pair ? mmt_f8_norm_kernel<MINB, true> : mmt_f8_norm_kernel<MINB, false>,          \
              (unsigned)blocks, MMT_WARPS * 32, 0, (unsigned)jobs.cluster, jobs, *norm, sc, x, R,  \
              in)                                                                                  \
        : cuda_launch_cluster(                                                                     \
              c, pair ? mmt_norm_kernel<MINB, true> : mmt_norm_kernel<MINB, false>,                \
              (unsigned)blocks, MMT_WARPS * 32, 0, (unsigned)jobs.cluster, jobs, *norm, x, R, in))
    if (G == 2 && norm)
        one_wave ? MMT_LAUNCH_NORM(1) : MMT_LAUNCH_NORM(4);
    else if (G == 2)
        one_wave ? MMT_LAUNCH(2, 1) : MMT_LAUNCH(2, 4);
    else if (G == 5)
        three ? MMT_LAUNCH(5, 3) : MMT_LAUNCH(5, 4);
    else
        three ? MMT_LAUNCH(10, 3) : MMT_LAUNCH(10, 4);
#undef MMT_LAUNCH_NORM
#undef MMT_LAUNCH
    if (yparts)
        cuda_xs_written(c, ys[0], (size_t)R * (size_t)outs[0], jobs.j[0].ys);
}

int cuda_xs_rows(int R)
{
    return mmt_group_rows(R) > 2; /* groups of 2 split x in the warp */
}

uint32_t *cuda_xs_target(cuda_ctx *c, size_t n)
{
    if (n % MMT_K)
        return NULL;
    return (uint32_t *)cuda_grow(c, (void **)&c->mm_xs, &c->mm_xs_cap, n / 16 * 24 * 4);
}

void cuda_xs_written(cuda_ctx *c, const float *y, size_t n, uint32_t *parts)
{
    c->xs_src = y;
    c->xs_parts = parts;
    c->xs_n = n;
    c->xs_launch = c->nlaunch;
}

/* ---- dispatch --------------------------------------------------------------- */

void cuda_matmul(void *ctx, float *y, const float *x, tdm_weight w, int R, int in, int out,
                 int accumulate)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || out <= 0)
        return;
    if (cuda_bulk_takes(c, x, w.data, w.dtype, in, out)) {
        const uint16_t *wd = (const uint16_t *)w.data;
        cuda_bulk_matmul_n(c, x, R, in, 1, &y, &wd, &out, accumulate);
        return;
    }
    /* The vector paths need every row of w and x 16-byte aligned. */
    const int vec = in % 8 == 0 && ((uintptr_t)w.data % 16) == 0 && ((uintptr_t)x % 16) == 0;
    if ((vec && mmt_takes(w)) || w.dtype == TDM_DTYPE_FP8) {
        mmt_matmul(c, x, R, in, 1, &y, &w, NULL, &out, accumulate, NULL);
        return;
    }
    /* Rows per block: the fewest that hold the whole call (up to 16), so a
     * verify block of k <= 15 streams the weights once and a decode step
     * keeps few registers. Each row's arithmetic is the same in every
     * variant. */
    const int rows = R <= 2 ? 2 : R <= 8 ? 8 : 16;
    const int nchunks = (R + rows - 1) / rows, kw = mm_kwarps(in);
    const size_t blocks = (size_t)((out + MM_COLS - 1) / MM_COLS) * (size_t)nchunks;
    TDM_ASSERT(blocks < (1u << 31));
#define MM_LAUNCH(N)                                                                               \
    cuda_launch(c, mm_kernel<N>, (unsigned)blocks, (unsigned)kw * 32, 0, y, x, w.data, w.dtype, R, \
                in, out, accumulate, vec, nchunks)
    if (rows == 2)
        MM_LAUNCH(2);
    else if (rows == 8)
        MM_LAUNCH(8);
    else
        MM_LAUNCH(16);
#undef MM_LAUNCH
}

void cuda_matmul_n(void *ctx, const float *x, int R, int in, int n, float *const *ys,
                   const tdm_weight *ws, const int *outs)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (c->bulk && R > 0) { /* x split once per group of weights cuBLAS takes */
        float *by[MMT_MAXJOBS];
        const uint16_t *bw[MMT_MAXJOBS];
        int bo[MMT_MAXJOBS], nb = 0;
        for (int i = 0; i < n; i++) {
            if (outs[i] <= 0)
                continue;
            if (!cuda_bulk_takes(c, x, ws[i].data, ws[i].dtype, in, outs[i])) {
                cuda_matmul(ctx, ys[i], x, ws[i], R, in, outs[i], 0);
                continue;
            }
            by[nb] = ys[i];
            bw[nb] = (const uint16_t *)ws[i].data;
            bo[nb++] = outs[i];
            if (nb == MMT_MAXJOBS) {
                cuda_bulk_matmul_n(c, x, R, in, nb, by, bw, bo, 0);
                nb = 0;
            }
        }
        if (nb)
            cuda_bulk_matmul_n(c, x, R, in, nb, by, bw, bo, 0);
        return;
    }
    /* Tensor-core weights of one dtype in groups of up to MMT_MAXJOBS per
     * launch; any other weight alone. Each output gets exactly what
     * cuda_matmul gives. */
    float *gy[MMT_MAXJOBS];
    tdm_weight gw[MMT_MAXJOBS];
    int go[MMT_MAXJOBS], ng = 0;
    const int xvec = in % 8 == 0 && ((uintptr_t)x % 16) == 0;
    for (int i = 0; i < n; i++) {
        if (R <= 0 || outs[i] <= 0)
            continue;
        if (xvec && mmt_takes(ws[i])) {
            if (ng && gw[0].dtype != ws[i].dtype) {
                mmt_matmul(c, x, R, in, ng, gy, gw, NULL, go, 0, NULL);
                ng = 0;
            }
            gy[ng] = ys[i];
            gw[ng] = ws[i];
            go[ng++] = outs[i];
            if (ng == MMT_MAXJOBS) {
                mmt_matmul(c, x, R, in, ng, gy, gw, NULL, go, 0, NULL);
                ng = 0;
            }
        } else {
            cuda_matmul(ctx, ys[i], x, ws[i], R, in, outs[i], 0);
        }
    }
    if (ng)
        mmt_matmul(c, x, R, in, ng, gy, gw, NULL, go, 0, NULL);
}

void cuda_matmul_silu(void *ctx, float *y, const float *x, tdm_weight gate, tdm_weight up, int R,
                      int in, int out)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || out <= 0)
        return;
    if (cuda_bulk_takes(c, x, gate.data, gate.dtype, in, out) &&
        cuda_bulk_takes(c, x, up.data, up.dtype, in, out)) {
        cuda_bulk_matmul_silu(c, y, x, (const uint16_t *)gate.data, (const uint16_t *)up.data, R,
                              in, out);
        return;
    }
    const int xvec = in % 8 == 0 && ((uintptr_t)x % 16) == 0;
    if (xvec && mmt_takes(gate) && mmt_takes(up) && gate.dtype == up.dtype) {
        mmt_matmul(c, x, R, in, 1, &y, &gate, &up, &out, 0, NULL);
        return;
    }
    /* Other weights: the two products, then silu_mul (up in scratch). */
    float *u = (float *)cuda_grow(c, (void **)&c->mm_up, &c->mm_up_cap,
                                  (size_t)R * (size_t)out * sizeof(float));
    cuda_matmul(ctx, y, x, gate, R, in, out, 0);
    cuda_matmul(ctx, u, x, up, R, in, out, 0);
    cuda_silu_mul(ctx, y, y, u, (size_t)R * (size_t)out);
}

/* One launch where the products take x through the warps (one group of 2
 * rows) on the tensor cores, the norm's row is one warp's (in <= 1024) and
 * every block runs at once (4 a multiprocessor): each block normalizes the
 * rows as it reads them (mmt_norm). Elsewhere the norm, then the products,
 * as the separate ops. Measured on one H100 (NOTES.md): the 0.8B shape's
 * decode step, every norm fused, 6 % faster; on the 4B shape (rows of 2,560,
 * five warps' sums a block) fusing the one-wave launches gained nothing
 * (3.665 -> 3.688 ms, most of it an unused norm argument every mmt_kernel
 * launch then carried; the norm has mmt_norm_kernel now),
 * and with the gate/up pair and the LM head too it lost 4 % (a norm in every
 * block of every wave). */
void cuda_norm_matmul(void *ctx, float *xn, const float *x, const float *w, float eps,
                      int zero_centred, int R, int in, int n, float *const *ys,
                      const tdm_weight *ws, const tdm_weight *up, const int *outs)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || in <= 0)
        return;
    TDM_ASSERT(xn != x && (!up || n == 1));
    bool fuse = !c->bulk && mmt_group_rows(R) == 2 && n <= MMT_MAXJOBS && in % 8 == 0 &&
                cuda_norm_threads(in) == 32 &&
                ((uintptr_t)x | (uintptr_t)xn | (uintptr_t)w) % 16 == 0;
    for (int i = 0; i < n && fuse; i++)
        fuse = outs[i] > 0 && mmt_takes(ws[i]) && ws[i].dtype == ws[0].dtype;
    if (up && fuse)
        fuse = mmt_takes(*up) && up->dtype == ws[0].dtype;
    if (fuse)
        fuse = mmt_blocks_one_group(in, n, outs, up != NULL) <= (size_t)4 * (size_t)c->sm_count;
    if (!fuse) {
        cuda_rmsnorm(ctx, xn, x, w, R, in, eps, zero_centred);
        if (up)
            cuda_matmul_silu(ctx, ys[0], xn, ws[0], *up, R, in, outs[0]);
        else
            cuda_matmul_n(ctx, xn, R, in, n, ys, ws, outs);
        return;
    }
    const mmt_norm nm = {xn, w, eps, zero_centred};
    mmt_matmul(c, x, R, in, n, ys, ws, up, outs, 0, &nm);
}
