/*
 * sample.cu - argmax, softmax and sampling over rows of logits (a vocabulary of
 * ~250k values is 1 MB a row, too much for one SM to stream quickly).
 *
 * A row is cut into SAMPLE_SPLITS contiguous slices, slice s starting at
 * s·n/SAMPLE_SPLITS, each worked by one block of a thread-block cluster;
 * the blocks combine their results through distributed shared memory, in
 * rank order, so no scratch memory is needed and the order depends on n
 * alone: a row's bits never depend on R.
 *  - argmax keeps the first index among equal maxima, as the CPU backend
 *    does (NaN is never better, and every thread starts from element 0, as
 *    the CPU's scan does); only its [R] result crosses to the host.
 *  - softmax: the row maximum (exact in any order), then exp(x - max) and
 *    the slices' sums, added in rank order by every block, then the
 *    division. Sums per slice: per thread, per warp, warps in order.
 */
#include "sample.cuh"

#include <cooperative_groups.h>

#include <limits.h>
#include <math.h>

namespace cg = cooperative_groups;

#define SAMPLE_THREADS 1024
#define SAMPLE_SPLITS 8

/* (value, index) with "better" = larger value, then smaller index. NaN is
 * never better, like `x > best` on the CPU. */
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ int sample_begin(int n, int s)
{
    return (int)((long long)n * s / SAMPLE_SPLITS);
}

/* The argmax of row xr [n] to *out, or map[argmax] when map is given, by
 * the whole cluster (the result is written by rank 0). Ends with a cluster
 * barrier. */
__device__ void argmax_row(cg::cluster_group &cluster, const float *xr, int n, int32_t *out,
                           const int32_t *map)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const int rank = (int)cluster.block_rank();
    const int end = sample_begin(n, rank + 1);
    float bv = xr[0];
    int bi = 0;
    for (int i = sample_begin(n, rank) + (int)threadIdx.x; i < end; i += SAMPLE_THREADS)
        if (am_better(xr[i], i, bv, bi))
            bv = xr[i], bi = i;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi))
            bv = ov, bi = oi;
    }
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SAMPLE_THREADS / 32; w++)
            if (am_better(sv[w], si[w], bv, bi))
                bv = sv[w], bi = si[w];
        sv[0] = bv;
        si[0] = bi;
    }
    cluster.sync(); /* every slice's best is in sv[0], si[0] of its block */
    if (rank == 0 && threadIdx.x == 0) {
        for (int r = 1; r < SAMPLE_SPLITS; r++) {
            const float v = *cluster.map_shared_rank(&sv[0], r);
            const int i = *cluster.map_shared_rank(&si[0], r);
            if (am_better(v, i, bv, bi))
                bv = v, bi = i;
        }
        *out = map ? map[bi] : bi;
    }
    cluster.sync(); /* block 0 has read them: the others may exit */
}

__global__ void __cluster_dims__(SAMPLE_SPLITS, 1, 1) __launch_bounds__(SAMPLE_THREADS)
    argmax_kernel(int32_t *out, const float *x, int n)
{
    cuda_kernel_begin();
    cg::cluster_group cluster = cg::this_cluster();
    argmax_row(cluster, x + (size_t)blockIdx.y * (size_t)n, n, &out[blockIdx.y], NULL);
}

/* argmax_to: block row i of the grid takes row rows[i] of x. */
__global__ void __cluster_dims__(SAMPLE_SPLITS, 1, 1) __launch_bounds__(SAMPLE_THREADS)
    argmax_to_kernel(int32_t *out, const float *x, const int32_t *rows, int n, const int32_t *map)
{
    cuda_kernel_begin();
    cg::cluster_group cluster = cg::this_cluster();
    argmax_row(cluster, x + (size_t)rows[blockIdx.y] * (size_t)n, n, &out[blockIdx.y], map);
}

void cuda_argmax_to(void *ctx, int32_t *out, const float *x, const int32_t *rows, int nrows, int n,
                    const int32_t *map)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (nrows <= 0 || n <= 0)
        return;
    const int32_t *drows = (const int32_t *)cuda_stage(c, rows, (size_t)nrows * sizeof(int32_t));
    cuda_launch(c, argmax_to_kernel, dim3(SAMPLE_SPLITS, (unsigned)nrows), SAMPLE_THREADS, 0, out,
                x, drows, n, map);
}

/* Device memory for the [R] token ids of an argmax or sample call, grown on
 * demand (both calls wait for their result, so nothing still uses it). */
static int32_t *sample_ids(cuda_ctx *c, int R)
{
    if (R > c->argmax_cap) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        CUDA_CHECK(cudaFree(c->argmax_dev));
        c->argmax_dev = NULL;
        CUDA_CHECK(cuda_malloc(c, (void **)&c->argmax_dev, (size_t)R * sizeof(int32_t)));
        c->argmax_cap = R;
    }
    return c->argmax_dev;
}

void cuda_argmax(void *ctx, int32_t *out, const float *x, int R, int n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || n <= 0)
        return;
    int32_t *ids = sample_ids(c, R);
    cuda_launch(c, argmax_kernel, dim3(SAMPLE_SPLITS, (unsigned)R), SAMPLE_THREADS, 0, ids, x, n);
    CUDA_CHECK(
        cudaMemcpyAsync(out, ids, (size_t)R * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

/* Every block reads the SAMPLE_SPLITS values v of the cluster in rank order. */
__device__ __forceinline__ float sample_all_max(cg::cluster_group &cluster, float *v)
{
    float m = *cluster.map_shared_rank(v, 0);
    for (int r = 1; r < SAMPLE_SPLITS; r++)
        m = fmaxf(m, *cluster.map_shared_rank(v, r));
    return m;
}

__device__ __forceinline__ float sample_all_sum(cg::cluster_group &cluster, float *v)
{
    float s = 0.0f;
    for (int r = 0; r < SAMPLE_SPLITS; r++)
        s += *cluster.map_shared_rank(v, r);
    return s;
}

__global__ void __cluster_dims__(SAMPLE_SPLITS, 1, 1) __launch_bounds__(SAMPLE_THREADS)
    softmax_kernel(float *x, int n)
{
    cuda_kernel_begin();
    __shared__ float scratch[33];
    __shared__ float part[2]; /* the slice's max, then its sum */
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    float *xr = x + (size_t)blockIdx.y * (size_t)n;
    const int b = sample_begin(n, rank) + (int)threadIdx.x, end = sample_begin(n, rank + 1);
    float mx = -INFINITY;
    for (int i = b; i < end; i += SAMPLE_THREADS)
        mx = fmaxf(mx, xr[i]);
    mx = cuda_block_max(mx, scratch);
    if (threadIdx.x == 0)
        part[0] = mx;
    cluster.sync();
    mx = sample_all_max(cluster, &part[0]);
    float sum = 0.0f;
    for (int i = b; i < end; i += SAMPLE_THREADS) {
        const float e = expf(xr[i] - mx);
        xr[i] = e;
        sum += e;
    }
    sum = cuda_block_sum(sum, scratch);
    if (threadIdx.x == 0)
        part[1] = sum;
    cluster.sync();
    sum = sample_all_sum(cluster, &part[1]);
    for (int i = b; i < end; i += SAMPLE_THREADS)
        xr[i] /= sum;
    cluster.sync(); /* every block has read the others' sums: they may exit */
}

void cuda_softmax(void *ctx, float *x, int R, int n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || n <= 0)
        return;
    cuda_launch(c, softmax_kernel, dim3(SAMPLE_SPLITS, (unsigned)R), SAMPLE_THREADS, 0, x, n);
}

/* ---- sample -----------------------------------------------------------------
 * One cluster per row, as above; spec/sampling.c's arithmetic wherever it
 * decides a bit of the result:
 *  1. the row max; e = exp((x - max) / T) in double, rounded to float, the
 *     normaliser summed in double; p = (float)(e / sum). The slice of p
 *     stays in shared memory (in global scratch when a slice is too long).
 *  2. With top-k or top-p, the support is the first S tokens of the order
 *     "descending p, ascending id", S the first prefix length that reaches
 *     k tokens or a mass of top_p. A radix select on the float bits of p
 *     (8 bits a level, most significant first) finds the S-th token without
 *     sorting: each level's histogram counts the tokens and their mass in
 *     every bucket of the undecided bits, and the first bucket (from the
 *     top) where the count or the mass is reached holds it. The mass is in
 *     2^-62 fixed point, so the histograms' atomic adds are exact and
 *     deterministic; it differs from the reference's double sums by less
 *     than 1e-13. Tokens equal to the S-th one enter in id order (found by
 *     a prefix count when only some of them are in). The kept mass is then
 *     summed in double and the support renormalised as the reference does.
 *  3. The draw: the first token whose running sum (in index order) exceeds
 *     u. Each thread sums a contiguous run of tokens, a scan over threads
 *     and blocks gives where each run starts, and the first run whose end
 *     exceeds u is searched with the very additions that gave its total.
 * Sums in double follow a fixed tree (per thread, per warp, warps then
 * blocks in order), so a row's result depends on n and its own inputs only.
 * Where that tree differs from the reference's sequential sums the draw
 * may differ when u is within ~1e-12 of a cumulative boundary. */

#define DRAW_ALL 0xffffffffu

/* p in 2^-62 fixed point (truncated): sums of p <= ~1 stay below 2^63. */
__device__ __forceinline__ unsigned long long draw_mass(float p)
{
    return (unsigned long long)(p * 0x1p62f);
}

__device__ __forceinline__ double draw_block_sum(double v, double *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(DRAW_ALL, v, o);
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int i = 0; i < nw; i++)
            s += scratch[i];
        scratch[32] = s;
    }
    __syncthreads();
    return scratch[32];
}

/* Exclusive scan over the block in thread order; *total gets the sum.
 * scratch: shared [33]. */
template <typename T> __device__ T draw_block_scan(T v, T *scratch, T *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    T incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(DRAW_ALL, incl, o);
        if (lane >= o)
            incl += y;
    }
    T ex = __shfl_up_sync(DRAW_ALL, incl, 1);
    if (lane == 0)
        ex = 0;
    __syncthreads();
    if (lane == 31)
        scratch[warp] = incl;
    __syncthreads();
    if (threadIdx.x == 0) {
        T run = 0;
        for (int w = 0; w < nw; w++) {
            const T t = scratch[w];
            scratch[w] = run;
            run += t;
        }
        scratch[32] = run;
    }
    __syncthreads();
    *total = scratch[32];
    return scratch[warp] + ex;
}

/* Minimum (or maximum) over the block. scratch: shared [33]. */
__device__ __forceinline__ int draw_block_minmax(int v, int *scratch, bool want_max)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = want_max ? __reduce_max_sync(DRAW_ALL, v) : __reduce_min_sync(DRAW_ALL, v);
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int m = scratch[0];
        for (int i = 1; i < nw; i++)
            m = want_max ? (scratch[i] > m ? scratch[i] : m) : (scratch[i] < m ? scratch[i] : m);
        scratch[32] = m;
    }
    __syncthreads();
    return scratch[32];
}

/* A block's shared state. Each value that other blocks of the cluster read
 * has a slot of its own, written once, so no block overwrites what a slower
 * one has yet to read; the histograms alternate between two buffers, and a
 * buffer is cleared only after the barrier that follows the last reads of it. */
struct draw_smem {
    unsigned long long mass[2][256];  /* this slice's histograms */
    unsigned long long tot_mass[256]; /* the cluster's, summed by every block */
    unsigned long long above_mass;    /* with prefix, above_cnt, bcnt: a level's decision */
    double dscratch[33];
    double sum_part, kept_part, draw_part;
    unsigned cnt[2][256];
    unsigned tot_cnt[256];
    unsigned prefix, above_cnt, bcnt;
    int iscratch[33];
    float fscratch[33];
    float max_part;
    int tie_part, tie_found, draw_found, draw_last;
};

/* The level's decision (warp 0): the first bucket from the top whose
 * running count reaches keep or running mass reaches P, over the cluster's
 * histogram in tot_*. */
__device__ void draw_decide(draw_smem &sm, int shift, unsigned keep, unsigned long long P)
{
    const int lane = threadIdx.x & 31;
    unsigned lc = 0;
    unsigned long long lm = 0;
    for (int q = 0; q < 8; q++) {
        const int d = 255 - 8 * lane - q;
        lc += sm.tot_cnt[d];
        lm += sm.tot_mass[d];
    }
    unsigned ic = lc;
    unsigned long long im = lm;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned yc = __shfl_up_sync(DRAW_ALL, ic, o);
        const unsigned long long ym = __shfl_up_sync(DRAW_ALL, im, o);
        if (lane >= o) {
            ic += yc;
            im += ym;
        }
    }
    unsigned c = sm.above_cnt + (ic - lc);
    unsigned long long m = sm.above_mass + (im - lm);
    int hit = -1;
    for (int q = 0; q < 8 && hit < 0; q++) {
        const int d = 255 - 8 * lane - q;
        const unsigned c2 = c + sm.tot_cnt[d];
        const unsigned long long m2 = m + sm.tot_mass[d];
        if (c2 >= keep || m2 >= P)
            hit = d;
        else
            c = c2, m = m2;
    }
    /* Some bucket reaches it: the chosen bucket of the level above did,
     * and its tokens are exactly this level's. */
    const unsigned ball = __ballot_sync(DRAW_ALL, hit >= 0);
    if (lane == __ffs(ball) - 1) {
        sm.prefix |= (unsigned)hit << shift;
        sm.above_cnt = c;
        sm.above_mass = m;
        sm.bcnt = sm.tot_cnt[hit];
    }
}

__global__ void __cluster_dims__(SAMPLE_SPLITS, 1, 1) __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(int32_t *out, const float *x, int n, const tdm_sample_row *rows, float *spill,
                  const int32_t *xrows, const int32_t *map)
{
    cuda_kernel_begin();
    extern __shared__ float draw_dyn[];
    __shared__ draw_smem sm;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank(), tid = (int)threadIdx.x;
    const tdm_sample_row s = rows[blockIdx.y];
    const float *xr = x + (size_t)(xrows ? xrows[blockIdx.y] : (int)blockIdx.y) * (size_t)n;
    if (!(s.temperature > 0.0f) || s.top_k == 1) {
        argmax_row(cluster, xr, n, &out[blockIdx.y], map);
        return;
    }
    const int b0 = sample_begin(n, rank), len = sample_begin(n, rank + 1) - b0;
    float *buf = spill ? spill + (size_t)blockIdx.y * (size_t)n + b0 : draw_dyn; /* [len] */
    /* Runs of contiguous tokens per thread, for the passes in index order. */
    const int run = (len + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int j0 = min(len, tid * run), j1 = min(len, j0 + run);

    /* 1. Probabilities. */
    float mx = -INFINITY;
    for (int j = tid; j < len; j += SAMPLE_THREADS) {
        const float v = xr[b0 + j];
        buf[j] = v;
        mx = fmaxf(mx, v);
    }
    mx = cuda_block_max(mx, sm.fscratch);
    if (tid == 0)
        sm.max_part = mx;
    cluster.sync();
    mx = sample_all_max(cluster, &sm.max_part);
    const double inv_t = 1.0 / (double)s.temperature;
    double sum = 0.0;
    for (int j = tid; j < len; j += SAMPLE_THREADS) {
        const double e = exp(((double)buf[j] - (double)mx) * inv_t);
        buf[j] = (float)e;
        sum += e;
    }
    sum = draw_block_sum(sum, sm.dscratch);
    if (tid == 0)
        sm.sum_part = sum;
    cluster.sync();
    sum = 0.0;
    for (int r = 0; r < SAMPLE_SPLITS; r++)
        sum += *cluster.map_shared_rank(&sm.sum_part, r);
    for (int j = tid; j < len; j += SAMPLE_THREADS)
        buf[j] = (float)((double)buf[j] / sum);

    /* 2. The support: tokens with key >= kmin, and those with key == keq
     * up to id tcut. */
    const bool use_k = s.top_k > 0 && s.top_k < (uint32_t)n;
    const bool use_p = s.top_p > 0.0f && s.top_p < 1.0f;
    const bool cut = use_k || use_p;
    unsigned kmin = 0, keq = 0;
    int tcut = -1;
    if (cut) {
        const unsigned keep = use_k ? s.top_k : (unsigned)n;
        const unsigned long long P = use_p ? draw_mass(s.top_p) : ~0ull;
        if (tid == 0) {
            sm.prefix = 0;
            sm.above_cnt = 0;
            sm.above_mass = 0;
        }
        bool whole = false; /* the S-th token ends its bucket */
        for (int level = 0; level < 4 && !whole; level++) {
            const int shift = 24 - 8 * level;
            unsigned *hc = sm.cnt[level & 1];
            unsigned long long *hm = sm.mass[level & 1];
            for (int d = tid; d < 256; d += SAMPLE_THREADS)
                hc[d] = 0, hm[d] = 0;
            __syncthreads();
            const unsigned prefix = sm.prefix;
            /* A thread adds a run of equal digits at once: flat or tied rows
             * would otherwise serialise every add on one bucket. */
            int cd = -1;
            unsigned cc = 0;
            unsigned long long cm = 0;
            for (int j = tid; j < len; j += SAMPLE_THREADS) {
                const unsigned key = __float_as_uint(buf[j]);
                if (level > 0 && (key >> (shift + 8)) != (prefix >> (shift + 8)))
                    continue;
                const int d = (int)((key >> shift) & 255u);
                if (d != cd) {
                    if (cc) {
                        atomicAdd(&hc[cd], cc);
                        atomicAdd(&hm[cd], cm);
                    }
                    cd = d, cc = 0, cm = 0;
                }
                cc++;
                cm += draw_mass(buf[j]);
            }
            if (cc) {
                atomicAdd(&hc[cd], cc);
                atomicAdd(&hm[cd], cm);
            }
            cluster.sync();
            for (int d = tid; d < 256; d += SAMPLE_THREADS) {
                unsigned tc = 0;
                unsigned long long tm = 0;
                for (int r = 0; r < SAMPLE_SPLITS; r++) {
                    tc += *cluster.map_shared_rank(&hc[d], r);
                    tm += *cluster.map_shared_rank(&hm[d], r);
                }
                sm.tot_cnt[d] = tc;
                sm.tot_mass[d] = tm;
            }
            __syncthreads();
            if (tid < 32)
                draw_decide(sm, shift, keep, P);
            __syncthreads();
            /* The whole bucket is in when it is one token, or when the count
             * is reached at its end and the mass is not reached in it. */
            const unsigned long long bmass = sm.tot_mass[(sm.prefix >> shift) & 255u];
            whole = sm.bcnt == 1 || (sm.above_cnt + sm.bcnt == keep && sm.above_mass + bmass < P);
        }
        kmin = sm.prefix;
        if (!whole) {
            /* All 32 bits decided: bcnt tokens equal the S-th; take the
             * first `take` of them in id order. */
            const unsigned long long v = draw_mass(__uint_as_float(sm.prefix));
            unsigned take = sm.bcnt;
            if (use_k && keep - sm.above_cnt < take)
                take = keep - sm.above_cnt;
            if (use_p && v > 0) {
                const unsigned long long need = (P - sm.above_mass + v - 1) / v;
                if (need < take)
                    take = (unsigned)need;
            }
            if (take < sm.bcnt) {
                keq = sm.prefix;
                kmin = keq + 1;
                int ce = 0, total;
                for (int j = j0; j < j1; j++)
                    ce += __float_as_uint(buf[j]) == keq;
                const int ex = draw_block_scan(ce, sm.iscratch, &total);
                if (tid == 0) {
                    sm.tie_part = total;
                    sm.tie_found = INT_MAX;
                }
                cluster.sync();
                int off = 0;
                for (int r = 0; r < rank; r++)
                    off += *cluster.map_shared_rank(&sm.tie_part, r);
                int k = (int)take - off - ex; /* the k-th equal token of this run */
                if (k >= 1 && k <= ce)
                    for (int j = j0; j < j1; j++)
                        if (__float_as_uint(buf[j]) == keq && --k == 0) {
                            sm.tie_found = b0 + j;
                            break;
                        }
                cluster.sync();
                tcut = INT_MAX;
                for (int r = 0; r < SAMPLE_SPLITS; r++)
                    tcut = min(tcut, *cluster.map_shared_rank(&sm.tie_found, r));
            }
        }
    }
    auto member = [=](unsigned key, int i) { return key >= kmin || (key == keq && i <= tcut); };
    double kept = 1.0;
    if (cut) {
        double k = 0.0;
        for (int j = tid; j < len; j += SAMPLE_THREADS) {
            const unsigned key = __float_as_uint(buf[j]);
            if (member(key, b0 + j))
                k += buf[j];
        }
        k = draw_block_sum(k, sm.dscratch);
        if (tid == 0)
            sm.kept_part = k;
        cluster.sync();
        kept = 0.0;
        for (int r = 0; r < SAMPLE_SPLITS; r++)
            kept += *cluster.map_shared_rank(&sm.kept_part, r);
    }

    /* 3. The draw, over runs of contiguous tokens that other threads wrote. */
    __syncthreads();
    double tsum = 0.0;
    int last = -1;
    for (int j = j0; j < j1; j++) {
        float q = buf[j];
        if (cut) {
            const unsigned key = __float_as_uint(q);
            q = member(key, b0 + j) ? (float)((double)q / kept) : 0.0f;
            buf[j] = q;
        }
        if (q > 0.0f) {
            tsum += q;
            last = b0 + j;
        }
    }
    double btotal;
    const double ex = draw_block_scan(tsum, sm.dscratch, &btotal);
    last = draw_block_minmax(last, sm.iscratch, true);
    if (tid == 0) {
        sm.draw_part = btotal;
        sm.draw_last = last;
        sm.draw_found = INT_MAX;
    }
    cluster.sync();
    double base = 0.0;
    for (int r = 0; r < rank; r++)
        base += *cluster.map_shared_rank(&sm.draw_part, r);
    base += ex;
    const bool cand = tsum > 0.0 && s.u < base + tsum;
    if (draw_block_minmax(cand ? tid : INT_MAX, sm.iscratch, false) == tid) {
        double loc = 0.0;
        for (int j = j0; j < j1; j++) {
            const float q = buf[j];
            if (q > 0.0f) {
                loc += q;
                if (s.u < base + loc) {
                    sm.draw_found = b0 + j;
                    break;
                }
            }
        }
    }
    cluster.sync();
    if (rank == 0 && tid == 0) {
        int first = INT_MAX, lastall = -1;
        for (int r = 0; r < SAMPLE_SPLITS; r++) {
            first = min(first, *cluster.map_shared_rank(&sm.draw_found, r));
            lastall = max(lastall, *cluster.map_shared_rank(&sm.draw_last, r));
        }
        /* No run exceeds u: rounding left it above the total mass, and the
         * reference then takes the last token in the support. */
        const int t = first != INT_MAX ? first : (lastall >= 0 ? lastall : 0);
        out[blockIdx.y] = map ? map[t] : t;
    }
    cluster.sync(); /* block 0 has read the others' results: they may exit */
}

void cuda_sample(void *ctx, int32_t *out, const float *x, int R, int n, const tdm_sample_row *rows)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || n <= 0)
        return;
    int32_t *ids = sample_ids(c, R);
    const tdm_sample_row *drows =
        (const tdm_sample_row *)cuda_stage(c, rows, (size_t)R * sizeof(tdm_sample_row));
    /* A slice of probabilities in shared memory when it fits beside the
     * kernel's own, else in scratch of [R, n]. */
    const size_t slice = ((size_t)n + SAMPLE_SPLITS - 1) / SAMPLE_SPLITS * sizeof(float);
    cudaFuncAttributes fa;
    CUDA_CHECK(cudaFuncGetAttributes(&fa, sample_kernel));
    size_t smem = 0;
    float *spill = NULL;
    if (fa.sharedSizeBytes + slice <= (size_t)c->smem_optin) {
        smem = slice;
        CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
    } else {
        const size_t need = (size_t)R * (size_t)n;
        if (need > c->sample_spill_cap) {
            CUDA_CHECK(cudaStreamSynchronize(c->stream));
            CUDA_CHECK(cudaFree(c->sample_spill));
            c->sample_spill = NULL;
            CUDA_CHECK(cuda_malloc(c, (void **)&c->sample_spill, need * sizeof(float)));
            c->sample_spill_cap = need;
        }
        spill = c->sample_spill;
    }
    cuda_launch(c, sample_kernel, dim3(SAMPLE_SPLITS, (unsigned)R), SAMPLE_THREADS, smem, ids, x, n,
                drows, spill, (const int32_t *)NULL, (const int32_t *)NULL);
    CUDA_CHECK(
        cudaMemcpyAsync(out, ids, (size_t)R * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

/* The rows' probabilities are worked out in probs itself (the spill of
 * cuda_sample's kernel), where the caller (a drafter's chain, a verify
 * step's probs_of) finds the distribution each token was drawn from. */
void cuda_sample_to(void *ctx, int32_t *out, float *probs, const float *x, const int32_t *rows,
                    int nrows, int n, const int32_t *map, const tdm_sample_row *srows)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (nrows <= 0 || n <= 0)
        return;
    const int32_t *drows = (const int32_t *)cuda_stage(c, rows, (size_t)nrows * sizeof(int32_t));
    const tdm_sample_row *dsrows =
        (const tdm_sample_row *)cuda_stage(c, srows, (size_t)nrows * sizeof(tdm_sample_row));
    cuda_launch(c, sample_kernel, dim3(SAMPLE_SPLITS, (unsigned)nrows), SAMPLE_THREADS, 0, out, x,
                n, dsrows, probs, drows, map);
}
