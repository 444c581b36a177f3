// Balanced splits by work items (DecodeParams::balanced_target > 0, balanced_seq_cost == 0: the many-row kernels),
// computed where they are used: every warp of the main kernel reads all B sequence lengths (a few hundred bytes,
// L2-resident after the first CTA) and derives the same split of every sequence. No planner kernel and no host
// sync, so a CUDA graph replay follows the current seq_lens; the CTAs of split 0 record each sequence's first work
// item and split count in DecodeParams::split_table for the combine, which would otherwise redo the plan in each of
// its (many) warps.
//
// The batch's keys are cut into about balanced_target chunks of equal length (about one wave of CTAs); a sequence
// is never cut finer than sqrt(split_cost * its length) keys, where more splits would cost more in partials than
// they save in time. One CTA per work item: short sequences are not packed together (balanced_ranges.cuh does
// that for the few-row kernels).
// Every function here is warp-cooperative: all 32 lanes call it with the same arguments.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../params.h"
#include "sequence_length.cuh"

namespace mla::cuda {

// Split lengths are multiples of p.kv_len_per_split, which holds the alignment in balanced mode (16, or the key
// tile of a kernel whose tiles must start on tile boundaries). Longer than the capacity changes nothing, so lengths
// are capped there: below 2^31, and the 32-bit sums below cannot wrap (every lane runs this for every sequence,
// and 64-bit division is several times slower).
__device__ __forceinline__ unsigned round_up_split(const DecodeParams& p, unsigned x) {
  const unsigned align = static_cast<unsigned>(p.kv_len_per_split);
  x = min(x, static_cast<unsigned>(p.capacity));
  return max((x + align - 1) / align * align, align);
}

struct SequenceSplits {
  int count;   // splits of the sequence, >= 1 (an empty sequence's one split writes out 0, lse -inf)
  int length;  // keys per split, a multiple of the alignment
};

// Per lane (no communication): the splits of a sequence of `len` keys for a batch-wide split length `chunk`; the
// count is len / chunk rounded to nearest (at least 1), so all counts add up to at most total / chunk + B.
__device__ __forceinline__ SequenceSplits splits_of(const DecodeParams& p, int chunk, int len) {
  const unsigned n = static_cast<unsigned>(len);
  const unsigned floor_len = static_cast<unsigned>(ceilf(sqrtf(p.balanced_split_cost * static_cast<float>(len))));
  const unsigned base = max(static_cast<unsigned>(chunk), round_up_split(p, floor_len));
  const unsigned count = max(1u, (n + base / 2) / base);
  return SequenceSplits{static_cast<int>(count), static_cast<int>(round_up_split(p, (n + count - 1) / count))};
}

// Work items are numbered sequence by sequence, first every sequence cut into several splits, then the sequences
// in one piece: long work starts first and the short pieces fill the SMs behind it.
struct BatchPlan {
  int chunk;       // batch-wide split length
  int long_items;  // items of the sequences with more than one split
};

// Sums over the batch for a given chunk: items of multi-split sequences and the count of one-split sequences.
__device__ __forceinline__ int2 count_items(const DecodeParams& p, int chunk) {
  const int lane = threadIdx.x & 31;
  int many = 0, single = 0;
  for (int b = lane; b < p.batch; b += 32) {
    const int count = splits_of(p, chunk, clamped_seq_len(p, b)).count;
    many += count > 1 ? count : 0;
    single += count == 1 ? 1 : 0;
  }
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) {
    many += __shfl_xor_sync(0xffffffffu, many, off);
    single += __shfl_xor_sync(0xffffffffu, single, off);
  }
  return make_int2(many, single);
}

__device__ __forceinline__ BatchPlan balanced_plan(const DecodeParams& p) {
  const int lane = threadIdx.x & 31;
  int64_t total = 0;
  for (int b = lane; b < p.batch; b += 32) total += clamped_seq_len(p, b);
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
  const int64_t target = p.balanced_target;
  const int64_t even = (total + target - 1) / target;
  int chunk = static_cast<int>(round_up_split(p, static_cast<unsigned>(min(even, static_cast<int64_t>(p.capacity)))));
  int2 items = count_items(p, chunk);
  // Rounding and one-piece sequences can overshoot one wave of CTAs by a little; a few items in a second wave would
  // nearly double the time, so lengthen the splits to fit. (A large overshoot means many sequences: several waves
  // are unavoidable and short splits balance them best.)
  const int64_t all = static_cast<int64_t>(items.x) + items.y;
  if (all > target && 4 * all <= 5 * target) {
    const int64_t longer = (static_cast<int64_t>(chunk) * all + target - 1) / target;
    chunk = static_cast<int>(round_up_split(p, static_cast<unsigned>(min(longer, static_cast<int64_t>(p.capacity)))));
    items = count_items(p, chunk);
  }
  return BatchPlan{chunk, items.x};
}

// A work item: the sequence that owns it (-1 for a spare item beyond the plan's), that sequence's first item and its
// splits.
struct WorkItem {
  int batch_index;
  int first;
  SequenceSplits splits;
};

__device__ __forceinline__ WorkItem find_work_item(const DecodeParams& p, const BatchPlan& plan, int item) {
  const int lane = threadIdx.x & 31;
  const bool in_long = item < plan.long_items;
  int before = in_long ? 0 : plan.long_items;  // items of the sequences already passed
  for (int b0 = 0; b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    SequenceSplits s{0, 0};
    if (b < p.batch) s = splits_of(p, plan.chunk, clamped_seq_len(p, b));
    const int own = in_long ? (s.count > 1 ? s.count : 0) : (b < p.batch && s.count == 1 ? 1 : 0);
    int inclusive = own;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inclusive, off);
      if (lane >= off) inclusive += v;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, own > 0 && item < before + inclusive);
    if (hit != 0) {
      const int src = __ffs(hit) - 1;
      const int first = before + __shfl_sync(0xffffffffu, inclusive - own, src);
      const SequenceSplits splits{__shfl_sync(0xffffffffu, s.count, src), __shfl_sync(0xffffffffu, s.length, src)};
      return WorkItem{b0 + src, first, splits};
    }
    before += __shfl_sync(0xffffffffu, inclusive, 31);
  }
  return WorkItem{-1, 0, SequenceSplits{1, 0}};
}

// Work item `item` of the batch's plan. Out of line on purpose: inlined, the plan's code sat in the kernels' prologue
// and slowed every call, also those without balanced splits (perf-notes v13); one call returns everything in
// registers. Static: every instantiation file compiles its own copy (one shared symbol would be defined twice).
static __device__ __noinline__ WorkItem balanced_work_item(const DecodeParams& p, int item) {
  return find_work_item(p, balanced_plan(p), item);
}

}  // namespace mla::cuda
