// Launch options: switches read once from the environment (for A/B measurements) and the shape rule for
// programmatic dependent launch. Plain C++ (no CUDA headers needed).
#pragma once

#include <cstdint>

#include "../env_switch.h"
#include "../params.h"

namespace mla::cuda {

// Programmatic dependent launch between the decode kernels on sm_90+ (on by default); MLA_EXT_PDL=0 turns it off.
inline bool programmatic_launch_enabled() {
  static const bool enabled = env_switch("MLA_EXT_PDL", true);
  return enabled;
}

// fp32 runs on the tensor cores as 3xTF32 (decode_kernel_tf32.cuh); MLA_EXT_FP32_CUDA_CORES=1 runs it on the CUDA
// cores in plain fp32 instead (decode_kernel_simt.cuh, also the kernel of devices with 99 KB of shared memory).
inline bool fp32_on_cuda_cores() {
  static const bool on = env_switch("MLA_EXT_FP32_CUDA_CORES", false);
  return on;
}

// A call with seq_lens on the sm_90a kernel runs its work items in clusters of two, merging each sequence of two
// pieces there (launch_sm90.cuh; on by default); MLA_EXT_ITEM_PAIRS=0 launches them unclustered, all partials
// merged by the combine.
inline bool item_pairs_enabled() {
  static const bool enabled = env_switch("MLA_EXT_ITEM_PAIRS", true);
  return enabled;
}

// Programmatic dependent launch saves about one launch gap (~1 us) per kernel boundary, but made long calls of
// large batches up to a few percent slower on the H200 (perf-notes v10). It is used where the gap weighs: batches
// of up to kOverlapMaxBatch sequences (the serving case whatever the block table's width) and calls that read at
// most kOverlapMaxKeys cache rows. Shapes only, so a CUDA graph replays the same choice.
constexpr int kOverlapMaxBatch = 16;
constexpr int64_t kOverlapMaxKeys = int64_t{64} * 1024;

inline bool use_programmatic_launch(const DecodeParams& p) {
  const bool small = p.batch <= kOverlapMaxBatch || static_cast<int64_t>(p.batch) * p.capacity <= kOverlapMaxKeys;
  return small && programmatic_launch_enabled();
}

}  // namespace mla::cuda
