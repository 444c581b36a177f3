// Whether a grid launched in thread-block clusters keeps as many CTAs resident at once as it would without them.
// Host code shared by the launchers of the kernels that merge in clusters.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/launch/device_info.h"

namespace mla::cuda::detail {

// Whether clusters of `cluster` CTAs of kKernel keep as many CTAs resident as the grid would have without them (a
// lone grid must stay one wave): the CTAs of a cluster share a GPC, which may leave some of its SMs without one (on
// the H200, 15 clusters of 8 lone CTAs fit, not 16, and 62 of 4 CTAs two per SM, not 64: perf-log v45). Asked
// once per (kernel, device, cluster size).
template <class Cfg, auto kKernel>
bool clusters_keep_residency(int cluster, int64_t ctas, const DeviceInfo& d) {
  static std::atomic<int> resident_clusters[3][kMaxDevices] = {};  // clusters of 2, 4, 8 CTAs
  static std::atomic<int> resident_per_sm[kMaxDevices] = {};       // CTAs per SM without clusters
  const int size_index = cluster == 2 ? 0 : cluster == 4 ? 1 : 2;
  const int clusters = remembered_for_device(resident_clusters[size_index], d.device, [cluster] {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster));
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(Cfg::kSmemBytes);
    config.attrs = &attribute;
    config.numAttrs = 1;
    int count = 0;
    throw_on_error(cudaOccupancyMaxActiveClusters(&count, kKernel, &config), "cudaOccupancyMaxActiveClusters");
    return count;
  });
  const int per_sm = remembered_for_device(resident_per_sm, d.device, [] {
    int count = 0;
    throw_on_error(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, kKernel, Cfg::kThreads, Cfg::kSmemBytes),
                   "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return count;
  });
  const int64_t needed = std::min<int64_t>(ctas, static_cast<int64_t>(per_sm) * d.sm_count);
  return static_cast<int64_t>(clusters) * cluster >= needed;
}

}  // namespace mla::cuda::detail
