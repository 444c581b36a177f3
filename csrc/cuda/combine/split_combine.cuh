// The split-KV combine: many pieces of one query row -> out, lse. Each piece is weighted by exp(lse_piece - max), and
// the values of a piece whose lse is -inf are never read (an empty piece writes only its lse), so 0 * garbage never
// happens. merge_states.cuh merges two states the same way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/schedule/split_table.cuh"
#include "params.h"

namespace mla::cuda {

constexpr int kCombineColumns = 128;                        // output columns per unit: 32 lanes x float4
constexpr int kCombineChunks = kHeadDim / kCombineColumns;  // units per query row
constexpr int kCombineMaxWarps = 16;                        // warps per CTA
constexpr int kCombineBatch = 8;                            // splits whose loads a warp keeps in flight at once

// Maximum that keeps NaN (fmaxf drops it): a split that saw a non-finite key makes the whole row NaN.
__device__ __forceinline__ float max_keep_nan(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}

// The warp's maximum (keeping NaN), in every lane.
__device__ __forceinline__ float warp_max_keep_nan(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = max_keep_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

template <typename T>
__device__ __forceinline__ void store4(T* dst, float a, float b, float c, float d) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
  } else {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(a, b), pack2<T>(c, d));
  }
}

// Adds the partial sums of warps 1 .. kGroups - 1 of a unit (slots first_slot + g) to warp 0's, in warp order. The
// loads go out in batches before the adds: small batches wait on this kernel after the main one, and a chain of
// dependent shared-memory loads was a visible part of it (perf-log v16).
template <int kGroups>
__device__ __forceinline__ void add_warp_partials(float4& acc, float& weight_sum, const float4 (*part_acc)[32],
                                                  const float* part_sum, int first_slot, int lane) {
#pragma unroll
  for (int g0 = 1; g0 < kGroups; g0 += kCombineBatch) {
    float4 v[kCombineBatch];
    float w[kCombineBatch];
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) {  // the bounds fold away once the loops are unrolled
      if (g0 + i < kGroups) {
        v[i] = part_acc[first_slot + g0 + i][lane];
        w[i] = part_sum[first_slot + g0 + i];
      }
    }
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) {
      if (g0 + i < kGroups) {
        acc.x += v[i].x;
        acc.y += v[i].y;
        acc.z += v[i].z;
        acc.w += v[i].w;
        weight_sum += w[i];
      }
    }
  }
}

// Warps per unit for `splits` pieces: the power of two that sums them in one batch each, up to 16. The launcher
// sizes the fixed-count kernel with it, the per-sequence kernel each sequence.
__host__ __device__ constexpr int combine_warps_for(int64_t splits) {
  int groups = 1;
  while (groups < kCombineMaxWarps && groups * kCombineBatch < splits) groups *= 2;
  return groups;
}

// A unit is (query row of the batch, 128-column chunk) and the splits it merges: split s has its lse at
// lse_partial[lse_first + s * lse_stride] and its values at kHeadDim times that offset.
struct CombineUnit {
  bool active;  // false for the overhang of the last CTA and for sequences with one split
  int batch_index, row, chunk;
  int num_splits;
  int64_t lse_first, lse_stride;
};

// A balanced call's unit: its sequence's pieces are slots first .. first + count - 1 of split_table's row, rows
// apart in the partials.
__device__ __forceinline__ void read_sequence_splits(const DecodeParams& p, int rows, CombineUnit& u) {
  u.num_splits = sequence_pieces(p, u.batch_index);
  u.lse_first = static_cast<int64_t>(sequence_first_slot(p, u.batch_index)) * rows + u.row;
  u.lse_stride = rows;
}

// Merges one unit with G = groups warps at consecutive CTA slots (this one is warp `group` of them, at `warp_slot`):
// warp g sums splits g, g + G, ... in batches of kCombineBatch independent loads, and the G partial sums are added
// in warp order, so the result is deterministic. With G > 1 every warp finds the row's maximum lse itself (no
// barrier and no exchange before the sums) and the CTA meets at one barrier, so `groups` must be the same for every
// warp of the CTA. kEarlyFirstBatch: the first batch's loads go out before the maximum's, as they do not depend on
// it, so a unit of at most kCombineBatch splits per warp waits on one round trip to L2 instead of two (perf-log
// v49: 0.35 us of the fixed-count kernel's 4.3; the per-sequence kernel spills with it and measured slower).
template <typename T, bool kEarlyFirstBatch>
__device__ __forceinline__ void combine_unit(const DecodeParams& p, const CombineUnit& u, int group, int groups,
                                             int warp_slot, int lane, float4 (*part_acc)[32], float* part_sum) {
  const bool active = u.active;
  const int num_splits = u.num_splits;
  const int64_t lse_first = u.lse_first, lse_stride = u.lse_stride;
  const float* lse_row = p.lse_partial + lse_first;
  const int64_t values_stride = lse_stride * kHeadDim;
  const float* values = p.out_partial + lse_first * kHeadDim + u.chunk * kCombineColumns + lane * 4;

  float l[kCombineBatch];
  float4 v[kCombineBatch];
  auto load_batch = [&](int s0) {  // all loads first: independent, so they overlap
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) {
      const int s = s0 + i * groups;
      l[i] = kNegInf;
      v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s < num_splits) {
        l[i] = lse_row[s * lse_stride];
        v[i] = *reinterpret_cast<const float4*>(values + s * values_stride);
      }
    }
  };
  if (kEarlyFirstBatch && active) load_batch(group);

  float m = kNegInf;
  if (active && groups == 1) {
    for (int s = lane; s < num_splits; s += 32) m = max_keep_nan(m, lse_row[s * lse_stride]);
  } else if (active) {
    constexpr int kLoads = 4;  // per lane at once: 128 splits in one round trip
    for (int s0 = lane; s0 < num_splits; s0 += 32 * kLoads) {
      float ls[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) ls[i] = s0 + 32 * i < num_splits ? lse_row[(s0 + 32 * i) * lse_stride] : kNegInf;
#pragma unroll
      for (int i = 0; i < kLoads; ++i) m = max_keep_nan(m, ls[i]);
    }
  }
  m = warp_max_keep_nan(m);

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float weight_sum = 0.f;
  if (active && m != kNegInf) {
    for (int s0 = group; s0 < num_splits; s0 += groups * kCombineBatch) {
      if (!kEarlyFirstBatch || s0 != group) load_batch(s0);
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        // An empty split's values were never written: select them away rather than multiply them by 0.
        const bool used = l[i] != kNegInf;
        const float wt = used ? expf(l[i] - m) : 0.f;
        acc.x += used ? wt * v[i].x : 0.f;
        acc.y += used ? wt * v[i].y : 0.f;
        acc.z += used ? wt * v[i].z : 0.f;
        acc.w += used ? wt * v[i].w : 0.f;
        weight_sum += wt;
      }
    }
  }
  if (groups > 1) {
    part_acc[warp_slot][lane] = acc;
    if (lane == 0) part_sum[warp_slot] = weight_sum;
    __syncthreads();
    if (group != 0) return;
    static_assert(kCombineMaxWarps == 16, "a unit's warp count is 1, 2, 4, 8 or 16");
    if (groups == 2) add_warp_partials<2>(acc, weight_sum, part_acc, part_sum, warp_slot, lane);
    if (groups == 4) add_warp_partials<4>(acc, weight_sum, part_acc, part_sum, warp_slot, lane);
    if (groups == 8) add_warp_partials<8>(acc, weight_sum, part_acc, part_sum, warp_slot, lane);
    if (groups == 16) add_warp_partials<16>(acc, weight_sum, part_acc, part_sum, warp_slot, lane);
  }
  if (!active) return;
  const bool seen = !(weight_sum == 0.f);
  const float inv = seen ? 1.f / weight_sum : 0.f;
  T* out = static_cast<T*>(p.out) + out_row_offset(p, u.batch_index, u.row) + u.chunk * kCombineColumns + lane * 4;
  store4<T>(out, acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  if (u.chunk == 0 && lane == 0) {
    p.lse[lse_row_offset(p, u.batch_index, u.row)] = seen ? m + logf(weight_sum) : kNegInf;
  }
}

// The combine with a fixed number of warps per unit: blockDim = (32, G, U), U units per CTA, G warps per unit (a
// power of two up to 16). The launcher picks G from the split count (few splits: one warp per unit, many: up to 16
// warps) so small batches still spread over the GPU. Both combine kernels keep to 64 registers, so two CTAs of 512
// threads fit on an SM.
template <typename T>
__global__ void __launch_bounds__(32 * kCombineMaxWarps, 2)
    combine_splits_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ float4 part_acc[kCombineMaxWarps][32];
  __shared__ float part_sum[kCombineMaxWarps];

  const int lane = threadIdx.x;
  const int group = threadIdx.y;
  const int groups = blockDim.y;
  const int warp_slot = threadIdx.z * groups + group;
  const int rows = p.seqlen_q * p.num_heads;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * blockDim.z + threadIdx.z;
  CombineUnit u;
  u.active = unit < static_cast<int64_t>(p.batch) * rows * kCombineChunks;  // the last CTA may overhang
  const int64_t row_global = u.active ? unit / kCombineChunks : 0;          // b * rows + r
  u.chunk = static_cast<int>(unit % kCombineChunks);
  u.batch_index = static_cast<int>(row_global / rows);
  u.row = static_cast<int>(row_global - static_cast<int64_t>(u.batch_index) * rows);
  wait_for_previous_grid();  // the partials come from the main kernel, which may still be finishing
  allow_next_grid_launch();

  u.num_splits = p.num_splits;
  u.lse_first = row_global * u.num_splits;
  u.lse_stride = 1;
  if (p.balanced_target > 0) {
    read_sequence_splits(p, rows, u);
    u.active = u.active && u.num_splits > 1;  // a sequence with one split got its outputs from the main kernel
  }
  combine_unit<T, true>(p, u, group, groups, warp_slot, lane, part_acc, part_sum);
}

// combine_rows_kernel's rows per CTA and splits per batch of copies (2 KB each), 32 KB of shared memory per CTA either
// way. Balanced calls take twice the splits per batch: a long sequence's row then keeps 16 KB in flight, as the unit
// kernel's four warps per row do.
template <bool kBalanced>
struct RowCombineShape {
  static constexpr int kWarps = kBalanced ? 2 : 4;
  static constexpr int kSplits = kBalanced ? 8 : 4;
};
constexpr int kRowCombineSplits = RowCombineShape<false>::kSplits;  // the most pieces of a fixed split it merges

// The combine one warp per whole 512-column row, lane i holding columns 4i + 128j (j < 4) and split i's lse. The
// maximum, the weights and their sum take one load and two shuffle trees per row instead of one per 128-column unit,
// and the indexing is spread over 4x the data: combine_splits_kernel spent its time issuing instructions, not waiting
// on L2 (perf-log v37). The values come through shared memory by cp.async, so a batch's splits are in flight at
// once: loaded into registers, ptxas issued them one split at a time, reusing the registers (perf-log v38).
// kBalanced = false: a fixed split of at most kRowCombineSplits pieces, one batch. kBalanced = true: a balanced call,
// sequence b's pieces at split_table's slots (any count, in batches; 0 or 1 piece: the main kernel wrote the row).
// blockDim = 32 * RowCombineShape<kBalanced>::kWarps.
template <typename T, bool kBalanced>
__global__ void __launch_bounds__(32 * RowCombineShape<kBalanced>::kWarps)
    combine_rows_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int kWarps = RowCombineShape<kBalanced>::kWarps;
  constexpr int kSplits = RowCombineShape<kBalanced>::kSplits;
  __shared__ __align__(16) float staged[kWarps][kSplits][kHeadDim];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int rows = p.seqlen_q * p.num_heads;
  const int64_t row_global = static_cast<int64_t>(blockIdx.x) * kWarps + warp;  // b * rows + r
  wait_for_previous_grid();  // the partials come from the main kernel, which may still be finishing
  allow_next_grid_launch();
  if (row_global >= static_cast<int64_t>(p.batch) * rows) return;  // the last CTA may overhang
  const int b = static_cast<int>(row_global / rows);
  const int r = static_cast<int>(row_global - static_cast<int64_t>(b) * rows);
  // Split s of this row: lse at lse_partial[first + s * stride], values at kHeadDim times that offset.
  int num_splits = p.num_splits;
  int64_t first = row_global * num_splits, stride = 1;
  if constexpr (kBalanced) {
    num_splits = sequence_pieces(p, b);  // the same for the whole warp
    if (num_splits <= 1) return;
    first = static_cast<int64_t>(sequence_first_slot(p, b)) * rows + r;
    stride = rows;
  }
  const float* lse_row = p.lse_partial + first;
  const float* values = p.out_partial + first * kHeadDim + lane * 4;

  float l = lane < num_splits ? lse_row[lane * stride] : kNegInf;  // splits 0-31, kept for their weights
  float m = l;
  if constexpr (kBalanced) {
    for (int s = lane + 32; s < num_splits; s += 32) m = max_keep_nan(m, lse_row[s * stride]);
  }
  m = warp_max_keep_nan(m);

  float4 acc[kCombineChunks] = {};
  float weight_sum = 0.f;
  if (m != kNegInf) {  // the same for the whole warp
    // Groups of 32 splits, one per lane (a fixed split has one group of at most kSplits).
    for (int group = 0; group < (kBalanced ? num_splits : 1); group += 32) {
      if (kBalanced && group > 0) l = group + lane < num_splits ? lse_row[(group + lane) * stride] : kNegInf;
      // Split group + lane's weight: 0 for an empty split and past the last.
      const float w = l != kNegInf ? expf(l - m) : 0.f;
      weight_sum += w;
      const unsigned used = __ballot_sync(0xffffffffu, l != kNegInf);
      const int group_end = kBalanced ? min(32, num_splits - group) : kSplits;
      for (int s0 = 0; s0 < group_end; s0 += kSplits) {
#pragma unroll
        for (int i = 0; i < kSplits; ++i) {
          // An empty split's values were never written, nor is there a split past the last: zero-filled, not read.
          const int s = s0 + i;  // < 32
          const int bytes = ((used >> s) & 1u) ? 16 : 0;
          const float* src = values + (bytes ? static_cast<int64_t>(group + s) * stride * kHeadDim : 0);
#pragma unroll
          for (int j = 0; j < kCombineChunks; ++j) {
            cp_async_16(smem_u32(&staged[warp][i][j * kCombineColumns + lane * 4]), src + j * kCombineColumns, bytes);
          }
        }
        cp_async_commit();
        cp_async_wait<0>();
        // Each lane reads back only the columns it copied, so no barrier is needed between the copies and the reads.
#pragma unroll
        for (int i = 0; i < kSplits; ++i) {
          const float ws = __shfl_sync(0xffffffffu, w, s0 + i);
#pragma unroll
          for (int j = 0; j < kCombineChunks; ++j) {
            const float4 v = *reinterpret_cast<const float4*>(&staged[warp][i][j * kCombineColumns + lane * 4]);
            acc[j].x += ws * v.x;
            acc[j].y += ws * v.y;
            acc[j].z += ws * v.z;
            acc[j].w += ws * v.w;
          }
        }
        // The next batch overwrites what this one read: its reads must be done first.
        if (kBalanced) __syncwarp();
      }
    }
    weight_sum = warp_sum(weight_sum);
  }
  const bool seen = !(weight_sum == 0.f);
  const float inv = seen ? 1.f / weight_sum : 0.f;
  T* out = static_cast<T*>(p.out) + out_row_offset(p, b, r) + lane * 4;
#pragma unroll
  for (int j = 0; j < kCombineChunks; ++j) {
    store4<T>(out + j * kCombineColumns, acc[j].x * inv, acc[j].y * inv, acc[j].z * inv, acc[j].w * inv);
  }
  if (lane == 0) p.lse[lse_row_offset(p, b, r)] = seen ? m + logf(weight_sum) : kNegInf;
}

// CTA-sized chunks (kCombineMaxWarps warps) of a sequence's units with `groups` warps each.
__device__ __forceinline__ int chunks_of_sequence(int units_per_sequence, int groups) {
  return (units_per_sequence * groups + kCombineMaxWarps - 1) / kCombineMaxWarps;
}

// Sequence b's warps per unit, 0 for a sequence of one split (the main kernel wrote its outputs).
__device__ __forceinline__ int sequence_warps(const DecodeParams& p, int b) {
  const int splits = sequence_pieces(p, b);
  return splits > 1 ? combine_warps_for(splits) : 0;
}

// Warps per unit after `doublings` doublings, at most kCombineMaxWarps (0 stays 0).
__device__ __forceinline__ int doubled(int warps, int doublings) {
  return min(warps << doublings, kCombineMaxWarps);
}

constexpr int kCombineDoublings = 4;  // one warp per unit up to kCombineMaxWarps

// How many doublings of every sequence's warps per unit still fit all of them in the grid's warps at once, given
// warps_at(k): the batch's warps per unit after k doublings (times units per sequence: the grid's warps). Few
// units (a small batch of few rows) would leave most of the grid idle; doubling makes each warp sum fewer splits.
template <class WarpsAt>
__device__ __forceinline__ int doublings_that_fit(int units_per_sequence, WarpsAt warps_at) {
  const int64_t grid_warps = static_cast<int64_t>(gridDim.x) * kCombineMaxWarps;
  int doublings = 0;
  while (doublings < kCombineDoublings && 2 * warps_at(doublings) * units_per_sequence <= grid_warps) ++doublings;
  return doublings;
}

// Where a sequence's units lie in the combine's chunks: its first chunk and its warps per unit.
struct SequenceChunks {
  int batch_index, first_chunk, warps;
};

// Up to 32 sequences: lane b of every warp holds sequence b's warps per unit and chunk end; no shared memory, no
// barrier.
struct NarrowBatchLayout {
  static constexpr int kMaxBatch = 32;  // one lane per sequence
  int warps, end, total_chunks;

  __device__ __forceinline__ NarrowBatchLayout(const DecodeParams& p, int units_per_sequence) {
    const int lane = threadIdx.x;
    const int own = lane < p.batch ? sequence_warps(p, lane) : 0;
    const int doublings =
        doublings_that_fit(units_per_sequence, [&](int k) { return static_cast<int64_t>(warp_sum(doubled(own, k))); });
    warps = doubled(own, doublings);
    end = warp_inclusive_sum(chunks_of_sequence(units_per_sequence, warps));
    total_chunks = __shfl_sync(0xffffffffu, end, 31);
  }

  __device__ __forceinline__ SequenceChunks locate(const DecodeParams&, int units_per_sequence, int c) const {
    const int b = __popc(__ballot_sync(0xffffffffu, end <= c));  // ends grow with b: the sequences before chunk c
    const int seq_warps = __shfl_sync(0xffffffffu, warps, b);
    return {b, __shfl_sync(0xffffffffu, end, b) - chunks_of_sequence(units_per_sequence, seq_warps), seq_warps};
  }
};

// Any number of sequences: thread t (of 512) lays out sequences [t * per, t * per + per) and a block-wide prefix
// sum gives each thread's chunk end, kept in shared memory for the lookups. Three barriers.
struct WideBatchLayout {
  static constexpr int kThreads = 32 * kCombineMaxWarps;
  struct Shared {
    int warp_warps[kCombineMaxWarps][kCombineDoublings + 1];  // per warp: its sequences' warps per unit, summed
    int warp_chunks[kCombineMaxWarps];
    int thread_end[kThreads];  // chunks of the sequences of threads 0 .. t
  };
  Shared& sh;
  int per, doublings, total_chunks;

  __device__ __forceinline__ WideBatchLayout(const DecodeParams& p, int units_per_sequence, Shared& shared)
      : sh(shared) {
    const int lane = threadIdx.x;
    const int warp = threadIdx.y;
    const int thread = warp * 32 + lane;
    per = (p.batch + kThreads - 1) / kThreads;
    const int first = min(thread * per, p.batch);
    const int last = min(first + per, p.batch);
    int warps[kCombineDoublings + 1] = {};
    for (int b = first; b < last; ++b) {
      const int own = sequence_warps(p, b);
#pragma unroll
      for (int k = 0; k <= kCombineDoublings; ++k) warps[k] += doubled(own, k);
    }
#pragma unroll
    for (int k = 0; k <= kCombineDoublings; ++k) {
      warps[k] = warp_sum(warps[k]);
      if (lane == 0) sh.warp_warps[warp][k] = warps[k];
    }
    __syncthreads();
    doublings = doublings_that_fit(units_per_sequence, [&](int k) {
      int64_t sum = 0;
      for (int w = 0; w < kCombineMaxWarps; ++w) sum += sh.warp_warps[w][k];
      return sum;
    });
    int chunks = 0;
    for (int b = first; b < last; ++b) {
      chunks += chunks_of_sequence(units_per_sequence, doubled(sequence_warps(p, b), doublings));
    }
    const int inclusive = warp_inclusive_sum(chunks);
    if (lane == 31) sh.warp_chunks[warp] = inclusive;
    __syncthreads();
    int before = 0;
    total_chunks = 0;
    for (int w = 0; w < kCombineMaxWarps; ++w) {
      before += w < warp ? sh.warp_chunks[w] : 0;
      total_chunks += sh.warp_chunks[w];
    }
    sh.thread_end[thread] = before + inclusive;
    __syncthreads();
  }

  __device__ __forceinline__ SequenceChunks locate(const DecodeParams& p, int units_per_sequence, int c) const {
    // The thread whose sequences hold chunk c: the first whose end passes c (ends grow with the thread), found 16
    // threads at a time, then one; then its sequences in turn.
    const int lane = threadIdx.x;
    const int coarse = __popc(__ballot_sync(0xffffffffu, sh.thread_end[16 * lane + 15] <= c));
    const int owner =
        16 * coarse + __popc(__ballot_sync(0xffffffffu, lane < 16 && sh.thread_end[16 * coarse + lane] <= c));
    SequenceChunks s{owner * per, owner == 0 ? 0 : sh.thread_end[owner - 1], 0};
    s.warps = doubled(sequence_warps(p, s.batch_index), doublings);
    for (int n = chunks_of_sequence(units_per_sequence, s.warps); s.first_chunk + n <= c;
         n = chunks_of_sequence(units_per_sequence, s.warps)) {
      s.first_chunk += n;
      s.warps = doubled(sequence_warps(p, ++s.batch_index), doublings);
    }
    return s;
  }
};

// The chunks of one CTA of combine_by_sequence_kernel, in turn.
template <typename T, class Layout>
__device__ __forceinline__ void combine_chunks(const DecodeParams& p, const Layout& layout, int rows) {
  __shared__ float4 part_acc[kCombineMaxWarps][32];
  __shared__ float part_sum[kCombineMaxWarps];
  const int lane = threadIdx.x;
  const int warp = threadIdx.y;
  const int units_per_sequence = rows * kCombineChunks;
  for (int c = blockIdx.x; c < layout.total_chunks; c += gridDim.x) {
    const SequenceChunks s = layout.locate(p, units_per_sequence, c);
    const int slot = (c - s.first_chunk) * kCombineMaxWarps + warp;
    const int unit = slot / s.warps;  // a power of two that divides kCombineMaxWarps: units stay in this CTA
    CombineUnit u;
    u.active = unit < units_per_sequence;  // the last chunk of a sequence may overhang
    u.batch_index = s.batch_index;
    u.row = unit / kCombineChunks;
    u.chunk = unit % kCombineChunks;
    read_sequence_splits(p, rows, u);
    combine_unit<T, false>(p, u, slot % s.warps, s.warps, warp, lane, part_acc, part_sum);
    if (s.warps > 1) __syncthreads();  // the next chunk may reuse part_acc (one warp per unit uses none)
  }
}

// The combine of balanced calls with two or more sequences, laid out per sequence on the device (narrow or wide
// batch layout): each sequence's units get the warps its own split count needs (combine_warps_for), and its units
// x warps are cut into CTA-sized chunks of kCombineMaxWarps warps, so a chunk holds one sequence and a unit never
// spans two CTAs. CTAs stride over the chunks; a batch whose sequences all have one split has none, and its CTAs
// leave after the layout. A fixed count sized on the host (from the total split count) cannot tell a batch with one
// long sequence from a uniform one: too few warps for the long sequence, or too many CTAs for the uniform batch
// (perf-log v17, v19). blockDim = (32, kCombineMaxWarps).
template <typename T, bool kWideBatch>
__global__ void __launch_bounds__(32 * kCombineMaxWarps, 2)
    combine_by_sequence_kernel(const __grid_constant__ DecodeParams p) {
  const int rows = p.seqlen_q * p.num_heads;
  wait_for_previous_grid();  // split_table and the partials come from the kernels before
  allow_next_grid_launch();
  if constexpr (kWideBatch) {
    __shared__ WideBatchLayout::Shared shared;
    combine_chunks<T>(p, WideBatchLayout(p, rows * kCombineChunks, shared), rows);
  } else {
    combine_chunks<T>(p, NarrowBatchLayout(p, rows * kCombineChunks), rows);
  }
}

}  // namespace mla::cuda
