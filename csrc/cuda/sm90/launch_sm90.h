// Torch-free entry points of the Hopper (sm_90a) decode kernel, defined in launch_sm90.cuh and instantiated for
// fp16 and bf16 in instantiations/sm90_*.cu. The kernel choice (launch_decode.cuh) asks whether it takes a call; the
// launcher then runs it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/launch/device_info.h"
#include "cuda/schedule/tile_plan.h"
#include "params.h"
#include "switches.h"

namespace mla::cuda {

// What launch_decode_sm90 did: nothing (launched false: the caller runs the portable kernel), or the main kernel,
// which merged a fixed split of two pieces in thread-block clusters (merged_in_cluster: no combine kernel needed) or
// ran a call's work items in clusters of two (item_pairs: the combine takes the sequences not merged there).
struct Sm90Launch {
  bool launched = false;
  bool merged_in_cluster = false;
  bool item_pairs = false;
};

// Launches the sm_90a main kernel (not the split combine) for a call it takes (sm90_takes_call); launched is false
// only where the driver refuses the caches' tensor maps or the grid is too large. kFp8Cache: a float8_e4m3fn cache
// stored per tensor (instantiations/sm90_fp8_*.cu), whose tiles the kernel converts; never in clusters.
template <DType dtype, bool kFp8Cache = false>
Sm90Launch launch_decode_sm90(const DecodeParams& params, cudaStream_t stream, const DeviceInfo& device);

// Whether launch_decode_sm90 runs this call's balanced work items in clusters of two, which the planner kernel then
// pairs (see pair_items_in_cluster); false also where it would not launch (the many-row kernel, which pairs nothing,
// runs the call instead) and on an fp8 cache (never in clusters).
template <DType dtype>
bool sm90_pairs_items(const DecodeParams& params, const DeviceInfo& device);

// Whether this build holds the kernel's sm_90a code for `device` and the driver can describe caches to the copy
// engine (once per device).
template <DType dtype, bool kFp8Cache = false>
bool sm90_kernel_ready(int device);

// The shapes and layouts the kernel takes: S_q * H > 16 rows, dense caches or pages of a multiple of 64 keys, a
// caller's split on 64-key boundaries (the planners cut on them), 16-byte aligned cache pointers and strides (an
// fp8 cache's strides count bytes).
inline bool sm90_takes_layout(const DecodeParams& p) {
  const auto aligned16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; };
  const int64_t element_bytes = p.cache_format == CacheFormat::kNative ? 2 : 1;
  const auto rows_aligned = [&](int64_t stride) { return stride > 0 && (stride * element_bytes) % 16 == 0; };
  return sm90_takes_rows(static_cast<int64_t>(p.seqlen_q) * p.num_heads) &&
         !(p.num_splits > 1 && p.kv_len_per_split % kSm90KeyTile != 0) &&
         !(p.block_table != nullptr && p.page_size % kSm90KeyTile != 0) &&  // a tile in one page
         aligned16(p.kv) && aligned16(p.k_pe) && rows_aligned(p.kv_row_stride) && rows_aligned(p.k_pe_row_stride) &&
         rows_aligned(p.kv_page_stride) && rows_aligned(p.k_pe_page_stride);
}

// Whether a device of compute capability major.x runs this kernel where it takes a call: sm_90 devices unless
// MLA_EXT_DISABLE_SM90 is set. The kernel choice goes by it, and so does the choice of the portable kernels'
// configurations: with it set, Hopper runs their A100 configurations (clusters and programmatic dependent launch stay
// on).
inline bool sm90_kernel_enabled(int major) {
  return major == 9 && !sm90_disabled();
}

}  // namespace mla::cuda
