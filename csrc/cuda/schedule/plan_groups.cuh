// The thread groups that run a balanced plan (balanced_items.cuh) together: one warp, when a main-kernel CTA plans
// its own item, or the planner kernel's whole CTA, whose warps each take a share of the batch (one sequence per
// thread up to its size), so the plan's passes over seq_lens run side by side instead of as one warp's chain of
// dependent loads and divisions (perf-log v15, v26, v27); a batch of up to 32 sequences keeps the warp, which needs
// no shared memory or barriers; the few-row kernels' range start for a batch of one sequence takes each thread
// alone, whose plan needs no communication.
// Every member of the group calls each function with the same arguments; results are the same in every thread and
// exact (integer sums and maxima), so all groups plan alike.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/common/device_primitives.cuh"

namespace mla::cuda {

// Each thread on its own: for a batch of one sequence, where a warp's reductions would only add latency (a chain of
// shuffles per sum) to what one thread computes. Only the reductions range_line uses.
struct ThreadGroup {
  __device__ __forceinline__ int rank() const { return 0; }
  __device__ __forceinline__ int size() const { return 1; }
  __device__ __forceinline__ int64_t sum(int64_t v) const { return v; }
  __device__ __forceinline__ int max(int v) const { return v; }
};

struct WarpGroup {
  __device__ __forceinline__ int rank() const { return threadIdx.x & 31; }
  __device__ __forceinline__ int size() const { return 32; }
  __device__ __forceinline__ int64_t sum(int64_t v) const { return warp_sum(v); }
  // Both components' shuffles interleaved, so the two trees overlap (two warp_sum calls compile to a different order).
  __device__ __forceinline__ int2 sum(int2 v) const {
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
      v.x += __shfl_xor_sync(0xffffffffu, v.x, off);
      v.y += __shfl_xor_sync(0xffffffffu, v.y, off);
    }
    return v;
  }
  __device__ __forceinline__ int max(int v) const {
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) v = ::max(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
  }
  // Inclusive prefix sums of both components in lane order; `total` gets the warp's sums.
  __device__ __forceinline__ int2 inclusive_sum(int2 v, int2& total) const {
    v = make_int2(warp_inclusive_sum(v.x), warp_inclusive_sum(v.y));
    total = make_int2(__shfl_sync(0xffffffffu, v.x, 31), __shfl_sync(0xffffffffu, v.y, 31));
    return v;
  }
};

// A one-dimensional CTA of whole warps (up to 32). Each reduction reduces within warps, gathers the warps' results
// through `slots` (shared memory, one entry per warp) into the lanes of every warp and reduces them there again; the
// barrier before the writes keeps a reduction from overwriting entries the previous one is still reading.
struct BlockGroup {
  int64_t (*slots)[2];  // [32][2] in shared memory

  __device__ __forceinline__ int rank() const { return threadIdx.x; }
  __device__ __forceinline__ int size() const { return blockDim.x; }

  __device__ __forceinline__ int64_t sum(int64_t v) const {
    return WarpGroup{}.sum(gather(WarpGroup{}.sum(v), 0, 0).x);
  }
  __device__ __forceinline__ int2 sum(int2 v) const {
    v = WarpGroup{}.sum(v);
    const longlong2 w = gather(v.x, v.y, 0);
    return WarpGroup{}.sum(make_int2(static_cast<int>(w.x), static_cast<int>(w.y)));
  }
  __device__ __forceinline__ int max(int v) const {
    return WarpGroup{}.max(static_cast<int>(gather(WarpGroup{}.max(v), 0, INT_MIN).x));
  }

  // Inclusive prefix sums of both components in thread order; `total` gets the whole group's sums.
  __device__ __forceinline__ int2 inclusive_sum(int2 v, int2& total) const {
    const int warp = threadIdx.x >> 5;
    int2 warp_total;
    v = WarpGroup{}.inclusive_sum(v, warp_total);
    // lane l scans warp l's total: the warps before this one give its offset, all of them the group's total
    const longlong2 w = gather(warp_total.x, warp_total.y, 0);
    const int2 warps_upto = WarpGroup{}.inclusive_sum(make_int2(static_cast<int>(w.x), static_cast<int>(w.y)), total);
    const int before_x = __shfl_sync(0xffffffffu, warps_upto.x, (warp + 31) & 31);
    const int before_y = __shfl_sync(0xffffffffu, warps_upto.y, (warp + 31) & 31);
    if (warp > 0) v.x += before_x, v.y += before_y;
    return v;
  }

 private:
  // Every warp passes its warp-wide (a, b); lane l of every warp gets warp l's, (pad, 0) past the last warp.
  __device__ __forceinline__ longlong2 gather(int64_t a, int64_t b, int64_t pad) const {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) slots[warp][0] = a, slots[warp][1] = b;
    __syncthreads();
    return lane < warps ? make_longlong2(slots[lane][0], slots[lane][1]) : make_longlong2(pad, 0);
  }
};

}  // namespace mla::cuda
