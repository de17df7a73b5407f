/*
 * attention.cu - causal GQA attention: out [R, nH, D] = softmax(q·Kᵀ · D^-0.5) · V per (row,
 * head), the row at position n_past + i of its segment seeing cache entries 0 .. n_past + i,
 * times sigmoid(gate) where a gate [R, nH, D] is given (the product mul_sigmoid would make of the
 * stored value). q [R, nH, D]; the caches [positions, nKV, D] (row stride nKV·D), 16-byte aligned;
 * D % 4 == 0, D <= ATT_MAXD; query head h reads kv head h / (nH / nKV).
 *
 * Invariants a change must keep (the GPU tests check them to the bit):
 *  - A row's result is a function of its own q and keys (and the head shapes) alone: never of
 *    R, of the other segments, or of which kernel runs it.
 *  - The order: the row's nkeys keys fall into ns = min(ATT_SPLITS, ceil(nkeys / ATT_SPLIT_KEYS))
 *    contiguous splits, split s starting at s·nkeys/ns; in a split, warp w takes the tiles of
 *    TK keys w, w + ATT_WARPS, ... (TK = att_tk(GP, NC), from the head shapes) with an online
 *    softmax per head; warps are merged in warp order, then splits in split order. A merge of
 *    partials (m_i, l_i, o_i) is M = max m_i, c_i = exp(m_i - M), L = Σ c_i·l_i,
 *    O = Σ c_i·o_i, sums in i order; out = O·(1/L).
 *  - att_split_kernel and att_row_kernel compute the same bits: all float arithmetic is spelled
 *    out (fmaf, __fmul_rn, __fadd_rn) so no compiler contraction can differ between them.
 *  - The launch never depends on key counts (a captured graph replays as the context grows):
 *    ATT_SPLITS blocks per (row, head group) in the cluster kernel, the empty ones exit at once.
 *
 * Work split. A block of ATT_WARPS warps handles the GP query heads that share a kv head, so a
 * key is read once for all of them. Few (row, head group) units (< ATT_CLUSTER_UNITS: decode,
 * verify blocks): att_split_kernel, the ATT_SPLITS blocks of a row a thread-block cluster,
 * block s computing split s and block 0 merging the others' partials from their shared memory.
 * Many (prefill, big batches): att_row_kernel, one block per (row, head group) computing the
 * splits in turn and merging them from its own shared memory. Per tile a lane owns the float4
 * chunks lane, lane + 32, ... of the head dim: its key chunks go to registers, its value chunks
 * to shared memory by cp.async (in flight while the scores are computed); the GP·TK partial dot
 * products are reduced across the warp by halving (att_reduce), which leaves each lane one score.
 * Measurements behind ATT_SPLITS and ATT_TKMAX, and earlier designs: NOTES.md.
 */
#include "attention.cuh"
#include "matmul.cuh"
#include "seglist.cuh"

#include <cooperative_groups.h>

#include <atomic>
#include <math.h>
#include <stdint.h>

namespace cg = cooperative_groups;

#define ATT_WARPS 8
#define ATT_THREADS (ATT_WARPS * 32)
/* Splits per row at most: the cluster size. Six, not eight: a verify
 * block's rows past 384 keys then fit one wave (4B, 9 rows: 36 clusters;
 * clusters are placed within a GPC, whose 32 block slots hold four
 * clusters of 7 or 8 but five of 6). A single row streams longer splits
 * and is slower; seven lost everywhere (NOTES.md). Changing it changes the
 * splits, so every row's bits. */
#define ATT_SPLITS 6
#define ATT_SPLIT_KEYS 64 /* keys per split at least */
#define ATT_MAXD 512
/* Below this many (row, head group) units the rows run split over a
 * cluster each; at and above it the rows alone fill the GPU. */
#define ATT_CLUSTER_UNITS 256

/* Keys per tile at most, and blocks of the cluster kernel a multiprocessor
 * must hold (att_split_minb): with 4 keys a tile (fewer registers) two
 * blocks fit where a lane holds at most 8 float4s of q (GP·NC <= 8: no
 * more than 64 bytes spilled), so a verify block's clusters (a cluster per
 * row and kv head) run in fewer waves (measurements in NOTES.md). TK sets
 * which keys a warp takes, so changing it changes every row's bits. */
#define ATT_TKMAX 4

/* Partials one merge adds at most (a row's splits, a block's warps): the
 * merge factors are [ATT_MERGE][GP], then L [GP]. */
#define ATT_MERGE (ATT_SPLITS > ATT_WARPS ? ATT_SPLITS : ATT_WARPS)

__host__ __device__ constexpr int att_min(int a, int b)
{
    return a < b ? a : b;
}

__host__ __device__ constexpr int att_split_minb(int gp, int nc)
{
    return gp * nc <= 8 ? 2 : 1;
}

/* Keys per tile from the head slots per block and the float4 chunks per
 * lane: GP·TK <= 32 score slots, TK·NC <= 16 key float4s in registers,
 * TK <= ATT_TKMAX. */
__host__ __device__ constexpr int att_tk(int gp, int nc)
{
    return att_min(ATT_TKMAX, att_min(32 / gp, 16 / nc));
}

__host__ __device__ constexpr int att_log2(int v)
{
    return v <= 1 ? 0 : 1 + att_log2(v / 2);
}

/* A partial result: o [GP][D], then m [GP], l [GP], padded to float4s. */
__host__ __device__ constexpr int att_psz(int gp, int d)
{
    return gp * d + ((2 * gp + 3) & ~3);
}

/* The work area: the warps' value tiles [ATT_WARPS][TK][D], later their
 * partials [ATT_WARPS][psz]. */
__host__ __device__ constexpr int att_work(int gp, int nc, int d)
{
    return ATT_WARPS * (att_tk(gp, nc) * d > att_psz(gp, d) ? att_tk(gp, nc) * d : att_psz(gp, d));
}

/* Shared memory of a block, in floats: q [GP][D], the work area, the
 * partials (1 in a cluster, one per split in a row kernel), merge factors
 * [ATT_MERGE][GP] and L [GP]. */
__host__ __device__ constexpr int att_smem_floats(int gp, int nc, int d, bool cluster)
{
    return gp * d + att_work(gp, nc, d) + (cluster ? 1 : ATT_SPLITS) * att_psz(gp, d) +
           (((ATT_MERGE + 1) * gp + 3) & ~3);
}

struct att_units {
    __device__ int operator()(const tdm_attn_seg &s) const
    {
        return s.nrows;
    }
};

/* The block's row: its cache rows for one kv head and its key count. */
typedef struct att_row {
    const float *k, *v;
    int row, nkeys;
} att_row;

/* Row unit u of the call (segments in order, rows in order). Every warp
 * runs it; false (for the whole block) past the last row. */
__device__ __forceinline__ bool att_find(const tdm_attn_seg *segs, int nseg, int u, int kh, int D,
                                         att_row *ar)
{
    int first;
    const int si = cuda_seg_find(segs, nseg, u, att_units(), &first);
    if (si < 0)
        return false;
    const tdm_attn_seg sg = segs[si];
    const int i = u - first;
    ar->row = sg.row0 + i;
    ar->nkeys = sg.n_past + i + 1;
    ar->k = sg.k_cache + (size_t)kh * (size_t)D;
    ar->v = sg.v_cache + (size_t)kh * (size_t)D;
    return true;
}

__device__ __forceinline__ int att_nsplit(int nkeys)
{
    return min(ATT_SPLITS, (nkeys + ATT_SPLIT_KEYS - 1) / ATT_SPLIT_KEYS);
}

__device__ __forceinline__ int att_split_begin(int nkeys, int ns, int s)
{
    return (int)((long long)nkeys * s / ns);
}

__device__ __forceinline__ void att_cp16(float *smem, const float *g)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
}

__device__ __forceinline__ float4 att_zero4(void)
{
    return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ float att_dot4(float4 a, float4 b, float s)
{
    s = fmaf(a.x, b.x, s);
    s = fmaf(a.y, b.y, s);
    s = fmaf(a.z, b.z, s);
    return fmaf(a.w, b.w, s);
}

__device__ __forceinline__ float4 att_scale4(float4 a, float c)
{
    return make_float4(__fmul_rn(a.x, c), __fmul_rn(a.y, c), __fmul_rn(a.z, c), __fmul_rn(a.w, c));
}

__device__ __forceinline__ float4 att_fma4(float p, float4 v, float4 o)
{
    return make_float4(fmaf(p, v.x, o.x), fmaf(p, v.y, o.y), fmaf(p, v.z, o.z), fmaf(p, v.w, o.w));
}

/* Sums S values per lane over the warp, S a power of two <= 32, in the
 * fixed lane-bit order 16, 8, 4, 2, 1 (one exchange per STEP): the first
 * log2(S) exchanges send half of the remaining values (lanes with the bit
 * set keep the upper half), the rest add whole. Lane l ends with the total
 * of slot l >> (5 - log2(S)) in a[0]. */
template <int S, int STEP = 0> __device__ __forceinline__ void att_reduce(float (&a)[S], int lane)
{
    if constexpr (STEP < 5) {
        constexpr int off = 16 >> STEP, n = S >> STEP;
        if constexpr (n > 1) {
            const bool up = (lane & off) != 0;
#pragma unroll
            for (int i = 0; i < n / 2; i++) {
                const float send = up ? a[i] : a[i + n / 2];
                const float keep = up ? a[i + n / 2] : a[i];
                a[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, off));
            }
        } else {
            a[0] = __fadd_rn(a[0], __shfl_xor_sync(0xffffffffu, a[0], off));
        }
        att_reduce<S, STEP + 1>(a, lane);
    }
}

/* One warp's online softmax over keys k0 + (warp + ATT_WARPS·t)·TK ... of
 * [k0, k1): o, m, l per head slot, o for the lane's float4 chunks. vb: the
 * warp's value tile, [TK][D] in shared memory. */
template <int GP, int NC>
__device__ __forceinline__ void att_warp(const float *qs, const float *kc, const float *vc,
                                         size_t kvw, int D, int k0, int k1, float scale, float *vb,
                                         float4 (&o)[GP][NC], float (&m)[GP], float (&l)[GP])
{
    constexpr int TK = att_tk(GP, NC), S = GP * TK, SH = 5 - att_log2(S);
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int slot = lane >> SH, hs = slot / TK, js = slot % TK;
    float4 q[GP][NC];
#pragma unroll
    for (int h = 0; h < GP; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = 4 * (lane + 32 * c);
            q[h][c] = d < D ? *(const float4 *)(qs + h * D + d) : att_zero4();
            o[h][c] = att_zero4();
        }
    }
    for (int j0 = k0 + warp * TK; j0 < k1; j0 += ATT_WARPS * TK) {
        const int nv = min(TK, k1 - j0);
#pragma unroll
        for (int j = 0; j < TK; j++)
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = 4 * (lane + 32 * c);
                if (j < nv && d < D)
                    att_cp16(vb + j * D + d, vc + (size_t)(j0 + j) * kvw + (size_t)d);
            }
        asm volatile("cp.async.commit_group;" ::: "memory");
        float4 kr[TK][NC];
#pragma unroll
        for (int j = 0; j < TK; j++)
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = 4 * (lane + 32 * c);
                kr[j][c] = j < nv && d < D
                               ? __ldg((const float4 *)(kc + (size_t)(j0 + j) * kvw + (size_t)d))
                               : att_zero4();
            }
        float a[S];
#pragma unroll
        for (int h = 0; h < GP; h++)
#pragma unroll
            for (int j = 0; j < TK; j++) {
                float s = 0.0f;
#pragma unroll
                for (int c = 0; c < NC; c++)
                    s = att_dot4(q[h][c], kr[j][c], s);
                a[h * TK + j] = s;
            }
        att_reduce<S>(a, lane);
        const float sc = js < nv ? __fmul_rn(a[0], scale) : -INFINITY;
        /* Tile maximum per head: over the lanes of its TK slots. */
        float tm = sc;
#pragma unroll
        for (int off = 1 << SH; off < (TK << SH); off <<= 1)
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, off));
        float cf[GP], mine = 0.0f;
#pragma unroll
        for (int h = 0; h < GP; h++) {
            const float mn = fmaxf(m[h], __shfl_sync(0xffffffffu, tm, (h * TK) << SH));
            cf[h] = expf(m[h] - mn); /* 0 on the first tile: m = -inf */
            m[h] = mn;
            if (h == hs)
                mine = mn;
        }
        const float p = expf(sc - mine); /* 0 for keys past k1 */
#pragma unroll
        for (int h = 0; h < GP; h++) {
            l[h] = __fmul_rn(l[h], cf[h]);
#pragma unroll
            for (int c = 0; c < NC; c++)
                o[h][c] = att_scale4(o[h][c], cf[h]);
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
        for (int j = 0; j < TK; j++) {
            if (j >= nv)
                break;
            float4 vv[NC];
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = 4 * (lane + 32 * c);
                vv[c] = d < D ? *(const float4 *)(vb + j * D + d) : att_zero4();
            }
#pragma unroll
            for (int h = 0; h < GP; h++) {
                const float pj = __shfl_sync(0xffffffffu, p, (h * TK + j) << SH);
                l[h] = __fadd_rn(l[h], pj);
#pragma unroll
                for (int c = 0; c < NC; c++)
                    o[h][c] = att_fma4(pj, vv[c], o[h][c]);
            }
        }
    }
}

/* Where a block's output goes: out (and gate) [R, nH, D] from element `at`,
 * the first of the block's heads in its row; xs: the output's bf16 parts for
 * the matmul that reads it next (matmul.cuh), or NULL. */
typedef struct att_out {
    float *out;
    const float *gate;
    uint32_t *xs;
    size_t at;
} att_out;

/* Merges n partials (part(i): o [GP][D], m [GP], l [GP]) in order i. The
 * result goes to dst as a partial, or, when dst is NULL, to the output:
 * out_h [D] = O / L for the first nh head slots (times sigmoid(gate_h) where
 * the gate is given), out_h at ao.at + h·D. All threads of the block call
 * it; it ends with a barrier. */
template <int GP, typename Part>
__device__ __forceinline__ void att_merge(Part part, int n, int D, float *fac, float *dst,
                                          const att_out &ao, int nh)
{
    const int t = (int)threadIdx.x, od = GP * D;
    if (t < GP) {
        float M = -INFINITY;
        for (int i = 0; i < n; i++)
            M = fmaxf(M, part(i)[od + t]);
        float L = 0.0f;
        for (int i = 0; i < n; i++) {
            const float *pi = part(i);
            const float c = expf(pi[od + t] - M); /* 0 for an empty partial */
            fac[i * GP + t] = c;
            L = fmaf(pi[od + GP + t], c, L);
        }
        fac[ATT_MERGE * GP + t] = L;
        if (dst) {
            dst[od + t] = M;
            dst[od + GP + t] = L;
        }
    }
    __syncthreads();
    if (dst) {
        for (int idx = t; idx < od; idx += ATT_THREADS) {
            const int h = idx / D;
            float O = 0.0f;
            for (int i = 0; i < n; i++)
                O = fmaf(part(i)[idx], fac[i * GP + h], O);
            dst[idx] = O;
        }
    } else {
        for (int i4 = 4 * t; i4 < nh * D; i4 += 4 * ATT_THREADS) {
            const int h = i4 / D; /* D % 4 == 0: the four share a head */
            const float rl = 1.0f / fac[ATT_MERGE * GP + h];
            float y[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float O = 0.0f;
                for (int i = 0; i < n; i++)
                    O = fmaf(part(i)[i4 + e], fac[i * GP + h], O);
                y[e] = __fmul_rn(O, rl);
                if (ao.gate)
                    y[e] = __fmul_rn(y[e], cuda_sigmoid(ao.gate[ao.at + (size_t)i4 + e]));
            }
            const float4 v = make_float4(y[0], y[1], y[2], y[3]);
            *(float4 *)(ao.out + ao.at + i4) = v;
            if (ao.xs)
                cuda_xs_put4(ao.xs, ao.at + (size_t)i4, v);
        }
    }
    __syncthreads();
}

/* The partial of keys [k0, k1) for the block's GP heads into dst (shared),
 * or, when dst is NULL (the row has one split), the output (ao). The
 * merge of a single partial is exact (c = 1, sums of one term), so writing
 * O / L here gives the bits a merge of one split would. */
template <int GP, int NC>
__device__ __forceinline__ void att_block_partial(const float *qs, const att_row &ar, size_t kvw,
                                                  int D, int k0, int k1, float scale, float *work,
                                                  float *fac, float *dst, const att_out &ao, int nh)
{
    constexpr int TK = att_tk(GP, NC);
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int psz = att_psz(GP, D);
    float4 o[GP][NC];
    float m[GP], l[GP];
    att_warp<GP, NC>(qs, ar.k, ar.v, kvw, D, k0, k1, scale, work + warp * TK * D, o, m, l);
    __syncthreads(); /* the value tiles are done with: work holds the warps' partials */
    float *wp = work + warp * psz;
#pragma unroll
    for (int h = 0; h < GP; h++) {
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = 4 * (lane + 32 * c);
            if (d < D)
                *(float4 *)(wp + h * D + d) = o[h][c];
        }
        if (lane == 0) {
            wp[GP * D + h] = m[h];
            wp[GP * D + GP + h] = l[h];
        }
    }
    __syncthreads();
    att_merge<GP>([=](int i) { return (const float *)(work + i * psz); }, ATT_WARPS, D, fac, dst,
                  ao, nh);
}

/* The block's query heads into qs [GP][D] (zeros for slots past the group). */
__device__ __forceinline__ void att_load_q(float *qs, const float *q, int row, int h0, int nh,
                                           int nH, int D, int gp)
{
    for (int i = (int)threadIdx.x; i < gp * D; i += ATT_THREADS) {
        const int h = i / D;
        qs[i] = h < nh
                    ? q[((size_t)row * (size_t)nH + (size_t)(h0 + h)) * (size_t)D + (size_t)(i % D)]
                    : 0.0f;
    }
    __syncthreads();
}

/* blockIdx.y: kv head and head group; the group's first head and count. */
__device__ __forceinline__ int att_heads(int nH, int nKV, int gp, int *kh, int *h0)
{
    const int G = nH / nKV, ng = (G + gp - 1) / gp, g = (int)blockIdx.y % ng;
    *kh = (int)blockIdx.y / ng;
    *h0 = *kh * G + g * gp;
    return min(gp, G - g * gp);
}

template <int GP, int NC>
__global__ void __cluster_dims__(ATT_SPLITS, 1, 1)
    __launch_bounds__(ATT_THREADS, att_split_minb(GP, NC))
        att_split_kernel(float *out, const float *gate, uint32_t *xs, const float *q,
                         const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D)
{
    cuda_kernel_begin();
    extern __shared__ float4 att_smem[];
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    int kh, h0;
    const int nh = att_heads(nH, nKV, GP, &kh, &h0);
    att_row ar;
    if (!att_find(segs, nseg, (int)blockIdx.x / ATT_SPLITS, kh, D, &ar))
        return; /* the whole cluster: same row */
    const int ns = att_nsplit(ar.nkeys);
    /* Blocks past the row's splits leave at once: a cluster barrier waits
     * for the threads that have not exited, and their multiprocessors take
     * other clusters' blocks meanwhile. */
    if (rank >= ns)
        return;
    float *qs = (float *)att_smem, *work = qs + GP * D;
    float *part = work + att_work(GP, NC, D), *fac = part + att_psz(GP, D);
    const size_t kvw = (size_t)nKV * (size_t)D;
    const att_out ao = {out, gate, xs, ((size_t)ar.row * (size_t)nH + (size_t)h0) * (size_t)D};
    att_load_q(qs, q, ar.row, h0, nh, nH, D, GP);
    att_block_partial<GP, NC>(qs, ar, kvw, D, att_split_begin(ar.nkeys, ns, rank),
                              att_split_begin(ar.nkeys, ns, rank + 1), 1.0f / sqrtf((float)D), work,
                              fac, ns == 1 ? (float *)NULL : part, ao, nh);
    if (ns == 1)
        return;
    cluster.sync(); /* every split's partial is in its block's shared memory */
    if (rank == 0)
        att_merge<GP>([&](int i) { return (const float *)cluster.map_shared_rank(part, i); }, ns, D,
                      fac, (float *)NULL, ao, nh);
    cluster.sync(); /* block 0 has read them: the others may exit */
}

template <int GP, int NC>
__global__ void __launch_bounds__(ATT_THREADS, 1)
    att_row_kernel(float *out, const float *gate, uint32_t *xs, const float *q,
                   const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D)
{
    cuda_kernel_begin();
    extern __shared__ float4 att_smem[];
    int kh, h0;
    const int nh = att_heads(nH, nKV, GP, &kh, &h0);
    att_row ar;
    if (!att_find(segs, nseg, (int)blockIdx.x, kh, D, &ar))
        return;
    const int ns = att_nsplit(ar.nkeys), psz = att_psz(GP, D);
    float *qs = (float *)att_smem, *work = qs + GP * D;
    float *parts = work + att_work(GP, NC, D), *fac = parts + ATT_SPLITS * psz;
    const size_t kvw = (size_t)nKV * (size_t)D;
    const att_out ao = {out, gate, xs, ((size_t)ar.row * (size_t)nH + (size_t)h0) * (size_t)D};
    att_load_q(qs, q, ar.row, h0, nh, nH, D, GP);
    for (int s = 0; s < ns; s++)
        att_block_partial<GP, NC>(qs, ar, kvw, D, att_split_begin(ar.nkeys, ns, s),
                                  att_split_begin(ar.nkeys, ns, s + 1), 1.0f / sqrtf((float)D),
                                  work, fac, ns == 1 ? (float *)NULL : parts + s * psz, ao, nh);
    if (ns > 1)
        att_merge<GP>([=](int i) { return (const float *)(parts + i * psz); }, ns, D, fac,
                      (float *)NULL, ao, nh);
}

/* Raises a kernel's dynamic shared memory limit to what its largest head
 * dim needs, once per device (the first call of a shape runs eagerly, never
 * inside a graph capture). */
template <bool CLUSTER, int GP, int NC>
static void att_prepare(void (*kernel)(float *, const float *, uint32_t *, const float *,
                                       const tdm_attn_seg *, int, int, int, int),
                        int device)
{
    static std::atomic<unsigned long long> done{0};
    const unsigned long long bit = device < 64 ? 1ull << device : 0;
    if (bit && (done.load() & bit))
        return;
    const size_t bytes = (size_t)att_smem_floats(GP, NC, 128 * NC, CLUSTER) * sizeof(float);
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    done.fetch_or(bit);
}

template <int GP, int NC>
static void att_launch(cuda_ctx *c, float *out, const float *gate, uint32_t *xs, const float *q,
                       const tdm_attn_seg *d, int nseg, int R, int nH, int nKV, int D)
{
    const int G = nH / nKV, ng = (G + GP - 1) / GP;
    const bool cluster = R * nKV * ng < ATT_CLUSTER_UNITS;
    const size_t smem = (size_t)att_smem_floats(GP, NC, D, cluster) * sizeof(float);
    if (cluster) {
        if (!c->replaying)
            att_prepare<true, GP, NC>(att_split_kernel<GP, NC>, c->device);
        const dim3 grid((unsigned)(ATT_SPLITS * R), (unsigned)(nKV * ng));
        cuda_launch(c, att_split_kernel<GP, NC>, grid, ATT_THREADS, smem, out, gate, xs, q, d, nseg,
                    nH, nKV, D);
    } else {
        if (!c->replaying)
            att_prepare<false, GP, NC>(att_row_kernel<GP, NC>, c->device);
        const dim3 grid((unsigned)R, (unsigned)(nKV * ng));
        cuda_launch(c, att_row_kernel<GP, NC>, grid, ATT_THREADS, smem, out, gate, xs, q, d, nseg,
                    nH, nKV, D);
    }
}

/* The kernel instance for the head shapes. */
static void att_dispatch(cuda_ctx *c, float *out, const float *gate, uint32_t *xs, const float *q,
                         const tdm_attn_seg *d, int nseg, int R, int nH, int nKV, int D)
{
    /* Head slots per block: the group size rounded up to a power of two,
     * at most 8, and at most 16 float4s of q per lane. */
    const int G = nH / nKV, nc = (D + 127) / 128 == 3 ? 4 : (D + 127) / 128;
    int gp = 1;
    while (gp < G && gp < 8 && gp * nc < 16)
        gp *= 2;
#define ATT_CASE(GP, NC)                                                                           \
    if (gp == GP && nc == NC)                                                                      \
        return att_launch<GP, NC>(c, out, gate, xs, q, d, nseg, R, nH, nKV, D);
    ATT_CASE(1, 1)
    ATT_CASE(2, 1)
    ATT_CASE(4, 1)
    ATT_CASE(8, 1)
    ATT_CASE(1, 2)
    ATT_CASE(2, 2)
    ATT_CASE(4, 2)
    ATT_CASE(8, 2)
    ATT_CASE(1, 4)
    ATT_CASE(2, 4)
#undef ATT_CASE
    TDM_ASSERT(gp == 4 && nc == 4); /* the only shape left */
    att_launch<4, 4>(c, out, gate, xs, q, d, nseg, R, nH, nKV, D);
}

/* Also writes the output's parts for the matmul that reads it next (o_proj),
 * where that matmul takes its R rows as parts. */
void cuda_attention(void *ctx, float *out, const float *q, const float *gate,
                    const tdm_attn_seg *segs, int nseg, int nH, int nKV, int D)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    TDM_ASSERT(D > 0 && D <= ATT_MAXD && D % 4 == 0 && nKV > 0 && nH % nKV == 0);
    TDM_ASSERT((uintptr_t)out % 16 == 0); /* written as float4s */
    int R = 0;
    for (int i = 0; i < nseg; i++) {
        R += segs[i].nrows;
        /* cache rows are read as float4s (cp.async, __ldg) */
        TDM_ASSERT(((uintptr_t)segs[i].k_cache | (uintptr_t)segs[i].v_cache) % 16 == 0);
    }
    if (R == 0 || nH == 0)
        return;
    const tdm_attn_seg *d =
        (const tdm_attn_seg *)cuda_stage(c, segs, (size_t)nseg * sizeof(tdm_attn_seg));
    const size_t n = (size_t)R * (size_t)nH * (size_t)D;
    uint32_t *xs = cuda_xs_rows(R) ? cuda_xs_target(c, n) : NULL;
    att_dispatch(c, out, gate, xs, q, d, nseg, R, nH, nKV, D);
    if (xs)
        cuda_xs_written(c, out, n, xs);
}
