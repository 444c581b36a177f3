// Fixed splits merged inside a thread-block cluster (sm_90+), instead of fp32 partials in global memory and a
// combine kernel behind a grid boundary. The launcher puts one (sequence, row block)'s c splits (c = 2, 4 or 8 on the
// few-row kernel, 2 on the sm_90a kernel) in one cluster of consecutive CTAs (CTA rank = split). Each CTA leaves its
// rows normalised, with their lse, in its own shared memory; after a cluster barrier, CTA r merges columns
// [r 512 / c, (r + 1) 512 / c) of every row from all c CTAs' shared memory (distributed shared memory) and writes them
// out; CTA 0 writes the lse. A second barrier keeps every CTA's shared memory alive until the others have read it. The
// weights are the combine's (combine_rows_kernel): exp(lse_s - max) for the splits that saw a key, the max keeping
// NaN.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/combine/split_combine.cuh"
#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/schedule/tile_plan.h"
#include "params.h"

namespace mla::cuda {

// The portable cluster size (the sm_90a kernel's, and the longest pieces merged: tile_plan.h).
constexpr int kMaxClusterSplits = 8;

// The merge's use of a CTA's KV stages (on the sm_90a kernel: its Q and KV stages) once its last tile is done: kRowTile
// rows of kHeadDim floats (8 floats of padding per row put a warp's 8 fragment rows on different bank pairs), their
// lse, then what the CTA's own threads derive for its share: each row's split weights, which splits saw a key, 1 / sum
// of the weights.
template <int kRowTile>
struct ClusterMergeBuffer {
  static constexpr int kStride = kHeadDim + 8;
  static constexpr int kLseOffset = kRowTile * kStride * 4;
  static constexpr int kWeightOffset = kLseOffset + kRowTile * 4;
  static constexpr int kUsedOffset = kWeightOffset + kRowTile * kMaxClusterSplits * 4;
  static constexpr int kInvOffset = kUsedOffset + kRowTile * 4;
  static constexpr int kBytes = kInvOffset + kRowTile * 4;
};

// Stages one row (row_local of the CTA's block) from a thread's share of an mma accumulator, as write_row_result
// would write a partial: value pairs pair(j) / l at columns col0 + kStride j, j < kPairs, and (writes_lse) the lse.
template <int kRowTile, int kPairs, int kStride = 8, class Pair>
__device__ __forceinline__ void stage_row_for_merge(uint8_t* buffer, int row_local, float l, float row_max, int col0,
                                                    bool writes_lse, Pair pair) {
  using B = ClusterMergeBuffer<kRowTile>;
  const bool seen = !(l == 0.f);  // NaN (a non-finite used key) must reach the output
  const float inv = seen ? 1.f / l : 0.f;
  float* values = reinterpret_cast<float*>(buffer) + row_local * B::kStride + col0;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const float2 v = pair(j);
    *reinterpret_cast<float2*>(values + j * kStride) = make_float2(v.x * inv, v.y * inv);
  }
  if (writes_lse) {
    reinterpret_cast<float*>(buffer + B::kLseOffset)[row_local] =
        seen ? (row_max + log2f(l)) * 0.6931471805599453f : kNegInf;
  }
}

// One unit's 4 columns summed over the splits that saw a key (bit s of `used`), weighed by weights[s].
template <int kSplits>
__device__ __forceinline__ float4 weigh_splits(const float4 (&v)[kSplits], uint32_t used, const float* weights) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int s = 0; s < kSplits; ++s) {
    if ((used >> s) & 1u) {
      const float ws = weights[s];
      acc.x += ws * v[s].x;
      acc.y += ws * v[s].y;
      acc.z += ws * v[s].z;
      acc.w += ws * v[s].w;
    }
  }
  return acc;
}

// Called by kThreads threads of every CTA of the cluster (tid: 0 .. kThreads - 1) once all rows are staged
// (stage_row_for_merge); cta_sync() is a barrier over those threads of the CTA. The CTA's other threads, if any,
// must take part in the two cluster barriers (join_cluster_merge). kBatch: units (4 columns of a row) whose remote
// loads a thread issues together.
template <typename T, int kRowTile, int kThreads, int kSplits, int kBatch, class CtaSync>
__device__ __forceinline__ void merge_staged_rows_of(const DecodeParams& p, const CtaWork& w, uint8_t* buffer, int tid,
                                                     CtaSync cta_sync) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using B = ClusterMergeBuffer<kRowTile>;
  static_assert(kRowTile <= kThreads, "a thread per row weighs the splits");
  static_assert(kSplits <= kMaxClusterSplits && kHeadDim % (4 * kSplits) == 0, "each CTA merges whole 4-column groups");
  const uint32_t rank = cluster_cta_rank();
  const uint32_t base = smem_u32(buffer);
  float* weights = reinterpret_cast<float*>(buffer + B::kWeightOffset);
  uint32_t* used_splits = reinterpret_cast<uint32_t*>(buffer + B::kUsedOffset);
  float* inv_sums = reinterpret_cast<float*>(buffer + B::kInvOffset);
  cluster_barrier();  // every CTA's rows and lse are staged

  if (tid < kRowTile) {
    float lse[kSplits];
    float m = kNegInf;
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      lse[s] = load_cluster_f32(cluster_shared_address(base + B::kLseOffset + 4 * tid, s));
      m = max_keep_nan(m, lse[s]);
    }
    float sum = 0.f;
    uint32_t used = 0;
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      // An empty split's weight is 0 and its values are never used (selected away, not multiplied by 0).
      const bool saw_key = m != kNegInf && lse[s] != kNegInf;
      const float weight = saw_key ? expf(lse[s] - m) : 0.f;
      weights[tid * kMaxClusterSplits + s] = weight;
      used |= saw_key ? 1u << s : 0u;
      sum += weight;
    }
    used_splits[tid] = used;
    const bool seen = !(sum == 0.f);
    inv_sums[tid] = seen ? 1.f / sum : 0.f;
    const int r = w.row_begin + tid;
    if (rank == 0 && r < w.rows) p.lse[lse_row_offset(p, w.batch_index, r)] = seen ? m + logf(sum) : kNegInf;
  }
  cta_sync();  // the weights, for this CTA's threads

  // This CTA's columns of every row, 4 at a time (a unit), all splits' loads of kBatch units first, so that they are
  // in flight together.
  constexpr int quads = kHeadDim / 4 / kSplits;  // per row
  constexpr int units = kRowTile * quads;
  static_assert(kBatch == 1 || units % (kThreads * kBatch) == 0, "whole batches of units");
  const int col0 = static_cast<int>(rank) * quads * 4;
  if constexpr (kBatch == 1) {
    for (int u = tid; u < units; u += kThreads) {
      const int row_local = u / quads;
      const int col = col0 + 4 * (u - row_local * quads);
      const int r = w.row_begin + row_local;
      if (r >= w.rows) continue;
      const uint32_t addr = base + (row_local * B::kStride + col) * 4;
      float4 v[kSplits];
#pragma unroll
      for (int s = 0; s < kSplits; ++s) v[s] = load_cluster_f32x4(cluster_shared_address(addr, s));
      const float4 acc = weigh_splits(v, used_splits[row_local], weights + row_local * kMaxClusterSplits);
      const float inv = inv_sums[row_local];
      store4<T>(static_cast<T*>(p.out) + out_row_offset(p, w.batch_index, r) + col, acc.x * inv, acc.y * inv,
                acc.z * inv, acc.w * inv);
    }
  } else {
    for (int u0 = tid; u0 < units; u0 += kThreads * kBatch) {
      float4 v[kBatch][kSplits];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int row_local = (u0 + b * kThreads) / quads;
        const int col = col0 + 4 * (u0 + b * kThreads - row_local * quads);
        if (w.row_begin + row_local >= w.rows) continue;
        const uint32_t addr = base + (row_local * B::kStride + col) * 4;
#pragma unroll
        for (int s = 0; s < kSplits; ++s) v[b][s] = load_cluster_f32x4(cluster_shared_address(addr, s));
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int row_local = (u0 + b * kThreads) / quads;
        const int col = col0 + 4 * (u0 + b * kThreads - row_local * quads);
        const int r = w.row_begin + row_local;
        if (r >= w.rows) continue;
        const float4 acc = weigh_splits(v[b], used_splits[row_local], weights + row_local * kMaxClusterSplits);
        const float inv = inv_sums[row_local];
        store4<T>(static_cast<T*>(p.out) + out_row_offset(p, w.batch_index, r) + col, acc.x * inv, acc.y * inv,
                  acc.z * inv, acc.w * inv);
      }
    }
  }
  cluster_barrier();  // the other CTAs have read this one's shared memory
#else
  __trap();  // the launcher merges in clusters on sm_90+ only
#endif
}

// What a CTA's threads that hold no rows do while the others merge: the merge's two cluster barriers.
__device__ __forceinline__ void join_cluster_merge() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cluster_barrier();
  cluster_barrier();
#else
  __trap();
#endif
}

// The few-row kernels: the launcher puts a fixed split's num_splits (2, 4 or 8) pieces in each cluster, and all of
// the CTA's threads merge.
template <typename T, int kRowTile, int kThreads>
__device__ __forceinline__ void merge_staged_rows(const DecodeParams& p, const CtaWork& w, uint8_t* buffer) {
  const int tid = static_cast<int>(threadIdx.x);
  const auto sync = [] { cta_barrier_all_threads(); };
  switch (p.num_splits) {
    case 2: merge_staged_rows_of<T, kRowTile, kThreads, 2, 1>(p, w, buffer, tid, sync); break;
    case 4: merge_staged_rows_of<T, kRowTile, kThreads, 4, 1>(p, w, buffer, tid, sync); break;
    default: merge_staged_rows_of<T, kRowTile, kThreads, kMaxClusterSplits, 1>(p, w, buffer, tid, sync); break;
  }
}

}  // namespace mla::cuda
