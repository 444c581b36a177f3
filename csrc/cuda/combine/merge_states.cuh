// merge_states: two partial attentions over disjoint key sets -> out, lse, weighted by exp(lse_part - max) as the
// split combine weighs its pieces; a side whose lse is -inf is never read, and both -inf give out 0, lse -inf.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/combine/split_combine.cuh"
#include "cuda/common/device_primitives.cuh"
#include "params.h"

namespace mla::cuda {

// One warp per row; lanes stride over the row's columns.
template <typename T>
__global__ void __launch_bounds__(128) merge_states_kernel(const __grid_constant__ MergeStatesParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const int lane = threadIdx.x & 31;
  const float lse_a = p.lse_a[row];
  const float lse_b = p.lse_b[row];
  const float m = max_keep_nan(lse_a, lse_b);  // a NaN side makes the row NaN (weights and sum below)
  const bool any = m != kNegInf;
  const float wa = (any && lse_a != kNegInf) ? expf(lse_a - m) : 0.f;
  const float wb = (any && lse_b != kNegInf) ? expf(lse_b - m) : 0.f;
  const float inv = any ? 1.f / (wa + wb) : 0.f;
  const T* a = static_cast<const T*>(p.out_a) + row * p.dim;
  const T* b = static_cast<const T*>(p.out_b) + row * p.dim;
  T* out = static_cast<T*>(p.out) + row * p.dim;
  for (int c = lane; c < p.dim; c += 32) {
    float v = 0.f;
    if (wa > 0.f) v += wa * to_float(a[c]);
    if (wb > 0.f) v += wb * to_float(b[c]);
    out[c] = from_float<T>(v * inv);
  }
  if (lane == 0) p.lse[row] = any ? m + logf(wa + wb) : kNegInf;
}

}  // namespace mla::cuda
