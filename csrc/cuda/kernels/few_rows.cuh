// Split-KV MLA decode main kernel for few query rows per sequence (H * S_q <= 32), fp16/bf16, mma.sync.
//
// This regime is memory-bound: the kernel must keep HBM busy while doing little math per byte, so each SM has to
// turn KV tiles around quickly. One CTA = (sequence, 16 or 32 query rows, KV split); each row group of 16 rows has
// 4 warps, and warp q of a group
//   - holds the group's query block for K-dim steps [9q, 9q + 9) in registers for the whole CTA (Q is read from
//     shared memory once, not once per tile), and computes partial scores over its quarter of the 576 dims for all
//     keys of the tile: 4-8 independent mma chains of 9 steps, each K element read from shared memory once;
//   - adds the four quarters' partial scores (exchanged through shared memory in fragment order, summed in a fixed
//     order, so every warp holds bitwise the same scores), then runs the online softmax redundantly - the full row
//     is in registers, so no max/sum exchange and no P round trip: P feeds P . V straight from registers;
//   - accumulates output columns [128q, 128q + 128) (64 fp32 registers).
// Two barriers per tile: the pipeline's and the partial-score exchange.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/combine/cluster_merge.cuh"
#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/common/fragment_softmax.cuh"
#include "cuda/common/tile_loader.cuh"
#include "cuda/kernels/dim_split_shape.cuh"
#include "params.h"

namespace mla::cuda {

template <typename T, int kRowGroups, int kKeyTile, int kStages, bool kSm90Only>
struct DimSplitTile : DimSplitShape<T, kRowGroups, kKeyTile, kStages, kSm90Only,
                                    KvTileCopier<T, kKeyTile, dim_split_threads<kRowGroups>()>> {
  using Shape = typename DimSplitTile::DimSplitShape;
  static constexpr int kKSteps = (kHeadDim + kRopeDim) / 16;           // 36
  static constexpr int kWarpKSteps = kKSteps / Shape::kWarpsPerGroup;  // 9 per warp

  static_assert(kKSteps % Shape::kWarpsPerGroup == 0, "K-dim steps split evenly over a group's warps");
  static_assert(ClusterMergeBuffer<Shape::kRowTile>::kBytes <= kStages * Shape::Pipeline::kStageBytes,
                "a cluster merge stages the rows in the KV stages");
};

template <class Cfg, bool kMergeInCluster>
__device__ __forceinline__ void decode_dim_split_body(const DecodeParams& p, const CtaWork& w) {
  using T = typename Cfg::Element;
  using Row = typename Cfg::Row;
  constexpr int kNT = Cfg::kKeyNTiles;
  constexpr int kCT = Cfg::kColNTiles;
  constexpr int kWKS = Cfg::kWarpKSteps;

  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* q_smem = smem + Cfg::kQOffset;
  float4* partial = reinterpret_cast<float4*>(smem + Cfg::kPartialOffset);
  const uint32_t q_base = smem_u32(q_smem);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int group = warp / Cfg::kWarpsPerGroup;
  const int quarter = warp - group * Cfg::kWarpsPerGroup;
  const int group_row0 = group * 16;

  const float scale_log2 = p.sm_scale * 1.4426950408889634f;

  int row_limit[2];  // rows group_row0 + lane / 4 + half * 8
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = w.row_begin + group_row0 + (lane >> 2) + half * 8;
    row_limit[half] = r < w.rows ? row_key_limit(p, w.seq_len, r) : 0;
  }

  typename Cfg::Pipeline pipe{smem + Cfg::kKvOffset, smem + Cfg::kValidOffset, {}};
  pipe.start(p, w, q_smem);

  float acc[kCT][4];
#pragma unroll
  for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[ct][e] = 0.f;
  float row_max[2] = {kNegInf, kNegInf};  // running max, log2 domain (scaled)
  float row_sum[2] = {0.f, 0.f};          // this thread's share of the running denominator
  uint32_t q_frag[kWKS][4];               // A fragments of this warp's K-dim quarter, loaded with tile 0

  const int a_row = group_row0 + (lane & 15);
  const int a_xor = (lane >> 4) ^ (a_row & 7);
  const int k_key = (lane & 7) + ((lane >> 4) << 3);
  const int k_xor = ((lane >> 3) & 1) ^ (lane & 7);
  const int v_key = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int v_xor = (lane >> 4) ^ (lane & 7);
  const int kstep0 = quarter * kWKS;
  const int col_chunk0 = quarter * (Cfg::kWarpCols / 8);

  for (int tile = 0; tile < w.num_tiles; ++tile) {
    pipe.advance(p, w, tile);
    const uint32_t kv_base = smem_u32(pipe.stage(tile));
    const uint8_t* tile_valid = pipe.key_valid(tile);
    const int tile_begin = w.key_begin + tile * Cfg::kKeyTile;

    if (tile == 0) {  // the query block arrived with tile 0
#pragma unroll
      for (int kk = 0; kk < kWKS; ++kk) {
        ldmatrix_x4(q_frag[kk], q_base + a_row * Row::kBytes + (((2 * (kstep0 + kk)) ^ a_xor) << 4));
      }
    }

    // ---- partial scores over this warp's 144 dims, all keys of the tile ----
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kWKS; ++kk) {
      const uint32_t chunk_off = ((2 * (kstep0 + kk)) ^ k_xor) << 4;
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, kv_base + (k_key + np * 16) * Row::kBytes + chunk_off);
        mma_16816<T>(s[2 * np], q_frag[kk], b[0], b[1]);
        mma_16816<T>(s[2 * np + 1], q_frag[kk], b[2], b[3]);
      }
    }
    add_quarter_scores<Cfg::kWarpsPerGroup>(s, partial, group, quarter, lane);

    // ---- mask, scale, online softmax (whole rows are in this warp) ----
    float alpha[2];
    float base[2];
    fragment_softmax_rescale</*kFtz=*/false>(s, tile_valid, tile_begin, row_limit, lane & 3, scale_log2, row_max,
                                             row_sum, alpha, base);
    uint32_t pa[kNT / 2][4];  // P as A fragments: the score accumulator layout is the A layout of P . V
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float p0 = exp2f(s[nt][0] - base[0]);
      const float p1 = exp2f(s[nt][1] - base[0]);
      const float p2 = exp2f(s[nt][2] - base[1]);
      const float p3 = exp2f(s[nt][3] - base[1]);
      row_sum[0] += p0 + p1;
      row_sum[1] += p2 + p3;
      pa[nt / 2][(nt & 1) * 2 + 0] = pack2<T>(p0, p1);
      pa[nt / 2][(nt & 1) * 2 + 1] = pack2<T>(p2, p3);
    }

    // ---- acc = acc * alpha + P . V over this warp's 128 columns ----
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {  // skipped once the row maxima settle
#pragma unroll
      for (int ct = 0; ct < kCT; ++ct) {
        acc[ct][0] *= alpha[0];
        acc[ct][1] *= alpha[0];
        acc[ct][2] *= alpha[1];
        acc[ct][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int ks = 0; ks < kNT / 2; ++ks) {
      const uint32_t v_row = kv_base + (ks * 16 + v_key) * Row::kBytes;
#pragma unroll
      for (int cp = 0; cp < kCT / 2; ++cp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_row + (((col_chunk0 + 2 * cp) ^ v_xor) << 4));
        mma_16816<T>(acc[2 * cp], pa[ks], b[0], b[1]);
        mma_16816<T>(acc[2 * cp + 1], pa[ks], b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: each warp holds whole-row sums; write its 128 columns ----
  if constexpr (kMergeInCluster) {
    uint8_t* buffer = smem + Cfg::kKvOffset;  // the pieces merge in the cluster through the KV stages
    cta_barrier_all_threads();                // every warp is done reading the last tile
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = row_sum[half];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      stage_row_for_merge<Cfg::kRowTile, kCT>(
          buffer, group_row0 + (lane >> 2) + half * 8, l, row_max[half], quarter * Cfg::kWarpCols + 2 * (lane & 3),
          quarter == 0 && (lane & 3) == 0,
          [&](int ct) { return make_float2(acc[ct][half * 2], acc[ct][half * 2 + 1]); });
    }
    merge_staged_rows<T, Cfg::kRowTile, Cfg::kThreads>(p, w, buffer);
  } else {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = row_sum[half];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = w.row_begin + group_row0 + (lane >> 2) + half * 8;
      if (r >= w.rows) continue;
      write_row_result<T, kCT>(p, w, r, l, row_max[half], quarter * Cfg::kWarpCols + 2 * (lane & 3),
                               quarter == 0 && (lane & 3) == 0,
                               [&](int ct) { return make_float2(acc[ct][half * 2], acc[ct][half * 2 + 1]); });
    }
  }
}

// kMergeInCluster: launched in clusters of one sequence's pieces of a fixed split, which merge in the cluster
// (cluster_merge.cuh); its own kernel, so that the merge's registers do not reshape the usual kernel (perf-log v45).
template <class Cfg, bool kMergeInCluster = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1) decode_dim_split_kernel(const __grid_constant__ DecodeParams p) {
  wait_for_previous_grid();  // q may come from the kernel just before
  allow_next_grid_launch();
  if constexpr (body_compiled_here<Cfg::kSm90Only || kMergeInCluster>()) {
    for_each_cta_work<Cfg::kRowTile, Cfg::kKeyTile>(
        p, [&](const CtaWork& w) { decode_dim_split_body<Cfg, kMergeInCluster>(p, w); });
  }
}

}  // namespace mla::cuda
