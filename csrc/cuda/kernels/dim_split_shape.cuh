// The CTA shape and shared-memory layout the dim-split kernels share (few_rows.cuh on 16-bit caches, few_rows_fp8.cuh
// on fp8 ones): 16-row groups of 4 warps, each warp owning a quarter of the dims; the query block, then the KV stages
// as Copier lays them out, then the partial scores and the stages' valid bytes.
#pragma once

#include <cstdint>

#include "cuda/common/tile_loader.cuh"
#include "params.h"

namespace mla::cuda {

template <int kRowGroups>
constexpr int dim_split_threads() {
  return kRowGroups * 4 * 32;
}

template <typename T, int kRowGroups_, int kKeyTile_, int kStages_, bool kSm90Only_, class Copier>
struct DimSplitShape {
  using Element = T;
  static constexpr int kRowGroups = kRowGroups_;
  static constexpr int kRowTile = 16 * kRowGroups;
  static constexpr int kWarpsPerGroup = 4;
  static constexpr int kWarps = kRowGroups * kWarpsPerGroup;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeyTile = kKeyTile_;
  static constexpr int kStages = kStages_;
  static constexpr bool kSm90Only = kSm90Only_;
  static constexpr bool kWalksRanges = true;  // balanced splits: walks ranges (several sequences per CTA)

  static constexpr int kKeyNTiles = kKeyTile / 8;
  static constexpr int kWarpCols = kHeadDim / kWarpsPerGroup;  // 128 output columns per warp
  static constexpr int kColNTiles = kWarpCols / 8;

  using Row = RowLayout<T>;  // the query block's rows
  using Pipeline = KvPipeline<T, kRowTile, kKeyTile, kStages, kThreads, Copier>;
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kRowTile * Row::kBytes;
  static constexpr int kPartialOffset = kKvOffset + kStages * Pipeline::kStageBytes;  // [warp][n-tile][lane] float4
  static constexpr int kValidOffset = kPartialOffset + kWarps * kKeyNTiles * 32 * 16;
  static constexpr int kSmemBytes = kValidOffset + Pipeline::kValidBytes;

  static_assert(dim_split_threads<kRowGroups>() == kThreads, "the copier is sized for the CTA");
  static_assert(sizeof(T) == 2, "the tensor-core kernels take fp16 or bf16 queries");
  static_assert(kKeyTile % 16 == 0, "key tile: whole k16 steps of P . V");
  static_assert(kStages >= 2, "pipeline depth");
};

}  // namespace mla::cuda
