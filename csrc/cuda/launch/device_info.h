// Facts about the current CUDA device that the launchers and the split planner need, read once per device.
// Torch-free host code: included by the launchers (nvcc) and by the torch-facing op (host compiler).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <stdexcept>
#include <string>

namespace mla::cuda {

inline void throw_on_error(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

struct DeviceInfo {
  int device;
  int major;  // compute capability major.minor
  int minor;
  int smem_optin;  // largest dynamic shared memory a block may opt into
  int sm_count;
};

constexpr int kMaxDevices = 64;  // devices whose facts are remembered; others are asked again on every call

// A non-negative fact about `device` (whether a kernel can run there, an occupancy count), computed by compute() on
// first use and remembered in state (the fact + 1; 0 while unknown). A compute() that throws leaves it unknown.
template <class Compute>
int remembered_for_device(std::atomic<int> (&state)[kMaxDevices], int device, Compute compute) {
  if (device < 0 || device >= kMaxDevices) return compute();
  const int known = state[device].load(std::memory_order_relaxed);
  if (known != 0) return known - 1;
  const int fact = compute();
  state[device].store(fact + 1, std::memory_order_relaxed);
  return fact;
}

// Read once per device: attribute queries are cheap but not free, and this runs on every call.
inline DeviceInfo current_device_info() {
  static std::atomic<int> cached[kMaxDevices][4] = {};
  int device = 0;
  throw_on_error(cudaGetDevice(&device), "cudaGetDevice");
  DeviceInfo info{device, 0, 0, 0, 0};
  if (device < kMaxDevices) {
    info.major = cached[device][0].load(std::memory_order_acquire);
    info.minor = cached[device][1].load(std::memory_order_relaxed);
    info.smem_optin = cached[device][2].load(std::memory_order_relaxed);
    info.sm_count = cached[device][3].load(std::memory_order_relaxed);
  }
  if (info.major == 0) {
    throw_on_error(cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device),
                   "cudaDeviceGetAttribute(compute capability)");
    throw_on_error(cudaDeviceGetAttribute(&info.minor, cudaDevAttrComputeCapabilityMinor, device),
                   "cudaDeviceGetAttribute(compute capability minor)");
    throw_on_error(cudaDeviceGetAttribute(&info.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                   "cudaDeviceGetAttribute(max shared memory per block)");
    throw_on_error(cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device),
                   "cudaDeviceGetAttribute(multiprocessor count)");
    if (device < kMaxDevices) {  // major last, released: a reader that sees it non-zero sees the others too
      cached[device][3].store(info.sm_count, std::memory_order_relaxed);
      cached[device][2].store(info.smem_optin, std::memory_order_relaxed);
      cached[device][1].store(info.minor, std::memory_order_relaxed);
      cached[device][0].store(info.major, std::memory_order_release);
    }
  }
  return info;
}

}  // namespace mla::cuda
