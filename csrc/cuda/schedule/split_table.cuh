// split_table (balanced calls): row b holds sequence b's first partial slot and its piece count. The CTA of piece 0
// or the planner kernel writes it; the combine reads it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "params.h"

namespace mla::cuda {

__device__ __forceinline__ void record_sequence_pieces(const DecodeParams& p, int b, int first_slot, int pieces) {
  p.split_table[2 * static_cast<int64_t>(b)] = first_slot;
  p.split_table[2 * static_cast<int64_t>(b) + 1] = pieces;
}

__device__ __forceinline__ int sequence_first_slot(const DecodeParams& p, int b) {
  return p.split_table[2 * static_cast<int64_t>(b)];
}

__device__ __forceinline__ int sequence_pieces(const DecodeParams& p, int b) {
  return p.split_table[2 * static_cast<int64_t>(b) + 1];
}

}  // namespace mla::cuda
