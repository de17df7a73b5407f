/*
 * gdn.cu - causal conv + SiLU with per-sequence window state, and the
 * recurrent gated delta rule, per segment of rows. Both stage the caller's
 * segment array as it is (seglist.cuh).
 *
 * Conv: one kernel. A thread owns one channel of a chunk of up to
 * CONV_CHUNK rows of a segment: it loads the K weights, the K-1 inputs
 * before the chunk (from the state or from x) and the chunk's inputs, then
 * walks the rows with the window in registers, writing y and, when asked,
 * the window after every row. Chunks only spread long segments over more
 * threads: every output is the same K-term sum whatever the chunking. The
 * in-place window update is done by the thread of chunk 0, the only one
 * that reads the old window (chunks start CONV_CHUNK >= K-1 rows apart), so
 * no other thread can see it half written.
 *
 * Delta rule: one block of GDN_WARPS warps per (value-column tile, v-head,
 * segment). SL lanes share a value column e: lane (slice s, column) keeps
 * the state rows d = s*P .. s*P+P-1 of column e in registers for the whole
 * segment, and reads the same slice of q and k. Per position, with q and k
 * taken as they are and their norms folded into scalars:
 *   S *= exp(g);  kv = (Sᵀk)·|k|⁻¹;  delta = (v - kv)·beta;
 *   S += k (delta·|k|⁻¹);  o = (Sᵀq)·|q|⁻¹·Dk^-0.5
 * (|x|⁻¹ = 1/sqrt(Σx² + 1e-6)); algebraically the reference with q and k
 * l2-normalised first. Every sum over d is per thread over its slice in
 * four interleaved chains (rows t % 4; a 9-row verify call 16.0 -> 15.1 us
 * against one chain in order), then a butterfly over the SL lanes of the
 * column: no shared memory and no barrier. P and SL follow from Dk alone,
 * so a position computes the same bits in a prefill, a verify block or a
 * decode step, in any batch. The gates come from the projections a and b
 * inside the kernel (no separate gates kernel on the critical path; prompt
 * chunks taking the chunked form get them as arrays from gdn_gates_kernel,
 * the same bits). The next position's q, k, v, a and b are loaded while
 * the current one is computed.
 *
 * Replay (the replay strategy): a verify leaves the state as it is and
 * writes each position's k, v, decay, beta and 1/|k| into the sequence's
 * record (25 KB a position and layer at the 4B shape, against its 2 MB
 * state); rows appended to a pending verify first replay the record's rows.
 * The commit (cuda_gdn_replay) is the kernel's GDN_COMMIT instance, with no
 * rows of its own: all linear layers of a sequence in one launch, each
 * state read once, advanced by the accepted positions and written once.
 */
#include "gdn.cuh"
#include "gdn_chunk.cuh"
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

/* g, beta [R, Hv] for the chunked form (gdn_chunk.cu takes them as arrays). */
__global__ void gdn_gates_kernel(float *g, float *beta, const tdm_gdn_gates gt, int R, int Hv)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * (size_t)Hv)
        return;
    const int h = (int)(i % (size_t)Hv);
    gdn_gate(gt.a[i], gt.b[i], gt.A_log[h], gt.dt_bias[h], &g[i], &beta[i]);
}

/* One position's inputs for a thread: its slices of q and k (0 past Dk),
 * v at its column (0 past Dv), the gate projections a and b of its
 * v-head. */
template <int P> struct gdn_in {
    float q[P], k[P], v, ga, gb;
};

/* P floats from p (zero from element `valid` on); 16-byte loads when vec. */
template <int P>
__device__ __forceinline__ void gdn_slice(float *dst, const float *p, int valid, int vec)
{
    if (vec) { /* valid % 4 == 0 and p aligned: a float4 is all in or all out */
#pragma unroll
        for (int t = 0; t < P; t += 4) {
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t < valid)
                a = *(const float4 *)(p + t);
            dst[t] = a.x, dst[t + 1] = a.y, dst[t + 2] = a.z, dst[t + 3] = a.w;
        }
    } else {
#pragma unroll
        for (int t = 0; t < P; t++)
            dst[t] = t < valid ? p[t] : 0.0f;
    }
}

template <int P>
__device__ __forceinline__ void gdn_load(gdn_in<P> &in, const float *qkv, size_t row, int stride,
                                         const tdm_gdn_gates &gt, int hk, int hv, int Hk, int Hv,
                                         int Dk, int Dv, int d0, int e, bool live, int vec)
{
    const float *base = qkv + row * (size_t)stride;
    const float *q = base + (size_t)hk * (size_t)Dk + d0, *k = q + (size_t)Hk * (size_t)Dk;
    gdn_slice<P>(in.q, q, Dk - d0, vec);
    gdn_slice<P>(in.k, k, Dk - d0, vec);
    in.v = live ? base[2 * (size_t)Hk * (size_t)Dk + (size_t)hv * (size_t)Dv + (size_t)e] : 0.0f;
    in.ga = gt.a[row * (size_t)Hv + (size_t)hv];
    in.gb = gt.b[row * (size_t)Hv + (size_t)hv];
}

/* A thread's part of row i of a record (tdm_gdn_input_floats floats a row:
 * k, v, decay, beta, 1/|k|). */
template <int P> struct gdn_rec {
    float k[P], v, decay, beta, ik;
};

template <int P>
__device__ __forceinline__ void gdn_load_rec(gdn_rec<P> &in, const float *rec, int i, int width,
                                             int hk, int hv, int Hk, int Hv, int Dk, int Dv, int d0,
                                             int e, bool live)
{
    const float *r = rec + (size_t)i * (size_t)width;
    const size_t kd = (size_t)Hk * (size_t)Dk, vd = (size_t)Hv * (size_t)Dv;
    gdn_slice<P>(in.k, r + (size_t)hk * (size_t)Dk + d0, Dk - d0, Dk % 4 == 0);
    in.v = live ? r[kd + (size_t)hv * (size_t)Dv + (size_t)e] : 0.0f;
    in.decay = r[kd + vd + (size_t)hv];
    in.beta = r[kd + vd + (size_t)Hv + (size_t)hv];
    in.ik = r[kd + vd + 2 * (size_t)Hv + (size_t)hk];
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
 * kv = (Sᵀk)·ik; S += k ((v - kv)·beta·ik). A record's rows come here; a
 * step's rows compute the same values inline (gdn_kernel). Every product
 * and difference in both is an explicit rounding (fmaf, __fmul_rn,
 * __fsub_rn), never left to the compiler's contraction, so the two give
 * the same bits (the GPU tests compare replay with extra_buffer). */
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

/* P: state rows per thread; SL: lanes per value column (P * SL >= Dk).
 * A segment with a record first advances the state by its record rows
 * 0 .. replayed-1 (no output), then runs its rows from qkv, writing each
 * one's inputs into the record. The state goes back in place when the
 * segment has neither states_out nor a record. MODE: GDN_PLAIN (no
 * segment of the launch has a record: an instance without the record's
 * code, whose row loop keeps the registers and schedule it had before
 * records existed), GDN_RECORD, or GDN_COMMIT (gdn_replay): only
 * the record's rows, then the state back in place; an instance of its own
 * with few registers, so that 4 blocks share a multiprocessor (its launch
 * has a block per column tile, head, layer and sequence). */
enum { GDN_PLAIN, GDN_RECORD, GDN_COMMIT };

template <int P, int SL, int MODE>
__global__ void __launch_bounds__(GDN_WARPS * 32, MODE == GDN_COMMIT ? 4 : 1)
    gdn_kernel(float *out, const float *qkv, int stride, const tdm_gdn_gates gt,
               const tdm_gdn_seg *segs, int Hk, int Hv, int Dk, int Dv, int vec, int width)
{
    cuda_kernel_begin();
    constexpr int CPW = 32 / SL; /* value columns per warp */
    const tdm_gdn_seg sg = segs[blockIdx.z];
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int col = lane % CPW, d0 = (lane / CPW) * P;
    const int hv = (int)blockIdx.y, hk = hv / (Hv / Hk);
    const int e = ((int)blockIdx.x * GDN_WARPS + warp) * CPW + col;
    const bool live = e < Dv;
    const size_t hs = (size_t)Dk * (size_t)Dv, dv = (size_t)Dv;
    constexpr bool COMMIT = MODE == GDN_COMMIT, REC = MODE != GDN_PLAIN;
    const int nrep = REC && sg.inputs ? sg.replayed : 0; /* record rows first */
    float S[P];
    {
        const float *st = sg.state + (size_t)hv * hs + (size_t)e;
#pragma unroll
        for (int t = 0; t < P; t++)
            S[t] = live && d0 + t < Dk ? st[(size_t)(d0 + t) * dv] : 0.0f;
    }
    if (REC && nrep > 0) {
        gdn_rec<P> rc, rn;
        gdn_load_rec(rc, sg.inputs, 0, width, hk, hv, Hk, Hv, Dk, Dv, d0, e, live);
        for (int i = 0; i < nrep; i++) {
            if (i + 1 < nrep)
                gdn_load_rec(rn, sg.inputs, i + 1, width, hk, hv, Hk, Hv, Dk, Dv, d0, e, live);
            gdn_advance<P, SL>(S, rc.k, rc.ik, rc.v, rc.decay, rc.beta);
            if (i + 1 < nrep)
                rc = rn;
        }
    }
    if constexpr (!COMMIT) {
        const size_t kd = (size_t)Hk * (size_t)Dk, vd = (size_t)Hv * (size_t)Dv;
        const float scale = 1.0f / sqrtf((float)Dk);
        const float A_log = sg.nrows > 0 ? gt.A_log[hv] : 0.0f;
        const float dt_bias = sg.nrows > 0 ? gt.dt_bias[hv] : 0.0f;
        gdn_in<P> cur, nxt;
        if (sg.nrows > 0)
            gdn_load(cur, qkv, (size_t)sg.row0, stride, gt, hk, hv, Hk, Hv, Dk, Dv, d0, e, live,
                     vec);
        for (int i = 0; i < sg.nrows; i++) {
            const size_t row = (size_t)(sg.row0 + i);
            if (i + 1 < sg.nrows)
                gdn_load(nxt, qkv, row + 1, stride, gt, hk, hv, Hk, Hv, Dk, Dv, d0, e, live, vec);
            /* gdn_advance's arithmetic written out, the output's sum in the
             * state's update loop: the same roundings, so the same values
             * (the GPU tests hold replay to extra_buffer bit for bit). This
             * is the measured form; gdn_advance plus a separate output loop
             * measured the same in the kernel before the instances were
             * split (20.8 against 21.0 us a 9-row call), not since. */
            gdn_sum4 sq, sk;
#pragma unroll
            for (int t = 0; t < P; t++) {
                sq.add(t, cur.q[t], cur.q[t]);
                sk.add(t, cur.k[t], cur.k[t]);
            }
            const float iq = 1.0f / sqrtf(gdn_col_sum<SL>(sq.total()) + 1e-6f);
            const float ik = 1.0f / sqrtf(gdn_col_sum<SL>(sk.total()) + 1e-6f);
            float g, beta;
            gdn_gate(cur.ga, cur.gb, A_log, dt_bias, &g, &beta);
            const float decay = expf(g);
            gdn_sum4 kv4;
#pragma unroll
            for (int t = 0; t < P; t++) {
                S[t] = __fmul_rn(S[t], decay);
                kv4.add(t, S[t], cur.k[t]);
            }
            const float kv = __fmul_rn(gdn_col_sum<SL>(kv4.total()), ik);
            const float dl = __fmul_rn(__fmul_rn(__fsub_rn(cur.v, kv), beta), ik);
            gdn_sum4 o4;
#pragma unroll
            for (int t = 0; t < P; t++) {
                S[t] = fmaf(cur.k[t], dl, S[t]);
                o4.add(t, S[t], cur.q[t]);
            }
            const float o = gdn_col_sum<SL>(o4.total()) * (iq * scale);
            if (live && d0 == 0)
                out[(row * (size_t)Hv + (size_t)hv) * dv + (size_t)e] = o;
            if (sg.states_out && live) {
                float *so = sg.states_out + ((size_t)i * (size_t)Hv + (size_t)hv) * hs + (size_t)e;
#pragma unroll
                for (int t = 0; t < P; t++)
                    if (d0 + t < Dk)
                        so[(size_t)(d0 + t) * dv] = S[t];
            }
            if (REC && sg.inputs) {
                /* this row into the record: k and 1/|k| by one column of
                 * the first v-head of its k-head, v by the first slice, the
                 * gates by one thread */
                float *r = sg.inputs + (size_t)(sg.replayed + i) * (size_t)width;
                if (blockIdx.x == 0 && warp == 0 && col == 0 && hv % (Hv / Hk) == 0) {
#pragma unroll
                    for (int t = 0; t < P; t++)
                        if (d0 + t < Dk)
                            r[(size_t)hk * (size_t)Dk + (size_t)(d0 + t)] = cur.k[t];
                    if (d0 == 0)
                        r[kd + vd + 2 * (size_t)Hv + (size_t)hk] = ik;
                }
                if (live && d0 == 0)
                    r[kd + (size_t)hv * dv + (size_t)e] = cur.v;
                if (blockIdx.x == 0 && threadIdx.x == 0) {
                    r[kd + vd + (size_t)hv] = decay;
                    r[kd + vd + (size_t)Hv + (size_t)hv] = beta;
                }
            }
            if (i + 1 < sg.nrows)
                cur = nxt;
        }
    }
    const bool back = COMMIT || (!sg.states_out && !sg.inputs);
    if (back && live && sg.nrows + nrep > 0) {
        float *st = sg.state + (size_t)hv * hs + (size_t)e;
#pragma unroll
        for (int t = 0; t < P; t++)
            if (d0 + t < Dk)
                st[(size_t)(d0 + t) * dv] = S[t];
    }
}

/* The launch for Dk: P and SL from Dk alone (32 state rows a thread and SL
 * the power of two that covers Dk; small heads take 8 or 16 rows a thread),
 * so a position computes the same bits in every call. */
template <int MODE>
static void gdn_launch(cuda_ctx *c, float *out, const float *qkv, int qkv_stride, tdm_gdn_gates gt,
                       const tdm_gdn_seg *d, int nseg, int Hk, int Hv, int Dk, int Dv, int vec)
{
    int p = Dk <= 8 ? 8 : Dk <= 32 ? 16 : 32, sl = 1;
    while (p * sl < Dk)
        sl *= 2;
    const int cols = GDN_WARPS * 32 / sl;
    const dim3 grid((unsigned)((Dv + cols - 1) / cols), (unsigned)Hv, (unsigned)nseg);
#define GDN_LAUNCH(P, SL)                                                                          \
    cuda_launch(c, gdn_kernel<P, SL, MODE>, grid, GDN_WARPS * 32, 0, out, qkv, qkv_stride, gt, d,  \
                Hk, Hv, Dk, Dv, vec, (int)tdm_gdn_input_floats(Hk, Hv, Dk, Dv))
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
    /* Prompt-prefill segments of at least one chunk go to the chunked form
     * (gdn_chunk.cu); the rest run here. */
    int nchunked = 0;
    for (int i = 0; i < nseg; i++)
        nchunked += segs[i].chunked && !segs[i].states_out && segs[i].nrows >= GDN_CHUNK_MIN;
    if (nchunked && cuda_gdn_chunked_fits(c, Dk)) {
        /* The chunked form takes the gates as arrays: every row's, once. */
        int R = 0;
        for (int i = 0; i < nseg; i++)
            R = segs[i].row0 + segs[i].nrows > R ? segs[i].row0 + segs[i].nrows : R;
        const size_t n = (size_t)R * (size_t)Hv;
        float *g =
            (float *)cuda_grow(c, (void **)&c->gdn_gb, &c->gdn_gb_cap, 2 * n * sizeof(float));
        float *beta = g + n;
        cuda_launch(c, gdn_gates_kernel, cuda_blocks(n, 256), 256, 0, g, beta, gt, R, Hv);
        tdm_gdn_seg *rest = (tdm_gdn_seg *)malloc((size_t)nseg * sizeof(tdm_gdn_seg));
        TDM_ASSERT(rest != NULL);
        int nrest = 0;
        for (int i = 0; i < nseg; i++) {
            if (segs[i].chunked && !segs[i].states_out && segs[i].nrows >= GDN_CHUNK_MIN)
                cuda_gdn_chunked(c, out, qkv, qkv_stride, g, beta, &segs[i], Hk, Hv, Dk, Dv);
            else
                rest[nrest++] = segs[i];
        }
        if (nrest)
            cuda_gdn_recurrent(ctx, out, qkv, qkv_stride, gt, rest, nrest, Hk, Hv, Dk, Dv);
        free(rest);
        return;
    }
    const tdm_gdn_seg *d =
        (const tdm_gdn_seg *)cuda_stage(c, segs, (size_t)nseg * sizeof(tdm_gdn_seg));
    const int vec = Dk % 4 == 0 && Dv % 4 == 0 && qkv_stride % 4 == 0 && (uintptr_t)qkv % 16 == 0;
    int rec = 0;
    for (int i = 0; i < nseg; i++)
        rec |= segs[i].inputs != NULL;
    if (rec)
        gdn_launch<GDN_RECORD>(c, out, qkv, qkv_stride, gt, d, nseg, Hk, Hv, Dk, Dv, vec);
    else
        gdn_launch<GDN_PLAIN>(c, out, qkv, qkv_stride, gt, d, nseg, Hk, Hv, Dk, Dv, vec);
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
    for (int i = 0; i < nseg; i++)
        r[i] = tdm_gdn_seg{0, 0, segs[i].state, NULL, segs[i].inputs, segs[i].nrows, 0};
    const tdm_gdn_seg *d =
        (const tdm_gdn_seg *)cuda_stage(c, r, (size_t)nseg * sizeof(tdm_gdn_seg));
    free(r);
    gdn_launch<GDN_COMMIT>(c, NULL, NULL, 0, tdm_gdn_gates{}, d, nseg, Hk, Hv, Dk, Dv, 0);
}
