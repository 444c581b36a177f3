// The tile copies of a float8_e4m3fn cache (DecodeParams::cache_format) for KvPipeline (tile_loader.cuh), as the fp8
// kernel (kernels/few_rows_fp8.cuh) reads them: tiles are copied as they are stored, half the bytes of a 16-bit cache
// per key, and the kernel converts the values it reads into its mma fragments, so no converted copy of a tile is kept
// and the stages can hold twice the tiles in flight.
//
// A stage holds a tile's keys as stored, in regions: the latent bytes [key][512], the rope [key][64 e4m3 or 64 T] and,
// per block, the scales [key][4 fp32]. Their 16-byte chunks are XOR-swizzled by key so that the kernel's fragment
// loads (few_rows_fp8.cuh), which read 8 keys x 64 bytes, 4 keys x 2 chunks or 8 keys x 16 bytes at a time, hit
// every bank once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/common/tile_loader.cuh"
#include "params.h"

namespace mla::cuda {

template <CacheFormat kFormat, typename T, int kKeyTile>
struct Fp8StageLayout {
  static_assert(kFormat == CacheFormat::kFp8PerTensor || kFormat == CacheFormat::kFp8PerBlock, "an fp8 cache");
  static constexpr bool kPerBlock = kFormat == CacheFormat::kFp8PerBlock;
  static constexpr int kLatentChunks = kHeadDim / 16;                            // 32 per key
  static constexpr int kPeElementBytes = kPerBlock ? sizeof(T) : 1;              // T per block, e4m3 per tensor
  static constexpr int kPeChunks = kRopeDim * kPeElementBytes / 16;              // 8 or 4 per key
  static constexpr int kPeOffset = kKeyTile * kHeadDim;                          // the rope region
  static constexpr int kScaleOffset = kPeOffset + kKeyTile * kPeChunks * 16;     // per block: the scale region
  static constexpr int kBytes = kScaleOffset + (kPerBlock ? kKeyTile * 16 : 0);  // 576 or 656 bytes a key
  static_assert(kLatentChunks == 32 && kPeChunks < 32, "a chunk per lane");

  // Chunk `chunk` of key `key`'s latent bytes: keys 2 apart (P . V reads 4 of them) and neighbours (the scores read
  // 2) land on different chunk positions within each group of 8.
  __device__ static __forceinline__ uint32_t latent(int key, int chunk) {
    return static_cast<uint32_t>(key * kHeadDim + ((chunk ^ (((key >> 1) & 3) << 1) ^ ((key & 1) << 2)) << 4));
  }
  __device__ static __forceinline__ uint32_t rope(int key, int chunk) {
    const int swizzle = kPerBlock ? (key & 3) << 1 : (key >> 1) & 3;
    return static_cast<uint32_t>(kPeOffset + key * kPeChunks * 16 + ((chunk ^ swizzle) << 4));
  }
  __device__ static __forceinline__ uint32_t scales(int key) { return static_cast<uint32_t>(kScaleOffset + key * 16); }
};

// KvPipeline's copier for an fp8 cache: the page lookups are those of a 16-bit cache (KvTileCopier), the copies lay
// keys out as stored (Fp8StageLayout).
template <typename T, CacheFormat kFormat, int kKeyTile, int kThreads>
struct Fp8TileCopier : KvTileCopier<T, kKeyTile, kThreads> {
  static_assert(sizeof(T) == 2, "fp16 or bf16 queries");
  using Base = KvTileCopier<T, kKeyTile, kThreads>;
  using Base::kRowsPerWarp;
  using Base::kWarps;
  using Stage = Fp8StageLayout<kFormat, T, kKeyTile>;
  static constexpr bool kPerBlock = Stage::kPerBlock;
  static constexpr int kStageBytes = Stage::kBytes;

  // Key `row` of a stage from its latent, rope and scale rows (bytes 0: zero-filled, so an invisible key reads as 0,
  // never NaN).
  __device__ static __forceinline__ void copy_row(uint32_t stage, int row, const uint8_t* kv, const uint8_t* k_pe,
                                                  const float* scales, int bytes) {
    const int lane = threadIdx.x & 31;
    cp_async_16(stage + Stage::latent(row, lane), kv + lane * 16, bytes);
    if (lane < Stage::kPeChunks) cp_async_16(stage + Stage::rope(row, lane), k_pe + lane * 16, bytes);
    if (kPerBlock && lane == Stage::kPeChunks) cp_async_16(stage + Stage::scales(row), scales, bytes);
  }

  // Warp w copies rows w, w + kWarps, ... A whole-page tile's rows follow its first key at one stride; otherwise lane i
  // resolved the page of row warp + kWarps * i and hands its offsets to the warp when the row is copied.
  __device__ static __forceinline__ void issue(const DecodeParams& p, const PendingTile& tile, uint8_t* stage,
                                               uint8_t* tile_valid) {
    const KeySlot slot = resolve_key(p, tile.key);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const bool ok = slot.page >= 0;
    const bool whole = tile.whole_page && ok;
    if (lane < kRowsPerWarp) tile_valid[warp + kWarps * lane] = ok ? 1 : 0;
    const int64_t page = ok ? slot.page : 0;
    const int64_t key = ok ? slot.offset + (whole ? warp : 0) : 0;
    const int64_t kv_off = page * p.kv_page_stride + key * p.kv_row_stride;  // bytes
    const int64_t pe_off = (page * p.k_pe_page_stride + key * p.k_pe_row_stride) * Stage::kPeElementBytes;
    const int64_t scale_off = kPerBlock ? page * p.kv_scale_page_stride + key * p.kv_scale_row_stride : 0;  // floats
    const uint8_t* kv = static_cast<const uint8_t*>(p.kv);
    const uint8_t* k_pe = static_cast<const uint8_t*>(p.k_pe);
    const uint32_t base = smem_u32(stage);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int row = warp + kWarps * i;
      if (whole) {
        const int64_t step = static_cast<int64_t>(kWarps) * i;
        copy_row(base, row, kv + kv_off + step * p.kv_row_stride,
                 k_pe + pe_off + step * p.k_pe_row_stride * Stage::kPeElementBytes,
                 p.kv_scale + scale_off + (kPerBlock ? step * p.kv_scale_row_stride : 0), 16);
      } else {
        copy_row(base, row, kv + __shfl_sync(0xffffffffu, kv_off, i), k_pe + __shfl_sync(0xffffffffu, pe_off, i),
                 p.kv_scale + __shfl_sync(0xffffffffu, scale_off, i), __shfl_sync(0xffffffffu, ok ? 16 : 0, i));
      }
    }
  }
};

}  // namespace mla::cuda
