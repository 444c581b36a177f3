// The sm_90a decode kernel's CTA tile (decode_kernel_sm90.cuh): its shared-memory layout, barriers and register
// split, and the pieces around the tile loop: the page lookup, the query tile load and the epilogue that writes
// out / lse or the fp32 split partials.
//
// Operand tiles use the 128-byte swizzle that both TMA and wgmma understand: 64-column blocks of 64 rows, 8192
// bytes each, row r at r * 128, 16-byte chunk c at chunk c ^ (r % 8).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/combine/cluster_merge.cuh"
#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "params.h"

namespace mla::cuda::sm90 {

struct Sm90Tile {
  static constexpr int kRowTile = 64;  // query rows per CTA (one wgmma M)
  static constexpr int kKeyTile = 64;  // keys per stage
  static constexpr int kStages = 2;    // even tiles in stage 0 (consumer warpgroup 0's), odd ones in stage 1
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kBlockCols = 64;                               // columns of one swizzled block (128 bytes)
  static constexpr int kBlockBytes = 64 * 128;                        // 64 rows x 128 bytes
  static constexpr int kBlocks = (kHeadDim + kRopeDim) / kBlockCols;  // 9: 8 latent + 1 rotary
  static constexpr int kLatentBlocks = kHeadDim / kBlockCols;         // 8
  static constexpr int kTileBytes = kBlocks * kBlockBytes;            // one [64 x 576] operand, 73728 bytes
  static constexpr int kPBlock = kLatentBlocks;  // a tile's P lives in its stage's k_pe block once its S is complete
  static constexpr int kHalves = 2;              // V halves of a stage, one per consumer warpgroup
  static constexpr int kHalfBlocks = kLatentBlocks / kHalves;         // half c = latent blocks [4c, 4c + 4)
  static constexpr int kHalfWarps = kConsumerThreads / kHalves / 32;  // a warpgroup's warps: empty barrier count
  // Dynamic shared memory: Q and the two KV stages, with alignment slack.
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kTileBytes;
  static constexpr int kAlign = 1024;  // the swizzle pattern repeats every 1024 bytes: tiles start aligned
  static constexpr int kSmemBytes = kKvOffset + kStages * kTileBytes + kAlign;
  // A stage's blocks land in three parts, each behind one full barrier: the owner's V half, the other half (4 blocks,
  // 32 KB each), then k_pe (one block).
  static constexpr int kParts = kHalves + 1;
  // mbarriers: full[stage][part], then empty[stage][half].
  static constexpr int kBarriers = kStages * kParts + kStages * kHalves;
  // Statically declared shared memory: barriers, published row maxima, row sums. Its presence also tells the
  // launcher that the sm_90a body was compiled (builds without sm_90a get an empty kernel with none).
  static constexpr int kStaticSmemBytes = kBarriers * 8 + 4 * kRowTile * 4;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kProducerRegs = 40;
  // Registers per thread at launch (__launch_bounds__(kThreads, 1), allocated in units of 8): 168. setmaxnreg moves
  // registers only within the CTA's allocation, so the consumers can take no more than the producer gives away
  // (256 x (232 - 168) = 128 x (168 - 40)); a consumer asking for more waits in its allocation loop for ever.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  // Named barriers (0 is __syncthreads). kConsumerBarrier: the 256 consumer threads. kReadyBarrier + t % 2: one-way
  // signal "P_t and m_t are in shared memory" from the owner of tile t to the other warpgroup (256 threads).
  // kOwnerBarrier + c: warpgroup c alone (128 threads), between writing P (and zeroing V rows) and its own P . V.
  static constexpr int kConsumerBarrier = 1;
  static constexpr int kReadyBarrier = 2;
  static constexpr int kOwnerBarrier = 4;

  // The first block of part `part` of a stage whose tiles warpgroup `owner` owns, parts in the order the producer
  // loads them and the owner's S reads them: the owner's V half (freed first), the other half, then k_pe (free once
  // both halves are).
  static constexpr int part_block(int owner, int part) {
    return part < kHalves ? (part ^ owner) * kHalfBlocks : kLatentBlocks;
  }
  // The i-th block of that walk, its part, and whether the block opens its part.
  static constexpr int walk_part(int i) { return i < kLatentBlocks ? i / kHalfBlocks : kHalves; }
  static constexpr int walk_block(int owner, int i) { return part_block(owner, walk_part(i)) + i % kHalfBlocks; }
  static constexpr bool opens_part(int i) { return i < kLatentBlocks ? i % kHalfBlocks == 0 : i == kLatentBlocks; }
  static constexpr int part_bytes(int part) { return part < kHalves ? kHalfBlocks * kBlockBytes : kBlockBytes; }

  static_assert(kHeadDim % kBlockCols == 0 && kRopeDim == kBlockCols, "576 = 8 latent blocks + 1 rotary block");
  static_assert(kStages == 2 && kHalves == 2, "tiles go in pairs, one per consumer warpgroup");
  static_assert(kPBlock + 1 == kBlocks, "8 latent blocks, then k_pe");
  static_assert(kSmemBytes + kStaticSmemBytes <= 232448, "fits Hopper's 227 KB per block");
  static_assert(ClusterMergeBuffer<kRowTile>::kBytes <= kKvOffset + kStages * kTileBytes,
                "a cluster merge stages the rows over Q and the KV stages");
  static_assert(kConsumerThreads * (kConsumerRegs - kLaunchRegs) <= 128 * (kLaunchRegs - kProducerRegs),
                "the consumers take no more registers than the producer frees");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Page holding the 64-key tile that starts at `key0` (< capacity) and the tile's first row in that page; -1 when
// the block_table entry is outside [0, P).
__device__ __forceinline__ int tile_page(const DecodeParams& p, const CtaWork& w, int key0, int& row_in_page) {
  const int page_in_seq = key0 / p.page_size;
  row_in_page = key0 - page_in_seq * p.page_size;
  const int page = p.block_table == nullptr ? w.batch_index : block_table_entry(p, w.batch_index, page_in_seq);
  return page >= 0 && page < p.num_pages ? page : -1;
}

// Query rows [row_begin, +64) as [q | q_pe] in the swizzled block layout; rows past S_q * H are zero. Eight threads
// share a row: thread k copies chunk k of each of the row's nine blocks (eight latent, one rotary), so each row's
// address is worked out once per thread instead of once per chunk (the per-chunk form was half of the instructions a
// short CTA executes, perf-log v62), and a warp's copies of one block read four whole 128-byte rows.
template <typename T>
__device__ __forceinline__ void load_query_tile(const DecodeParams& p, const CtaWork& w, uint32_t q_smem,
                                                int consumer_thread) {
  using C = Sm90Tile;
  constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunksPerBlockRow = 128 / 16;
  constexpr int kRowsPerPass = C::kConsumerThreads / kChunksPerBlockRow;
  constexpr int kLatentChunks = C::kLatentBlocks * kChunksPerBlockRow;  // a [q | q_pe] row's first q_pe chunk
  static_assert(kChunksPerBlockRow * kElemsPerChunk == C::kBlockCols, "a block row is eight 16-byte chunks");
  static_assert(C::kRowTile % kRowsPerPass == 0, "whole passes over the tile's rows");
  const int k = consumer_thread % kChunksPerBlockRow;
#pragma unroll
  for (int pass = 0; pass < C::kRowTile / kRowsPerPass; ++pass) {  // a fixed count: no peeled pass
    const int row = pass * kRowsPerPass + consumer_thread / kChunksPerBlockRow;
    const int r = w.row_begin + row;
    const T* q_row = static_cast<const T*>(p.q);  // a valid address for the zero-filling copies of padding rows
    const T* q_pe_row = q_row;
    int bytes = 0;
    if (r < w.rows) {
      q_row = query_chunk<T>(p, w.batch_index, r, 0);
      q_pe_row = query_chunk<T>(p, w.batch_index, r, kLatentChunks);
      bytes = 16;
    }
    const uint32_t dst = q_smem + row * 128 + ((k ^ (row & 7)) << 4);
#pragma unroll
    for (int block = 0; block < C::kLatentBlocks; ++block) {
      cp_async_16(dst + block * C::kBlockBytes, q_row + (block * kChunksPerBlockRow + k) * kElemsPerChunk, bytes);
    }
    cp_async_16(dst + C::kLatentBlocks * C::kBlockBytes, q_pe_row + k * kElemsPerChunk, bytes);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// This thread's shares of its two rows' sums, added over the 4 threads of each row and stored as warpgroup cw's share
// (red_sum[cw]); both warpgroups' shares are read (row_total) after the consumer barrier.
__device__ __forceinline__ void publish_row_sums(float (&row_sum)[2], float (*red_sum)[64], int cw, int warp_row,
                                                 int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    if ((lane & 3) == 0) red_sum[cw][warp_row + 8 * h] = row_sum[h];
  }
}
__device__ __forceinline__ float row_total(const float (*red_sum)[64], int row) {
  return red_sum[0][row] + red_sum[1][row];  // fixed order: deterministic
}

// Epilogue. Consumer warpgroup cw holds output columns [256 cw, +256) of rows warp_row and warp_row + 8 (acc,
// against row_max) and its share of the row sums; the shares are added in a fixed order (deterministic), then each
// row is written as out + lse (one split) or fp32 partials.
template <typename T>
__device__ __forceinline__ void write_rows(const DecodeParams& p, const CtaWork& w, const float (&acc)[128],
                                           const float (&row_max)[2], float (&row_sum)[2], float (*red_sum)[64], int cw,
                                           int warp_row, int lane) {
  using C = Sm90Tile;
  publish_row_sums(row_sum, red_sum, cw, warp_row, lane);
  named_barrier(C::kConsumerBarrier, C::kConsumerThreads);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp_row + 8 * h;
    if (r >= w.rows) continue;
    const float l = row_total(red_sum, warp_row + 8 * h);
    write_row_result<T, 32>(p, w, r, l, row_max[h], cw * 256 + 2 * (lane & 3), cw == 0 && (lane & 3) == 0,
                            [&](int j) { return make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]); });
  }
}

// Epilogue of the kernel launched in clusters of a (sequence, row block)'s two pieces (cluster_merge.cuh), by the 256
// consumer threads: the rows, normalised, staged over Q and the KV stages (free once both warpgroups' last products
// are complete), then merged with the other piece's into the output. The producer warpgroup joins the merge's
// cluster barriers.
template <typename T>
__device__ __forceinline__ void merge_rows_in_cluster(const DecodeParams& p, const CtaWork& w, const float (&acc)[128],
                                                      const float (&row_max)[2], float (&row_sum)[2],
                                                      float (*red_sum)[64], int cw, int warp_row, int lane,
                                                      uint8_t* buffer) {
  using C = Sm90Tile;
  publish_row_sums(row_sum, red_sum, cw, warp_row, lane);
  fence_proxy_async();  // this thread's stores below follow the wgmma reads of the same bytes
  named_barrier(C::kConsumerBarrier, C::kConsumerThreads);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = row_total(red_sum, warp_row + 8 * h);
    stage_row_for_merge<C::kRowTile, 32>(
        buffer, warp_row + 8 * h, l, row_max[h], cw * 256 + 2 * (lane & 3), cw == 0 && (lane & 3) == 0,
        [&](int j) { return make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]); });
  }
  // A thread merges 16 units (4 columns of a row; the CTA merges 256 columns of 64 rows): their remote loads go out 4
  // units at a time, 4 round trips instead of 16.
  constexpr int kBatch = 4;
  const int consumer_thread = cw * 128 + (static_cast<int>(threadIdx.x) & 127);
  merge_staged_rows_of<T, C::kRowTile, C::kConsumerThreads, kSm90ClusterPieces, kBatch>(
      p, w, buffer, consumer_thread, [] { named_barrier(C::kConsumerBarrier, C::kConsumerThreads); });
}

#endif  // sm_90a

}  // namespace mla::cuda::sm90
