// The CUDA split planners' rules, checked without a GPU: which kernel's tiles a call is planned for decides whether
// the sm_90a kernel can take it (64-key split boundaries, work items rather than ranges), and the planners must not
// change calls outside the rows that moved to that kernel.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>

#include "cuda/schedule/split_plan.h"
#include "cuda/schedule/tile_plan.h"

namespace {

using mla::DType;
using mla::cuda::BalancedSplit;
using mla::cuda::KernelChoice;
using mla::cuda::MainKernel;

// The kernel choose_kernel makes on a device where every configuration fits and the sm_90a kernel takes the layout:
// that kernel for fp16/bf16 over 16 rows on Hopper, else the portable kernel of the row tile.
KernelChoice kernel_for(int rows, DType dtype, bool hopper) {
  if (dtype == DType::kFloat32) return {MainKernel::kFp32TensorCore, mla::cuda::kSmallRowTile, hopper};
  if (hopper && mla::cuda::sm90_takes_rows(rows)) return {MainKernel::kSm90, mla::cuda::kLargeRowTile, hopper};
  const int row_tile = mla::cuda::row_tile_for(rows, dtype);
  const MainKernel kernel = row_tile == mla::cuda::kLargeRowTile ? MainKernel::kManyRows
                            : row_tile == mla::cuda::kMidRowTile ? MainKernel::kMidRows
                                                                 : MainKernel::kFewRows;
  return {kernel, row_tile, hopper};
}
int default_kv_len_per_split(int batch, int rows, int capacity, int sms, DType dtype, bool hopper) {
  return mla::cuda::default_kv_len_per_split(batch, rows, capacity, sms, dtype, kernel_for(rows, dtype, hopper));
}
BalancedSplit balanced_split_for(int batch, int rows, int capacity, int sms, DType dtype, bool hopper) {
  return mla::cuda::balanced_split_for(batch, rows, capacity, sms, dtype, kernel_for(rows, dtype, hopper));
}

int failures = 0;

void check(bool ok, const char* what, DType dtype, int batch, int rows, int capacity, int sms, bool sm90, int got) {
  if (ok) return;
  ++failures;
  std::printf("FAIL %s: dtype %d batch %d rows %d capacity %d sms %d sm90 %d -> %d\n", what, static_cast<int>(dtype),
              batch, rows, capacity, sms, sm90 ? 1 : 0, got);
}

bool is_16_bit(DType dtype) {
  return dtype != DType::kFloat32;
}

// CTAs of a few-row grid (one row block per sequence) at this split.
int grid_ctas(int batch, int capacity, int split) {
  return batch * ((capacity + split - 1) / split);
}

void check_shape_only_plan(DType dtype, int batch, int rows, int capacity, int sms) {
  const int plain = default_kv_len_per_split(batch, rows, capacity, sms, dtype, false);
  const int hopper = default_kv_len_per_split(batch, rows, capacity, sms, dtype, true);
  check(plain > 0 && plain % 16 == 0, "split is a positive multiple of 16", dtype, batch, rows, capacity, sms, false,
        plain);
  check(hopper > 0 && hopper % 16 == 0, "split is a positive multiple of 16", dtype, batch, rows, capacity, sms, true,
        hopper);
  if (rows <= 32 && is_16_bit(dtype)) {
    check(plain % 32 == 0, "few rows split on 32-key tiles", dtype, batch, rows, capacity, sms, false, plain);
  }
  if (rows > 32 && is_16_bit(dtype)) {
    check(plain % 64 == 0, "many rows split on 64-key tiles", dtype, batch, rows, capacity, sms, false, plain);
  }
  if (rows > 16 && is_16_bit(dtype)) {
    check(hopper % 64 == 0, "sm_90a calls split on its 64-key tiles", dtype, batch, rows, capacity, sms, true, hopper);
  }
  // The sm_90a kernel's own costs (waves, cluster merges) are weighed from 17 rows on only.
  if (rows <= 16 && is_16_bit(dtype)) {
    check(plain == hopper, "plan unchanged for the portable kernels' calls", dtype, batch, rows, capacity, sms, true,
          hopper);
  }
  if (!is_16_bit(dtype)) {
    check(hopper % 32 == 0, "fp32 on Hopper splits on its 32-key tiles", dtype, batch, rows, capacity, sms, true,
          hopper);
  }
}

void check_balanced_plan(DType dtype, int batch, int rows, int capacity, int sms) {
  const BalancedSplit plain = balanced_split_for(batch, rows, capacity, sms, dtype, false);
  const BalancedSplit hopper = balanced_split_for(batch, rows, capacity, sms, dtype, true);
  for (const bool sm90 : {false, true}) {
    const BalancedSplit& s = sm90 ? hopper : plain;
    check(s.target >= 1, "at least one piece", dtype, batch, rows, capacity, sms, sm90, s.target);
    check(s.align == 32 || s.align == 64, "cuts on 32- or 64-key tiles", dtype, batch, rows, capacity, sms, sm90,
          s.align);
    // The target is a wave of CTAs, whatever the capacity; one sequence's work items stop at the pieces its
    // capacity allows: the device cuts n keys at least sqrt(split_cost * n) apart, into round(n / cut) pieces, so
    // at most sqrt(capacity / split_cost) + 1/2 of them (the grid must hold them all; one more is a spare CTA).
    const BalancedSplit wave = balanced_split_for(batch, rows, std::numeric_limits<int>::max(), sms, dtype, sm90);
    if (batch == 1 && s.seq_cost == 0) {
      const int most = static_cast<int>(std::sqrt(static_cast<double>(std::max(capacity, 1)) / s.split_cost) + 0.5);
      check(s.target >= std::min(wave.target, most) && s.target <= std::min(wave.target, most + 1),
            "one sequence: work items for the pieces its capacity allows", dtype, batch, rows, capacity, sms, sm90,
            s.target);
    } else {
      check(s.target == wave.target, "the target does not follow the capacity", dtype, batch, rows, capacity, sms, sm90,
            s.target);
    }
  }
  const bool moved = rows > 16 && rows <= 32 && is_16_bit(dtype);
  if (moved) {
    // The sm_90a kernel walks work items only, on 64-key tiles; the portable 32-row kernel walks ranges.
    check(hopper.seq_cost == 0 && hopper.align == 64, "17-32 rows: work items for the sm_90a kernel", dtype, batch,
          rows, capacity, sms, true, hopper.seq_cost);
    check(plain.seq_cost > 0 && plain.align == 32, "17-32 rows: ranges for the portable kernel", dtype, batch, rows,
          capacity, sms, false, plain.seq_cost);
  } else {
    check(plain.target == hopper.target && plain.seq_cost == hopper.seq_cost && plain.align == hopper.align &&
              plain.split_cost == hopper.split_cost,
          "balanced plan unchanged outside 17-32 rows", dtype, batch, rows, capacity, sms, true, hopper.seq_cost);
    const bool ranges = rows <= 32 || !is_16_bit(dtype);
    check((plain.seq_cost > 0) == ranges, "ranges for few rows and fp32, work items for many rows", dtype, batch, rows,
          capacity, sms, false, plain.seq_cost);
  }
}

}  // namespace

int main() {
  const DType dtypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32};
  const int row_counts[] = {1, 8, 16, 17, 24, 32, 33, 48, 64, 128, 256};
  for (const DType dtype : dtypes) {
    for (const int rows : row_counts) {
      for (const int sms : {1, 108, 132}) {
        for (const int batch : {1, 2, 7, 16, 64, 128, 1000}) {
          for (const int capacity : {1, 15, 64, 100, 1000, 4096, 16385, 131072}) {
            check_shape_only_plan(dtype, batch, rows, capacity, sms);
            check_balanced_plan(dtype, batch, rows, capacity, sms);
          }
        }
      }
    }
  }
  // What the cost model is for: one long sequence spreads over the SMs; a batch that fills a wave keeps one split.
  const int one_sequence = default_kv_len_per_split(1, 16, 16384, 132, DType::kBFloat16, true);
  check(one_sequence <= 16384 / 32, "one sequence spreads over the SMs", DType::kBFloat16, 1, 16, 16384, 132, true,
        one_sequence);
  const int full_wave = default_kv_len_per_split(1000, 128, 4096, 132, DType::kBFloat16, true);
  check(full_wave >= 4096, "a full wave keeps one split per sequence", DType::kBFloat16, 1000, 128, 4096, 132, true,
        full_wave);
  // A few-row CTA alone on its SM streams faster than two sharing one: a short batch takes one CTA per SM rather than
  // twice the splits (B = 16, S = 1K: 128-key splits, 128 CTAs; 64-key ones measured 17 % slower on an H200).
  const int lone = default_kv_len_per_split(16, 16, 1024, 132, DType::kBFloat16, true);
  check(grid_ctas(16, 1024, lone) <= 132, "a short batch of few rows runs one CTA per SM", DType::kBFloat16, 16, 16,
        1024, 132, true, lone);
  // Also for the shortest batches, a lone grid wins where the alternative is two CTAs per SM (B = 4, S = 4K: 128-key
  // splits, 128 CTAs, measured 15-17 % faster on an H200 than 64-key ones, 256 CTAs).
  const int lone_short = default_kv_len_per_split(4, 16, 4096, 132, DType::kBFloat16, true);
  check(grid_ctas(4, 4096, lone_short) <= 132, "a batch of 4 few-row sequences runs one CTA per SM", DType::kBFloat16,
        4, 16, 4096, 132, true, lone_short);
  // With one head it does not: B = 4, H = 1, S = 16K measured 10 % slower in 512-key lone splits than in 256-key ones.
  const int one_head = default_kv_len_per_split(4, 1, 16384, 132, DType::kBFloat16, true);
  check(grid_ctas(4, 16384, one_head) > 132, "one head keeps two CTAs per SM at B = 4, S = 16K", DType::kBFloat16, 4, 1,
        16384, 132, true, one_head);
  // B = 1, H = 128, S = 1K with seq_lens: 16 pieces of 64 keys, 32 CTAs and a combine sized for 16 splits, where a
  // wave of 66 per row block launched 134 CTAs and a combine sized for 132 (3-5 us more than the fixed split).
  const BalancedSplit one_short = balanced_split_for(1, 128, 1024, 132, DType::kBFloat16, true);
  check(one_short.target == 16, "one short sequence of many rows: 16 work items", DType::kBFloat16, 1, 128, 1024, 132,
        true, one_short.target);
  // The sm_90a kernel's calls at 128 heads, where H200 graph timings put one wave ahead of two (perf-log v51):
  // B = 23, S = 4K in two pieces merged in clusters (92 CTAs, ~13 % faster than 5 pieces in 230 CTAs); B = 14, S = 16K
  // in 4 pieces (112 CTAs, ~7 % faster than 9 pieces in 252).
  const int merged = default_kv_len_per_split(23, 128, 4096, 132, DType::kBFloat16, true);
  check(merged == 2048, "B = 23, H = 128, S = 4K: two pieces merged in one wave", DType::kBFloat16, 23, 128, 4096, 132,
        true, merged);
  const int one_wave = default_kv_len_per_split(14, 128, 16384, 132, DType::kBFloat16, true);
  check(one_wave == 4096, "B = 14, H = 128, S = 16K: four pieces in one wave", DType::kBFloat16, 14, 128, 16384, 132,
        true, one_wave);
  std::printf("split planner rules: %s\n", failures == 0 ? "all hold" : "FAILED");
  return failures == 0 ? 0 : 1;
}
