// Split-KV MLA decode main kernel on a float8_e4m3fn cache, fp16/bf16 queries, mma.sync: blocks of 16 or 32 query rows
// (more rows per sequence run as several blocks). The dim-split schedule of few_rows.cuh; what differs is where the
// values come from:
//   - the stages hold keys as stored (fp8_tile_loader.cuh), and each warp converts the bytes it reads straight into
//     fp16 mma fragments (fp8_fragments.cuh): no dequantised copy of a tile, so a stage costs half the shared memory
//     and twice the tiles fit in flight.
//   - The fragments' K-dim order is free (a dot product does not care), so each lane reads 16 contiguous bytes of a
//     key for four k16 steps of scores, and the query fragments are loaded in the same order. For P . V each lane reads
//     16 contiguous bytes (16 output columns) of four keys; n-tile j of the warp's 128 columns takes column 16 n + j,
//     so a thread ends up holding 32 contiguous columns of its two rows.
//   - Warp q of a row group takes latent dims [128q, 128q + 128) for the scores, the block under one per-block scale,
//     and the same 128 output columns, plus rope dims [16q, 16q + 16).
// Scales stay in fp32: per tensor in the softmax scale and the output; per block on each warp's latent partial scores
// and on P, which carries key scale x a per-warp power of two (pv_unit) that keeps it within fp16's range.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/common/fp8_fragments.cuh"
#include "cuda/common/fp8_tile_loader.cuh"
#include "cuda/common/fragment_softmax.cuh"
#include "cuda/common/tile_loader.cuh"
#include "cuda/kernels/dim_split_shape.cuh"
#include "params.h"

namespace mla::cuda {

template <typename T, CacheFormat kCache, int kRowGroups, int kKeyTile, int kStages, bool kSm90Only>
struct Fp8DimSplitTile : DimSplitShape<T, kRowGroups, kKeyTile, kStages, kSm90Only,
                                       Fp8TileCopier<T, kCache, kKeyTile, dim_split_threads<kRowGroups>()>> {
  using Shape = typename Fp8DimSplitTile::DimSplitShape;
  static constexpr CacheFormat kCacheFormat = kCache;
  static constexpr int kLatentSteps = Shape::kWarpCols / 16;  // 8 k16 steps: latent dims, output columns, one block

  static_assert(Shape::kWarpCols == kFp8BlockValues && kRopeDim == 16 * Shape::kWarpsPerGroup,
                "a warp's share of the dims");
};

template <class Cfg>
__device__ __forceinline__ void decode_fp8_dim_split_body(const DecodeParams& p, const CtaWork& w) {
  using T = typename Cfg::Element;
  using QRow = typename Cfg::Row;
  using Stage = typename Cfg::Pipeline::Copier::Stage;
  constexpr int kNT = Cfg::kKeyNTiles;
  constexpr int kCT = Cfg::kColNTiles;
  constexpr bool kPerBlock = Stage::kPerBlock;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;

  extern __shared__ __align__(128) uint8_t smem[];
  const uint8_t* q_smem = smem + Cfg::kQOffset;
  float4* partial = reinterpret_cast<float4*>(smem + Cfg::kPartialOffset);

  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int warp = threadIdx.x >> 5;
  const int group = warp / Cfg::kWarpsPerGroup;
  const int quarter = warp - group * Cfg::kWarpsPerGroup;
  const int group_row0 = group * 16;
  const int latent0 = quarter * Cfg::kWarpCols;  // this warp's latent dims and output columns

  int row_limit[2];  // rows group_row0 + g + half * 8
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = w.row_begin + group_row0 + g + half * 8;
    row_limit[half] = r < w.rows ? row_key_limit(p, w.seq_len, r) : 0;
  }

  typename Cfg::Pipeline pipe{smem + Cfg::kKvOffset, smem + Cfg::kValidOffset, {}};
  pipe.start(p, w, smem + Cfg::kQOffset);
  const float tensor_scale = kPerBlock ? 1.f : *p.kv_scale;
  float scale_log2 = p.sm_scale * 1.4426950408889634f;
  float q_unscale = 1.f;  // the latent query fragments hold q / q_unscale (bf16 queries)
  float pv_unit = 0.f;    // per block: P carries key scale x pv_unit; 0 until a tile has a positive scale

  float acc[kCT][4];
#pragma unroll
  for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[ct][e] = 0.f;
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.f, 0.f};
  uint32_t q_latent[Cfg::kLatentSteps][4];  // fp16 A fragments, K-dim order of the key loads below
  uint32_t q_rope[4];                       // per tensor fp16, per block T (the rope is stored in T)

  for (int tile = 0; tile < w.num_tiles; ++tile) {
    pipe.advance(p, w, tile);
    const uint8_t* kv = pipe.stage(tile);
    const uint8_t* tile_valid = pipe.key_valid(tile);
    const int tile_begin = w.key_begin + tile * Cfg::kKeyTile;

    if (tile == 0) {  // the query block arrived with tile 0. Step 4G + s takes dims latent0 + 64G + 16t + 4s + [0, 4)
#pragma unroll
      for (int kk = 0; kk < Cfg::kLatentSteps; ++kk) {
        const int d = latent0 + 64 * (kk / 4) + 16 * t + 4 * (kk % 4);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint2 v =
              *reinterpret_cast<const uint2*>(q_smem + QRow::offset(group_row0 + g + 8 * half, d / 8) + (d % 8) * 2);
          q_latent[kk][half] = v.x;      // dims d, d + 1: k = 2t, 2t + 1
          q_latent[kk][half + 2] = v.y;  // dims d + 2, d + 3: k = 2t + 8, 2t + 9
        }
      }
      const int d = 16 * quarter + 4 * t;  // rope dims d + [0, 4)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint2 v = *reinterpret_cast<const uint2*>(
            q_smem + QRow::offset(group_row0 + g + 8 * half, QRow::kKvChunks + d / 8) + (d % 8) * 2);
        q_rope[half] = v.x;
        q_rope[half + 2] = v.y;
      }
      if constexpr (kBf16) {  // to fp16, scaled by a power of two that fits the warp's largest value
        float m = 0.f;
#pragma unroll
        for (int kk = 0; kk < Cfg::kLatentSteps; ++kk)
#pragma unroll
          for (int i = 0; i < 4; ++i) m = fmaxf(m, bf16x2_abs_max(q_latent[kk][i]));
        if constexpr (!kPerBlock) {
#pragma unroll
          for (int i = 0; i < 4; ++i) m = fmaxf(m, bf16x2_abs_max(q_rope[i]));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const int e = fp16_exponent_for(m);
        const float factor = ldexpf(1.f, e);
        q_unscale = ldexpf(1.f, -e);
#pragma unroll
        for (int kk = 0; kk < Cfg::kLatentSteps; ++kk)
#pragma unroll
          for (int i = 0; i < 4; ++i) q_latent[kk][i] = bf16x2_to_half2(q_latent[kk][i], factor);
        if constexpr (!kPerBlock) {
#pragma unroll
          for (int i = 0; i < 4; ++i) q_rope[i] = bf16x2_to_half2(q_rope[i], factor);
        }
      }
      // Per tensor every score is q . (tensor_scale x stored key), latent and rope alike.
      if constexpr (!kPerBlock) scale_log2 *= tensor_scale;
    }

    // Per block: the scales of block `quarter` of this thread's keys nt * 8 + 2t + {0, 1}.
    float key_scale[kPerBlock ? kNT : 1][2];
    float rescale = 1.f;  // per block: the factor acc takes when pv_unit moves
    if constexpr (kPerBlock) {
      float m = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          key_scale[nt][k] = reinterpret_cast<const float*>(kv + Stage::scales(nt * 8 + 2 * t + k))[quarter];
          m = fmaxf(m, key_scale[nt][k]);
        }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));  // the tile's largest scale of block `quarter`
      if (m > 0.f && m <= 3.4e38f && (pv_unit == 0.f || m * pv_unit > 1.f)) {
        int x;
        frexpf(m, &x);
        const float unit = ldexpf(1.f, -max(-120, min(120, x)));  // m x unit <= 1
        rescale = pv_unit == 0.f ? 1.f : unit / pv_unit;
        pv_unit = unit;
      }
    }

    // ---- partial scores over this warp's 128 latent and 16 rope dims, all keys of the tile ----
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
      const int key = nt * 8 + g;
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        const uint4 bytes = *reinterpret_cast<const uint4*>(kv + Stage::latent(key, quarter * 8 + part * 4 + t));
        const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t b0, b1;
          e4m3x4_to_half2x2(words[i], b0, b1);
          mma_16816<__half>(s[nt], q_latent[4 * part + i], b0, b1);
        }
      }
      // The latent sums hold q / q_unscale: scale them (per block by the key's scale too) before the rope, which per
      // block is stored unscaled in T and multiplies the unscaled query.
      if constexpr (kPerBlock) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= key_scale[nt][e & 1] * q_unscale;
        const uint2 rope = *reinterpret_cast<const uint2*>(kv + Stage::rope(key, 2 * quarter + t / 2) + 8 * (t & 1));
        mma_16816<T>(s[nt], q_rope, rope.x, rope.y);
      } else {
        const uint32_t rope = *reinterpret_cast<const uint32_t*>(kv + Stage::rope(key, quarter) + 4 * t);
        uint32_t b0, b1;
        e4m3x4_to_half2x2(rope, b0, b1);
        mma_16816<__half>(s[nt], q_rope, b0, b1);
        if constexpr (kBf16) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] *= q_unscale;  // before the sum: each warp has its own power of two
        }
      }
    }
    add_quarter_scores<Cfg::kWarpsPerGroup>(s, partial, group, quarter, lane);

    // ---- mask, scale, online softmax (whole rows are in this warp) ----
    float alpha[2];
    float base[2];
    fragment_softmax_rescale</*kFtz=*/false>(s, tile_valid, tile_begin, row_limit, t, scale_log2, row_max, row_sum,
                                             alpha, base);
    uint32_t pa[kNT / 2][4];  // P as fp16 A fragments: the score accumulator layout is the A layout of P . V
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      float p0 = exp2f(s[nt][0] - base[0]);
      float p1 = exp2f(s[nt][1] - base[0]);
      float p2 = exp2f(s[nt][2] - base[1]);
      float p3 = exp2f(s[nt][3] - base[1]);
      row_sum[0] += p0 + p1;
      row_sum[1] += p2 + p3;
      if constexpr (kPerBlock) {  // this warp's output columns are block `quarter`: P carries its scales
        const float v0 = key_scale[nt][0] * pv_unit;
        const float v1 = key_scale[nt][1] * pv_unit;
        p0 *= v0;
        p1 *= v1;
        p2 *= v0;
        p3 *= v1;
      }
      pa[nt / 2][(nt & 1) * 2 + 0] = pack2<__half>(p0, p1);
      pa[nt / 2][(nt & 1) * 2 + 1] = pack2<__half>(p2, p3);
    }

    // ---- acc = acc * alpha + P . V over this warp's 128 columns ----
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f || rescale != 1.f)) {
#pragma unroll
      for (int ct = 0; ct < kCT; ++ct) {
        acc[ct][0] *= alpha[0] * rescale;
        acc[ct][1] *= alpha[0] * rescale;
        acc[ct][2] *= alpha[1] * rescale;
        acc[ct][3] *= alpha[1] * rescale;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kNT / 2; ++ks) {
      // keys 16 ks + 2t + {0, 1} (k = 2t, 2t + 1) and 16 ks + 8 + 2t + {0, 1} (k = 2t + 8, 2t + 9), columns
      // latent0 + 16g + [0, 16): byte j of a key row is n-tile j's B value
      const int key = ks * 16 + 2 * t;
      const int chunk = quarter * 8 + g;
      const uint4 r0 = *reinterpret_cast<const uint4*>(kv + Stage::latent(key, chunk));
      const uint4 r1 = *reinterpret_cast<const uint4*>(kv + Stage::latent(key + 1, chunk));
      const uint4 r2 = *reinterpret_cast<const uint4*>(kv + Stage::latent(key + 8, chunk));
      const uint4 r3 = *reinterpret_cast<const uint4*>(kv + Stage::latent(key + 9, chunk));
      const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w};
      const uint32_t w1[4] = {r1.x, r1.y, r1.z, r1.w};
      const uint32_t w2[4] = {r2.x, r2.y, r2.z, r2.w};
      const uint32_t w3[4] = {r3.x, r3.y, r3.z, r3.w};
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        uint32_t lo_keys[2], hi_keys[2];
        interleave_bytes(w0[word], w1[word], lo_keys);
        interleave_bytes(w2[word], w3[word], hi_keys);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t b0[2], b1[2];
          e4m3x4_to_half2x2(lo_keys[h], b0[0], b0[1]);
          e4m3x4_to_half2x2(hi_keys[h], b1[0], b1[1]);
          mma_16816<__half>(acc[4 * word + 2 * h], pa[ks], b0[0], b1[0]);
          mma_16816<__half>(acc[4 * word + 2 * h + 1], pa[ks], b0[1], b1[1]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: each warp holds whole-row sums; acc[j][2 half + e] is column latent0 + 32t + 16e + j ----
  const float out_scale = kPerBlock ? (pv_unit == 0.f ? 1.f : 1.f / pv_unit) : tensor_scale;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = row_sum[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = w.row_begin + group_row0 + g + half * 8;
    if (r >= w.rows) continue;
    write_row_result<T, 16, /*kStride=*/2>(
        p, w, r, l, row_max[half], latent0 + 32 * t, quarter == 0 && t == 0, [&](int j) {
          const int e = j / 8;
          const int c = 2 * (j % 8);
          return make_float2(acc[c][2 * half + e] * out_scale, acc[c + 1][2 * half + e] * out_scale);
        });
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    decode_fp8_dim_split_kernel(const __grid_constant__ DecodeParams p) {
  wait_for_previous_grid();  // q may come from the kernel just before
  allow_next_grid_launch();
  if constexpr (body_compiled_here<Cfg::kSm90Only>()) {
    for_each_cta_work<Cfg::kRowTile, Cfg::kKeyTile>(p, [&](const CtaWork& w) { decode_fp8_dim_split_body<Cfg>(p, w); });
  }
}

}  // namespace mla::cuda
