// Process-wide counts of decode kernel launches per path, so tests can tell which kernel ran (read through the
// private op torch.ops.mla._kernel_launch_counts). Plain C++: the launchers (.cu) and the op library (.cpp)
// share one instance through the inline variable.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace mla::cuda {

// Index into the counts; append new paths at the end (tests index by position).
enum class KernelPath : int {
  kPortable = 0,        // the portable main kernels (mma.sync for fp16/bf16; fp32 on the CUDA cores)
  kSm90 = 1,            // the Hopper wgmma + TMA main kernel
  kFp32TensorCore = 2,  // fp32 as 3xTF32 on the tensor cores
  kClusterMerge = 3,    // (besides kPortable or kSm90) a fixed split merged in thread-block clusters
  kItemPairs = 4,       // (besides kSm90) work items run in clusters of two, a two-piece sequence's merged there
  kHopperConfig = 5,    // (besides kPortable or kFp32TensorCore) a configuration that needs Hopper's shared memory
  kCount = 6,
};

inline std::atomic<int64_t> kernel_launch_counters[static_cast<int>(KernelPath::kCount)] = {};

inline void count_launch(KernelPath path) {
  kernel_launch_counters[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed);
}

inline std::vector<int64_t> kernel_launch_counts() {
  std::vector<int64_t> counts;
  for (const auto& counter : kernel_launch_counters) counts.push_back(counter.load(std::memory_order_relaxed));
  return counts;
}

}  // namespace mla::cuda
