// The keys a sequence has, as every kernel sees them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "params.h"

namespace mla::cuda {

// Keys of sequence b after clamping seq_lens to [0, capacity] (what the kernels attend to).
__device__ __forceinline__ int clamped_seq_len(const DecodeParams& p, int b) {
  int len = p.capacity;
  if (p.seq_lens != nullptr) len = p.seq_lens[static_cast<int64_t>(b) * p.seq_lens_stride];
  return min(max(len, 0), p.capacity);
}

}  // namespace mla::cuda
