// Split-KV MLA decode main kernel for fp32 inputs: plain fp32 FFMA (no tf32), so results match a float64
// reference to ~1e-6. Same work split, pipeline, masking and epilogue contract as the tensor-core kernel.
//
// One CTA = 16 query rows x one KV split, 256 threads. Per KV tile of kKeyTile keys:
//   scores: 16 row x key blocks of kBlockRows x 4, each summed over 576 by the 16 lanes of a half-warp (one
//           d-slice of 36 each, 16-byte loads), then a butterfly reduce-scatter leaves one score per lane;
//   softmax: one thread per (row, key), row reductions by shuffles inside groups of kKeyTile lanes;
//   P . V:  each thread owns 8 rows x 4 consecutive columns (float4 loads of V, broadcast loads of P).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/common/tile_loader.cuh"
#include "params.h"

namespace mla::cuda {

template <int kKeyTile_, int kStages_>
struct SimtTile {
  using Element = float;
  static constexpr int kRowTile = 16;
  static constexpr int kThreads = 256;
  static constexpr int kKeyTile = kKeyTile_;
  static constexpr int kStages = kStages_;
  static constexpr bool kWalksRanges = true;  // balanced splits: walks ranges (several sequences per CTA)
  static constexpr bool kSm90Only = false;

  static constexpr int kKeyBlocks = kKeyTile / 4;      // 4 keys per score block
  static constexpr int kBlockRows = kKeyTile / 4;      // rows per score block: 16 blocks in all
  static constexpr int kBlockValues = kBlockRows * 4;  // partial scores one lane sums
  static constexpr int kSlices = 16;                   // lanes sharing one block (d-slices)
  using Row = RowLayout<float>;
  static constexpr int kChunksPerSlice = Row::kChunks / kSlices;  // 144 / 16 = 9 float4 per row per lane

  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kRowTile * Row::kBytes;
  static constexpr int kScoreOffset = kKvOffset + kStages * kKeyTile * Row::kBytes;  // [kRowTile][kKeyTile]
  static constexpr int kProbOffset = kScoreOffset + kRowTile * kKeyTile * 4;         // [kKeyTile][kRowTile]
  static constexpr int kAlphaOffset = kProbOffset + kKeyTile * kRowTile * 4;         // [kRowTile]
  static constexpr int kStatsOffset = kAlphaOffset + kRowTile * 4;                   // [kRowTile] (max, sum)
  static constexpr int kValidOffset = kStatsOffset + kRowTile * 8;
  static constexpr int kSmemBytes =
      kValidOffset + KvPipeline<float, kRowTile, kKeyTile, kStages, kThreads>::kValidBytes;

  static_assert(kKeyTile == 8 || kKeyTile == 16, "key tile");
  static_assert(kStages >= 2, "pipeline depth");
};

// c ? a : b as a register select: written as a C++ select of two array elements, the compiler turns it into a
// select of addresses and moves the whole array to local memory.
__device__ __forceinline__ float select_value(bool c, float a, float b) {
  float r;
  asm("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n selp.f32 %0, %1, %2, p;\n}\n"
      : "=f"(r)
      : "f"(a), "f"(b), "r"(static_cast<int>(c)));
  return r;
}

// One reduce-scatter step across lanes `offset` apart: keep kKeep of the 2 * kKeep values (the upper or lower half,
// by the lane's `offset` bit), adding the partner's copy; with kKeep == 0 the last value is summed outright.
template <int kKeep, int kValues>
__device__ __forceinline__ void butterfly_step(float (&part)[kValues], int slice, int offset) {
  if constexpr (kKeep == 0) {
    part[0] += __shfl_xor_sync(0xffffffffu, part[0], offset);
  } else {
    const bool upper = (slice & offset) != 0;
#pragma unroll
    for (int j = 0; j < kKeep; ++j) {
      const float lo = part[j];
      const float hi = part[j + kKeep];
      const float send = select_value(upper, lo, hi);
      part[j] = select_value(upper, hi, lo) + __shfl_xor_sync(0xffffffffu, send, offset);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void decode_simt_body(const DecodeParams& p, const CtaWork& w) {
  using Row = typename Cfg::Row;
  constexpr int kN = Cfg::kKeyTile;
  constexpr int kBR = Cfg::kBlockRows;
  constexpr int kV = Cfg::kBlockValues;

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* q_smem = smem + Cfg::kQOffset;
  float* scores = reinterpret_cast<float*>(smem + Cfg::kScoreOffset);
  float* probs = reinterpret_cast<float*>(smem + Cfg::kProbOffset);
  float* alphas = reinterpret_cast<float*>(smem + Cfg::kAlphaOffset);
  float2* stats = reinterpret_cast<float2*>(smem + Cfg::kStatsOffset);

  const int tid = threadIdx.x;
  const float scale_log2 = p.sm_scale * 1.4426950408889634f;

  KvPipeline<float, Cfg::kRowTile, kN, Cfg::kStages, Cfg::kThreads> pipe{
      smem + Cfg::kKvOffset, smem + Cfg::kValidOffset, {}};
  pipe.start(p, w, q_smem);

  // Score-block coordinates: 16 d-slices (lanes of a half-warp) x 16 blocks.
  const int slice = tid & 15;
  const int block = tid >> 4;
  const int block_row0 = (block / Cfg::kKeyBlocks) * kBR;
  const int block_key0 = (block % Cfg::kKeyBlocks) * 4;
  // After the reduce-scatter this lane holds block value `value_index` (lane pairs share one when kV == 8).
  const int value_index = kV == 16 ? slice : slice >> 1;
  const bool writes_score = kV == 16 || (slice & 1) == 0;

  // Softmax coordinates: one thread per (row, key); rows of a group are kN consecutive lanes.
  const bool softmax_thread = tid < Cfg::kRowTile * kN;
  const int sm_row = tid / kN;
  const int sm_key = tid % kN;
  const int sm_row_global = w.row_begin + sm_row;
  const int sm_limit = (softmax_thread && sm_row_global < w.rows) ? row_key_limit(p, w.seq_len, sm_row_global) : 0;
  float row_max = kNegInf;  // running max (log2 domain), identical across the row's lanes
  float row_sum = 0.f;

  // P . V coordinates: 4 consecutive latent columns x 8 rows.
  const int col4 = tid & 127;
  const int row8 = (tid >> 7) * 8;
  float acc[8][4];
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = 0.f;

  for (int tile = 0; tile < w.num_tiles; ++tile) {
    pipe.advance(p, w, tile);
    const uint8_t* kv_tile = pipe.stage(tile);
    const uint8_t* tile_valid = pipe.key_valid(tile);
    const int tile_begin = w.key_begin + tile * kN;

    // ---- partial scores of this lane's d-slice ----
    float part[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) part[v] = 0.f;
#pragma unroll 3
    for (int ci = 0; ci < Cfg::kChunksPerSlice; ++ci) {
      const int chunk = slice + ci * Cfg::kSlices;
      float4 qv[kBR];
      float4 kvv[4];
#pragma unroll
      for (int r = 0; r < kBR; ++r) {
        qv[r] = *reinterpret_cast<const float4*>(q_smem + Row::offset(block_row0 + r, chunk));
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        kvv[k] = *reinterpret_cast<const float4*>(kv_tile + Row::offset(block_key0 + k, chunk));
      }
#pragma unroll
      for (int r = 0; r < kBR; ++r) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float& d = part[r * 4 + k];
          d = fmaf(qv[r].x, kvv[k].x, d);
          d = fmaf(qv[r].y, kvv[k].y, d);
          d = fmaf(qv[r].z, kvv[k].z, d);
          d = fmaf(qv[r].w, kvv[k].w, d);
        }
      }
    }
    // Butterfly reduce-scatter over the 16 slices: each step halves the values a lane keeps.
    butterfly_step<kV / 2>(part, slice, 8);
    butterfly_step<kV / 4>(part, slice, 4);
    butterfly_step<kV / 8>(part, slice, 2);
    butterfly_step<kV / 16>(part, slice, 1);
    if (writes_score) {
      scores[(block_row0 + value_index / 4) * kN + block_key0 + (value_index & 3)] = part[0];
    }
    __syncthreads();

    // ---- mask, online softmax ----
    if (softmax_thread) {
      const int key = tile_begin + sm_key;
      float s = scores[sm_row * kN + sm_key];
      s = (tile_valid[sm_key] != 0 && key < sm_limit) ? s * scale_log2 : kNegInf;
      float m = s;
#pragma unroll
      for (int off = kN / 2; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const float m_new = fmaxf(row_max, m);
      const float base = m_new == kNegInf ? 0.f : m_new;  // no key yet: keep exp2 arguments finite
      const float alpha = exp2f(row_max - base);
      row_max = m_new;
      const float prob = exp2f(s - base);
      float sum = prob;
#pragma unroll
      for (int off = kN / 2; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      row_sum = row_sum * alpha + sum;
      probs[sm_key * Cfg::kRowTile + sm_row] = prob;
      if (sm_key == 0) alphas[sm_row] = alpha;
    }
    __syncthreads();

    // ---- acc = acc * alpha + P . V ----
    // The tile's P . V is summed on its own first: adding every key straight into the running output lets rounding
    // grow with the split's length (3e-5 over ~1800 equal keys in one split, against the 1e-5 fp32 contract).
    float tile_acc[8][4];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) tile_acc[r][c] = 0.f;
#pragma unroll 4
    for (int k = 0; k < kN; ++k) {
      const float4 v = *reinterpret_cast<const float4*>(kv_tile + Row::offset(k, col4));
      const float4 p_lo = *reinterpret_cast<const float4*>(probs + k * Cfg::kRowTile + row8);
      const float4 p_hi = *reinterpret_cast<const float4*>(probs + k * Cfg::kRowTile + row8 + 4);
      const float pr[8] = {p_lo.x, p_lo.y, p_lo.z, p_lo.w, p_hi.x, p_hi.y, p_hi.z, p_hi.w};
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        tile_acc[r][0] = fmaf(pr[r], v.x, tile_acc[r][0]);
        tile_acc[r][1] = fmaf(pr[r], v.y, tile_acc[r][1]);
        tile_acc[r][2] = fmaf(pr[r], v.z, tile_acc[r][2]);
        tile_acc[r][3] = fmaf(pr[r], v.w, tile_acc[r][3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const float a = alphas[row8 + r];
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(acc[r][c], a, tile_acc[r][c]);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue ----
  if (softmax_thread && sm_key == 0) stats[sm_row] = make_float2(row_max, row_sum);
  __syncthreads();
  const bool single_split = w.single_split;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int row = w.row_begin + row8 + r;
    if (row >= w.rows) continue;
    const float2 st = stats[row8 + r];
    const bool seen = !(st.y == 0.f);  // NaN (a non-finite used key) must reach the output
    const float inv = seen ? 1.f / st.y : 0.f;
    const float4 o = make_float4(acc[r][0] * inv, acc[r][1] * inv, acc[r][2] * inv, acc[r][3] * inv);
    const float lse = seen ? (st.x + log2f(st.y)) * 0.6931471805599453f : kNegInf;
    if (single_split) {
      float* out = static_cast<float*>(p.out) + out_row_offset(p, w.batch_index, row);
      *reinterpret_cast<float4*>(out + col4 * 4) = o;
      if (col4 == 0) p.lse[lse_row_offset(p, w.batch_index, row)] = lse;
    } else {
      const int64_t prow = partial_row_index(p, w, row);
      if (seen) *reinterpret_cast<float4*>(p.out_partial + prow * kHeadDim + col4 * 4) = o;
      if (col4 == 0) p.lse_partial[prow] = lse;
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) decode_simt_kernel(const __grid_constant__ DecodeParams p) {
  wait_for_previous_grid();  // q may come from the kernel just before
  allow_next_grid_launch();
  for_each_cta_work<Cfg::kRowTile, Cfg::kKeyTile>(p, [&](const CtaWork& w) { decode_simt_body<Cfg>(p, w); });
}

}  // namespace mla::cuda
