// The online-softmax step of the kernels whose warps hold whole 16-row score tiles in m16n8 accumulator layout
// (s[nt][half * 2 + e]: row g + 8 half, key 8 nt + 2t + e, lane = 4g + t): the dim-split and fp32 tensor-core kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_primitives.cuh"

namespace mla::cuda {

// Masks keys that were not loaded or lie past a row's limit to -inf, scales the rest to the log2 domain, and moves
// the running max (row_max) to the tile's. alpha: the factor the old output and row_sum take (row_sum is rescaled
// here); base: the max the tile's exponentials subtract (0 while a row has seen no key, so exp2 arguments stay
// finite). kFtz: exp2_ftz instead of exp2f.
template <bool kFtz, int kNT>
__device__ __forceinline__ void fragment_softmax_rescale(float (&s)[kNT][4], const uint8_t* tile_valid, int tile_begin,
                                                         const int (&row_limit)[2], int t, float scale_log2,
                                                         float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2],
                                                         float (&base)[2]) {
  float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e1 = 0; e1 < 2; ++e1) {
      const int key_local = nt * 8 + 2 * t + e1;
      const bool loaded = tile_valid[key_local] != 0;
      const int key = tile_begin + key_local;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float& v = s[nt][half * 2 + e1];
        v = (loaded && key < row_limit[half]) ? v * scale_log2 : kNegInf;
        tile_max[half] = fmaxf(tile_max[half], v);
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float m = tile_max[half];
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float m_new = fmaxf(row_max[half], m);
    base[half] = m_new == kNegInf ? 0.f : m_new;
    if constexpr (kFtz) {
      alpha[half] = exp2_ftz(row_max[half] - base[half]);
    } else {
      alpha[half] = exp2f(row_max[half] - base[half]);
    }
    row_max[half] = m_new;
    row_sum[half] *= alpha[half];
  }
}

// The dim-split kernels: each of a row group's kQuarters warps holds partial scores over its share of the dims for
// all keys of the tile. Every warp stores its share (partial: [warp][nt][lane] float4) and, after the group's
// barrier, adds the shares in a fixed order, so every warp of the group holds bitwise the same scores.
template <int kQuarters, int kNT>
__device__ __forceinline__ void add_quarter_scores(float (&s)[kNT][4], float4* partial, int group, int quarter,
                                                   int lane) {
  const int warp = group * kQuarters + quarter;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    partial[(warp * kNT + nt) * 32 + lane] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
  named_barrier(1 + group, kQuarters * 32);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    // A warp's own quarter is still in its registers (bitwise what it wrote): only the others are read back.
    const float4 own = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
    const float4* quarters = partial + (group * kQuarters * kNT + nt) * 32 + lane;
    float4 sum = quarter == 0 ? own : quarters[0];
#pragma unroll
    for (int q = 1; q < kQuarters; ++q) {  // fixed order: every warp gets bitwise the same scores
      const float4 v = quarter == q ? own : quarters[q * kNT * 32];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    s[nt][0] = sum.x;
    s[nt][1] = sum.y;
    s[nt][2] = sum.z;
    s[nt][3] = sum.w;
  }
}

}  // namespace mla::cuda
