// The environment switches, all of them, each read once per process (a function-local static), so every call and
// every replay of a captured CUDA graph see the same choice. Plain C++, no torch or CUDA headers.
//   MLA_EXT_STRICT=1           strict value checking from import on (mla_ext.set_strict changes it later)
//   MLA_EXT_DISABLE_SM90=1     Hopper runs the portable kernels in the configurations an A100 runs (tests use it)
//   MLA_EXT_FP32_CUDA_CORES=1  fp32 on the CUDA cores in plain fp32 instead of 3xTF32 on the tensor cores
#pragma once

#include <cstdlib>
#include <cstring>

namespace mla {

// The switch `name`: unset or empty gives `fallback`, "0" false, any other value true.
inline bool env_switch(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return fallback;
  return std::strcmp(value, "0") != 0;
}

// Strict mode's value at load time.
inline bool strict_from_environment() {
  static const bool on = env_switch("MLA_EXT_STRICT", false);
  return on;
}

// The sm_90a kernel and the Hopper-only configurations of the portable kernels are off.
inline bool sm90_disabled() {
  static const bool on = env_switch("MLA_EXT_DISABLE_SM90", false);
  return on;
}

// fp32 runs on the CUDA cores (kernels/fp32_simt.cuh, also the kernel of devices with 99 KB of shared memory).
inline bool fp32_on_cuda_cores() {
  static const bool on = env_switch("MLA_EXT_FP32_CUDA_CORES", false);
  return on;
}

}  // namespace mla
