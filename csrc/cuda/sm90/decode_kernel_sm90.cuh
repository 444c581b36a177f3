// Split-KV MLA decode main kernel for Hopper (sm_90a): TMA-fed KV tiles and warpgroup MMA (wgmma), fp16/bf16.
//
// One CTA = (sequence, block of 64 query rows, KV split), 384 threads in three warpgroups (layout, barriers and
// the epilogue in cta_tile_sm90.cuh):
//   warpgroup 0   producer: one thread streams 64-key tiles [kv (512) | k_pe (64)] into two shared-memory stages
//                 with the bulk tensor copy engine, a full mbarrier per part (a V half, the other, k_pe); it gives its
//                 registers away.
//   warpgroups 1-2 consumers, "seesaw" schedule. WG c (c = 0, 1) owns the tiles t with t % 2 == c (= its stage):
//                 it computes their full S_t = Q . K_t^T (64 x 64, m64n64k16, both operands in shared memory), and
//                 accumulates output columns [256c, 256c + 256) from EVERY tile: O_c += P_t . V_t[:, 256c:], V being
//                 the tile read transposed (MN-major), so it reads V only from latent blocks [4c, 4c + 4) of a
//                 stage ("half c"). Each holds a 64 x 256 fp32 accumulator (128 registers per thread).
// The running row max is one chain through the tiles: the owner of tile t takes m_t = max(m_{t-1}, rowmax S_t),
// writes P_t = exp2(S_t - m_t) over the k_pe block of the tile's own stage (only the owner reads K, and its S_t is
// complete) and publishes m_t; both warpgroups rescale their O half and row-sum share by exp2(m_{t-1} - m_t) before
// adding P_t . V_t, so all four stay expressed against the same max. Per pair of tiles (a even, b = a + 1):
//   WG0: wait S_a | softmax a, signal a | O_0 += P_a V_a, free half 0 of a | wait signal b | O_0 += P_b V_b,
//        free half 0 of b | issue S_{a+2}
//   WG1:          wait signal a, wait S_b | O_1 += P_a V_a | softmax b, signal b | free half 1 of a |
//        O_1 += P_b V_b, free half 1 of b | issue S_{b+2}
// so each softmax overlaps the other warpgroup's products (S_b under softmax a, both P_a . V_a under softmax b).
//
// Stages are released in halves. Of a stage's nine 64-column blocks, K (all of them) is read by the owner's S only,
// V half c (blocks 4c..4c+3) by WG c's P . V only, and block 8 holds P once S is complete, read by both P . V. So
// half c is free once S and WG c's P . V of the tile are complete, and block 8 once both halves are. Each stage has
// one empty mbarrier per half; the producer refills a stage in the order its owner's S walks it: the owner's half,
// the other half, then k_pe. So tile a + 2 starts loading (half 0, 32 KB) once WG0's P_a . V_a is complete, under
// softmax b, not only once WG1's P_a . V_a is (after softmax b). WG0 frees half 0 of b as soon as its P_b . V_b is
// complete and before S_{a+2} waits for its blocks: holding it through that wait would queue the whole refill of
// b + 2 behind the copies of a + 2.
//
// Synchronisation (phase parity of tile t: (t / 2) & 1; each mbarrier completes once per use of its stage):
//   full[s][p]   6 mbarriers, count 1 (+ the part's TMA bytes: 32 KB for a V half, 8 KB for k_pe): the producer's
//                arrive.expect_tx (a bare arrive for a tile whose page is not loaded). Waited by the owner only (the
//                three parts in walk order, each before its share of S); the other warpgroup reads its V half after
//                the owner's signal (ready + s), which orders those copies before its reads.
//   empty[s][h]  4 mbarriers, count 4: lane 0 of each warp of WG h, once its P . V of the tile is complete (or the
//                tile was skipped). Waited by the producer before loading half h of tile t + 2 into stage s; both
//                before its k_pe block.
//   ready + s    named barrier, 256 threads: the owner's 128 arrive (P_t, m_t, zeroed V rows written), the other
//                warpgroup's 128 wait.
//   owner + c    named barrier, 128 threads: WG c alone, between writing P_t and its own P_t . V_t.
// No warp arrives twice in one phase: between a warp's arrivals for tiles t and t + 2 its warpgroup waits at the
// ready barrier of t + 1 or t + 2 (a tile of the other warpgroup), which needs all four of its warps, so all have
// arrived for t first; the owner arrives on ready + s for t + 2 only after S_{t+2}, i.e. after the other warpgroup
// freed its half of t, after it waited on ready + s for t.
// No deadlock: the releases of tile t wait only for copies of tiles <= t + 1 (S_{t+1} before WG1 frees half 1 of
// t), and the producer issues those before it waits for the releases of t.
//
// On a float8_e4m3fn cache stored per tensor (kFp8Cache) the copy brings a part's e4m3 bytes into the back of its
// space as soon as it is free, and warps 1-3 of the producer warpgroup convert them in place into the same layout
// (fp8_tiles_sm90.cuh); a full barrier then counts their 96 arrivals. The consumers differ only in the scale: kv_scale
// joins the softmax scale and multiplies the output.
//
// Masks: a tile lies in one page (the launcher guarantees page_size % 64 == 0 or a dense cache, and splits that
// start on 64-key boundaries). A tile whose page is outside [0, P) is never loaded and skipped by everyone. Keys at
// or past the CTA's key_end (seq_len, split end, causal limit of the last row) may hold NaN in the cache: scores
// are selected to -inf and, in the last tile, those V rows are zeroed in shared memory before P . V.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/sm90/cta_tile_sm90.cuh"
#include "cuda/sm90/fp8_tiles_sm90.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "params.h"

namespace mla::cuda::sm90 {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

namespace detail {

using C = Sm90Tile;

__device__ __forceinline__ bool tile_loaded(const DecodeParams& p, const CtaWork& w, int tile) {
  int row_in_page = 0;
  return tile_page(p, w, w.key_begin + tile * C::kKeyTile, row_in_page) >= 0;
}

// The value, hidden from loop-invariant code motion: recomputing what depends on it costs a few integer
// instructions per tile, while hoisting (e.g. the 16 P store addresses) holds registers across the whole loop and
// makes ptxas spill next to O and S.
__device__ __forceinline__ int recomputed(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Barrier `part` of tile t's stage in an array of [stage][part] mbarriers (full, or an fp8 cache's raw).
__device__ __forceinline__ uint32_t part_barrier(uint32_t bars, int tile, int part) {
  return bars + 8 * ((tile % C::kStages) * C::kParts + part);
}
__device__ __forceinline__ uint32_t empty_barrier(uint32_t empty_bar, int stage, int half) {
  return empty_bar + 8 * (stage * C::kHalves + half);
}
__device__ __forceinline__ uint32_t phase_parity(int tile) {
  return (tile / C::kStages) & 1;
}

// Before a part of tile t goes into its stage: a V half waits for its own empty barrier (the stage's previous tile
// freed by that half's warpgroup); k_pe follows both halves, so it waits for nothing more.
__device__ __forceinline__ void wait_part_free(uint32_t empty_bar, int tile, int part) {
  const int stage = tile % C::kStages;
  const int use = tile / C::kStages;  // how often this stage was filled before
  if (use > 0 && part < C::kHalves) {
    mbarrier_wait(empty_barrier(empty_bar, stage, C::part_block(stage, part) / C::kHalfBlocks), (use - 1) & 1);
  }
}

// Copies a tile's part (first block `block`) into shared memory at `dst`, its `bytes` counted on `bar`; a tile whose
// page is not loaded gets a bare arrival instead (its phase must still complete).
__device__ __forceinline__ void copy_part(const CUtensorMap* kv_map, const CUtensorMap* k_pe_map, uint32_t dst,
                                          uint32_t bar, uint32_t bytes, int part, int block, int row_in_page,
                                          int page) {
  if (page < 0) {
    mbarrier_arrive(bar);
    return;
  }
  mbarrier_arrive_expect_tx(bar, bytes);
  // the cache maps' third coordinate counts 64-column blocks: k_pe is block 0 of its own map
  const bool latent = part < C::kHalves;
  tma_load_4d(dst, latent ? kv_map : k_pe_map, bar, 0, row_in_page, latent ? block : 0, page);
}

// Producer (one thread): tile t into stage t % 2, one box per part in its owner's walk order, each after
// wait_part_free, so the owner's half of tile t + 2 is in flight while the other warpgroup still reads its half of
// tile t. A tile whose page is not loaded gets bare arrivals, after the same waits (a full barrier must not complete
// a phase ahead of a consumer still waiting on the previous one); the consumers skip it.
// On an fp8 cache (kFp8Cache) each box holds a part's e4m3 bytes, lands in the back of the part's space and arrives
// on copy_bar = raw[stage][part] for the converting threads (convert_fp8_tiles) instead of the full barrier; tiles
// Fp8Tile::kPrefetchTiles ahead are asked of L2 (half the bytes per tile keep fewer in flight).
template <bool kFp8Cache>
__device__ __forceinline__ void produce_tiles(const DecodeParams& p, const CtaWork& w, const CUtensorMap* kv_map,
                                              const CUtensorMap* k_pe_map, uint32_t kv_smem, uint32_t copy_bar,
                                              uint32_t empty_bar) {
  using F = Fp8Tile;
  const auto prefetch = [&](int tile) {
    int row_in_page = 0;
    const int page = tile_page(p, w, w.key_begin + tile * C::kKeyTile, row_in_page);
    if (page < 0) return;
    tma_prefetch_4d(kv_map, 0, row_in_page, 0, page);
    tma_prefetch_4d(kv_map, 0, row_in_page, C::kHalfBlocks, page);
    tma_prefetch_4d(k_pe_map, 0, row_in_page, 0, page);
  };
  prefetch_tensor_map(kv_map);
  prefetch_tensor_map(k_pe_map);
  if constexpr (kFp8Cache) {
    for (int tile = 0; tile < min(F::kPrefetchTiles, w.num_tiles); ++tile) prefetch(tile);
  }
  for (int tile = 0; tile < w.num_tiles; ++tile) {
    if (kFp8Cache && tile + F::kPrefetchTiles < w.num_tiles) prefetch(tile + F::kPrefetchTiles);
    const int stage = tile % C::kStages;  // = its owner warpgroup
    int row_in_page = 0;
    const int page = tile_page(p, w, w.key_begin + tile * C::kKeyTile, row_in_page);
    const uint32_t dst = kv_smem + stage * C::kTileBytes;
#pragma unroll
    for (int part = 0; part < C::kParts; ++part) {
      const int block = C::part_block(stage, part);
      wait_part_free(empty_bar, tile, part);
      copy_part(kv_map, k_pe_map, dst + block * C::kBlockBytes + (kFp8Cache ? F::raw_offset(part) : 0),
                part_barrier(copy_bar, tile, part), kFp8Cache ? F::raw_bytes(part) : C::part_bytes(part), part, block,
                row_in_page, page);
    }
  }
}

// The converting threads on an fp8 cache (warps 1-3 of the producer warpgroup, fp8_tiles_sm90.cuh): each part of tile
// t, once its bytes are in (raw[stage][part]), in place into q's dtype, then an arrival on its full barrier (count 96)
// once their stores are visible to wgmma. A tile whose page is not loaded gets bare arrivals, but only after its raw
// barrier too: the copying thread's arrival there follows wait_part_free, so the full barrier cannot complete a phase
// ahead of a consumer still waiting on the previous one.
template <typename T>
__device__ __forceinline__ void convert_fp8_tiles(const DecodeParams& p, const CtaWork& w, uint32_t kv_smem,
                                                  uint32_t full_bar, uint32_t raw_bar, int thread) {
  for (int tile = 0; tile < w.num_tiles; ++tile) {
    const bool loaded = tile_loaded(p, w, tile);
    const uint32_t dst = kv_smem + (tile % C::kStages) * C::kTileBytes;
#pragma unroll
    for (int part = 0; part < C::kParts; ++part) {
      const uint32_t space = dst + C::part_block(tile % C::kStages, part) * C::kBlockBytes;
      mbarrier_wait(part_barrier(raw_bar, tile, part), phase_parity(tile));
      if (loaded) {
        if (part < C::kHalves) {
          fp8_detail::convert_half_in_place<T>(space, thread);
        } else {
          fp8_detail::convert_rope_in_place<T>(space, thread);
        }
        fence_proxy_async();  // generic-proxy stores, read by wgmma
      }
      mbarrier_arrive(part_barrier(full_bar, tile, part));
    }
  }
}

// Waits for the tile's blocks and issues S = Q . K^T into s (9 blocks x 4 k16 steps), walking the blocks in the
// order the producer loads them (kOwner = tile % 2: the caller owns the tile); blocks [kFirst, kEnd) of that walk
// as one commit group, by default all of them. Also
// issued for a tile whose page was not loaded (s is then garbage and ignored): s stays written only by wgmma on
// every path, which ptxas needs in order not to serialize the wgmma pipeline.
template <typename T, int kOwner, int kFirst = 0, int kEnd = C::kBlocks>
__device__ __forceinline__ void issue_scores(int tile, uint32_t q_smem, uint32_t kv_smem, uint32_t full_bar,
                                             float (&s)[32]) {
  static_assert(C::opens_part(kFirst), "a partial walk starts at a part, whose full barrier it waits for");
  const uint64_t q_desc = smem_descriptor(q_smem, 16, 1024);
  const uint64_t k_desc = smem_descriptor(kv_smem + kOwner * C::kTileBytes, 16, 1024);
#pragma unroll
  for (int i = kFirst; i < kEnd; ++i) {
    const int block = C::walk_block(kOwner, i);
    // One barrier per part: the products on the first part run while the later ones arrive.
    if (C::opens_part(i)) {
      mbarrier_wait(part_barrier(full_bar, tile, C::walk_part(i)), phase_parity(tile));
      wgmma_fence();  // after the wait's branch, so the compiler need not insert one (it would serialize the wgmmas)
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t desc_q = advance_descriptor(q_desc, block * C::kBlockBytes + kk * 32);
      const uint64_t desc_k = advance_descriptor(k_desc, block * C::kBlockBytes + kk * 32);
      if (i == 0 && kk == 0) {
        wgmma_m64n64k16_ss<T, false>(s, desc_q, desc_k);
      } else {
        wgmma_m64n64k16_ss<T, true>(s, desc_q, desc_k);
      }
    }
  }
  wgmma_commit();
}

// O_c += P_t . V_t[:, 256 cw:] (4 k16 steps over the tile's keys, N = 256), P_t from the stage's P block, as one
// commit group; none for a tile that was not loaded. (An empty group committed on that path instead makes ptxas
// serialize the wgmmas, C7520, so the callers' waits must hold with and without this group.)
template <typename T>
__device__ __forceinline__ void issue_values(float (&acc)[128], int tile, bool loaded, uint32_t kv_smem, int cw) {
  const uint32_t kv_stage = kv_smem + (tile % C::kStages) * C::kTileBytes;
  if (loaded) {
    const uint64_t p_desc = smem_descriptor(kv_stage + C::kPBlock * C::kBlockBytes, 16, 1024);
    const uint64_t v_desc = smem_descriptor(kv_stage + cw * C::kHalfBlocks * C::kBlockBytes, C::kBlockBytes, 1024);
    fence_registers(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint64_t desc_p = advance_descriptor(p_desc, ks * 32);
      const uint64_t desc_v = advance_descriptor(v_desc, ks * 2048);
      wgmma_m64n256k16_ss_tb<T>(acc, desc_p, desc_v, 1);
    }
    wgmma_commit();
  }
}

// This warp is done with its V half of the tile's stage: its P . V of the tile is complete (or was skipped), and
// so is the owner's S of it (the owner issues its P . V after its S, the other warpgroup after the owner's signal,
// which follows S). One of the 4 arrivals the producer waits for before refilling the half.
__device__ __forceinline__ void release_half(uint32_t empty_bar, int tile, int cw, int lane) {
  __syncwarp();
  if (lane == 0) mbarrier_arrive(empty_barrier(empty_bar, tile % C::kStages, cw));
}

// This warpgroup's P . V of the tile completes; then its V half is released. kPending: wgmma groups issued after
// that P . V that may stay in flight (the early-scores path's first half of the next S).
template <int kPending = 0>
__device__ __forceinline__ void finish_values(float (&acc)[128], uint32_t empty_bar, int tile, int cw, int lane) {
  wgmma_wait<kPending>();
  fence_registers(acc);
  release_half(empty_bar, tile, cw, lane);
}

// How far (log2 units) a row's running max may lag its scores: an O half is rescaled only when a tile raises the max
// by more than this (perf-log v56), which with random scores happens in the first tiles only.
constexpr float kMaxSlack = 8.f;

__device__ __forceinline__ void rescale(float (&acc)[128], const float (&alpha)[2]) {
  if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc[4 * j] *= alpha[0];
      acc[4 * j + 1] *= alpha[0];
      acc[4 * j + 2] *= alpha[1];
      acc[4 * j + 3] *= alpha[1];
    }
  }
}

// Moves the running max of this thread's two rows to m_new. alpha = exp2(m_old - m_new) rescales what was kept
// against m_old (the row-sum share here, the O half by the caller); offset is what new scores subtract. Owner and
// other warpgroup compute it from the same values, so their states stay consistent.
__device__ __forceinline__ void advance_max(const float (&m_new)[2], float (&row_max)[2], float (&row_sum)[2],
                                            float (&alpha)[2], float (&offset)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    offset[h] = m_new[h] == kNegInf ? 0.f : m_new[h];  // no key yet: keep exp2 arguments finite
    alpha[h] = exp2_ftz(row_max[h] - offset[h]);
    row_max[h] = m_new[h];
    row_sum[h] *= alpha[h];
  }
}

// Owner's online softmax of a loaded tile: new running max, P = exp2(S - m) as T into the P block (row r at r * 128,
// key chunk c at chunk c ^ (r % 8): the layout the P . V descriptor reads), row sums. A whole tile (both rows see all
// its keys; a positive scale, as any real one is) needs no masks: the max of its raw scores, scaled once, is the max
// of the scaled ones (rounding is monotone), and the scale goes into exp2's argument by an fma: per thread 32 moves
// and 32 fmas instead of 32 multiplies, compares, selects and subtractions, on the softmax that sits between the two
// warpgroups' products (perf-log v55). Other tiles are scaled and masked first (masked slots may hold NaN) and take
// the same steps at a scale of 1 (an fma by 1 rounds as the subtraction does).
template <typename T>
__device__ __forceinline__ void softmax_tile(const float (&s)[32], const int (&limit)[2], int tile_key0,
                                             float scale_log2, int lane, int warp_row, uint8_t* p_block,
                                             float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2]) {
  const bool whole = scale_log2 > 0.f && int64_t{tile_key0} + C::kKeyTile <= min(limit[0], limit[1]);
  float x[32];  // the scores, raw (whole tile) or scaled and masked
  if (whole) {
#pragma unroll
    for (int i = 0; i < 32; ++i) x[i] = s[i];
  } else {
    const int key_base = tile_key0 + 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < 32; ++i)
      x[i] = key_base + (i / 4) * 8 + (i & 1) < limit[(i / 2) & 1] ? s[i] * scale_log2 : kNegInf;
  }
  const float scale = whole ? scale_log2 : 1.f;
  float m_new[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) m_new[h] = fmaxf(m_new[h], fmaxf(x[4 * j + 2 * h], x[4 * j + 2 * h + 1]));
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_new[h] *= scale;
    m_new[h] = fmaxf(m_new[h], __shfl_xor_sync(0xffffffffu, m_new[h], 1));
    m_new[h] = fmaxf(m_new[h], __shfl_xor_sync(0xffffffffu, m_new[h], 2));
    m_new[h] = fmaxf(row_max[h], m_new[h]);
    // A max that grew by at most kMaxSlack keeps the old one (alpha = 1, so neither warpgroup rescales its O half):
    // P <= 2^kMaxSlack then, which fp16, bf16 and the fp32 sums hold to the same relative precision as P <= 1.
    if (m_new[h] <= row_max[h] + kMaxSlack) m_new[h] = row_max[h];
  }
  float offset[2];
  advance_max(m_new, row_max, row_sum, alpha, offset);
  // Row warp_row + 8 h at (warp_row + 8 h) * 128; both rows have the same r % 8, so the same chunk swizzle.
  uint8_t* p_rows = p_block + recomputed(warp_row * 128 + (lane & 3) * 4);
  const int swizzle = recomputed(warp_row & 7);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float pe0 = exp2_ftz(fmaf(x[4 * j + 2 * h], scale, -offset[h]));
      const float pe1 = exp2_ftz(fmaf(x[4 * j + 2 * h + 1], scale, -offset[h]));
      row_sum[h] += pe0 + pe1;
      *reinterpret_cast<uint32_t*>(p_rows + h * 1024 + ((j ^ swizzle) << 4)) = pack2<T>(pe0, pe1);
    }
  }
}

// Keys past key_end can only be in the last tile; their V rows may hold NaN (0 * NaN = NaN). The owner zeroes them
// in all 512 columns: its S is complete, and the other warpgroup reads V only after the owner's signal.
__device__ __forceinline__ void zero_hidden_values(uint8_t* stage_ptr, int visible, int tid) {
  for (int idx = tid; idx < (C::kKeyTile - visible) * C::kLatentBlocks * 8; idx += 128) {
    const int row = visible + (idx >> 6);
    const int block = (idx >> 3) & 7;
    *reinterpret_cast<uint4*>(stage_ptr + block * C::kBlockBytes + row * 128 + (idx & 7) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
}

// Owner's step once S_t is complete: softmax into the P block, publish m_t, signal the other warpgroup.
template <typename T>
__device__ __forceinline__ void own_tile(const CtaWork& w, int tile, bool loaded, const float (&s)[32],
                                         const int (&limit)[2], float scale_log2, uint8_t* smem, int tid, int lane,
                                         int warp_row, float (*published)[64], float (&row_max)[2], float (&row_sum)[2],
                                         float (&alpha)[2]) {
  alpha[0] = alpha[1] = 1.f;
  const int owner = tile % C::kStages;
  if (loaded) {
    uint8_t* stage_ptr = smem + C::kKvOffset + owner * C::kTileBytes;
    const int tile_key0 = w.key_begin + tile * C::kKeyTile;
    softmax_tile<T>(s, limit, tile_key0, scale_log2, lane, warp_row, stage_ptr + C::kPBlock * C::kBlockBytes, row_max,
                    row_sum, alpha);
    const int visible = w.key_end - tile_key0;
    if (visible < C::kKeyTile) zero_hidden_values(stage_ptr, visible, recomputed(tid));
  }
  if ((lane & 3) == 0) {
    published[owner][warp_row] = row_max[0];
    published[owner][warp_row + 8] = row_max[1];
  }
  fence_proxy_async();  // P and the zeroed V rows are read by wgmma next (both warpgroups)
  named_barrier_arrive(C::kReadyBarrier + owner, C::kConsumerThreads);
  // This warpgroup's own P . V reads what all four of its warps wrote.
  if (loaded) named_barrier(C::kOwnerBarrier + owner, C::kConsumerThreads / 2);
}

// The other warpgroup's step on tile t: wait for the owner's signal and take over its running max. Its V half of
// the tile needs no wait of its own: the owner observed every block's copy before its S, and its signal follows
// (an mbarrier wait costs ~120 cycles even on a completed phase, and these four sat between each signal and the
// product behind it).
__device__ __forceinline__ void other_tile(int tile, bool loaded, int warp_row, float (*published)[64],
                                           float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2]) {
  const int owner = tile % C::kStages;
  named_barrier(C::kReadyBarrier + owner, C::kConsumerThreads);
  alpha[0] = alpha[1] = 1.f;
  if (loaded) {
    const float m_new[2] = {published[owner][warp_row], published[owner][warp_row + 8]};
    float offset[2];
    advance_max(m_new, row_max, row_sum, alpha, offset);
  }
}

template <typename T, bool kMergeInCluster, bool kEarlyScores, bool kFp8Cache>
__device__ __forceinline__ void consume_tiles(const DecodeParams& p, const CtaWork& w, uint8_t* smem, uint32_t base,
                                              uint32_t full_bar, uint32_t empty_bar, float (*published)[64],
                                              float (*red_sum)[64]) {
  const int consumer_thread = static_cast<int>(threadIdx.x) - 128;
  const int cw = consumer_thread >> 7;  // owns tiles t % 2 == cw; output columns [256 cw, +256) = V half cw
  const int tid = consumer_thread & 127;
  const int lane = tid & 31;
  const int warp_row = (tid >> 5) * 16 + (lane >> 2);  // accumulator rows warp_row and warp_row + 8
  const uint32_t q_smem = base + C::kQOffset;
  const uint32_t kv_smem = base + C::kKvOffset;
  // An fp8 cache's tiles hold its values unscaled: the per-tensor scale multiplies the scores and the output.
  const float scale_log2 = p.sm_scale * (kFp8Cache ? *p.kv_scale : 1.f) * 1.4426950408889634f;
  const int n = w.num_tiles;

  // Keys a row may see in this CTA: [key_begin, limit). Padding rows (zero queries, results never written) see the
  // CTA's keys, so that a whole tile is whole for their warps too.
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp_row + 8 * h;
    limit[h] = r < w.rows ? min(row_key_limit(p, w.seq_len, r), w.key_end) : w.key_end;
  }

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  fence_registers(acc);  // zeroed here, not sunk between an S issue and its wait (ptxas would serialize, C7515)
  float row_max[2] = {kNegInf, kNegInf};  // running max, log2 domain (scaled); the same in both warpgroups
  float row_sum[2] = {0.f, 0.f};          // this thread's share of the denominator (its keys of its own tiles)
  float alpha[2];

  if (n > 0) {
    load_query_tile<T>(p, w, q_smem, consumer_thread);
    fence_proxy_async();  // cp.async writes are generic-proxy writes; wgmma reads through the async proxy
    named_barrier(C::kConsumerBarrier, C::kConsumerThreads);
  }

  // Every wgmma wait below is wait<0>, and at each one the group it is for is the last one issued, so the waits hold
  // whether or not a P . V group was issued for a skipped tile. (The early-scores path's wait<1> is for P . V(b): only
  // the S group issued behind it may stay in flight.)
  float s[32];
  if (cw == 0) {
    // WG0: even tiles. Only S(a) is in flight at the top of a pair: P . V(a - 1) completed before S(a) was issued.
    if (n > 0) issue_scores<T, 0>(0, q_smem, kv_smem, full_bar, s);
    for (int a = 0; a < n; a += 2) {
      const bool loaded_a = tile_loaded(p, w, a);
      const bool loaded_b = a + 1 < n && tile_loaded(p, w, a + 1);
      wgmma_wait<0>();  // S(a)
      fence_registers(s);
      own_tile<T>(w, a, loaded_a, s, limit, scale_log2, smem, tid, lane, warp_row, published, row_max, row_sum, alpha);
      rescale(acc, alpha);
      issue_values<T>(acc, a, loaded_a, kv_smem, 0);
      if (a + 1 == n) break;
      // P . V(a), then free half 0 of stage 0 before waiting for WG1's softmax: tile a + 2 starts loading under it.
      finish_values(acc, empty_bar, a, 0, lane);
      other_tile(a + 1, loaded_b, warp_row, published, row_max, row_sum, alpha);
      rescale(acc, alpha);
      issue_values<T>(acc, a + 1, loaded_b, kv_smem, 0);
      if (kEarlyScores && a + 2 < n) {
        // S(a + 2) on its half 0 (requested once P . V(a) completed, under softmax b) right behind P . V(b); then
        // P . V(b) complete, half 0 of stage 1 freed, and the rest of S(a + 2) (perf-log v60).
        issue_scores<T, 0, 0, C::kHalfBlocks>(a + 2, q_smem, kv_smem, full_bar, s);
        finish_values<1>(acc, empty_bar, a + 1, 0, lane);
        issue_scores<T, 0, C::kHalfBlocks, C::kBlocks>(a + 2, q_smem, kv_smem, full_bar, s);
      } else {
        // P . V(b), then free half 0 of stage 1 before S(a + 2) waits for its blocks: the refill of b + 2 must not
        // wait for a + 2's copies. (WG1's P . V(b) keeps the tensor cores busy meanwhile, and S(a + 2) starts on the
        // half requested under softmax b.)
        finish_values(acc, empty_bar, a + 1, 0, lane);
        if (a + 2 < n) issue_scores<T, 0>(a + 2, q_smem, kv_smem, full_bar, s);
      }
    }
  } else {
    // WG1: odd tiles. At the top of a pair only S(b) can be in flight: P . V(b - 2) completed before S(b) was
    // issued.
    if (n > 1) issue_scores<T, 1>(1, q_smem, kv_smem, full_bar, s);
    for (int a = 0; a < n; a += 2) {
      const bool loaded_a = tile_loaded(p, w, a);
      const bool loaded_b = a + 1 < n && tile_loaded(p, w, a + 1);
      other_tile(a, loaded_a, warp_row, published, row_max, row_sum, alpha);
      // S(b): P . V(a) would run behind it anyway (one warpgroup's wgmmas complete in order)
      wgmma_wait<0>();
      fence_registers(s);
      fence_registers(acc);
      rescale(acc, alpha);
      issue_values<T>(acc, a, loaded_a, kv_smem, 1);
      if (a + 1 == n) break;
      own_tile<T>(w, a + 1, loaded_b, s, limit, scale_log2, smem, tid, lane, warp_row, published, row_max, row_sum,
                  alpha);
      finish_values(acc, empty_bar, a, 1, lane);  // P . V(a)
      rescale(acc, alpha);
      issue_values<T>(acc, a + 1, loaded_b, kv_smem, 1);
      // S(b + 2) reads the stage of b: half 1 of it cannot be refilled before this warpgroup's P . V(b) is complete.
      finish_values(acc, empty_bar, a + 1, 1, lane);
      if (a + 3 < n) issue_scores<T, 1>(a + 3, q_smem, kv_smem, full_bar, s);
    }
  }
  wgmma_wait<0>();
  fence_registers(acc);
  // After an odd count both warpgroups left the loop before freeing their half of the last tile (n - 1, even).
  if (n & 1) release_half(empty_bar, n - 1, cw, lane);
  if constexpr (kFp8Cache) {
    // read again, not held through the loop (a volatile load: the first one is not reused)
    const float kv_scale = *static_cast<const volatile float*>(p.kv_scale);
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] *= kv_scale;
  }

  if (kMergeInCluster && piece_merges_in_cluster(p, w)) {
    merge_rows_in_cluster<T>(p, w, acc, row_max, row_sum, red_sum, cw, warp_row, lane, smem + C::kQOffset);
  } else {
    write_rows<T>(p, w, acc, row_max, row_sum, red_sum, cw, warp_row, lane);
  }
}

}  // namespace detail

#endif  // sm_90a

// kMergeInCluster: launched in clusters of two CTAs: a (sequence, row block)'s two pieces of a fixed split, or two
// work items of a call with seq_lens, which merge there (cluster_merge.cuh) when they are the two pieces of one
// sequence; its own kernel, so that the merge's code does not reshape the usual kernel's loop.
// kEarlyScores: warpgroup 0 issues the first half of S(a + 2) behind its P . V(b) instead of after it completes;
// 2-4 % faster where a sequence's row blocks share its tiles in L2 (128 heads, or several query tokens), ~2 % slower
// with one row block (64 heads; perf-log v60, v61), so the launcher picks it by row blocks per sequence.
// kFp8Cache: the cache is float8_e4m3fn per tensor (its tensor maps describe bytes); the producer warpgroup converts
// its tiles.
template <typename T, bool kMergeInCluster = false, bool kEarlyScores = false, bool kFp8Cache = false>
__global__ void __launch_bounds__(Sm90Tile::kThreads, 1)
    decode_sm90_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap kv_map,
                       const __grid_constant__ CUtensorMap k_pe_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Sm90Tile;
  static_assert(!(kFp8Cache && kMergeInCluster), "fp8 caches run without clusters");
  // full[stage][part], empty[stage][half], and on an fp8 cache raw[stage][part]
  __shared__ __align__(8) uint64_t barriers[C::kBarriers + (kFp8Cache ? C::kStages * C::kParts : 0)];
  __shared__ float published[2][64];  // [owner warpgroup][row]: running max after the owner's latest tile
  __shared__ float red_sum[2][64];    // [consumer warpgroup][row]: final row-sum shares
  extern __shared__ __align__(1024) uint8_t dynamic_smem[];
  const uint32_t raw = smem_u32(dynamic_smem);
  const uint32_t base = (raw + C::kAlign - 1) & ~static_cast<uint32_t>(C::kAlign - 1);
  uint8_t* smem = dynamic_smem + (base - raw);
  const uint32_t full_bar = smem_u32(&barriers[0]);
  const uint32_t empty_bar = smem_u32(&barriers[C::kStages * C::kParts]);
  const uint32_t raw_bar = smem_u32(&barriers[C::kBarriers]);  // (fp8 caches only)

  wait_for_previous_grid();  // launched with programmatic dependent launch: inputs may come from the kernel before
  allow_next_grid_launch();
  const CtaWork w = single_cta_work<C::kRowTile, C::kKeyTile, kMergeInCluster>(p);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < C::kStages * C::kParts; ++b) {
      // the producer thread (+ TMA bytes), or an fp8 cache's converting threads
      mbarrier_init(full_bar + 8 * b, kFp8Cache ? Fp8Tile::kThreads : 1);
      if (kFp8Cache) mbarrier_init(raw_bar + 8 * b, 1);  // the copying thread (+ TMA bytes)
    }
    for (int b = 0; b < C::kStages * C::kHalves; ++b) mbarrier_init(empty_bar + 8 * b, C::kHalfWarps);  // per warp
    fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      detail::produce_tiles<kFp8Cache>(p, w, &kv_map, &k_pe_map, base + C::kKvOffset, kFp8Cache ? raw_bar : full_bar,
                                       empty_bar);
    } else if (kFp8Cache && threadIdx.x >= 32) {
      detail::convert_fp8_tiles<T>(p, w, base + C::kKvOffset, full_bar, raw_bar, static_cast<int>(threadIdx.x) - 32);
    }
    if (kMergeInCluster && piece_merges_in_cluster(p, w)) join_cluster_merge();
  } else {
    setmaxnreg_inc<C::kConsumerRegs>();
    detail::consume_tiles<T, kMergeInCluster, kEarlyScores, kFp8Cache>(p, w, smem, base, full_bar, empty_bar, published,
                                                                       red_sum);
  }
#endif
}

}  // namespace mla::cuda::sm90
