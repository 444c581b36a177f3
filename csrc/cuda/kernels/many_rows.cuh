// Split-KV MLA decode main kernel for fp16/bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulation).
//
// One CTA = (sequence, block of kRowTile query rows, KV split). Each KV tile of kKeyTile keys is copied ONCE into
// shared memory (cp.async, kStages deep) and feeds both products:
//   scores = [q | q_pe] . [kv | k_pe]^T   (K-dim 576)    and    out += P . kv   (V = the tile's first 512 columns).
// Warps form a kWarpsM x kWarpsN grid. Warp (wm, wn) owns rows [wm * kWarpRows, +kWarpRows); for the scores it
// takes keys [wn * kWarpKeys, +kWarpKeys) of the tile, for the output columns [wn * kWarpCols, +kWarpCols). The
// kWarpsN warps of a row group therefore exchange their row maxima and their P slices through shared memory (two
// named barriers per tile, one group at a time), which keeps each thread's output block at 16 x kWarpCols / 32
// fp32 registers per 16 rows instead of the 256 a warp owning all 512 columns would need.
// Online softmax runs in the exp2 domain with sm_scale * log2(e) folded into one multiply.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/common/tile_loader.cuh"
#include "params.h"

namespace mla::cuda {

template <typename T, int kRowTile_, int kWarpRows_, int kWarpsN_, int kKeyTile_, int kStages_, bool kSm90Only_>
struct KeySplitTile {
  using Element = T;
  static constexpr int kRowTile = kRowTile_;    // query rows per CTA
  static constexpr int kWarpRows = kWarpRows_;  // rows per warp (16 or 32)
  static constexpr int kWarpsM = kRowTile / kWarpRows;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kWarps = kWarpsM * kWarpsN;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeyTile = kKeyTile_;  // keys per shared-memory stage
  static constexpr int kStages = kStages_;
  static constexpr bool kWalksRanges = false;    // balanced splits: one work item per CTA
  static constexpr bool kSm90Only = kSm90Only_;  // needs > 163 KB of shared memory: compiled for sm_90 only

  static constexpr int kMTiles = kWarpRows / 16;
  static constexpr int kWarpKeys = kKeyTile / kWarpsN;
  static constexpr int kKeyNTiles = kWarpKeys / 8;
  static constexpr int kWarpCols = kHeadDim / kWarpsN;
  static constexpr int kColNTiles = kWarpCols / 8;
  static constexpr int kKSteps = (kHeadDim + kRopeDim) / 16;

  using Row = RowLayout<T>;
  static constexpr int kPChunks = kKeyTile / 8;  // 16-byte chunks in one row of P

  static constexpr int kQBytes = kRowTile * Row::kBytes;
  static constexpr int kKvStageBytes = kKeyTile * Row::kBytes;
  static constexpr int kPBytes = kRowTile * kKeyTile * 2;
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kQBytes;
  static constexpr int kPOffset = kKvOffset + kStages * kKvStageBytes;
  static constexpr int kValidOffset = kPOffset + kPBytes;
  static constexpr int kReduceOffset = kValidOffset + KvPipeline<T, kRowTile, kKeyTile, kStages, kThreads>::kValidBytes;
  static constexpr int kSmemBytes = kReduceOffset + kWarpsN * kRowTile * static_cast<int>(sizeof(float));

  static_assert(sizeof(T) == 2, "the tensor-core kernel takes fp16 or bf16");
  static_assert(kWarpRows == 16 || kWarpRows == 32, "warp rows");
  static_assert(kRowTile % kWarpRows == 0, "row tile");
  static_assert(kWarpKeys % 8 == 0 && (kKeyNTiles == 1 || kKeyNTiles % 2 == 0), "keys per warp");
  static_assert(kWarpCols % 16 == 0, "columns per warp");
  static_assert(kKeyTile % 16 == 0, "key tile: whole k16 steps of P . V");
  static_assert(kStages >= 2, "pipeline depth");
  static_assert(kPChunks == 2 || kPChunks == 4 || kPChunks % 8 == 0, "P swizzle");

  // P is [kRowTile][kKeyTile] of T; its rows are narrower than 128 bytes for small tiles, so the XOR key is taken
  // from the row bits that select the 128-byte line.
  __device__ static __forceinline__ uint32_t p_offset(int row, int chunk) {
    if constexpr (kPChunks >= 8) {
      return static_cast<uint32_t>(row * kPChunks * 16 + ((chunk ^ (row & 7)) << 4));
    } else {
      constexpr int kRowsPerLine = 8 / kPChunks;
      return static_cast<uint32_t>(row * kPChunks * 16 + ((chunk ^ ((row / kRowsPerLine) & (kPChunks - 1))) << 4));
    }
  }
};

// Completes per-row values held as v[mi][half] by the lanes of mma fragments: first over the four lanes that share a
// row, then (kWarpsN > 1) over the warps of the row group through `exchange` ([kWarpsN][kRowTile] floats), in warp
// order so the result is deterministic. The caller guarantees no warp still reads `exchange` from a previous use.
template <class Cfg, class Combine>
__device__ __forceinline__ void reduce_across_row_group(float (&v)[Cfg::kMTiles][2], Combine combine, float* exchange,
                                                        int wn, int warp_row0, int lane, int barrier_id) {
#pragma unroll
  for (int mi = 0; mi < Cfg::kMTiles; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float x = v[mi][half];
      x = combine(x, __shfl_xor_sync(0xffffffffu, x, 1));
      x = combine(x, __shfl_xor_sync(0xffffffffu, x, 2));
      v[mi][half] = x;
    }
  }
  if constexpr (Cfg::kWarpsN > 1) {
    if ((lane & 3) == 0) {
#pragma unroll
      for (int mi = 0; mi < Cfg::kMTiles; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          exchange[wn * Cfg::kRowTile + warp_row0 + mi * 16 + (lane >> 2) + half * 8] = v[mi][half];
    }
    named_barrier(barrier_id, Cfg::kWarpsN * 32);
#pragma unroll
    for (int mi = 0; mi < Cfg::kMTiles; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = warp_row0 + mi * 16 + (lane >> 2) + half * 8;
        float x = exchange[r];
#pragma unroll
        for (int g = 1; g < Cfg::kWarpsN; ++g) x = combine(x, exchange[g * Cfg::kRowTile + r]);
        v[mi][half] = x;
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void decode_key_split_body(const DecodeParams& p) {
  using T = typename Cfg::Element;
  using Row = typename Cfg::Row;
  constexpr int kMT = Cfg::kMTiles;
  constexpr int kNT = Cfg::kKeyNTiles;
  constexpr int kCT = Cfg::kColNTiles;

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* q_smem = smem + Cfg::kQOffset;
  uint8_t* kv_smem = smem + Cfg::kKvOffset;
  float* reduce = reinterpret_cast<float*>(smem + Cfg::kReduceOffset);  // [kWarpsN][kRowTile]
  const uint32_t q_base = smem_u32(q_smem);
  uint8_t* p_smem = smem + Cfg::kPOffset;  // [kRowTile][kKeyTile] of T
  const uint32_t p_base = smem_u32(p_smem);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wm = warp / Cfg::kWarpsN;
  const int wn = warp - wm * Cfg::kWarpsN;
  const int warp_row0 = wm * Cfg::kWarpRows;
  const int warp_key0 = wn * Cfg::kWarpKeys;
  const int warp_col0 = wn * Cfg::kWarpCols;
  const int group_barrier = 1 + wm;  // named barrier of this row group (0 is __syncthreads)
  constexpr int kGroupThreads = Cfg::kWarpsN * 32;

  const CtaWork w = single_cta_work<Cfg::kRowTile, Cfg::kKeyTile>(p);  // many rows: never a balanced range
  const float scale_log2 = p.sm_scale * 1.4426950408889634f;

  // Key limit of each accumulator row this thread holds: rows warp_row0 + mi * 16 + lane / 4 + half * 8.
  int row_limit[kMT][2];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = w.row_begin + warp_row0 + mi * 16 + (lane >> 2) + half * 8;
      row_limit[mi][half] = r < w.rows ? row_key_limit(p, w.seq_len, r) : 0;
    }
  }

  KvPipeline<T, Cfg::kRowTile, Cfg::kKeyTile, Cfg::kStages, Cfg::kThreads> pipe{kv_smem, smem + Cfg::kValidOffset, {}};
  pipe.start(p, w, q_smem);

  float acc[kMT][kCT][4];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ct][e] = 0.f;
  float row_max[kMT][2];  // running max, log2 domain (scaled)
  float row_sum[kMT][2];  // this thread's share of the running denominator
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
    row_max[mi][0] = row_max[mi][1] = kNegInf;
    row_sum[mi][0] = row_sum[mi][1] = 0.f;
  }

  // Per-lane ldmatrix addressing. Rows of one lane share (row & 7), so the swizzle term is one XOR per load.
  const int a_row = warp_row0 + (lane & 15);  // A operand rows (Q, P)
  const int a_xor = (lane >> 4) ^ (a_row & 7);
  const int k_key = warp_key0 + (lane & 7) + ((lane >> 4) << 3);  // K rows for x4 (two n-tiles)
  const int k_xor = ((lane >> 3) & 1) ^ (lane & 7);
  const int v_key = (lane & 7) + (((lane >> 3) & 1) << 3);  // V rows for x4.trans
  const int v_xor = (lane >> 4) ^ (lane & 7);

  for (int tile = 0; tile < w.num_tiles; ++tile) {
    pipe.advance(p, w, tile);
    const uint32_t kv_base = smem_u32(pipe.stage(tile));
    const uint8_t* tile_valid = pipe.key_valid(tile);
    const int tile_begin = w.key_begin + tile * Cfg::kKeyTile;

    // ---- scores = Q . K^T over K-dim 576 (latent then rotary chunks: one uniform loop) ----
    float s[kMT][kNT][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][nt][e] = 0.f;

#pragma unroll
    for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        ldmatrix_x4(a[mi], q_base + (a_row + mi * 16) * Row::kBytes + (((2 * kk) ^ a_xor) << 4));
      }
      if constexpr (kNT == 1) {
        uint32_t b[2];
        ldmatrix_x2(b, kv_base + (warp_key0 + (lane & 7)) * Row::kBytes + (((2 * kk) ^ k_xor) << 4));
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) mma_16816<T>(s[mi][0], a[mi], b[0], b[1]);
      } else {
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, kv_base + (k_key + np * 16) * Row::kBytes + (((2 * kk) ^ k_xor) << 4));
#pragma unroll
          for (int mi = 0; mi < kMT; ++mi) {
            mma_16816<T>(s[mi][2 * np], a[mi], b[0], b[1]);
            mma_16816<T>(s[mi][2 * np + 1], a[mi], b[2], b[3]);
          }
        }
      }
    }

    // ---- mask, scale, tile row max ----
    float tile_max[kMT][2];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) tile_max[mi][0] = tile_max[mi][1] = kNegInf;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e1 = 0; e1 < 2; ++e1) {
        const int key_local = warp_key0 + nt * 8 + 2 * (lane & 3) + e1;
        const int key = tile_begin + key_local;
        const bool loaded = tile_valid[key_local] != 0;
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float& v = s[mi][nt][half * 2 + e1];
            v = (loaded && key < row_limit[mi][half]) ? v * scale_log2 : kNegInf;
            tile_max[mi][half] = fmaxf(tile_max[mi][half], v);
          }
        }
      }
    }
    reduce_across_row_group<Cfg>(
        tile_max, [](float x, float y) { return fmaxf(x, y); }, reduce, wn, warp_row0, lane, group_barrier);

    // ---- online softmax update; P (as T) to shared memory for the whole row group ----
    float alpha[kMT][2];
    float base[kMT][2];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float m_new = fmaxf(row_max[mi][half], tile_max[mi][half]);
        base[mi][half] = m_new == kNegInf ? 0.f : m_new;  // no key yet: keep exp2 arguments finite (-inf - -inf)
        alpha[mi][half] = exp2f(row_max[mi][half] - base[mi][half]);
        row_max[mi][half] = m_new;
        row_sum[mi][half] *= alpha[mi][half];
      }
    }
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float p0 = exp2f(s[mi][nt][half * 2] - base[mi][half]);
          const float p1 = exp2f(s[mi][nt][half * 2 + 1] - base[mi][half]);
          row_sum[mi][half] += p0 + p1;
          const int r = warp_row0 + mi * 16 + (lane >> 2) + half * 8;
          const int key_local = warp_key0 + nt * 8 + 2 * (lane & 3);
          *reinterpret_cast<uint32_t*>(p_smem + Cfg::p_offset(r, key_local >> 3) + ((key_local & 7) << 1)) =
              pack2<T>(p0, p1);
        }
      }
    }
    if constexpr (Cfg::kWarpsN > 1) {
      named_barrier(group_barrier, kGroupThreads);
    } else {
      __syncwarp();
    }

    // ---- acc = acc * alpha + P . V, V = latent columns [warp_col0, +kWarpCols) of the same tile ----
    bool rescale = false;  // once the row maxima settle, alpha == 1 and the rescale is skipped
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) rescale |= alpha[mi][0] != 1.f || alpha[mi][1] != 1.f;
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
        for (int ct = 0; ct < kCT; ++ct) {
          acc[mi][ct][0] *= alpha[mi][0];
          acc[mi][ct][1] *= alpha[mi][0];
          acc[mi][ct][2] *= alpha[mi][1];
          acc[mi][ct][3] *= alpha[mi][1];
        }
    }
#pragma unroll
    for (int ks = 0; ks < Cfg::kKeyTile / 16; ++ks) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        ldmatrix_x4(a[mi], p_base + Cfg::p_offset(a_row + mi * 16, 2 * ks + (lane >> 4)));
      }
      const uint32_t v_row = kv_base + (ks * 16 + v_key) * Row::kBytes;
#pragma unroll
      for (int cp = 0; cp < kCT / 2; ++cp) {
        uint32_t b[4];
        const int chunk = (warp_col0 >> 3) + 2 * cp;  // (chunk ^ v_xor): warp_col0 / 8 is a multiple of 8
        ldmatrix_x4_trans(b, v_row + ((chunk ^ v_xor) << 4));
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          mma_16816<T>(acc[mi][2 * cp], a[mi], b[0], b[1]);
          mma_16816<T>(acc[mi][2 * cp + 1], a[mi], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may land after the CTA exits (tail groups are empty, but keep it explicit)

  // ---- epilogue: full row sums, normalise, write out/lse (one split) or fp32 partials ----
  // Every warp of the group has passed its last P barrier, so the exchange buffer is free again.
  reduce_across_row_group<Cfg>(
      row_sum, [](float x, float y) { return x + y; }, reduce, wn, warp_row0, lane, group_barrier);

#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = w.row_begin + warp_row0 + mi * 16 + (lane >> 2) + half * 8;
      if (r >= w.rows) continue;
      write_row_result<T, kCT>(p, w, r, row_sum[mi][half], row_max[mi][half], warp_col0 + 2 * (lane & 3),
                               wn == 0 && (lane & 3) == 0,
                               [&](int ct) { return make_float2(acc[mi][ct][half * 2], acc[mi][ct][half * 2 + 1]); });
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) decode_key_split_kernel(const __grid_constant__ DecodeParams p) {
  wait_for_previous_grid();  // q may come from the kernel just before
  allow_next_grid_launch();
  if constexpr (body_compiled_here<Cfg::kSm90Only>()) decode_key_split_body<Cfg>(p);
}

}  // namespace mla::cuda
