/*
 * gdn.cu - causal conv + SiLU with per-sequence window state, and the
 * recurrent gated delta rule, per segment of rows.
 *
 * Delta rule: one block per (segment, v-head, tile of 32 value columns).
 * Thread (slice s, lane e) keeps state column e0+e for the keys d = s,
 * s+GDN_SLICES, ... in registers for the whole segment; positions run one
 * after another (the recurrent form, exact math). Per position:
 *   S *= exp(g);  kv = Sᵀk;  delta = (v - kv)·beta;  S += k deltaᵀ;  o = Sᵀq
 * with q, k l2-normalised (eps 1e-6) and q scaled by Dk^-0.5. The reductions
 * over d go per thread, then over slices in slice order: fixed, so a position
 * computes the same bits in a prefill, a verify block or a decode step.
 */
#include "gdn.cuh"

#include <math.h>

/* ---- causal conv ------------------------------------------------------ */

typedef struct conv_row {
    int row, i; /* row of the call, index within its segment */
    const float *state;
    float *states_out;
} conv_row;

typedef struct conv_segd {
    int row0, nrows;
    float *state;
} conv_segd;

/* One thread per (row, channel). */
__global__ void conv_kernel(float *y, const float *x, const float *w, const conv_row *rows, int R,
                            int C, int K)
{
    cuda_kernel_begin();
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)R * (size_t)C)
        return;
    const conv_row cr = rows[t / (size_t)C];
    const int c = (int)(t % (size_t)C), S = K - 1, row0 = cr.row - cr.i;
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        const int m = cr.i - S + j; /* input index relative to the segment */
        const float v = m < 0 ? cr.state[(size_t)(S + m) * (size_t)C + (size_t)c]
                              : x[(size_t)(row0 + m) * (size_t)C + (size_t)c];
        acc = fmaf(w[(size_t)c * (size_t)K + (size_t)j], v, acc);
    }
    y[(size_t)cr.row * (size_t)C + (size_t)c] = cuda_silu(acc);
    if (cr.states_out) {
        /* the window after this row: inputs i-S+1 .. i */
        float *so = cr.states_out + (size_t)cr.i * (size_t)S * (size_t)C;
        for (int j = 0; j < S; j++) {
            const int m = cr.i - S + 1 + j;
            so[(size_t)j * (size_t)C + (size_t)c] =
                m < 0 ? cr.state[(size_t)(S + m) * (size_t)C + (size_t)c]
                      : x[(size_t)(row0 + m) * (size_t)C + (size_t)c];
        }
    }
}

/* In-place window update after the conv has read the old window: one thread
 * per (segment, channel); j rises and reads index n+j > j, not yet written. */
__global__ void conv_state_kernel(const float *x, const conv_segd *segs, int nseg, int C, int K)
{
    cuda_kernel_begin();
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)nseg * (size_t)C)
        return;
    const conv_segd sg = segs[t / (size_t)C];
    const int c = (int)(t % (size_t)C), S = K - 1, n = sg.nrows;
    for (int j = 0; j < S; j++) {
        const int m = n - S + j;
        sg.state[(size_t)j * (size_t)C + (size_t)c] =
            m < 0 ? sg.state[(size_t)(S + m) * (size_t)C + (size_t)c]
                  : x[(size_t)(sg.row0 + m) * (size_t)C + (size_t)c];
    }
}

void cuda_conv_silu(void *ctx, float *y, const float *x, const float *w, const tdm_conv_seg *segs,
                    int nseg, int C, int K)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(K >= 1);
    int R = 0, nin = 0;
    for (int i = 0; i < nseg; i++) {
        R += segs[i].nrows;
        nin += !segs[i].states_out && segs[i].nrows > 0;
    }
    if (R == 0 || C <= 0)
        return;
    conv_row *rows = (conv_row *)malloc((size_t)R * sizeof(conv_row));
    conv_segd *sd = (conv_segd *)malloc((size_t)(nin ? nin : 1) * sizeof(conv_segd));
    TDM_ASSERT(rows && sd);
    for (int i = 0, r = 0, s = 0; i < nseg; i++) {
        for (int j = 0; j < segs[i].nrows; j++, r++)
            rows[r] = (conv_row){segs[i].row0 + j, j, segs[i].state, segs[i].states_out};
        if (!segs[i].states_out && segs[i].nrows > 0)
            sd[s++] = (conv_segd){segs[i].row0, segs[i].nrows, segs[i].state};
    }
    const conv_row *drows = (const conv_row *)cuda_stage(c, rows, (size_t)R * sizeof(conv_row));
    const size_t n = (size_t)R * (size_t)C;
    cuda_launch(c, conv_kernel, cuda_blocks(n, 256), 256, 0, y, x, w, drows, R, C, K);
    if (nin > 0 && K > 1) {
        const conv_segd *dsd =
            (const conv_segd *)cuda_stage(c, sd, (size_t)nin * sizeof(conv_segd));
        const size_t m = (size_t)nin * (size_t)C;
        cuda_launch(c, conv_state_kernel, cuda_blocks(m, 256), 256, 0, x, dsd, nin, C, K);
    }
    free(rows);
    free(sd);
}

/* ---- gated delta rule --------------------------------------------------- */

#define GDN_SLICES 8
#define GDN_COLS 32

typedef struct gdn_segd {
    int row0, nrows;
    float *state;      /* [Hv, Dk, Dv] */
    float *states_out; /* NULL or [nrows, Hv, Dk, Dv] */
} gdn_segd;

/* KPT: state values per thread = ceil(Dk / GDN_SLICES). */
template <int KPT>
__global__ void __launch_bounds__(GDN_SLICES *GDN_COLS)
    gdn_kernel(float *out, const float *qkv, int stride, const float *g, const float *beta,
               const gdn_segd *segs, int Hk, int Hv, int Dk, int Dv)
{
    cuda_kernel_begin();
    extern __shared__ float sm[];
    float *qn = sm;                           /* [Dk] */
    float *kn = qn + Dk;                      /* [Dk] */
    float *red = kn + Dk;                     /* [GDN_SLICES][GDN_COLS] */
    float *vec = red + GDN_SLICES * GDN_COLS; /* [GDN_COLS]: kv, then delta */
    __shared__ float norms[2];
    const gdn_segd sg = segs[blockIdx.x];
    const int hv = blockIdx.y, hk = hv / (Hv / Hk);
    const int lane = threadIdx.x % GDN_COLS, sl = threadIdx.x / GDN_COLS;
    const int e = blockIdx.z * GDN_COLS + lane;
    const bool live = e < Dv;
    const size_t hs = (size_t)Dk * (size_t)Dv;
    const float scale = 1.0f / sqrtf((float)Dk);
    float S[KPT];
    const float *init = sg.state + (size_t)hv * hs;
#pragma unroll
    for (int t = 0; t < KPT; t++) {
        const int d = sl + GDN_SLICES * t;
        S[t] = live && d < Dk ? init[(size_t)d * (size_t)Dv + (size_t)e] : 0.0f;
    }
    for (int i = 0; i < sg.nrows; i++) {
        const size_t row = (size_t)(sg.row0 + i);
        const float *q = qkv + row * (size_t)stride + (size_t)hk * (size_t)Dk;
        const float *k = q + (size_t)Hk * (size_t)Dk;
        const float *v =
            qkv + row * (size_t)stride + 2 * (size_t)Hk * (size_t)Dk + (size_t)hv * (size_t)Dv;
        /* Norms: warp 0 sums q², warp 1 sums k², each in a fixed order. */
        if (threadIdx.x < 64) {
            const float *p = threadIdx.x < 32 ? q : k;
            float ss = 0.0f;
            for (int d = lane; d < Dk; d += 32)
                ss = fmaf(p[d], p[d], ss);
            ss = cuda_warp_sum(ss);
            if (lane == 0)
                norms[threadIdx.x / 32] = ss;
        }
        __syncthreads();
        const float iq = 1.0f / sqrtf(norms[0] + 1e-6f), ik = 1.0f / sqrtf(norms[1] + 1e-6f);
        for (int d = threadIdx.x; d < Dk; d += blockDim.x) {
            qn[d] = (q[d] * iq) * scale;
            kn[d] = k[d] * ik;
        }
        const size_t gi = row * (size_t)Hv + (size_t)hv;
        const float decay = expf(g[gi]), b = beta[gi];
        __syncthreads();
        /* kv[e] = sum_d S[d,e] kn[d] after the decay */
        float part = 0.0f;
#pragma unroll
        for (int t = 0; t < KPT; t++) {
            const int d = sl + GDN_SLICES * t;
            S[t] *= decay;
            if (d < Dk)
                part = fmaf(S[t], kn[d], part);
        }
        red[sl * GDN_COLS + lane] = part;
        __syncthreads();
        if (sl == 0) {
            float kv = 0.0f;
            for (int s = 0; s < GDN_SLICES; s++)
                kv += red[s * GDN_COLS + lane];
            vec[lane] = live ? (v[e] - kv) * b : 0.0f; /* delta */
        }
        __syncthreads();
        const float delta = vec[lane];
        part = 0.0f;
#pragma unroll
        for (int t = 0; t < KPT; t++) {
            const int d = sl + GDN_SLICES * t;
            if (d < Dk) {
                S[t] = fmaf(kn[d], delta, S[t]);
                part = fmaf(S[t], qn[d], part);
            }
        }
        red[sl * GDN_COLS + lane] = part;
        __syncthreads();
        if (sl == 0 && live) {
            float o = 0.0f;
            for (int s = 0; s < GDN_SLICES; s++)
                o += red[s * GDN_COLS + lane];
            out[gi * (size_t)Dv + (size_t)e] = o;
        }
        if (sg.states_out && live) {
            float *so = sg.states_out + ((size_t)i * (size_t)Hv + (size_t)hv) * hs;
#pragma unroll
            for (int t = 0; t < KPT; t++) {
                const int d = sl + GDN_SLICES * t;
                if (d < Dk)
                    so[(size_t)d * (size_t)Dv + (size_t)e] = S[t];
            }
        }
        __syncthreads(); /* qn, kn, red and vec are rewritten by the next position */
    }
    if (!sg.states_out && live && sg.nrows > 0) {
        float *st = sg.state + (size_t)hv * hs;
#pragma unroll
        for (int t = 0; t < KPT; t++) {
            const int d = sl + GDN_SLICES * t;
            if (d < Dk)
                st[(size_t)d * (size_t)Dv + (size_t)e] = S[t];
        }
    }
}

void cuda_gdn_recurrent(void *ctx, float *out, const float *qkv, int qkv_stride, const float *g,
                        const float *beta, const tdm_gdn_seg *segs, int nseg, int Hk, int Hv,
                        int Dk, int Dv)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(Hk > 0 && Hv % Hk == 0 && Dk > 0 && Dk <= 512 && Dv > 0);
    if (nseg <= 0 || Hv <= 0)
        return;
    gdn_segd *sd = (gdn_segd *)malloc((size_t)nseg * sizeof(gdn_segd));
    TDM_ASSERT(sd != NULL);
    for (int i = 0; i < nseg; i++)
        sd[i] = (gdn_segd){segs[i].row0, segs[i].nrows, segs[i].state, segs[i].states_out};
    const gdn_segd *dsd = (const gdn_segd *)cuda_stage(c, sd, (size_t)nseg * sizeof(gdn_segd));
    free(sd);
    dim3 grid((unsigned)nseg, (unsigned)Hv, (unsigned)((Dv + GDN_COLS - 1) / GDN_COLS));
    const size_t smem = (2 * (size_t)Dk + GDN_SLICES * GDN_COLS + GDN_COLS) * sizeof(float);
    const int kpt = (Dk + GDN_SLICES - 1) / GDN_SLICES;
    const unsigned th = GDN_SLICES * GDN_COLS;
#define GDN_LAUNCH(N)                                                                              \
    cuda_launch(c, gdn_kernel<N>, grid, th, smem, out, qkv, qkv_stride, g, beta, dsd, Hk, Hv, Dk,  \
                Dv)
    if (kpt <= 2)
        GDN_LAUNCH(2);
    else if (kpt <= 4)
        GDN_LAUNCH(4);
    else if (kpt <= 8)
        GDN_LAUNCH(8);
    else if (kpt <= 16)
        GDN_LAUNCH(16);
    else if (kpt <= 32)
        GDN_LAUNCH(32);
    else
        GDN_LAUNCH(64);
#undef GDN_LAUNCH
}
