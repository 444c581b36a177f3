// Split-KV MLA decode main kernel for Hopper (sm_90a): TMA-fed KV tiles and warpgroup MMA (wgmma), fp16/bf16.
//
// One CTA = (sequence, block of 64 query rows, KV split), 384 threads in three warpgroups:
//   warpgroup 0   producer: one thread streams 64-key tiles [kv (512) | k_pe (64)] into two shared-memory stages
//                 with the bulk tensor copy engine (a full mbarrier per 64-column block, so the score products
//                 start on the first block; an empty mbarrier per stage); it gives its registers away.
//   warpgroups 1-2 consumers: warpgroup c computes scores for keys [32c, 32c + 32) of the tile against all 64
//                 rows (S_c = Q . K_c^T, K-dim 576, both operands in shared memory), the two exchange row maxima,
//                 write P_c = exp2(S_c - m) into one 64x64 P tile, and then each accumulates output columns
//                 [256c, 256c + 256): O_c += P . V[:, 256c:] with V = the same tile read transposed (MN-major).
// So every FLOP is done once; each consumer holds a 64x256 fp32 accumulator (128 registers per thread). The scores
// of tile t + 1 are issued right behind P . V of tile t; the stage is released once P . V(t) is complete.
// Operand tiles use the 128-byte swizzle that both TMA and wgmma understand: 64-column blocks of 64 rows, 8192
// bytes each, row r at r * 128, 16-byte chunk c at chunk c ^ (r % 8).
//
// Masks: a tile lies in one page (the launcher guarantees page_size % 64 == 0 or a dense cache, and splits that
// start on 64-key boundaries). A tile whose page is outside [0, P) is never loaded and skipped by everyone. Keys at
// or past the CTA's key_end (seq_len, split end, causal limit of the last row) may hold NaN in the cache: scores
// are selected to -inf and, in the last tile, those V rows are zeroed in shared memory before P . V.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "../../params.h"
#include "../decode_work.cuh"
#include "../device_primitives.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace mla::cuda::sm90 {

struct Sm90Tile {
  static constexpr int kRowTile = 64;  // query rows per CTA (one wgmma M)
  static constexpr int kKeyTile = 64;  // keys per stage
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kBlockCols = 64;                               // columns of one swizzled block (128 bytes)
  static constexpr int kBlockBytes = 64 * 128;                        // 64 rows x 128 bytes
  static constexpr int kBlocks = (kHeadDim + kRopeDim) / kBlockCols;  // 9: 8 latent + 1 rotary
  static constexpr int kLatentBlocks = kHeadDim / kBlockCols;         // 8
  static constexpr int kTileBytes = kBlocks * kBlockBytes;            // one [64 x 576] operand, 73728 bytes
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kTileBytes;
  static constexpr int kPOffset = kKvOffset + kStages * kTileBytes;
  static constexpr int kPBytes = kRowTile * kKeyTile * 2;
  static constexpr int kAlign = 1024;  // the swizzle pattern repeats every 1024 bytes: tiles start aligned
  static constexpr int kSmemBytes = kPOffset + kPBytes + kAlign;  // dynamic shared memory, with alignment slack
  // Statically declared shared memory (barriers, row exchange). Its presence also tells the launcher that the
  // sm_90a body was compiled (builds without sm_90a get an empty kernel with none).
  static constexpr int kStaticSmemBytes = (kStages * kBlocks + kStages) * 8 + 4 * kRowTile * 4;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerBarrier = 1;  // named barrier of the 256 consumer threads (0 is __syncthreads)

  static_assert(kHeadDim % kBlockCols == 0 && kRopeDim == kBlockCols, "576 = 8 latent blocks + 1 rotary block");
  static_assert(kSmemBytes + kStaticSmemBytes <= 232448, "fits Hopper's 227 KB per block");
  static_assert(kConsumerRegs * kConsumerThreads + kProducerRegs * 128 <= 65536, "register file");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Page holding the 64-key tile that starts at `key0` (< capacity) and the tile's first row in that page; -1 when
// the block_table entry is outside [0, P).
__device__ __forceinline__ int tile_page(const DecodeParams& p, const CtaWork& w, int key0, int& row_in_page) {
  const int page_in_seq = key0 / p.page_size;
  row_in_page = key0 - page_in_seq * p.page_size;
  const int page = p.block_table == nullptr
                       ? w.batch_index
                       : p.block_table[static_cast<int64_t>(w.batch_index) * p.block_table_batch_stride + page_in_seq];
  return page >= 0 && page < p.num_pages ? page : -1;
}

__device__ __forceinline__ void produce_tiles(const DecodeParams& p, const CtaWork& w, const CUtensorMap* kv_map,
                                              const CUtensorMap* k_pe_map, uint32_t kv_smem, uint32_t full_bar,
                                              uint32_t empty_bar) {
  using C = Sm90Tile;
  prefetch_tensor_map(kv_map);
  prefetch_tensor_map(k_pe_map);
  for (int tile = 0; tile < w.num_tiles; ++tile) {
    const int stage = tile % C::kStages;
    const int use = tile / C::kStages;  // how often this stage was filled before
    if (use > 0) mbarrier_wait(empty_bar + 8 * stage, (use - 1) & 1);
    int row_in_page = 0;
    const int page = tile_page(p, w, w.key_begin + tile * C::kKeyTile, row_in_page);
    const uint32_t dst = kv_smem + stage * C::kTileBytes;
#pragma unroll
    for (int block = 0; block < C::kBlocks; ++block) {
      const uint32_t full = full_bar + 8 * (stage * C::kBlocks + block);
      if (page < 0) {
        mbarrier_arrive(full);  // nothing to load: the consumers skip this tile
        continue;
      }
      mbarrier_arrive_expect_tx(full, C::kBlockBytes);
      if (block < C::kLatentBlocks) {
        tma_load_3d(dst + block * C::kBlockBytes, kv_map, full, block * C::kBlockCols, row_in_page, page);
      } else {
        tma_load_3d(dst + block * C::kBlockBytes, k_pe_map, full, 0, row_in_page, page);
      }
    }
  }
}

// Query rows [row_begin, +64) as [q | q_pe] in the swizzled block layout; rows past S_q * H are zero.
template <typename T>
__device__ __forceinline__ void load_query_tile(const DecodeParams& p, const CtaWork& w, uint32_t q_smem,
                                                int consumer_thread) {
  using C = Sm90Tile;
  constexpr int kChunksPerRow = (kHeadDim + kRopeDim) / 8;  // 16-byte chunks
  for (int idx = consumer_thread; idx < C::kRowTile * kChunksPerRow; idx += C::kConsumerThreads) {
    const int row = idx / kChunksPerRow;
    const int chunk = idx - row * kChunksPerRow;
    const int r = w.row_begin + row;
    const T* src = static_cast<const T*>(p.q);
    int bytes = 0;
    if (r < w.rows) {
      src = query_chunk<T>(p, w.batch_index, r, chunk);
      bytes = 16;
    }
    const int block = chunk >> 3;
    const int c = chunk & 7;
    cp_async_16(q_smem + block * C::kBlockBytes + row * 128 + ((c ^ (row & 7)) << 4), src, bytes);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// Waits for tile `tile` and issues S_c = Q . K_c^T for it into s (keys [32 cw, +32) of the tile; 9 blocks x 4 k16
// steps, one commit group). Returns whether the tile's page was loaded; when it was not, the stage holds stale data
// and s is garbage that the caller ignores. Issuing unconditionally keeps s written only by wgmma on every path,
// which ptxas needs in order not to serialize the wgmma pipeline.
template <typename T>
__device__ __forceinline__ bool issue_scores(const DecodeParams& p, const CtaWork& w, int tile, uint32_t q_smem,
                                             uint32_t kv_smem, uint32_t full_bar, int cw, float (&s)[16]) {
  using C = Sm90Tile;
  int row_in_page = 0;
  const bool loaded = tile_page(p, w, w.key_begin + tile * C::kKeyTile, row_in_page) >= 0;
  const int stage = tile % C::kStages;
  const uint32_t parity = (tile / C::kStages) & 1;
  const uint32_t kv_stage = kv_smem + stage * C::kTileBytes;
#pragma unroll
  for (int block = 0; block < C::kBlocks; ++block) {
    // Each 64-column block has its own barrier: the products on the first blocks run while later ones arrive.
    mbarrier_wait(full_bar + 8 * (stage * C::kBlocks + block), parity);
    wgmma_fence();  // after the wait's branch, so the compiler need not insert one (it would serialize the wgmmas)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t desc_q = smem_descriptor(q_smem + block * C::kBlockBytes + kk * 32, 16, 1024);
      const uint64_t desc_k = smem_descriptor(kv_stage + block * C::kBlockBytes + cw * 4096 + kk * 32, 16, 1024);
      wgmma_m64n32k16_ss<T>(s, desc_q, desc_k, (block | kk) != 0);
    }
  }
  wgmma_commit();
  return loaded;
}

template <typename T>
__device__ __forceinline__ void consume_tiles(const DecodeParams& p, const CtaWork& w, uint8_t* smem, uint32_t base,
                                              uint32_t full_bar, uint32_t empty_bar, float (*red_max)[64],
                                              float (*red_sum)[64]) {
  using C = Sm90Tile;
  constexpr float kNegInf = -__builtin_huge_valf();
  const int consumer_thread = static_cast<int>(threadIdx.x) - 128;
  const int cw = consumer_thread >> 7;  // consumer warpgroup: keys [32 cw, +32) of S, columns [256 cw, +256) of O
  const int tid = consumer_thread & 127;
  const int lane = tid & 31;
  const int warp_row = (tid >> 5) * 16 + (lane >> 2);  // accumulator rows warp_row and warp_row + 8
  const uint32_t q_smem = base + C::kQOffset;
  const uint32_t kv_smem = base + C::kKvOffset;
  const uint32_t p_smem = base + C::kPOffset;
  uint8_t* p_ptr = smem + C::kPOffset;
  const float scale_log2 = p.sm_scale * 1.4426950408889634f;

  // Keys a row may see in this CTA: [key_begin, limit). Padding rows see none.
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp_row + 8 * h;
    limit[h] = r < w.rows ? min(row_key_limit(p, w.seq_len, r), w.key_end) : INT_MIN;
  }

  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float row_max[2] = {kNegInf, kNegInf};  // running max, log2 domain (scaled)
  float row_sum[2] = {0.f, 0.f};          // this thread's share of the denominator (its keys of each tile)

  if (w.num_tiles > 0) {
    load_query_tile<T>(p, w, q_smem, consumer_thread);
    fence_proxy_async();  // cp.async writes are generic-proxy writes; wgmma reads through the async proxy
    named_barrier(C::kConsumerBarrier, C::kConsumerThreads);
  }

  // Software pipeline: S(t + 1) is issued right behind P(t) . V, so the tensor cores go from one product to the
  // next without waiting for this warpgroup's barriers; PV(t) completes (and frees stage t) while S(t + 1) runs.
  float s[16];
  bool loaded = w.num_tiles > 0 && issue_scores<T>(p, w, 0, q_smem, kv_smem, full_bar, cw, s);
  for (int tile = 0; tile < w.num_tiles; ++tile) {
    const int stage = tile % C::kStages;
    const int tile_key0 = w.key_begin + tile * C::kKeyTile;
    wgmma_wait<0>();  // S(tile) (and everything before it) complete
    fence_registers(s);
    if (loaded) {
      // ---- mask, scale, row max over both warpgroups' keys ----
      float tile_max[2] = {kNegInf, kNegInf};
      float sc[16];  // masked, scaled scores (s itself is written only by wgmma)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = tile_key0 + cw * 32 + j * 8 + 2 * (lane & 3) + e;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float& v = sc[4 * j + 2 * h + e];
            v = key < limit[h] ? s[4 * j + 2 * h + e] * scale_log2 : kNegInf;  // select: masked slots may hold NaN
            tile_max[h] = fmaxf(tile_max[h], v);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        if ((lane & 3) == 0) red_max[cw][warp_row + 8 * h] = tile_max[h];
      }
      // Also: both S products have read this stage, and both P . V of the previous tile are complete.
      named_barrier(C::kConsumerBarrier, C::kConsumerThreads);

      // ---- online softmax; P_c (as T) into the shared P tile ----
      float alpha[2];
      float offset[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_row + 8 * h;
        const float m_new = fmaxf(row_max[h], fmaxf(red_max[0][r], red_max[1][r]));
        offset[h] = m_new == kNegInf ? 0.f : m_new;  // no key yet: keep exp2 arguments finite
        alpha[h] = exp2f(row_max[h] - offset[h]);
        row_max[h] = m_new;
        row_sum[h] *= alpha[h];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key_local = cw * 32 + j * 8 + 2 * (lane & 3);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float p0 = exp2f(sc[4 * j + 2 * h] - offset[h]);
          const float p1 = exp2f(sc[4 * j + 2 * h + 1] - offset[h]);
          row_sum[h] += p0 + p1;
          const int r = warp_row + 8 * h;
          *reinterpret_cast<uint32_t*>(p_ptr + r * 128 + (((key_local >> 3) ^ (r & 7)) << 4) + (key_local & 7) * 2) =
              pack2<T>(p0, p1);
        }
      }

      // Keys past key_end can only be in the last tile; their V rows may hold NaN (0 * NaN = NaN): zero the rows
      // of this warpgroup's column blocks. Both S products are done (barrier above), so K may be overwritten.
      const int visible = w.key_end - tile_key0;
      if (visible < C::kKeyTile) {
        uint8_t* stage_ptr = smem + C::kKvOffset + stage * C::kTileBytes;
        for (int idx = tid; idx < (C::kKeyTile - visible) * 32; idx += 128) {
          const int row = visible + (idx >> 5);
          const int block = cw * 4 + ((idx >> 3) & 3);
          *reinterpret_cast<uint4*>(stage_ptr + block * C::kBlockBytes + row * 128 + (idx & 7) * 16) =
              make_uint4(0u, 0u, 0u, 0u);
        }
      }

      if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          acc[4 * j] *= alpha[0];
          acc[4 * j + 1] *= alpha[0];
          acc[4 * j + 2] *= alpha[1];
          acc[4 * j + 3] *= alpha[1];
        }
      }
      fence_proxy_async();  // P and the zeroed V rows are read by wgmma next
      named_barrier(C::kConsumerBarrier, C::kConsumerThreads);

      // ---- O_c += P . V_c: 4 k16 steps over the tile's keys, N = 256 columns ----
      const uint32_t kv_stage = kv_smem + stage * C::kTileBytes;
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const uint64_t desc_p = smem_descriptor(p_smem + ks * 32, 16, 1024);
        const uint64_t desc_v = smem_descriptor(kv_stage + cw * 4 * C::kBlockBytes + ks * 2048, C::kBlockBytes, 1024);
        wgmma_m64n256k16_ss_tb<T>(acc, desc_p, desc_v, 1);
      }
      wgmma_commit();
    }
    // S(tile + 1) into s (this tile's scores are consumed), queued behind P . V.
    bool next_loaded = false;
    if (tile + 1 < w.num_tiles) {
      next_loaded = issue_scores<T>(p, w, tile + 1, q_smem, kv_smem, full_bar, cw, s);
      wgmma_wait<1>();  // P . V(tile) complete; S(tile + 1) may still run
    } else {
      wgmma_wait<0>();
    }
    fence_registers(acc);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty_bar + 8 * stage);  // this warp is done with the stage
    loaded = next_loaded;
  }
  wgmma_wait<0>();

  // ---- epilogue: full row sums, normalise, write out/lse (one split) or fp32 partials ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    if ((lane & 3) == 0) red_sum[cw][warp_row + 8 * h] = row_sum[h];
  }
  named_barrier(C::kConsumerBarrier, C::kConsumerThreads);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp_row + 8 * h;
    if (r >= w.rows) continue;
    const float l = red_sum[0][warp_row + 8 * h] + red_sum[1][warp_row + 8 * h];  // fixed order: deterministic
    write_row_result<T, 32>(p, w, r, l, row_max[h], cw * 256 + 2 * (lane & 3), cw == 0 && (lane & 3) == 0,
                            [&](int j) { return make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]); });
  }
}

#endif  // sm_90a

template <typename T>
__global__ void __launch_bounds__(Sm90Tile::kThreads, 1)
    decode_sm90_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap kv_map,
                       const __grid_constant__ CUtensorMap k_pe_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Sm90Tile;
  __shared__ __align__(8) uint64_t barriers[C::kStages * C::kBlocks + C::kStages];  // full[stage][block], empty[stage]
  __shared__ float red_max[2][64];  // [consumer warpgroup][row]: tile row maxima
  __shared__ float red_sum[2][64];  // [consumer warpgroup][row]: final row sums
  extern __shared__ __align__(1024) uint8_t dynamic_smem[];
  const uint32_t raw = smem_u32(dynamic_smem);
  const uint32_t base = (raw + C::kAlign - 1) & ~static_cast<uint32_t>(C::kAlign - 1);
  uint8_t* smem = dynamic_smem + (base - raw);
  const uint32_t full_bar = smem_u32(&barriers[0]);
  const uint32_t empty_bar = smem_u32(&barriers[C::kStages * C::kBlocks]);

  wait_for_previous_grid();  // launched with programmatic dependent launch: inputs may come from the kernel before
  allow_next_grid_launch();
  const CtaWork w = cta_work<C::kRowTile, C::kKeyTile>(p);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < C::kStages * C::kBlocks; ++b) mbarrier_init(full_bar + 8 * b, 1);  // producer (+ TMA bytes)
    for (int s = 0; s < C::kStages; ++s) mbarrier_init(empty_bar + 8 * s, C::kConsumerThreads / 32);  // per warp
    fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x == 0) produce_tiles(p, w, &kv_map, &k_pe_map, base + C::kKvOffset, full_bar, empty_bar);
  } else {
    setmaxnreg_inc<C::kConsumerRegs>();
    consume_tiles<T>(p, w, smem, base, full_bar, empty_bar, red_max, red_sum);
  }
#endif
}

}  // namespace mla::cuda::sm90
