// Global -> shared copies of the query block and of KV tiles (cp.async, 16 bytes per request), shared by every
// decode kernel variant. A tile row holds one key's [kv (512) | k_pe (64)] (or one query row's [q | q_pe]),
// 16-byte chunks XOR-swizzled by (row % 8) so the 8 rows an ldmatrix / vector load touches hit distinct banks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "params.h"

namespace mla::cuda {

template <typename T>
struct RowLayout {
  static constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));
  static constexpr int kKvChunks = kHeadDim / kElemsPerChunk;  // chunks of the latent part
  static constexpr int kPeChunks = kRopeDim / kElemsPerChunk;  // chunks of the rotary part
  static constexpr int kChunks = kKvChunks + kPeChunks;        // a multiple of 8: the swizzle stays in the row
  static constexpr int kBytes = kChunks * 16;
  static_assert(kChunks % 8 == 0, "row swizzle needs whole groups of 8 chunks");

  __device__ static __forceinline__ uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>(row * kBytes + ((chunk ^ (row & 7)) << 4));
  }
};

// Query rows [row_begin, row_begin + kRowTile) of the CTA's sequence; rows past S_q * H are zero-filled. A row is
// shared by as many threads as it has rotary chunks (8 for 2-byte types, 16 for fp32): thread k copies latent chunks
// k, k + kPeChunks, ... and rotary chunk k, so it works out its row's q and q_pe addresses once (a division by the head
// count and three 64-bit products) instead of once per chunk, and a warp's copies read whole 128-byte lines. Its
// chunks share their swizzle: chunk ^ (row & 7) changes bits 0-2 only.
template <typename T, int kRowTile, int kThreads>
__device__ __forceinline__ void load_query_block(const DecodeParams& p, const CtaWork& w, uint8_t* q_smem) {
  using L = RowLayout<T>;
  constexpr int kThreadsPerRow = L::kPeChunks;
  constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  static_assert(kThreads % kThreadsPerRow == 0 && L::kKvChunks % kThreadsPerRow == 0, "whole rows per pass");
  const int k = threadIdx.x % kThreadsPerRow;
  const uint32_t base = smem_u32(q_smem);
#pragma unroll
  for (int pass = 0; pass < (kRowTile + kRowsPerPass - 1) / kRowsPerPass; ++pass) {
    const int row = pass * kRowsPerPass + static_cast<int>(threadIdx.x / kThreadsPerRow);
    if (kRowTile % kRowsPerPass != 0 && row >= kRowTile) break;
    const int r = w.row_begin + row;
    const T* q_row = static_cast<const T*>(p.q);  // a valid address for the zero-filling copies of padding rows
    const T* q_pe_row = q_row;
    int bytes = 0;
    if (r < w.rows) {
      q_row = query_chunk<T>(p, w.batch_index, r, k);
      q_pe_row = query_chunk<T>(p, w.batch_index, r, L::kKvChunks + k);
      bytes = 16;
    }
    const uint32_t dst = base + L::offset(row, k);
#pragma unroll
    for (int i = 0; i < L::kKvChunks / kThreadsPerRow; ++i) {
      cp_async_16(dst + i * kThreadsPerRow * 16, q_row + i * kThreadsPerRow * L::kElemsPerChunk, bytes);
    }
    cp_async_16(dst + L::kKvChunks * 16, q_pe_row, bytes);
  }
}

// A tile's page lookup, issued a pipeline step before its copy so the block_table read's latency hides behind a
// tile of math. Whole-page tiles (every key in range, all on one page: every interior tile of a dense cache, and of
// a paged one whose pages hold whole tiles) look their page up once: `key` is the tile's first key in every lane.
// Other tiles look up each key: `key` is lane i's row warp + kWarps * i.
struct PendingTile {
  PendingKey key;
  bool whole_page;  // the same in every thread of the CTA
};

// Copies KV tiles. Warp w owns rows w, w + kWarps, ... of a tile; 32 lanes x 16 bytes of one row per instruction,
// coalesced. A whole-page tile's rows lie at one stride from the page's row, so each lane steps its own pointers (no
// per-row exchange). Other tiles take the per-key path: lane i resolves the page of its row i (one block_table read and
// one division per key) and broadcasts the row's offsets when the warp copies that row. Invisible keys are zero-filled
// without a global read, so NaN in unused slots never enters, and their `valid` byte is 0 for the masks.
template <typename T, int kKeyTile, int kThreads>
struct KvTileCopier {
  using L = RowLayout<T>;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowsPerWarp = kKeyTile / kWarps;
  static constexpr int kStageBytes = kKeyTile * L::kBytes;  // a tile in shared memory
  static_assert(kKeyTile % kWarps == 0 && kRowsPerWarp <= 32, "rows of a tile split evenly over warps");
  static_assert(L::kPeChunks <= 32, "one rotary chunk per lane");

  // The tile's page lookups, whole-page where every key is in range and on one page.
  __device__ static __forceinline__ PendingTile fetch(const DecodeParams& p, const CtaWork& w, int tile_begin) {
    if (tile_begin + kKeyTile <= w.key_end) {  // every key in range (tile_begin >= key_begin)
      if (p.block_table == nullptr) return PendingTile{{w.batch_index, tile_begin, true}, true};
      const int page_in_seq = tile_begin / p.page_size;
      const int offset = tile_begin - page_in_seq * p.page_size;
      if (offset + kKeyTile <= p.page_size) {
        return PendingTile{{block_table_entry(p, w.batch_index, page_in_seq), offset, true}, true};
      }
    }
    return fetch_per_key(p, w, tile_begin);
  }

  __device__ static __forceinline__ PendingTile fetch_per_key(const DecodeParams& p, const CtaWork& w, int tile_begin) {
    const int lane = threadIdx.x & 31;
    const int row = static_cast<int>(threadIdx.x >> 5) + kWarps * lane;
    return PendingTile{fetch_key(p, w, lane < kRowsPerWarp ? tile_begin + row : -1), false};
  }

  __device__ static __forceinline__ void issue(const DecodeParams& p, const PendingTile& tile, uint8_t* kv_smem,
                                               uint8_t* valid) {
    const KeySlot slot = resolve_key(p, tile.key);
    if (tile.whole_page && slot.page >= 0) {
      issue_whole_page(p, slot, kv_smem, valid);
      return;
    }
    // A whole-page tile on an invalid page lands here too: every lane holds the page, so every row is zero-filled.
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const bool ok = slot.page >= 0;
    const int64_t kv_off = ok ? slot.page * p.kv_page_stride + slot.offset * p.kv_row_stride : 0;
    const int64_t pe_off = ok ? slot.page * p.k_pe_page_stride + slot.offset * p.k_pe_row_stride : 0;
    if (lane < kRowsPerWarp) valid[warp + kWarps * lane] = ok ? 1 : 0;
    const T* kv = static_cast<const T*>(p.kv) + lane * L::kElemsPerChunk;
    const T* k_pe = static_cast<const T*>(p.k_pe) + lane * L::kElemsPerChunk;
    const uint32_t base = smem_u32(kv_smem);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int64_t row_kv = __shfl_sync(0xffffffffu, kv_off, i);
      const int64_t row_pe = __shfl_sync(0xffffffffu, pe_off, i);
      const int bytes = __shfl_sync(0xffffffffu, ok ? 16 : 0, i);
      copy_row(base, warp + kWarps * i, kv + row_kv, k_pe + row_pe, bytes);
    }
  }

  // Rows slot.offset + row of page slot.page, all visible.
  __device__ static __forceinline__ void issue_whole_page(const DecodeParams& p, const KeySlot& slot, uint8_t* kv_smem,
                                                          uint8_t* valid) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane < kRowsPerWarp) valid[warp + kWarps * lane] = 1;
    const int64_t first_row = slot.offset + warp;
    const T* kv = static_cast<const T*>(p.kv) + slot.page * p.kv_page_stride + first_row * p.kv_row_stride +
                  lane * L::kElemsPerChunk;
    const T* k_pe = static_cast<const T*>(p.k_pe) + slot.page * p.k_pe_page_stride + first_row * p.k_pe_row_stride +
                    lane * L::kElemsPerChunk;
    const int64_t kv_step = kWarps * p.kv_row_stride;
    const int64_t pe_step = kWarps * p.k_pe_row_stride;
    const uint32_t base = smem_u32(kv_smem);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) copy_row(base, warp + kWarps * i, kv + i * kv_step, k_pe + i * pe_step, 16);
  }

  // Tile row `row` from this lane's chunks of one key's latent and rotary parts (`bytes` 0: zero-filled).
  __device__ static __forceinline__ void copy_row(uint32_t base, int row, const T* kv, const T* k_pe, int bytes) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int c = 0; c < L::kKvChunks; c += 32) {
      cp_async_16(base + L::offset(row, c + lane), kv + c * L::kElemsPerChunk, bytes);
    }
    if (lane < L::kPeChunks) cp_async_16(base + L::offset(row, L::kKvChunks + lane), k_pe, bytes);
  }
};

// The cp.async pipeline over a CTA's KV tiles: kStages shared-memory stages, each with a `valid` byte per key.
// The page lookups of tile t + 1 are in flight while tile t is issued; the query block rides in the first commit
// group with tile 0. A stage and its valid bytes are rewritten only after the barrier that ends their last use.
// The start's kStages - 1 tiles take the per-key path: whole-page ones there made the lone few-row CTAs of 4 tiles
// 10 % slower (docs/perf-log.md, v33, v34). Copier lays a tile out in its stage (KvTileCopier: 16-bit rows;
// Fp8TileCopier in fp8_tile_loader.cuh: fp8 keys as stored).
template <typename T, int kRowTile, int kKeyTile, int kStages, int kThreads,
          class Copier_ = KvTileCopier<T, kKeyTile, kThreads>>
struct KvPipeline {
  using Copier = Copier_;
  static constexpr int kStageBytes = Copier::kStageBytes;
  static constexpr int kValidBytes = (kStages * kKeyTile + 15) / 16 * 16;  // shared memory for the valid bytes

  uint8_t* kv_smem;  // [kStages][kStageBytes]
  uint8_t* valid;    // [kStages][kKeyTile]: 1 where the key was loaded (visible for load purposes)
  PendingTile pending;

  __device__ __forceinline__ void start(const DecodeParams& p, const CtaWork& w, uint8_t* q_smem) {
    if (w.num_tiles == 0) return;
    load_query_block<T, kRowTile, kThreads>(p, w, q_smem);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < w.num_tiles) {
        Copier::issue(p, Copier::fetch_per_key(p, w, w.key_begin + s * kKeyTile), kv_smem + s * kStageBytes,
                      valid + s * kKeyTile);
      }
      cp_async_commit();
    }
    if (kStages - 1 < w.num_tiles) pending = Copier::fetch(p, w, w.key_begin + (kStages - 1) * kKeyTile);
  }

  // Makes tile `tile` visible to every thread and queues tile + kStages - 1 into the stage freed by tile - 1.
  __device__ __forceinline__ void advance(const DecodeParams& p, const CtaWork& w, int tile) {
    const int next = tile + kStages - 1;
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (next < w.num_tiles) {
      Copier::issue(p, pending, kv_smem + (next % kStages) * kStageBytes, valid + (next % kStages) * kKeyTile);
      if (next + 1 < w.num_tiles) pending = Copier::fetch(p, w, w.key_begin + (next + 1) * kKeyTile);
    }
    cp_async_commit();
  }

  __device__ __forceinline__ const uint8_t* stage(int tile) const { return kv_smem + (tile % kStages) * kStageBytes; }
  __device__ __forceinline__ const uint8_t* key_valid(int tile) const { return valid + (tile % kStages) * kKeyTile; }
};

}  // namespace mla::cuda
