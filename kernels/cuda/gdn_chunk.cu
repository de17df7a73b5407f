/*
 * gdn_chunk.cu - the gated delta rule of one prompt-prefill segment in chunked form: gdn.cu's
 * recurrence (backend.h gdn_recurrent) over chunks of L = 64 positions, equal to it up to
 * rounding; the gates come as arrays g, beta [R, Hv] (gdn.cu's gdn_gates_kernel).
 *
 * Invariants a change must keep:
 *  - Deterministic, and a function of the segment alone: chunks start every 64 rows from row0,
 *    and every sum has one fixed order (one thread over keys, then chunk positions, ascending;
 *    the q, k norms lane-strided, then a butterfly). Only prompt prefill may take this form:
 *    it matches gdn.cu to rounding, not to the bit (backend.h).
 *  - Decay factors are e to sums of g over position ranges, each summed from its own start (a
 *    running sum down a column of Γ), never e^{γ_i}·e^{-γ_j}: γ can fall far below the exponent
 *    range within a chunk of strong decays, and the rounding of a sum then scales with the
 *    range, not with |γ_i|.
 *  - A short last chunk is padded with k = q = v = 0, β = 0, g = 0, which leaves T, V', O and S1
 *    of the real rows as they are.
 * tests/cuda/gdn_chunk_ref.c checks the math in double precision against the recurrence.
 *
 * Math, per v-head and chunk: S0 [Dk, Dv] is the state before it, i, j positions in it, γ_i
 * the sum of g from the chunk start through i, q and k l2-normalised as in gdn.cu:
 *   A[i][j] = β_i e^{γ_i-γ_j} (k_i·k_j) for j < i, else 0;  T = (I + A)^-1
 *   R  = diag(β) (V - diag(e^γ) K S0)        [L, Dv]
 *   V' = T R                                  [L, Dv]  (the deltas)
 *   O  = diag(e^γ) Q S0 + ((Q Kᵀ) ⊙ M) V',   M[i][j] = e^{γ_i-γ_j}, j <= i  (Γ below)
 *   S1 = e^{γ_last} S0 + (diag(e^{γ_last-γ}) K)ᵀ V'
 * (V' = U - W S0 with W = T diag(β e^γ) K, U = T diag(β) V, regrouped so W is never formed:
 * K S0 costs what W S0 does, and T R, [L, L] by [L, 32] a block, replaces T K, [L, L] by [L, Dk].)
 *
 * Layout: qkv rows [R, qkv_stride] as gdn.cu; out [R, Hv, Dv]; state [Hv, Dk, Dv] in place.
 * Work split: a block of 256 threads (8 warps; lane = state column) per (v-head, tile of 32
 * state columns) walks the chunks in order with its [Dk, 32] state tile in shared memory (142 KB
 * at Dk = 128, 222 KB at 256: cuda_gdn_chunked_fits). Γ, A, T and Q Kᵀ do not depend on the tile
 * and are recomputed by each of a head's Dv/32 blocks (no scratch to size or own; at Dv = 128
 * about half of a block's arithmetic). Per chunk:
 *  1. q, k normalised into shared memory, a warp a row (lane-strided fmaf, cuda_warp_sum);
 *  2. Γ by threads j (running sums down column j), e^γ by thread 64, while all threads form 4x4
 *     tiles of K Kᵀ and Q Kᵀ (thread (ti, tj): rows ti + 16a, columns tj + 16b); A, P = Γ ⊙ Q Kᵀ;
 *  3. T by elimination: a thread's 16 entries in registers, one barrier a step;
 *  4. K S0 and Q S0 (warp w: rows w + 8a), R, V' = T R;
 *  5. O to out, S1 in place (warp w: 4-key groups w, w + 8, ...).
 */
#include "gdn_chunk.cuh"

#include <math.h>

#define GC_L 64    /* chunk length */
#define GC_LP 68   /* row stride of the [L][L] matrices: float4-aligned, padded */
#define GC_COLS 32 /* state columns per block: one per lane */
#define GC_WARPS 8
#define GC_THREADS (GC_WARPS * 32)
#define GC_RPT (GC_L / GC_WARPS) /* chunk rows per warp in steps 4-5 */

/* R and then e^{γ_last-γ} ⊙ V' live where A was once T is formed. */
static_assert(2 * GC_COLS <= GC_LP, "R and the decayed deltas must fit in A's place");

typedef struct gc_seg {
    int row0, nrows;
    float *state; /* [Hv, Dk, Dv] */
} gc_seg;

__device__ __forceinline__ float gc_dot4(float4 a, float4 b, float acc)
{
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

__device__ __forceinline__ float gc_dot4s(float4 a, float b0, float b1, float b2, float b3,
                                          float acc)
{
    return fmaf(a.w, b3, fmaf(a.z, b2, fmaf(a.y, b1, fmaf(a.x, b0, acc))));
}

/* Shared memory, in floats: K and Q rows (float4 stride ks4, odd so that rows
 * read side by side fall in different banks), the state tile, A, T, P, V',
 * and g, β, e^γ, e^{γ_last-γ}. */
static size_t gc_smem(int Dk)
{
    const size_t Dk4 = ((size_t)Dk + 3) / 4, ks4 = Dk4 | 1;
    return sizeof(float) *
           (2 * GC_L * ks4 * 4 + 4 * Dk4 * GC_COLS + 3 * GC_L * GC_LP + GC_L * GC_COLS + 4 * GC_L);
}

/* grid (Hv, Dv tiles of GC_COLS), GC_THREADS threads, gc_smem(Dk) bytes. */
__global__ void __launch_bounds__(GC_THREADS, 1)
    gdn_chunk_kernel(float *out, const float *qkv, int stride, const float *g, const float *beta,
                     const gc_seg *segp, int Hk, int Hv, int Dk, int Dv)
{
    cuda_kernel_begin();
    extern __shared__ float4 gc_sm[];
    const gc_seg sg = *segp;
    const int hv = blockIdx.x, hk = hv / (Hv / Hk);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ti = threadIdx.x >> 4, tj = threadIdx.x & 15; /* [L][L] tiles */
    const int e = blockIdx.y * GC_COLS + lane;              /* this lane's state column */
    const bool live = e < Dv;
    const int Dk4 = (Dk + 3) >> 2, ks4 = Dk4 | 1;
    float4 *Kn = gc_sm;                     /* [L][ks4]: normalised k, zero-padded */
    float4 *Qn = Kn + GC_L * ks4;           /* [L][ks4]: normalised, scaled q */
    float *Ss = (float *)(Qn + GC_L * ks4); /* [4*Dk4][COLS]: the state tile */
    float *Am = Ss + 4 * Dk4 * GC_COLS;     /* [L][LP] */
    float *Tm = Am + GC_L * GC_LP;          /* [L][LP] */
    float *Pm = Tm + GC_L * GC_LP;          /* [L][LP]: Γ, then P */
    float *Vp = Pm + GC_L * GC_LP;          /* [L][COLS]: V' */
    float *gv = Vp + GC_L * GC_COLS;        /* [L] */
    float *bv = gv + GC_L;                  /* [L] */
    float *eg = bv + GC_L;                  /* [L]: e^{γ_i} */
    float *gl = eg + GC_L;                  /* [L]: e^{γ_last-γ_j} */
    float *Rm = Am;                         /* [L][COLS] */
    float *Vd = Am + GC_L * GC_COLS;        /* [L][COLS]: e^{γ_last-γ} ⊙ V' */
    const size_t hs = (size_t)Dk * (size_t)Dv;
    const size_t vcol = 2 * (size_t)Hk * (size_t)Dk + (size_t)hv * (size_t)Dv + (size_t)e;
    const float scale = 1.0f / sqrtf((float)Dk);
    float *st = sg.state + (size_t)hv * hs + (size_t)e;

    for (int d = warp; d < 4 * Dk4; d += GC_WARPS)
        Ss[d * GC_COLS + lane] = live && d < Dk ? st[(size_t)d * (size_t)Dv] : 0.0f;

    for (int c0 = 0; c0 < sg.nrows; c0 += GC_L) {
        const int n = min(GC_L, sg.nrows - c0);
        const size_t row0 = (size_t)sg.row0 + (size_t)c0;

        /* 1. q, k rows, g and β. */
        for (int i = warp; i < GC_L; i += GC_WARPS) {
            float *qr = (float *)(Qn + i * ks4), *kr = (float *)(Kn + i * ks4);
            if (i < n) {
                const float *q = qkv + (row0 + (size_t)i) * (size_t)stride + (size_t)hk * Dk;
                const float *k = q + (size_t)Hk * (size_t)Dk;
                float sq = 0.0f, sk = 0.0f;
                for (int d = lane; d < Dk; d += 32) {
                    sq = fmaf(q[d], q[d], sq);
                    sk = fmaf(k[d], k[d], sk);
                }
                sq = cuda_warp_sum(sq);
                sk = cuda_warp_sum(sk);
                const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
                for (int d = lane; d < 4 * Dk4; d += 32) {
                    qr[d] = d < Dk ? (q[d] * iq) * scale : 0.0f;
                    kr[d] = d < Dk ? k[d] * ik : 0.0f;
                }
            } else {
                for (int d = lane; d < 4 * Dk4; d += 32)
                    qr[d] = kr[d] = 0.0f;
            }
        }
        if (threadIdx.x < GC_L) {
            const int i = threadIdx.x;
            const size_t gi = (row0 + (size_t)i) * (size_t)Hv + (size_t)hv;
            gv[i] = i < n ? g[gi] : 0.0f;
            bv[i] = i < n ? beta[gi] : 0.0f;
        }
        __syncthreads();

        /* 2. Decays, and the Gram tiles meanwhile. */
        if (threadIdx.x < GC_L) {
            const int j = threadIdx.x;
            float s = 0.0f, last = 1.0f;
            for (int i = 0; i < j; i++)
                Pm[i * GC_LP + j] = 0.0f;
            Pm[j * GC_LP + j] = 1.0f;
            for (int i = j + 1; i < GC_L; i++) {
                s += gv[i];
                last = expf(s);
                Pm[i * GC_LP + j] = last;
            }
            gl[j] = last;
        } else if (threadIdx.x == GC_L) {
            float s = 0.0f;
            for (int i = 0; i < GC_L; i++) {
                s += gv[i];
                eg[i] = expf(s);
            }
        }
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++)
                kk[a][b] = qk[a][b] = 0.0f;
        for (int q4 = 0; q4 < Dk4; q4++) {
            float4 ki[4], qi[4], kj[4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                ki[a] = Kn[(ti + 16 * a) * ks4 + q4];
                qi[a] = Qn[(ti + 16 * a) * ks4 + q4];
                kj[a] = Kn[(tj + 16 * a) * ks4 + q4];
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    kk[a][b] = gc_dot4(ki[a], kj[b], kk[a][b]);
                    qk[a][b] = gc_dot4(qi[a], kj[b], qk[a][b]);
                }
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int i = ti + 16 * a, j = tj + 16 * b;
                const float gm = Pm[i * GC_LP + j];
                Am[i * GC_LP + j] = j < i ? (bv[i] * gm) * kk[a][b] : 0.0f;
                Pm[i * GC_LP + j] = j <= i ? gm * qk[a][b] : 0.0f;
            }
        __syncthreads();

        /* 3. T = (I + A)^-1. Row m is final when step m begins (every A[m][m'],
         * m' < m, has been applied in order); entries above the diagonal stay
         * exactly 0 and the diagonal exactly 1, and the update of a row i <= m
         * adds A[i][m] = 0, so no step needs a mask. */
        {
            float X[4][4];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++)
                    X[a][b] = ti + 16 * a == tj + 16 * b ? 1.0f : 0.0f;
#pragma unroll
            for (int ma = 0; ma < 4; ma++)
                for (int mi = 0; mi < 16; mi++) {
                    const int m = 16 * ma + mi;
                    if (ti == mi) {
#pragma unroll
                        for (int b = 0; b < 4; b++)
                            Tm[m * GC_LP + tj + 16 * b] = X[ma][b];
                    }
                    __syncthreads();
                    float tr[4], ac[4];
#pragma unroll
                    for (int b = 0; b < 4; b++)
                        tr[b] = Tm[m * GC_LP + tj + 16 * b];
#pragma unroll
                    for (int a = 0; a < 4; a++)
                        ac[a] = Am[(ti + 16 * a) * GC_LP + m];
#pragma unroll
                    for (int a = 0; a < 4; a++)
#pragma unroll
                        for (int b = 0; b < 4; b++)
                            X[a][b] = fmaf(-ac[a], tr[b], X[a][b]);
                }
        }
        __syncthreads(); /* A is read to the last step; R and Vd overwrite it */

        /* 4. K S0 and Q S0; R = β (v - e^γ K S0); V' = T R. */
        float ks[GC_RPT], qs[GC_RPT];
#pragma unroll
        for (int a = 0; a < GC_RPT; a++)
            ks[a] = qs[a] = 0.0f;
        for (int q4 = 0; q4 < Dk4; q4++) {
            const float s0 = Ss[(4 * q4) * GC_COLS + lane], s1 = Ss[(4 * q4 + 1) * GC_COLS + lane];
            const float s2 = Ss[(4 * q4 + 2) * GC_COLS + lane];
            const float s3 = Ss[(4 * q4 + 3) * GC_COLS + lane];
#pragma unroll
            for (int a = 0; a < GC_RPT; a++) {
                const int i = warp + GC_WARPS * a;
                ks[a] = gc_dot4s(Kn[i * ks4 + q4], s0, s1, s2, s3, ks[a]);
                qs[a] = gc_dot4s(Qn[i * ks4 + q4], s0, s1, s2, s3, qs[a]);
            }
        }
#pragma unroll
        for (int a = 0; a < GC_RPT; a++) {
            const int i = warp + GC_WARPS * a;
            const float v = live && i < n ? qkv[(row0 + (size_t)i) * (size_t)stride + vcol] : 0.0f;
            Rm[i * GC_COLS + lane] = bv[i] * (v - eg[i] * ks[a]);
        }
        __syncthreads();
        {
            float vp[GC_RPT];
#pragma unroll
            for (int a = 0; a < GC_RPT; a++)
                vp[a] = 0.0f;
            for (int m4 = 0; m4 < GC_L / 4; m4++) {
                const float r0 = Rm[(4 * m4) * GC_COLS + lane],
                            r1 = Rm[(4 * m4 + 1) * GC_COLS + lane];
                const float r2 = Rm[(4 * m4 + 2) * GC_COLS + lane];
                const float r3 = Rm[(4 * m4 + 3) * GC_COLS + lane];
#pragma unroll
                for (int a = 0; a < GC_RPT; a++) {
                    const int i = warp + GC_WARPS * a;
                    const float4 t = *(const float4 *)(Tm + i * GC_LP + 4 * m4);
                    vp[a] = gc_dot4s(t, r0, r1, r2, r3, vp[a]);
                }
            }
#pragma unroll
            for (int a = 0; a < GC_RPT; a++) {
                const int i = warp + GC_WARPS * a;
                Vp[i * GC_COLS + lane] = vp[a];
                Vd[i * GC_COLS + lane] = gl[i] * vp[a];
            }
        }
        __syncthreads();

        /* 5. O = e^γ Q S0 + P V'; S1 = e^{γ_last} S0 + Kᵀ (e^{γ_last-γ} ⊙ V'). */
        {
            float o[GC_RPT];
#pragma unroll
            for (int a = 0; a < GC_RPT; a++)
                o[a] = eg[warp + GC_WARPS * a] * qs[a];
            for (int m4 = 0; m4 < GC_L / 4; m4++) {
                const float v0 = Vp[(4 * m4) * GC_COLS + lane],
                            v1 = Vp[(4 * m4 + 1) * GC_COLS + lane];
                const float v2 = Vp[(4 * m4 + 2) * GC_COLS + lane];
                const float v3 = Vp[(4 * m4 + 3) * GC_COLS + lane];
#pragma unroll
                for (int a = 0; a < GC_RPT; a++) {
                    const int i = warp + GC_WARPS * a;
                    const float4 p = *(const float4 *)(Pm + i * GC_LP + 4 * m4);
                    o[a] = gc_dot4s(p, v0, v1, v2, v3, o[a]);
                }
            }
#pragma unroll
            for (int a = 0; a < GC_RPT; a++) {
                const int i = warp + GC_WARPS * a;
                if (live && i < n)
                    out[((row0 + (size_t)i) * (size_t)Hv + (size_t)hv) * (size_t)Dv + (size_t)e] =
                        o[a];
            }
        }
        {
            const float eL = eg[GC_L - 1];
            for (int q4 = warp; q4 < Dk4; q4 += 2 * GC_WARPS) {
                const int q4b = q4 + GC_WARPS;
                const bool two = q4b < Dk4;
                float acc[8];
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    acc[c] = eL * Ss[(4 * q4 + c) * GC_COLS + lane];
                    acc[4 + c] = two ? eL * Ss[(4 * q4b + c) * GC_COLS + lane] : 0.0f;
                }
                for (int j = 0; j < GC_L; j++) {
                    const float vd = Vd[j * GC_COLS + lane];
                    const float4 ka = Kn[j * ks4 + q4];
                    acc[0] = fmaf(ka.x, vd, acc[0]);
                    acc[1] = fmaf(ka.y, vd, acc[1]);
                    acc[2] = fmaf(ka.z, vd, acc[2]);
                    acc[3] = fmaf(ka.w, vd, acc[3]);
                    if (two) {
                        const float4 kb = Kn[j * ks4 + q4b];
                        acc[4] = fmaf(kb.x, vd, acc[4]);
                        acc[5] = fmaf(kb.y, vd, acc[5]);
                        acc[6] = fmaf(kb.z, vd, acc[6]);
                        acc[7] = fmaf(kb.w, vd, acc[7]);
                    }
                }
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    Ss[(4 * q4 + c) * GC_COLS + lane] = acc[c];
                    if (two)
                        Ss[(4 * q4b + c) * GC_COLS + lane] = acc[4 + c];
                }
            }
        }
        __syncthreads(); /* the next chunk rewrites K, Q, Γ; the store reads S */
    }

    if (live)
        for (int d = warp; d < Dk; d += GC_WARPS)
            st[(size_t)d * (size_t)Dv] = Ss[d * GC_COLS + lane];
}

int cuda_gdn_chunked_fits(cuda_ctx *c, int Dk)
{
    return Dk > 0 && gc_smem(Dk) <= (size_t)c->smem_optin;
}

void cuda_gdn_chunked(cuda_ctx *c, float *out, const float *qkv, int qkv_stride, const float *g,
                      const float *beta, const tdm_gdn_seg *seg, int Hk, int Hv, int Dk, int Dv)
{
    TDM_ASSERT(Hk > 0 && Hv > 0 && Hv % Hk == 0 && Dk > 0 && Dv > 0 && !seg->states_out);
    TDM_ASSERT(cuda_gdn_chunked_fits(c, Dk));
    if (seg->nrows <= 0)
        return;
    /* Staged rather than passed by value, so that a replayed graph reads the
     * segment of the call it replays. */
    const gc_seg s = {seg->row0, seg->nrows, seg->state};
    const gc_seg *ds = (const gc_seg *)cuda_stage(c, &s, sizeof(s));
    const size_t smem = gc_smem(Dk);
    CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
    const dim3 grid((unsigned)Hv, (unsigned)((Dv + GC_COLS - 1) / GC_COLS));
    cuda_launch(c, gdn_chunk_kernel, grid, GC_THREADS, smem, out, qkv, qkv_stride, g, beta, ds, Hk,
                Hv, Dk, Dv);
}

extern "C" void tdm_cuda_gdn_chunked(void *ctx, float *out, const float *qkv, int qkv_stride,
                                     const float *g, const float *beta, const tdm_gdn_seg *seg,
                                     int Hk, int Hv, int Dk, int Dv)
{
    cuda_gdn_chunked((cuda_ctx *)ctx, out, qkv, qkv_stride, g, beta, seg, Hk, Hv, Dk, Dv);
}
