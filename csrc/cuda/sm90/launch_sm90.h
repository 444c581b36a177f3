// Torch-free entry point of the Hopper (sm_90a) decode kernel, defined in launch_sm90.cuh and instantiated for
// fp16 and bf16 in instantiations/. The portable launcher (launch_decode.cuh) tries it first on sm_90 devices.
#pragma once

#include <cuda_runtime_api.h>

#include "../../env_switch.h"
#include "../../params.h"

namespace mla::cuda {

// Launches the sm_90a main kernel (not the split combine) when it supports the problem and this build holds its
// sm_90a code; returns false without launching otherwise (the caller then runs the portable kernel). Supported:
// S_q * H > 16 rows, dense caches or pages of a multiple of 64 keys, splits that start on 64-key boundaries,
// 16-byte aligned cache pointers and strides. Env MLA_EXT_DISABLE_SM90=1 (read once) turns it off.
template <DType dtype>
bool launch_decode_sm90(const DecodeParams& params, cudaStream_t stream, int device);

// MLA_EXT_DISABLE_SM90 (read once): the launcher and the split planners then leave this kernel out.
inline bool sm90_disabled_by_env() {
  static const bool disabled = env_switch("MLA_EXT_DISABLE_SM90", false);
  return disabled;
}

}  // namespace mla::cuda
