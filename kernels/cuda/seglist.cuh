/*
 * seglist.cuh - which segment a block works on.
 *
 * The ops over segments (conv, attention) stage the caller's segment array
 * as it is (backend.h's tdm_*_seg: row ranges, n_past, state and cache
 * pointers), so the host does no per-row work and stages a size fixed by
 * nseg. Each block then finds its segment on the device: segment i holds
 * units(segs[i]) consecutive work units (rows, chunks of rows), segments in
 * array order, and the block's unit number says which one it is. A warp
 * reads 32 segments at a time and prefix-sums their unit counts with
 * shuffles: one round trip to the staged list for up to 32 segments.
 */
#ifndef TANDEM_KERNELS_CUDA_SEGLIST_CUH
#define TANDEM_KERNELS_CUDA_SEGLIST_CUH

#include "common.cuh"

/* The segment holding unit u (-1 when u is past the last unit); *first gets
 * that segment's first unit. Called by all 32 lanes of a warp, which all get
 * the answer. */
template <typename Seg, typename Units>
__device__ __forceinline__ int cuda_seg_find(const Seg *segs, int nseg, int u, Units units,
                                             int *first)
{
    const int lane = threadIdx.x & 31;
    int base = 0;
    for (int s0 = 0; s0 < nseg; s0 += 32) {
        const int s = s0 + lane;
        const int n = s < nseg ? units(segs[s]) : 0;
        int incl = n;
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += t;
        }
        const int excl = incl - n;
        const unsigned hit = __ballot_sync(0xffffffffu, u >= base + excl && u < base + incl);
        if (hit) {
            const int l = __ffs(hit) - 1;
            *first = base + __shfl_sync(0xffffffffu, excl, l);
            return s0 + l;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    *first = base;
    return -1;
}

#endif
