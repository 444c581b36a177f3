// The shape rule for programmatic dependent launch. Plain C++ (no CUDA headers needed).
#pragma once

#include <cstdint>

#include "params.h"

namespace mla::cuda {

// Programmatic dependent launch saves about one launch gap (~1 us) per kernel boundary, but made long calls of
// large batches up to a few percent slower on the H200 (perf-log v10). It is used where the gap weighs: batches
// of up to kOverlapMaxBatch sequences (the serving case whatever the block table's width) and calls that read at
// most kOverlapMaxKeys cache rows. Shapes only, so a CUDA graph replays the same choice.
constexpr int kOverlapMaxBatch = 16;
constexpr int64_t kOverlapMaxKeys = int64_t{64} * 1024;

inline bool use_programmatic_launch(const DecodeParams& p) {
  return p.batch <= kOverlapMaxBatch || static_cast<int64_t>(p.batch) * p.capacity <= kOverlapMaxKeys;
}

}  // namespace mla::cuda
