/*
 * attention.cu - out [R, nH, D] = softmax(q·Kᵀ · D^-0.5) · V per (row, head),
 * the row at position n_past + i seeing cache entries 0..n_past+i.
 *
 * One block of ATT_WARPS warps per (row, head). Warp w takes keys w, w+4, ...;
 * for each key the lanes split the dot product over d (coalesced reads of the
 * cache row), and the warp keeps a running max, sum and its share of the
 * output (lane owns d = lane + 32t) — an online softmax, so no scratch of the
 * context's length. The warps' partial results are then merged in warp order.
 * Everything a row computes depends only on its own keys: rows agree to the
 * bit whatever the batch.
 */
#include "attention.cuh"

#include <math.h>

#define ATT_WARPS 4
#define ATT_MAXD 512 /* head_dim up to 512: 16 values per lane */

typedef struct att_row {
    int row, nkeys;
    const float *k, *v; /* the segment's caches */
} att_row;

__global__ void attention_kernel(float *out, const float *q, const att_row *rows, int nH, int nKV,
                                 int D)
{
    cuda_kernel_begin();
    __shared__ float qs[ATT_MAXD];
    __shared__ float part_o[ATT_WARPS][ATT_MAXD];
    __shared__ float part_m[ATT_WARPS], part_s[ATT_WARPS];
    const att_row ar = rows[blockIdx.x];
    const int h = blockIdx.y, kh = h / (nH / nKV);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t kvw = (size_t)nKV * (size_t)D;
    const float scale = 1.0f / sqrtf((float)D);
    const float *qr = q + ((size_t)ar.row * (size_t)nH + (size_t)h) * (size_t)D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = qr[d];
    __syncthreads();
    const int nt = (D + 31) / 32;
    float o[ATT_MAXD / 32];
#pragma unroll
    for (int t = 0; t < ATT_MAXD / 32; t++)
        o[t] = 0.0f;
    float mx = -INFINITY, sum = 0.0f;
    for (int j = warp; j < ar.nkeys; j += ATT_WARPS) {
        const float *kr = ar.k + (size_t)j * kvw + (size_t)kh * (size_t)D;
        float s = 0.0f;
        for (int d = lane; d < D; d += 32)
            s = fmaf(qs[d], kr[d], s);
        s = cuda_warp_sum(s) * scale;
        if (s > mx) {
            const float cf = expf(mx - s); /* 0 on the first key */
            sum *= cf;
#pragma unroll
            for (int t = 0; t < ATT_MAXD / 32; t++)
                o[t] *= cf;
            mx = s;
        }
        const float p = expf(s - mx);
        sum += p;
        const float *vr = ar.v + (size_t)j * kvw + (size_t)kh * (size_t)D;
#pragma unroll
        for (int t = 0; t < ATT_MAXD / 32; t++) {
            const int d = lane + 32 * t;
            if (t < nt && d < D)
                o[t] = fmaf(p, vr[d], o[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < ATT_MAXD / 32; t++) {
        const int d = lane + 32 * t;
        if (t < nt && d < D)
            part_o[warp][d] = o[t];
    }
    if (lane == 0) {
        part_m[warp] = mx;
        part_s[warp] = sum;
    }
    __syncthreads();
    /* Merge in warp order; a warp that saw no key has max -inf and weight 0. */
    float M = part_m[0];
    for (int w = 1; w < ATT_WARPS; w++)
        M = fmaxf(M, part_m[w]);
    float S = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        S += part_m[w] == -INFINITY ? 0.0f : part_s[w] * expf(part_m[w] - M);
    const float inv = 1.0f / S;
    float *orow = out + ((size_t)ar.row * (size_t)nH + (size_t)h) * (size_t)D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (part_m[w] != -INFINITY)
                acc += part_o[w][d] * expf(part_m[w] - M);
        orow[d] = acc * inv;
    }
}

void cuda_attention(void *ctx, float *out, const float *q, const tdm_attn_seg *segs, int nseg,
                    int nH, int nKV, int D)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(D > 0 && D <= ATT_MAXD && nKV > 0 && nH % nKV == 0);
    int R = 0;
    for (int i = 0; i < nseg; i++)
        R += segs[i].nrows;
    if (R == 0 || nH == 0)
        return;
    att_row *rows = (att_row *)malloc((size_t)R * sizeof(att_row));
    TDM_ASSERT(rows != NULL);
    for (int i = 0, r = 0; i < nseg; i++)
        for (int j = 0; j < segs[i].nrows; j++, r++)
            rows[r] = (att_row){segs[i].row0 + j, segs[i].n_past + j + 1, segs[i].k_cache,
                                segs[i].v_cache};
    const att_row *drows = (const att_row *)cuda_stage(c, rows, (size_t)R * sizeof(att_row));
    free(rows);
    dim3 grid((unsigned)R, (unsigned)nH);
    cuda_launch(c, attention_kernel, grid, ATT_WARPS * 32, 0, out, q, drows, nH, nKV, D);
}
