// Balanced splits by work items (DecodeParams::balanced_target > 0, balanced_seq_cost == 0: the many-row kernels),
// planned on device from seq_lens, so a CUDA graph replay follows the current lengths without a host sync: once per
// call by the planner kernel (work_item_planner.cuh), whose table gives each CTA of the main kernel its item, or, for
// a single sequence, by each CTA itself. The combine reads each sequence's first item and split count from
// split_table.
//
// The batch's keys are cut into about balanced_target chunks of equal length (about one wave of CTAs); a sequence
// is never cut finer than sqrt(split_cost * its length) keys, where more splits would cost more in partials than
// they save in time. One CTA per work item: short sequences are not packed together (balanced_ranges.cuh does
// that for the few-row kernels).
// The plan's passes take a thread group (plan_groups.cuh: a warp or the planner's CTA); every member calls them with
// the same arguments.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/common/sequence_length.cuh"
#include "cuda/schedule/plan_groups.cuh"
#include "params.h"

namespace mla::cuda {

// Split lengths are multiples of p.kv_len_per_split, which holds the alignment in balanced mode (for work items the
// many-row kernels' 64-key tile, a power of two), so rounding is a mask. Longer than the capacity changes nothing, so
// lengths are capped there: below 2^31, and the 32-bit sums below cannot wrap (the planners run this for every
// sequence, and 64-bit division is several times slower).
__device__ __forceinline__ unsigned round_up_split(const DecodeParams& p, unsigned x) {
  const unsigned align = static_cast<unsigned>(p.kv_len_per_split);
  x = min(x, static_cast<unsigned>(p.capacity));
  return max((x + align - 1) & ~(align - 1), align);
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

// The shortest chunk longer than `chunk` at which some sequence of several splits loses one, or INT_MAX when no
// sequence has several: a count c of round(n / chunk) falls at chunk > 2n / (2c - 1) (splits_of's sqrt floor is
// below that chunk, since it left the count at c).
template <class Group>
__device__ __forceinline__ int next_fewer_splits(const DecodeParams& p, const Group& g, int chunk) {
  int negated = INT_MIN;  // the group has max only: the shortest chunk as the largest negation
  for (int b = g.rank(); b < p.batch; b += g.size()) {
    const int len = clamped_seq_len(p, b);
    const int count = splits_of(p, chunk, len).count;
    if (count > 1) {
      const int64_t drop = 2 * static_cast<int64_t>(len) / (2 * count - 1) + 1;
      negated = max(negated, -static_cast<int>(min(drop, static_cast<int64_t>(INT_MAX))));
    }
  }
  negated = g.max(negated);
  return negated == INT_MIN ? INT_MAX : -negated;
}

// Sums over the batch for a given chunk: items of multi-split sequences and the count of one-split sequences.
template <class Group>
__device__ __forceinline__ int2 count_items(const DecodeParams& p, const Group& g, int chunk) {
  int many = 0, single = 0;
  for (int b = g.rank(); b < p.batch; b += g.size()) {
    const int count = splits_of(p, chunk, clamped_seq_len(p, b)).count;
    many += count > 1 ? count : 0;
    single += count == 1 ? 1 : 0;
  }
  return g.sum(make_int2(many, single));
}

// Rounds of lengthening the splits to fit one wave; each takes at least one split off the batch.
constexpr int kFitWaveRounds = 8;

template <class Group>
__device__ __forceinline__ BatchPlan balanced_plan(const DecodeParams& p, const Group& g) {
  int64_t total = 0;
  for (int b = g.rank(); b < p.batch; b += g.size()) total += clamped_seq_len(p, b);
  total = g.sum(total);
  const int64_t target = p.balanced_target;
  const int64_t even = (total + target - 1) / target;
  int chunk = static_cast<int>(round_up_split(p, static_cast<unsigned>(min(even, static_cast<int64_t>(p.capacity)))));
  int2 items = count_items(p, g, chunk);
  // Rounding and one-piece sequences can overshoot one wave of CTAs by a little; a few items in a second wave would
  // nearly double the time, so lengthen the splits until they fit: each round by the overshoot, and at least to where
  // some sequence loses a split (lengthening by the overshoot alone left B = 23 equal sequences at 128 heads in 3
  // splits each, 69 items for a wave of 66: perf-log v51). (A large overshoot means many sequences: several waves
  // are unavoidable and short splits balance them best.)
  int64_t all = static_cast<int64_t>(items.x) + items.y;
  if (all > target && 4 * all <= 5 * target) {
    for (int round = 0; round < kFitWaveRounds && all > target; ++round) {
      const int fewer = next_fewer_splits(p, g, chunk);
      if (fewer == INT_MAX) break;  // every sequence in one split already
      const int64_t longer =
          max((static_cast<int64_t>(chunk) * all + target - 1) / target, static_cast<int64_t>(fewer));
      chunk = static_cast<int>(round_up_split(p, static_cast<unsigned>(min(longer, static_cast<int64_t>(p.capacity)))));
      items = count_items(p, g, chunk);
      all = static_cast<int64_t>(items.x) + items.y;
    }
  } else if (all > target && items.y <= target) {
    // A few long sequences among short ones: the short items that do not fit beside the long pieces would run
    // behind them in a ragged tail (one short item costs its keys plus a CTA's start-up). When the one-piece
    // sequences fit in one wave and each is at most half a piece, cut the long sequences into one wave of pieces
    // instead; the short items follow in a second wave (perf-log v12, v14).
    int64_t long_keys = 0;
    int longest_single = 0;
    for (int b = g.rank(); b < p.batch; b += g.size()) {
      const int len = clamped_seq_len(p, b);
      if (splits_of(p, chunk, len).count > 1) {
        long_keys += len;
      } else {
        longest_single = max(longest_single, len);
      }
    }
    long_keys = g.sum(long_keys);
    longest_single = g.max(longest_single);
    if (2 * static_cast<int64_t>(longest_single) <= chunk) {
      int64_t piece = (long_keys + target - 1) / target;
      int2 wave = make_int2(0, 0);
      for (int attempt = 0; attempt < 2; ++attempt) {  // rounding each sequence's count can overshoot: lengthen once
        piece = round_up_split(p, static_cast<unsigned>(min(piece, static_cast<int64_t>(p.capacity))));
        wave = count_items(p, g, static_cast<int>(piece));
        if (wave.x <= target) break;
        piece = (piece * wave.x + target - 1) / target;
      }
      // a lengthened piece can pass chunk and turn two-piece sequences into one-piece ones: check both counts
      if (wave.x <= target && wave.y <= target) {
        chunk = static_cast<int>(piece);
        items = wave;
      }
    }
  }
  return BatchPlan{chunk, items.x};
}

// Work item `item` of a batch of one sequence, planned by its CTA (no planner kernel, see item_table): the sequence's
// pieces, then spares. Out of line: inlined, plan code in the kernels' prologue slowed every call (perf-log v13).
// Planned by a warp rather than by each thread alone: the split is the same, and the sm_90a kernel built with the
// warp's call measured faster at long lengths, slower at short ones (its loop's machine code differs, perf-log v69).
// Static: every instantiation file compiles its own copy (one shared symbol would be defined twice).
static __device__ __noinline__ int4 single_sequence_item(const DecodeParams& p, int item) {
  const SequenceSplits s = splits_of(p, balanced_plan(p, WarpGroup{}).chunk, clamped_seq_len(p, 0));
  return item < s.count ? make_int4(0, 0, s.count, s.length) : make_int4(-1, 0, 1, 0);
}

}  // namespace mla::cuda
