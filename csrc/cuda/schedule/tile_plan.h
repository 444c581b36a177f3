// Row tiles of the CUDA kernels, shared by the kernel choice (launch/kernel_choice.h), the launcher and the split
// planner (split_plan.cpp), which sizes the grid from them.
// Plain C++: compiled by both nvcc and the host compiler.
#pragma once

#include "params.h"

namespace mla::cuda {

constexpr int kSmallRowTile = 16;  // few query rows per sequence (H * S_q <= 16): memory-bound, one row group
constexpr int kMidRowTile = 32;    // two 16-row groups sharing each KV tile
constexpr int kLargeRowTile = 64;  // many rows (e.g. H = 128): more math per KV tile, 8 warps

// The portable kernels' row tile.
inline int row_tile_for(int rows_per_seq, DType dtype) {
  if (dtype == DType::kFloat32 || rows_per_seq <= kSmallRowTile) return kSmallRowTile;
  return rows_per_seq <= kMidRowTile ? kMidRowTile : kLargeRowTile;
}

// Rows per sequence the sm_90a kernel (launch_sm90.h) takes: up to 16 the portable kernel streams the cache faster;
// from 17 the 64-row tiles, part of them empty, still beat its 32-row one (perf-log v25).
inline bool sm90_takes_rows(int64_t rows_per_seq) {
  return rows_per_seq > kSmallRowTile;
}
// The sm_90a kernel's tiles: 64 rows (kLargeRowTile) and 64 keys, which splits and pages must hold whole.
constexpr int kSm90KeyTile = 64;

// Keys' worth of a CTA's fixed cost (query load, pipeline fill, launch) in the split planners; a balanced range
// charges it (plus a key per query row) for every sequence it walks.
constexpr int kCtaOverheadKeys = 64;
inline int range_seq_cost(int row_tile) {
  return kCtaOverheadKeys + row_tile;
}

// Fixed splits merged in thread-block clusters (cluster_merge.cuh), which the split planner weighs as well: the
// sm_90a kernel's clusters hold a row block's two pieces (perf-log v50). Pieces longer than kClusterMergeMaxKeys keep
// the combine: there the cluster kernels measured slower than the usual kernel and the combine together (the few-row
// one's loop is laid out around the merge: perf-log v45; sm_90a: v50).
constexpr int kSm90ClusterPieces = 2;
constexpr int kClusterMergeMaxKeys = 2048;

// Whether the sm_90a kernel merges a fixed split of `splits` pieces of `len` keys in clusters, where the clusters keep
// the grid resident (the launcher asks the occupancy API; the split planner takes one wave for it).
inline bool sm90_merges_fixed_split(int64_t splits, int64_t len) {
  return splits == kSm90ClusterPieces && len <= kClusterMergeMaxKeys;
}

// CTAs of that row tile resident per SM on the GPUs the defaults are tuned for (H100 / H200).
inline int ctas_per_sm_for(int row_tile) {
  return row_tile == kSmallRowTile ? 2 : 1;
}

}  // namespace mla::cuda
