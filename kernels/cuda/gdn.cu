/*
 * gdn.cu - the Gated DeltaNet mixer's stateful ops, per segment of rows (one sequence each).
 * conv_silu: depthwise causal conv of width K, then SiLU, with the window state [K-1, C] as left
 * context. gdn_recurrent: the gated delta rule in recurrent form; per v-head and position, with
 * |x|⁻¹ = 1/sqrt(Σx² + 1e-6), decay = exp(g), g = -exp(A_log)·softplus(a + dt_bias), beta =
 * sigmoid(b):
 *   S *= decay;  kv = (Sᵀk)·|k|⁻¹;  S += k ((v - kv)·beta·|k|⁻¹);  o = (Sᵀq)·(|q|⁻¹·Dk^-0.5)
 * (the reference with q and k l2-normalised first). gdn_replay: the replay strategy's commit,
 * each state advanced by the rows its record holds, every layer of a sequence in one launch.
 *
 * Invariants a change must keep (the GPU tests check them to the bit):
 *  - Batch invariance: a position's bits do not depend on R, on the segmentation or on whether
 *    it runs in a prefill, a verify block or a decode step. P (state rows a thread) and SL
 *    (lanes a value column) follow from Dk alone; sums over d run per thread in four interleaved
 *    chains (gdn_sum4), then a butterfly over the column's SL lanes; a row's norms in a fixed
 *    lane order and butterfly; the chunk of staged rows never enters the arithmetic.
 *  - A replay gives the bits of the rows it replays (extra_buffer == no_buffer == replay): step
 *    rows and record rows both go through gdn_advance, whose every product and difference is an
 *    explicit rounding (fmaf, __fmul_rn, __fsub_rn), and the record keeps k as read and the
 *    decay, beta and 1/|k| the step computed.
 *  - Conv: every output is the same K-term fmaf sum whatever the chunking; the window is written
 *    in place only by the thread of chunk 0, the one thread that reads the old window (chunks
 *    start CONV_CHUNK >= K-1 rows apart).
 *
 * Layout: conv x, y [R, C], w [C, K]. Delta rule: qkv rows [R, qkv_stride], q [Hk, Dk] at 0, k at
 * Hk·Dk, v [Hv, Dv] at 2·Hk·Dk; v-head h reads k-head h / (Hv/Hk); a, b [R, Hv]; out [R, Hv, Dv];
 * state [Hv, Dk, Dv]; record rows of tdm_gdn_input_floats (backend.h). 16-byte copies where Dk, Dv,
 * the stride and the pointers allow, else 4-byte copies of the same values.
 *
 * Work split. Conv: a thread per (channel, chunk of CONV_CHUNK rows), the block's segment found
 * by seglist.cuh. Delta rule: a block of GDN_WARPS warps per (value-column tile, v-head,
 * segment); each lane keeps P state rows of one column in registers for the whole segment. Rows
 * are staged in shared memory in chunks (up to 32 rows, 48 KB), a thread a 16-byte part of every
 * row; the warps make the rows' norms and gates, then the chain of positions reads only shared
 * memory and registers. The design's history and measurements: NOTES.md.
 */
#include "gdn.cuh"
#include "seglist.cuh"

#include <math.h>
#include <stdint.h>

/* ---- causal conv ------------------------------------------------------ */

#define CONV_CHUNK 16
#define CONV_THREADS 128
#define CONV_MAX_K 8

struct conv_units {
    __device__ int operator()(const tdm_conv_seg &s) const
    {
        return (s.nrows + CONV_CHUNK - 1) / CONV_CHUNK;
    }
};

template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_kernel(float *y, const float *x, const float *w, const tdm_conv_seg *segs, int nseg, int C)
{
    cuda_kernel_begin();
    constexpr int S = K - 1;
    int first;
    const int si = cuda_seg_find(segs, nseg, (int)blockIdx.y, conv_units(), &first);
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (si < 0 || c >= C)
        return;
    const tdm_conv_seg sg = segs[si];
    const int ci = (int)blockIdx.y - first, i0 = ci * CONV_CHUNK;
    const int nr = min(CONV_CHUNK, sg.nrows - i0);
    const size_t cs = (size_t)C;
    const float *xc = x + (size_t)sg.row0 * cs + (size_t)c;
    float wv[K], win[K], xs[CONV_CHUNK];
#pragma unroll
    for (int j = 0; j < K; j++)
        wv[j] = w[(size_t)c * K + j];
#pragma unroll
    for (int j = 0; j < S; j++) {
        const int m = i0 - S + j; /* input index relative to the segment */
        win[j] = m < 0 ? sg.state[(size_t)(S + m) * cs + (size_t)c] : xc[(size_t)m * cs];
    }
#pragma unroll
    for (int k = 0; k < CONV_CHUNK; k++)
        xs[k] = k < nr ? xc[(size_t)(i0 + k) * cs] : 0.0f;
#pragma unroll
    for (int k = 0; k < CONV_CHUNK; k++) {
        if (k >= nr)
            break;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < S; j++)
            acc = fmaf(wv[j], win[j], acc);
        acc = fmaf(wv[S], xs[k], acc);
        y[(size_t)(sg.row0 + i0 + k) * cs + (size_t)c] = cuda_silu(acc);
        if constexpr (S > 0) {
#pragma unroll
            for (int j = 0; j + 1 < S; j++)
                win[j] = win[j + 1];
            win[S - 1] = xs[k];
        }
        if (sg.states_out) {
            /* the window after this row: inputs i-S+1 .. i */
            float *so = sg.states_out + (size_t)(i0 + k) * (size_t)S * cs + (size_t)c;
#pragma unroll
            for (int j = 0; j < S; j++)
                so[(size_t)j * cs] = win[j];
        }
    }
    if (!sg.states_out && ci == 0) {
        /* The window after the segment: in registers when chunk 0 is the
         * whole segment, else its last S inputs, all rows of x. */
        const int n = sg.nrows;
#pragma unroll
        for (int j = 0; j < S; j++)
            sg.state[(size_t)j * cs + (size_t)c] =
                n <= CONV_CHUNK ? win[j] : xc[(size_t)(n - S + j) * cs];
    }
}

void cuda_conv_silu(void *ctx, float *y, const float *x, const float *w, const tdm_conv_seg *segs,
                    int nseg, int C, int K)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(K >= 1 && K <= CONV_MAX_K && K - 1 <= CONV_CHUNK);
    int units = 0;
    for (int i = 0; i < nseg; i++)
        units += (segs[i].nrows + CONV_CHUNK - 1) / CONV_CHUNK;
    if (units == 0 || C <= 0)
        return;
    const tdm_conv_seg *d =
        (const tdm_conv_seg *)cuda_stage(c, segs, (size_t)nseg * sizeof(tdm_conv_seg));
    const dim3 grid(cuda_blocks((size_t)C, CONV_THREADS), (unsigned)units);
#define CONV_LAUNCH(N)                                                                             \
    case N:                                                                                        \
        cuda_launch(c, conv_kernel<N>, grid, CONV_THREADS, 0, y, x, w, d, nseg, C);                \
        break
    switch (K) {
        CONV_LAUNCH(1);
        CONV_LAUNCH(2);
        CONV_LAUNCH(3);
        CONV_LAUNCH(4);
        CONV_LAUNCH(5);
        CONV_LAUNCH(6);
        CONV_LAUNCH(7);
        CONV_LAUNCH(8);
    }
#undef CONV_LAUNCH
}

/* ---- gated delta rule --------------------------------------------------- */

#define GDN_WARPS 4

/* Sum over the SL lanes of a value column (lanes col + k * 32/SL). */
template <int SL> __device__ __forceinline__ float gdn_col_sum(float v)
{
#pragma unroll
    for (int o = 32 / SL; o < 32; o <<= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A position's gates from its projections a, b and its v-head's A_log and
 * dt_bias (backend.h gdn_recurrent; the CPU backend's formulas). */
__device__ __forceinline__ void gdn_gate(float a, float b, float A_log, float dt_bias, float *g,
                                         float *beta)
{
    const float u = a + dt_bias;
    /* torch softplus(beta=1, threshold=20) */
    const float sp = u > 20.0f ? u : log1pf(expf(u));
    *g = -expf(A_log) * sp;
    *beta = cuda_sigmoid(b);
}

/* Sums over a thread's P rows (P % 4 == 0) in four interleaved chains,
 * (c0 + c1) + (c2 + c3): a quarter of one chain's latency. */
struct gdn_sum4 {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    __device__ __forceinline__ void add(int t, float a, float b)
    {
        c[t & 3] = fmaf(a, b, c[t & 3]);
    }
    __device__ __forceinline__ float total() const
    {
        return __fadd_rn(__fadd_rn(c[0], c[1]), __fadd_rn(c[2], c[3]));
    }
};

/* One position of the delta rule on a thread's state rows S, k as read,
 * ik = |k|⁻¹ as the row computed it (a record keeps it): S *= decay;
 * kv = (Sᵀk)·ik; S += k ((v - kv)·beta·ik). A step's rows and a record's
 * rows both come here; every product and difference is an explicit
 * rounding (fmaf, __fmul_rn, __fsub_rn), never left to the compiler's
 * contraction, so a replay gives the bits of the rows it replays (the GPU
 * tests compare replay with extra_buffer). */
template <int P, int SL>
__device__ __forceinline__ void gdn_advance(float (&S)[P], const float (&k)[P], float ik, float v,
                                            float decay, float beta)
{
    gdn_sum4 kv4;
#pragma unroll
    for (int t = 0; t < P; t++) {
        S[t] = __fmul_rn(S[t], decay);
        kv4.add(t, S[t], k[t]);
    }
    const float kv = __fmul_rn(gdn_col_sum<SL>(kv4.total()), ik);
    const float kd = __fmul_rn(__fmul_rn(__fsub_rn(v, kv), beta), ik); /* delta, times |k|⁻¹ */
#pragma unroll
    for (int t = 0; t < P; t++)
        S[t] = fmaf(k[t], kd, S[t]);
}

/* A staged row in shared memory (gdn_kernel): k [PS], v at the block's
 * columns [cols], four scalars, then for a step's rows q [PS]; PS = P·SL
 * >= Dk, zero past Dk. The scalars: a step's row is staged with its gate
 * projections a, b in slots 2, 3 and gets 1/|q|, 1/|k|, decay, beta from
 * the rows' prologue; a record's row is staged with 1/|k|, decay, beta in
 * slots 1, 2, 3. */
static __host__ __device__ inline int gdn_row_floats(int PS, int cols, bool step)
{
    return PS + cols + 4 + (step ? PS : 0);
}

__device__ __forceinline__ void gdn_cp4(float *dst, const float *src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}

/* n floats from src to dst by the block, 4 bytes at a time, zeros from
 * element `valid` to `n` (rows whose alignment rules out gdn_unit's 16-byte
 * copies). */
__device__ __forceinline__ void gdn_stage(float *dst, const float *src, int valid, int n)
{
    for (int j = (int)threadIdx.x; j < n; j += (int)blockDim.x) {
        if (j < valid)
            gdn_cp4(dst + j, src + j);
        else
            dst[j] = 0.0f;
    }
}

/* The rows of a chunk staged at once (16-byte aligned rows): each thread
 * takes a fixed part of a row (a unit: a 16-byte chunk, or a 4-byte
 * scalar) and copies it for every row of the chunk, its source and
 * destination moving by a row's strides, so the addresses are made once a
 * chunk rather than once a row. A 16-byte unit past the valid data fills
 * zeros (cp.async's source size 0, from the row's first valid address). */
struct gdn_unit {
    const float *src; /* row 0's */
    size_t ss;        /* floats from a row's source to the next one's */
    int dst;          /* floats into a row's shared-memory image */
    int bytes;        /* 16, 0 (16 zeros) or 4 */
};

__device__ __forceinline__ void gdn_unit_copy(const gdn_unit &u, float *sm, int drow, int nr)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(sm + u.dst);
    const float *s = u.src;
    if (u.bytes == 4) {
        for (int j = 0; j < nr; j++, d += 4u * (unsigned)drow, s += u.ss)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(s) : "memory");
    } else {
        for (int j = 0; j < nr; j++, d += 4u * (unsigned)drow, s += u.ss)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(s),
                         "r"(u.bytes)
                         : "memory");
    }
}

/* Unit u of a row's part at src (16-byte chunks, `valid` floats of it
 * real), into its image at dst. */
__device__ __forceinline__ gdn_unit gdn_chunk_unit(int u, const float *src, size_t ss, int dst,
                                                   int valid)
{
    const int m = 4 * u;
    return gdn_unit{m < valid ? src + m : src, ss, dst + m, m < valid ? 16 : 0};
}

/* *s += the squares of v's four values, in order. */
__device__ __forceinline__ void gdn_sq4(float *s, float4 v)
{
    *s = fmaf(v.x, v.x, *s), *s = fmaf(v.y, v.y, *s);
    *s = fmaf(v.z, v.z, *s), *s = fmaf(v.w, v.w, *s);
}

__device__ __forceinline__ void gdn_stage_wait(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
}

/* P: state rows per thread; SL: lanes per value column (P * SL >= Dk).
 * A segment with a record first advances the state by its record rows
 * 0 .. replayed-1 (no output), then runs its rows from qkv, writing each
 * one's inputs into the record. The state goes back in place when the
 * segment has neither states_out nor a record. MODE: GDN_PLAIN (no
 * segment of the launch has a record), GDN_RECORD, or GDN_COMMIT
 * (gdn_replay): only the record's rows, then the state back in place; an
 * instance of its own with few registers, so that 5 blocks share a
 * multiprocessor (its launch has a block per column tile, head, layer and
 * sequence: 3072 blocks for a 4B sequence, in fewer waves than at 4 a
 * multiprocessor: NOTES.md). Rows go through shared memory in chunks of rc
 * (gdn_row_floats floats each): the block copies a chunk in (cp.async, a
 * thread a unit of every row: gdn_unit), the warps make a step's rows'
 * norms and gates in parallel, and the chain of positions then reads only
 * shared memory and registers. */
enum { GDN_PLAIN, GDN_RECORD, GDN_COMMIT };

/* Positions per iteration of the chain: one position's output sum overlaps
 * the next one's state update. */
static constexpr int gdn_unroll = 2;

template <int P, int SL, int MODE>
__global__ void __launch_bounds__(GDN_WARPS * 32, MODE == GDN_COMMIT ? 5 : 1)
    gdn_kernel(float *out, const float *qkv, int stride, const tdm_gdn_gates gt,
               const tdm_gdn_seg *segs, int Hk, int Hv, int Dk, int Dv, int vec, int width, int rc)
{
    extern __shared__ float4 gdn_smem4[];
    float *sm = (float *)gdn_smem4;
    constexpr int CPW = 32 / SL, PS = P * SL, COLS = GDN_WARPS * CPW;
    constexpr int KC = PS / 4, VC = COLS / 4; /* 16-byte chunks of k (or q), of v */
    constexpr bool COMMIT = MODE == GDN_COMMIT, REC = MODE != GDN_PLAIN;
    const tdm_gdn_seg sg = segs[blockIdx.z]; /* staged before the launch */
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int col = lane % CPW, d0 = (lane / CPW) * P, bc = warp * CPW + col;
    const int hv = (int)blockIdx.y, hk = hv / (Hv / Hk);
    const int e0 = (int)blockIdx.x * COLS, e = e0 + bc;
    const size_t hs = (size_t)Dk * (size_t)Dv, dv = (size_t)Dv;
    cuda_kernel_begin();
    const bool live = e < Dv, whole = live && d0 + P <= Dk;
    const size_t kd = (size_t)Hk * (size_t)Dk, vd = (size_t)Hv * (size_t)Dv;
    const int nrep = REC && sg.inputs ? sg.replayed : 0; /* record rows first */
    const int nstep = COMMIT ? 0 : sg.nrows;
    if (nrep + nstep == 0)
        return; /* the whole block: no barrier below is reached */
    float S[P];
    float *const stp = sg.state + (size_t)hv * hs + (size_t)d0 * dv + (size_t)e;
    if (whole) {
#pragma unroll
        for (int t = 0; t < P; t++)
            S[t] = stp[(size_t)t * dv];
    } else {
#pragma unroll
        for (int t = 0; t < P; t++)
            S[t] = live && d0 + t < Dk ? stp[(size_t)t * dv] : 0.0f;
    }

    /* the record's rows: k, v, then 1/|k|, decay, beta in slots 1..3 */
    const int rrow = gdn_row_floats(PS, COLS, false);
    const int vr = Dk % 4 == 0 && Dv % 4 == 0 && ((uintptr_t)sg.inputs & 15) == 0;
    for (int c0 = 0; c0 < nrep; c0 += rc) {
        const int nr = min(rc, nrep - c0);
        if (c0 > 0)
            __syncthreads(); /* the chunk before is read */
        if (vr) {
            /* units: k's chunks, v's, then 1/|k|, decay, beta */
            const float *r = sg.inputs + (size_t)c0 * (size_t)width;
            const size_t sw = (size_t)width, sc = kd + vd; /* the scalars */
            for (int u = tid; u < KC + VC + 3; u += GDN_WARPS * 32) {
                const int x = u - KC - VC;
                const gdn_unit un =
                    u < KC  ? gdn_chunk_unit(u, r + (size_t)hk * (size_t)Dk, sw, 0, Dk)
                    : x < 0 ? gdn_chunk_unit(u - KC, r + kd + (size_t)hv * dv + (size_t)e0, sw, PS,
                                             Dv - e0)
                            : gdn_unit{r + sc +
                                           (x == 0   ? 2 * (size_t)Hv + (size_t)hk
                                            : x == 1 ? (size_t)hv
                                                     : (size_t)Hv + (size_t)hv),
                                       sw, PS + COLS + 1 + x, 4};
                gdn_unit_copy(un, sm, rrow, nr);
            }
        } else {
            for (int j = 0; j < nr; j++) {
                const float *r = sg.inputs + (size_t)(c0 + j) * (size_t)width;
                float *w = sm + (size_t)j * rrow;
                gdn_stage(w, r + (size_t)hk * (size_t)Dk, Dk, PS);
                gdn_stage(w + PS, r + kd + (size_t)hv * dv + (size_t)e0, Dv - e0, COLS);
                if (tid == 0) {
                    gdn_cp4(w + PS + COLS + 1, r + kd + vd + 2 * (size_t)Hv + (size_t)hk);
                    gdn_cp4(w + PS + COLS + 2, r + kd + vd + (size_t)hv);
                    gdn_cp4(w + PS + COLS + 3, r + kd + vd + (size_t)Hv + (size_t)hv);
                }
            }
        }
        gdn_stage_wait();
#pragma unroll gdn_unroll
        for (int j = 0; j < nr; j++) {
            const float *w = sm + (size_t)j * rrow;
            float k[P];
#pragma unroll
            for (int t = 0; t < P; t += 4)
                *(float4 *)(k + t) = *(const float4 *)(w + d0 + t);
            const float4 sc = *(const float4 *)(w + PS + COLS);
            gdn_advance<P, SL>(S, k, sc.y, w[PS + bc], sc.z, sc.w);
        }
    }

    if constexpr (!COMMIT) {
        const float scale = 1.0f / sqrtf((float)Dk);
        const float A_log = gt.A_log[hv], dt_bias = gt.dt_bias[hv];
        const int srow = gdn_row_floats(PS, COLS, true), so = PS + COLS; /* scalars */
        for (int c0 = 0; c0 < nstep; c0 += rc) {
            const int nr = min(rc, nstep - c0);
            if (c0 > 0 || nrep > 0)
                __syncthreads(); /* the chunk before is read */
            if (vec) {
                /* units: k's chunks, v's, q's, then a and b */
                const size_t row = (size_t)(sg.row0 + c0), ss = (size_t)stride;
                const float *x = qkv + row * ss, *xk = x + (size_t)hk * (size_t)Dk;
                for (int u = tid; u < 2 * KC + VC + 2; u += GDN_WARPS * 32) {
                    const int y = u - 2 * KC - VC;
                    const gdn_unit un =
                        u < KC ? gdn_chunk_unit(u, xk + kd, ss, 0, Dk)
                        : u < KC + VC
                            ? gdn_chunk_unit(u - KC, x + 2 * kd + (size_t)hv * dv + (size_t)e0, ss,
                                             PS, Dv - e0)
                        : y < 0 ? gdn_chunk_unit(u - KC - VC, xk, ss, so + 4, Dk)
                                : gdn_unit{(y == 0 ? gt.a : gt.b) + row * (size_t)Hv + (size_t)hv,
                                           (size_t)Hv, so + 2 + y, 4};
                    gdn_unit_copy(un, sm, srow, nr);
                }
            } else {
                for (int j = 0; j < nr; j++) {
                    const size_t row = (size_t)(sg.row0 + c0 + j);
                    const float *x = qkv + row * (size_t)stride;
                    float *w = sm + (size_t)j * srow;
                    gdn_stage(w, x + kd + (size_t)hk * (size_t)Dk, Dk, PS);
                    gdn_stage(w + PS, x + 2 * kd + (size_t)hv * dv + (size_t)e0, Dv - e0, COLS);
                    gdn_stage(w + so + 4, x + (size_t)hk * (size_t)Dk, Dk, PS);
                    if (tid == 0) {
                        gdn_cp4(w + so + 2, gt.a + row * (size_t)Hv + (size_t)hv);
                        gdn_cp4(w + so + 3, gt.b + row * (size_t)Hv + (size_t)hv);
                    }
                }
            }
            gdn_stage_wait();
            /* The rows' norms and gates. Warp w takes rows w, w + 4, ...,
             * two at a time: lane l sums the squares of elements 4l .. 4l+3
             * of every 128, then a butterfly over the warp, while the lanes
             * make both rows' gates; lane i keeps the sums and gates of the
             * warp's row i. Then the lanes make their rows' 1/|q|, 1/|k|
             * side by side. */
            float mq = 0.0f, mk = 0.0f, md = 0.0f, mb = 0.0f;
            for (int j = warp, i = 0; j < nr; j += 2 * GDN_WARPS, i += 2) {
                const int j2 = min(j + GDN_WARPS, nr - 1); /* a second row, or nr - 1: unused */
                const float *w = sm + (size_t)j * srow, *w2 = sm + (size_t)j2 * srow;
                float sq = 0.0f, sk = 0.0f, sq2 = 0.0f, sk2 = 0.0f;
                for (int m = lane * 4; m < PS; m += 128) {
                    gdn_sq4(&sq, *(const float4 *)(w + so + 4 + m));
                    gdn_sq4(&sk, *(const float4 *)(w + m));
                    gdn_sq4(&sq2, *(const float4 *)(w2 + so + 4 + m));
                    gdn_sq4(&sk2, *(const float4 *)(w2 + m));
                }
                float g, beta, g2, beta2;
                gdn_gate(w[so + 2], w[so + 3], A_log, dt_bias, &g, &beta);
                gdn_gate(w2[so + 2], w2[so + 3], A_log, dt_bias, &g2, &beta2);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    sq += __shfl_xor_sync(0xffffffffu, sq, o);
                    sk += __shfl_xor_sync(0xffffffffu, sk, o);
                    sq2 += __shfl_xor_sync(0xffffffffu, sq2, o);
                    sk2 += __shfl_xor_sync(0xffffffffu, sk2, o);
                }
                const float d = expf(g), d2 = expf(g2);
                if (lane == i)
                    mq = sq, mk = sk, md = d, mb = beta;
                if (lane == i + 1)
                    mq = sq2, mk = sk2, md = d2, mb = beta2;
            }
            __syncwarp(); /* the rows' a, b are read: their slots take the scalars */
            if (warp + lane * GDN_WARPS < nr)
                *(float4 *)(sm + (size_t)(warp + lane * GDN_WARPS) * srow + so) =
                    make_float4(1.0f / sqrtf(mq + 1e-6f), 1.0f / sqrtf(mk + 1e-6f), md, mb);
            __syncthreads();
            if (REC && sg.inputs && vr) {
                /* the chunk into the record: k and 1/|k| by the first
                 * column tile of the first v-head of its k-head, v by every
                 * block for its columns, decay and beta by the first tile;
                 * a thread a unit, as staged */
                const bool kb = blockIdx.x == 0 && hv % (Hv / Hk) == 0;
                float *r = sg.inputs + (size_t)(sg.replayed + c0) * (size_t)width;
                const size_t sw = (size_t)width;
                for (int u = tid; u < KC + VC + 3; u += GDN_WARPS * 32) {
                    const int m = u < KC ? 4 * u : 4 * (u - KC), x = u - KC - VC;
                    if (x < 0) {
                        const bool on = u < KC ? kb && m < Dk : e0 + m < Dv;
                        float *d = r + (u < KC ? (size_t)hk * (size_t)Dk + (size_t)m
                                               : kd + (size_t)hv * dv + (size_t)(e0 + m));
                        const float *s = sm + (u < KC ? m : PS + m);
                        for (int j = 0; on && j < nr; j++, d += sw, s += srow)
                            *(float4 *)d = *(const float4 *)s;
                    } else if (x == 0 ? kb : blockIdx.x == 0) {
                        float *d = r + kd + vd +
                                   (x == 0   ? 2 * (size_t)Hv + (size_t)hk
                                    : x == 1 ? (size_t)hv
                                             : (size_t)Hv + (size_t)hv);
                        const float *s = sm + so + 1 + x;
                        for (int j = 0; j < nr; j++, d += sw, s += srow)
                            *d = *s;
                    }
                }
            } else if (REC && sg.inputs) {
                const bool kb = blockIdx.x == 0 && hv % (Hv / Hk) == 0;
                for (int j = 0; j < nr; j++) {
                    const float *w = sm + (size_t)j * srow;
                    float *r = sg.inputs + (size_t)(sg.replayed + c0 + j) * (size_t)width;
                    if (kb)
                        for (int m = tid; m < Dk; m += GDN_WARPS * 32)
                            r[(size_t)hk * (size_t)Dk + (size_t)m] = w[m];
                    if (tid < COLS && e0 + tid < Dv)
                        r[kd + (size_t)hv * dv + (size_t)(e0 + tid)] = w[PS + tid];
                    if (tid == 0 && kb)
                        r[kd + vd + 2 * (size_t)Hv + (size_t)hk] = w[so + 1];
                    if (tid == 0 && blockIdx.x == 0) {
                        r[kd + vd + (size_t)hv] = w[so + 2];
                        r[kd + vd + (size_t)Hv + (size_t)hv] = w[so + 3];
                    }
                }
            }
#pragma unroll gdn_unroll
            for (int j = 0; j < nr; j++) {
                const float *w = sm + (size_t)j * srow;
                const int i = c0 + j;
                float k[P], q[P];
#pragma unroll
                for (int t = 0; t < P; t += 4) {
                    *(float4 *)(k + t) = *(const float4 *)(w + d0 + t);
                    *(float4 *)(q + t) = *(const float4 *)(w + so + 4 + d0 + t);
                }
                const float4 sc = *(const float4 *)(w + so);
                gdn_advance<P, SL>(S, k, sc.y, w[PS + bc], sc.z, sc.w);
                gdn_sum4 o4;
#pragma unroll
                for (int t = 0; t < P; t++)
                    o4.add(t, S[t], q[t]);
                const float o = gdn_col_sum<SL>(o4.total()) * (sc.x * scale);
                if (live && d0 == 0)
                    out[((size_t)(sg.row0 + i) * (size_t)Hv + (size_t)hv) * dv + (size_t)e] = o;
                if (sg.states_out && live) {
                    float *sp = sg.states_out + ((size_t)i * (size_t)Hv + (size_t)hv) * hs +
                                (size_t)d0 * dv + (size_t)e;
                    if (whole) {
#pragma unroll
                        for (int t = 0; t < P; t++)
                            sp[(size_t)t * dv] = S[t];
                    } else {
#pragma unroll
                        for (int t = 0; t < P; t++)
                            if (d0 + t < Dk)
                                sp[(size_t)t * dv] = S[t];
                    }
                }
            }
        }
    }
    const bool back = COMMIT || (!sg.states_out && !sg.inputs);
    if (back) {
        if (whole) {
#pragma unroll
            for (int t = 0; t < P; t++)
                stp[(size_t)t * dv] = S[t];
        } else if (live) {
#pragma unroll
            for (int t = 0; t < P; t++)
                if (d0 + t < Dk)
                    stp[(size_t)t * dv] = S[t];
        }
    }
}

/* The launch for Dk: P and SL from Dk alone (32 state rows a thread and SL
 * the power of two that covers Dk; small heads take 8 or 16 rows a thread),
 * so a position computes the same bits in every call. Rows are staged in
 * chunks of up to 32 that fit in 48 KB. */
template <int MODE>
static void gdn_launch(cuda_ctx *c, float *out, const float *qkv, int qkv_stride, tdm_gdn_gates gt,
                       const tdm_gdn_seg *d, int nseg, int maxrows, int Hk, int Hv, int Dk, int Dv,
                       int vec)
{
    int p = Dk <= 8 ? 8 : Dk <= 32 ? 16 : 32, sl = 1;
    while (p * sl < Dk)
        sl *= 2;
    const int cols = GDN_WARPS * 32 / sl;
    const int rowf = gdn_row_floats(p * sl, cols, MODE != GDN_COMMIT);
    int rc = 48 * 1024 / (rowf * (int)sizeof(float));
    rc = rc > 32 ? 32 : rc < 1 ? 1 : rc;
    rc = rc > maxrows ? maxrows : rc;
    const size_t smem = (size_t)rc * (size_t)rowf * sizeof(float);
    const dim3 grid((unsigned)((Dv + cols - 1) / cols), (unsigned)Hv, (unsigned)nseg);
#define GDN_LAUNCH(P, SL)                                                                          \
    cuda_launch(c, gdn_kernel<P, SL, MODE>, grid, GDN_WARPS * 32, smem, out, qkv, qkv_stride, gt,  \
                d, Hk, Hv, Dk, Dv, vec, (int)tdm_gdn_input_floats(Hk, Hv, Dk, Dv), rc)
    if (p == 8)
        GDN_LAUNCH(8, 1);
    else if (p == 16 && sl == 1)
        GDN_LAUNCH(16, 1);
    else if (p == 16)
        GDN_LAUNCH(16, 2);
    else if (sl == 2)
        GDN_LAUNCH(32, 2);
    else if (sl == 4)
        GDN_LAUNCH(32, 4);
    else if (sl == 8)
        GDN_LAUNCH(32, 8);
    else if (sl == 16)
        GDN_LAUNCH(32, 16);
    else
        GDN_LAUNCH(32, 32);
#undef GDN_LAUNCH
}

void cuda_gdn_recurrent(void *ctx, float *out, const float *qkv, int qkv_stride, tdm_gdn_gates gt,
                        const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk, int Dv)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(Hk > 0 && Hv % Hk == 0 && Dk > 0 && Dk <= 1024 && Dv > 0);
    if (nseg <= 0 || Hv <= 0)
        return;
    const tdm_gdn_seg *d =
        (const tdm_gdn_seg *)cuda_stage(c, segs, (size_t)nseg * sizeof(tdm_gdn_seg));
    const int vec = Dk % 4 == 0 && Dv % 4 == 0 && qkv_stride % 4 == 0 && (uintptr_t)qkv % 16 == 0;
    /* the chunk from the rows alone: a record's row count is staged
     * (it changes between replays of a graph), a launch's shape is not */
    int rec = 0, maxrows = 1;
    for (int i = 0; i < nseg; i++) {
        rec |= segs[i].inputs != NULL;
        maxrows = segs[i].nrows > maxrows ? segs[i].nrows : maxrows;
    }
    if (rec)
        gdn_launch<GDN_RECORD>(c, out, qkv, qkv_stride, gt, d, nseg, maxrows, Hk, Hv, Dk, Dv, vec);
    else
        gdn_launch<GDN_PLAIN>(c, out, qkv, qkv_stride, gt, d, nseg, maxrows, Hk, Hv, Dk, Dv, vec);
}

void cuda_gdn_replay(void *ctx, const tdm_gdn_seg *segs, int nseg, int Hk, int Hv, int Dk, int Dv)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(Hk > 0 && Hv % Hk == 0 && Dk > 0 && Dk <= 1024 && Dv > 0);
    if (nseg <= 0 || Hv <= 0)
        return;
    /* each segment: its record's nrows rows replayed, nothing from a step */
    tdm_gdn_seg *r = (tdm_gdn_seg *)malloc((size_t)nseg * sizeof(tdm_gdn_seg));
    TDM_ASSERT(r != NULL);
    int maxrows = 1;
    for (int i = 0; i < nseg; i++) {
        r[i] = tdm_gdn_seg{0, 0, segs[i].state, NULL, segs[i].inputs, segs[i].nrows};
        maxrows = segs[i].nrows > maxrows ? segs[i].nrows : maxrows;
    }
    const tdm_gdn_seg *d =
        (const tdm_gdn_seg *)cuda_stage(c, r, (size_t)nseg * sizeof(tdm_gdn_seg));
    free(r);
    /* no step rows: vec (their alignment) is unused; the kernel checks the record's */
    gdn_launch<GDN_COMMIT>(c, NULL, NULL, 0, tdm_gdn_gates{}, d, nseg, maxrows, Hk, Hv, Dk, Dv, 0);
}
