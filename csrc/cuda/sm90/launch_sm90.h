// Torch-free entry point of the Hopper (sm_90a) decode kernel, defined in launch_sm90.cuh and instantiated for
// fp16 and bf16 in instantiations/. The portable launcher (launch_decode.cuh) tries it first on sm_90 devices.
#pragma once

#include <cuda_runtime_api.h>

#include "../../env_switch.h"
#include "../../params.h"
#include "../device_info.h"

namespace mla::cuda {

// What launch_decode_sm90 did: nothing (launched false: the caller runs the portable kernel), or the main kernel,
// which merged a fixed split of two pieces in thread-block clusters (merged_in_cluster: no combine kernel needed) or
// ran a call's work items in clusters of two (item_pairs: the combine takes the sequences not merged there).
struct Sm90Launch {
  bool launched = false;
  bool merged_in_cluster = false;
  bool item_pairs = false;
};

// Launches the sm_90a main kernel (not the split combine) when it supports the problem and this build holds its
// sm_90a code. Supported: S_q * H > 16 rows, dense caches or pages of a multiple of 64 keys, splits that start on
// 64-key boundaries, 16-byte aligned cache pointers and strides. Callers ask sm90_kernel_enabled first.
template <DType dtype>
Sm90Launch launch_decode_sm90(const DecodeParams& params, cudaStream_t stream, const DeviceInfo& device);

// Whether a device of compute capability major.x runs this kernel where it supports a call: sm_90 devices unless
// MLA_EXT_DISABLE_SM90 is set (read once). The launcher and the split planners both go by it, and so does the choice
// of the portable kernels' configurations: with it set, Hopper runs their A100 configurations (clusters and
// programmatic dependent launch stay on).
inline bool sm90_kernel_enabled(int major) {
  static const bool disabled = env_switch("MLA_EXT_DISABLE_SM90", false);
  return major == 9 && !disabled;
}

}  // namespace mla::cuda
