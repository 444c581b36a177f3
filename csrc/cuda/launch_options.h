// Launch options read once from the environment, for A/B measurements. Plain C++ (no CUDA headers needed).
#pragma once

#include <cstdlib>
#include <cstring>

namespace mla::cuda {

// Programmatic dependent launch between the decode kernels on sm_90+ (on by default); MLA_EXT_PDL=0 turns it off.
inline bool programmatic_launch_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("MLA_EXT_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

}  // namespace mla::cuda
