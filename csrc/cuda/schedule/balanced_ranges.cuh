// Balanced splits by ranges (DecodeParams::balanced_target > 0 and balanced_seq_cost > 0: the few-row kernels),
// planned where they are used. The batch's keys are laid end to end on a line: sequence b takes max(len_b, 1) positions
// (an empty sequence still needs a CTA to write out 0, lse -inf), then balanced_seq_cost positions for its set-up. The
// line is cut into balanced_target ranges of L positions; range i (CTA i of each row block) covers [i L, (i + 1) L):
// the end of one sequence, short ones whole, the start of the next. A cut at position x inside sequence b (first
// position s_b) becomes key round_up(x - s_b, align), or the start of b + 1 when that is past b's keys. Every CTA
// derives the same cuts, so neighbouring ranges meet exactly, and every range costs the same however lengths mix: a CTA
// that finishes two short sequences is as busy as one holding a piece of a long one. No planner kernel and no host
// sync, so a CUDA graph replay follows the current seq_lens.
//
// A batch of equal lengths is laid out so that ranges hold whole pieces instead (whole_sequence_line): each sequence
// is cut into equal pieces, one per range, or a range holds m whole sequences. Equal cuts of the line would start a
// second sequence in nearly every range (another query load, pipeline fill and partial write) and cut most sequences
// into one piece more.
//
// The pieces of b are ranges i0 .. i0 + n - 1 with i0 = floor(s_b / L); piece j's partial rows go to slot
// i0 + j + b (distinct over all (range, sequence) pairs, as a range's sequences follow the previous range's, and
// below balanced_target + B); the CTA of piece 0 records (i0 + b, n) in split_table for the combine.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/common/device_primitives.cuh"
#include "cuda/common/sequence_length.cuh"
#include "cuda/schedule/plan_groups.cuh"
#include "params.h"

namespace mla::cuda {

// Positions a sequence of `len` keys takes on a line that gives each sequence `seq_cost` positions of set-up.
__device__ __forceinline__ int64_t line_positions(int seq_cost, int len) {
  return static_cast<int64_t>(max(len, 1)) + seq_cost;
}

// Cuts fall on multiples of the alignment (kv_len_per_split in balanced mode: for ranges the few-row kernels' 32-key
// tile, a power of two).
__device__ __forceinline__ int64_t round_up_cut(const DecodeParams& p, int64_t x) {
  const int64_t align = p.kv_len_per_split;
  return (x + align - 1) & ~(align - 1);
}

// Where a CTA's walk over its range stands.
struct RangeCursor {
  int64_t seq_start;  // line position of sequence batch_index's first key
  int64_t range_end;  // one past the range's last position
  int64_t length;     // L, positions per range
  int seq_cost;       // set-up positions of each sequence on this line
  int batch_index;    // the next sequence to visit; B when the range is done
  int key_begin;      // its first key in this range
};

// One sequence's share of a range.
struct RangeSegment {
  int batch_index;
  int seq_len;
  int key_begin;  // keys [key_begin, key_end) of the sequence
  int key_end;
  int piece;       // which piece of the sequence this is
  int pieces;      // how many the sequence has (1: write out / lse directly)
  int slot;        // partial slot of this piece
  int first_slot;  // partial slot of piece 0
};

// The line a plan cuts into ranges: L positions per range and each sequence's set-up positions.
struct RangeLine {
  int64_t length;
  int seq_cost;
};

// B sequences of `len` keys each, cut into whole pieces: for B <= target, each sequence into equal pieces, one per
// range, as many as the line of `general` would cut it into but at most target / B (the sequence's set-up positions
// pad it to whole ranges: no range starts a second sequence, so none pays a second set-up); above, m = ceil(B /
// target) whole sequences per range. At most `target` ranges either way; `ranges` gets their count. 32-bit
// divisions (keys, lengths and counts fit), as every warp of every CTA computes this before its first copy.
__device__ __forceinline__ RangeLine whole_sequence_line(const DecodeParams& p, int len, const RangeLine& general,
                                                         int64_t floor_len, int64_t& ranges) {
  const unsigned batch = static_cast<unsigned>(p.batch);
  const unsigned target = static_cast<unsigned>(p.balanced_target);
  if (batch > target) {
    const unsigned m = (batch + target - 1) / target;
    ranges = (batch + m - 1) / m;
    return RangeLine{m * line_positions(p.balanced_seq_cost, len), p.balanced_seq_cost};
  }
  const unsigned keys = static_cast<unsigned>(max(len, 1));
  const unsigned cuts = general.length >= keys ? 1u
                                               : (keys + static_cast<unsigned>(general.length) - 1) /
                                                     static_cast<unsigned>(general.length);
  const unsigned pieces = min(target / batch, cuts);
  const unsigned length =
      static_cast<unsigned>(round_up_cut(p, max(static_cast<int64_t>((keys + pieces - 1) / pieces), floor_len)));
  const unsigned used = (keys + length - 1) / length;
  ranges = static_cast<int64_t>(batch) * used;
  return RangeLine{length, static_cast<int>(used * length - keys)};
}

// The same in every warp: the batch's line cut into the target's ranges, but cuts at least sqrt(split_cost * longest
// sequence) apart (finer ones cost more in partials than they save), rounded up to the alignment; for equal lengths
// the whole-piece line, unless it leaves more than an eighth of those ranges unused. Group-cooperative
// (plan_groups.cuh): every member calls it.
template <class Group>
__device__ __forceinline__ RangeLine range_line(const DecodeParams& p, const Group& g) {
  int64_t total = 0;
  int longest = 0;
  int shortest = INT_MAX;
  for (int b = g.rank(); b < p.batch; b += g.size()) {
    const int len = clamped_seq_len(p, b);
    total += line_positions(p.balanced_seq_cost, len);
    longest = max(longest, len);
    shortest = min(shortest, len);
  }
  total = g.sum(total);
  longest = g.max(longest);
  shortest = -g.max(-shortest);
  const int64_t even = (total + p.balanced_target - 1) / p.balanced_target;
  const int64_t floor_len = static_cast<int64_t>(ceilf(sqrtf(p.balanced_split_cost * static_cast<float>(longest))));
  const RangeLine line{round_up_cut(p, max(max(even, floor_len), int64_t{1})), p.balanced_seq_cost};
  if (p.batch > 1 && shortest == longest) {
    int64_t ranges = 0;
    const RangeLine whole = whole_sequence_line(p, longest, line, floor_len, ranges);
    // 8 ranges >= 7 ceil(total / L), without the division
    if (total <= line.length * (8 * ranges / 7)) return whole;
  }
  return line;
}

// The cursor at the start of range `range`: the sequence holding position range * L (an exclusive prefix sum over
// the batch, 32 sequences per step) and the cut there. Warp-cooperative; a batch of one sequence is planned by each
// thread alone, without the warp's chains of shuffles.
__device__ __forceinline__ RangeCursor range_start(const DecodeParams& p, int range) {
  const int lane = threadIdx.x & 31;
  const bool one = p.batch == 1;
  RangeCursor c;
  const RangeLine line = one ? range_line(p, ThreadGroup{}) : range_line(p, WarpGroup{});
  c.length = line.length;
  c.seq_cost = line.seq_cost;
  const int64_t begin = static_cast<int64_t>(range) * c.length;
  c.range_end = begin + c.length;
  c.batch_index = p.batch;  // past the end of the line unless found below
  c.seq_start = 0;
  c.key_begin = 0;
  int64_t before = 0;  // positions of the sequences already passed
  if (one && begin < line_positions(c.seq_cost, clamped_seq_len(p, 0))) c.batch_index = 0;
  for (int b0 = 0; !one && b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    const int64_t own = b < p.batch ? line_positions(c.seq_cost, clamped_seq_len(p, b)) : 0;
    const int64_t inclusive = warp_inclusive_sum(own);
    const unsigned hit = __ballot_sync(0xffffffffu, b < p.batch && begin < before + inclusive);
    if (hit != 0) {
      const int src = __ffs(hit) - 1;
      c.batch_index = b0 + src;
      c.seq_start = before + __shfl_sync(0xffffffffu, inclusive - own, src);
      break;
    }
    before += __shfl_sync(0xffffffffu, inclusive, 31);
  }
  if (c.batch_index < p.batch) {
    const int len = clamped_seq_len(p, c.batch_index);
    const int64_t cut = round_up_cut(p, begin - c.seq_start);
    if (cut < max(len, 1)) {
      c.key_begin = static_cast<int>(cut);
    } else {  // past b's keys: the range starts with b + 1
      c.seq_start += line_positions(c.seq_cost, len);
      ++c.batch_index;
    }
  }
  return c;
}

// The next sequence of the cursor's range (range number `range`), if any, and moves the cursor past it. Per thread:
// every thread of the CTA walks the same way.
__device__ __forceinline__ bool next_segment(const DecodeParams& p, int range, RangeCursor& c, RangeSegment& s) {
  if (c.batch_index >= p.batch || c.seq_start >= c.range_end) return false;
  const int len = clamped_seq_len(p, c.batch_index);
  // A cut at offset y > 0 from the sequence's start falls inside it iff y <= last_cut.
  const int64_t last_cut = (max(len, 1) - 1) & ~static_cast<int64_t>(p.kv_len_per_split - 1);
  const int64_t first_range = c.seq_start / c.length;
  s.batch_index = c.batch_index;
  s.seq_len = len;
  s.key_begin = c.key_begin;
  s.pieces = 1 + static_cast<int>((c.seq_start + last_cut) / c.length - first_range);
  s.piece = range - static_cast<int>(first_range);
  s.slot = range + c.batch_index;
  s.first_slot = static_cast<int>(first_range) + c.batch_index;
  const int64_t rest = c.range_end - c.seq_start;  // > 0
  if (rest <= last_cut) {                          // the range ends inside this sequence
    s.key_end = static_cast<int>(round_up_cut(p, rest));
    c.batch_index = p.batch;
  } else {
    s.key_end = len;
    c.seq_start += line_positions(c.seq_cost, len);
    ++c.batch_index;
    c.key_begin = 0;
  }
  return true;
}

}  // namespace mla::cuda
