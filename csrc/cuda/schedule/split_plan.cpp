// Default split size for the CUDA decode: pick kv_len_per_split from shapes and the SM count only (never from
// seq_lens, so the choice is the same at CUDA-graph capture and replay).
//
// Cost model, in units of "one CTA slot streaming one key": a CTA costs its keys plus a fixed overhead (query load,
// pipeline fill, launch latency); CTAs run in waves of one per slot (two slots per SM for the few-row tile); more than
// one split adds the combine pass over the fp32 partials (written and read once, spread over all SMs) plus a second
// launch. A few-row grid of at most one CTA per SM runs faster than the slot count says, so its costs are divided by
// a measured speedup. On the sm_90a kernel a wave costs more beyond its keys, and two pieces in one wave merge in
// clusters instead of the combine. The candidate with the lowest cost wins; ties go to fewer splits. Small batches
// therefore spread one sequence over the whole GPU, large ones keep one split per sequence once a wave is full, and
// wave quantisation is weighed against split overhead.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cuda/schedule/split_plan.h"
#include "cuda/schedule/tile_plan.h"

namespace mla::cuda {
namespace {

constexpr int64_t kSplitAlign = 16;  // kv_len_per_split is a multiple of 16 (fp32's 16-key tile off Hopper)
// Many-row blocks split on 64-key boundaries: the Hopper kernel loads whole 64-key tiles (a split that starts
// elsewhere sends the call to the portable kernel), and the portable kernel's tiles are 64 or 32 keys anyway.
constexpr int64_t kLargeRowSplitAlign = 64;
// Splits and balanced ranges for few and mid rows cut on those kernels' 32-key tiles (fp32's 32-key tiles on Hopper
// too; its 16-key tiles elsewhere divide it): a split or cut of 16 mod 32 keys ends in a half-empty tile that costs a
// whole one (perf-log v21, v32).
constexpr int kRangeCutAlign = 32;
// Batches up to this size: one CTA per SM in balanced splits; see also lone_grid_divisors.
constexpr int kDeepBatch = 4;
constexpr double kCombineLaunchKeys = 32.0;
// A few-row CTA alone on its SM (a grid of at most one CTA per SM, which the launcher runs with deeper prefetch on
// Hopper) streams its keys ~1.77x as fast as one of two sharing an SM (H200: ~27 against ~16 GB/s each, perf-log
// v31). Which of a lone grid's costs it divides is fitted to H200 measurements (perf-log v31, v32): see
// lone_grid_divisors.
constexpr double kLoneCtaSpeedup = 1.77;
// From this many rows per sequence (8 and 16 heads measured) a lone grid's CTA overhead is cheaper too; with 1 head,
// longer lone splits measured 2-10 % slower than shorter shared ones, so fewer rows keep v31's rule (perf-log v32).
constexpr int kLoneOverheadRows = 8;
// The sm_90a kernel's waves, in keys' worth of one CTA's loop, fitted to H200 graph timings (32-128 rows, 1K-16K keys,
// 4-80 sequences; checked on 24-256 rows and up to 32K keys: perf-log v51): a wave costs ~320 beyond its keys (the
// 72 KB query load, the pipeline fill, the epilogue's normalisation and partial rows, and the ragged end of a wave of
// CTAs that stream at different rates); a cluster merge (kSm90ClusterPieces pieces) costs ~96 where the combine's
// launch and partials' round trip would be.
constexpr double kSm90WaveOverheadKeys = 320.0;
constexpr double kSm90ClusterMergeKeys = 96.0;

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// What a grid of at most one CTA per SM divides its costs by, where the tile otherwise puts two CTAs on an SM.
struct LoneGridDivisors {
  double stream = 1.0;
  double overhead = 1.0;
  double combine = 1.0;
};
LoneGridDivisors lone_grid_divisors(int batch, int rows_per_seq, int ctas_per_sm) {
  LoneGridDivisors d;
  if (ctas_per_sm <= 1) return d;
  if (rows_per_seq >= kLoneOverheadRows) {
    d.stream = d.overhead = kLoneCtaSpeedup;
    // Short batches: the combine too; weighed in full it gave them too few splits (B = 1-2, perf-log v32).
    if (batch <= kDeepBatch) d.combine = kLoneCtaSpeedup;
  } else if (batch > kDeepBatch) {
    d.stream = kLoneCtaSpeedup;
  }
  return d;
}

// The most work items the device's plan can cut one sequence of at most `capacity` keys into: it cuts n keys into
// round(n / L) pieces with L >= sqrt(split_cost * n) (balanced_items.cuh), at most sqrt(n / split_cost) + 1/2. The
// extra 0.01 covers the device's float square root (relative error ~1e-7, below 0.005 for any int capacity).
int64_t most_pieces_of_one_sequence(int capacity, float split_cost) {
  const double bound = std::sqrt(static_cast<double>(std::max(capacity, 1)) / split_cost) + 0.51;
  return std::max<int64_t>(1, static_cast<int64_t>(bound));
}

}  // namespace

int default_kv_len_per_split(int batch, int rows_per_seq, int capacity, int num_sms, DType dtype,
                             const KernelChoice& kernel) {
  if (capacity <= 0 || batch <= 0 || rows_per_seq <= 0) return static_cast<int>(kSplitAlign);
  const int row_tile = kernel.row_tile;
  const int64_t align = row_tile == kLargeRowTile                    ? kLargeRowSplitAlign
                        : dtype == DType::kFloat32 && !kernel.hopper ? kSplitAlign
                                                                     : kRangeCutAlign;
  const int ctas_per_sm = dtype == DType::kFloat32 ? 1 : ctas_per_sm_for(row_tile);
  const int64_t slots = static_cast<int64_t>(std::max(num_sms, 1)) * ctas_per_sm;
  const int64_t row_blocks = ceil_div(rows_per_seq, row_tile);
  const int64_t base_ctas = static_cast<int64_t>(batch) * row_blocks;
  const double element_bytes = dtype == DType::kFloat32 ? 4.0 : 2.0;
  const double key_bytes = (kHeadDim + kRopeDim) * element_bytes;
  const bool sm90_kernel = kernel.kernel == MainKernel::kSm90;
  // A wave's fixed cost: the portable tiles' CTA overhead (the query block weighing a key per row), or the fit above.
  const double overhead = sm90_kernel ? kSm90WaveOverheadKeys : range_seq_cost(row_tile);
  // Partial rows are fp32 [D], written by the main kernel and read by the combine. With few rows the combine has
  // few independent units of work (row x 128 columns) and streams the partials well below bandwidth, so they
  // weigh more (up to 4x, measured on H200).
  const double combine_units = static_cast<double>(batch) * rows_per_seq * 4.0;
  const double partial_weight = std::clamp(2.0 * static_cast<double>(num_sms) / combine_units, 1.0, 4.0);
  const double partial_keys_per_split = partial_weight * static_cast<double>(batch) * rows_per_seq * kHeadDim * 4.0 *
                                        2.0 / key_bytes / static_cast<double>(slots);

  const LoneGridDivisors lone_divisors = lone_grid_divisors(batch, rows_per_seq, ctas_per_sm);

  const int64_t max_splits = std::min<int64_t>(ceil_div(capacity, align), 8 * slots);
  double best_cost = std::numeric_limits<double>::infinity();
  int64_t best_len = round_up(capacity, align);
  int64_t last_len = -1;
  for (int64_t want = 1; want <= max_splits; ++want) {
    const int64_t len = round_up(ceil_div(capacity, want), align);
    if (len == last_len) continue;
    last_len = len;
    const int64_t splits = ceil_div(capacity, len);
    const int64_t ctas = base_ctas * splits;
    const int64_t waves = ceil_div(ctas, slots);
    const LoneGridDivisors by = ctas <= num_sms ? lone_divisors : LoneGridDivisors{};
    double cost = static_cast<double>(waves) * (static_cast<double>(len) / by.stream + overhead / by.overhead);
    // The launcher merges such a split in clusters where they keep the grid resident (one wave, here).
    const bool merged = sm90_kernel && sm90_merges_fixed_split(splits, len) && ctas <= static_cast<int64_t>(num_sms);
    if (merged) {
      cost += kSm90ClusterMergeKeys;
    } else if (splits > 1) {
      cost += (kCombineLaunchKeys + partial_keys_per_split * static_cast<double>(splits)) / by.combine;
    }
    if (cost < best_cost) {
      best_cost = cost;
      best_len = len;
    }
  }
  const int64_t limit = std::numeric_limits<int>::max() / 2 / kLargeRowSplitAlign * kLargeRowSplitAlign;
  return static_cast<int>(std::min(best_len, limit));
}

BalancedSplit balanced_split_for(int batch, int rows_per_seq, int capacity, int num_sms, DType dtype,
                                 const KernelChoice& kernel) {
  const int row_tile = kernel.row_tile;
  // Small batches of few rows get one CTA per SM (the launcher then picks the deep-prefetch configuration), as the
  // shape-only planner does when its grid leaves SMs free; otherwise the tile's usual CTAs per SM.
  const bool one_per_sm = dtype == DType::kFloat32 || (row_tile == kSmallRowTile && batch <= kDeepBatch);
  const int64_t slots = static_cast<int64_t>(std::max(num_sms, 1)) * (one_per_sm ? 1 : ctas_per_sm_for(row_tile));
  const int64_t row_blocks = ceil_div(std::max(rows_per_seq, 1), row_tile);
  // Splitting a sequence of n keys into n / L pieces costs about L (the longest piece) plus cost * n / L (partials
  // written and merged, proportional to the rows); the best L is sqrt(cost * n). cost = rows / 32 matches the
  // shape-only planner above for one sequence (e.g. L = 128 at 16 rows and 16K keys, 256 at 128 rows).
  const float split_cost = std::max(1.0f, static_cast<float>(rows_per_seq) / 32.0f);
  const int align = row_tile == kLargeRowTile ? static_cast<int>(kLargeRowSplitAlign) : kRangeCutAlign;
  // Few rows: ranges, each sequence costing a CTA's overhead as in the shape-only planner. Many rows: work items;
  // there a cut costs 64+ fp32 partial rows and another query load, and ranges (which cut nearly every sequence of
  // a near-uniform batch) measured 1.05-1.45x slower than items on the H200 (perf-log v11).
  const int seq_cost = row_tile == kLargeRowTile ? 0 : range_seq_cost(row_tile);
  int64_t target = std::max<int64_t>(1, slots / row_blocks);
  // One sequence cut into work items is never ragged: launch (and size the combine) for the pieces its capacity
  // allows, not a wave of mostly spare CTAs (B = 1, H = 128, S = 1K: 16 pieces where a wave is 66).
  if (batch == 1 && seq_cost == 0) target = std::min(target, most_pieces_of_one_sequence(capacity, split_cost));
  return BalancedSplit{static_cast<int>(target), split_cost, seq_cost, align};
}

}  // namespace mla::cuda
