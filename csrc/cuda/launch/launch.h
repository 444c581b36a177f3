// Torch-free entry points of the CUDA kernels. Each is explicitly instantiated once per dtype in
// instantiations/{fp16,bf16,fp32}.cu (fp8 caches: fp8_{fp16,bf16}.cu); the CUDA backend (ops_cuda.cpp) calls them.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/launch/device_info.h"
#include "cuda/launch/kernel_choice.h"
#include "params.h"

namespace mla::cuda {

// The main kernel for a checked call on `device`, from its shapes, layout, dtype and a caller's split (set in params
// when given; else the split is still to be planned, for this kernel). Throws where no kernel fits the device.
template <DType dtype>
KernelChoice choose_kernel(const DecodeParams& params, const DeviceInfo& device);

// Runs the chosen main kernel and, when the split has several pieces, the split-combine kernel, on `stream`, with the
// device facts the choice was made from. Writes params.out and params.lse for every row, including rows that see no
// key (out 0, lse -inf).
template <DType dtype>
void launch_decode(const DecodeParams& params, const KernelChoice& kernel, const DeviceInfo& device,
                   cudaStream_t stream);

// The same for a float8_e4m3fn cache (params.cache_format; fp16/bf16 queries), defined in launch_fp8_cache.cuh and
// instantiated in instantiations/fp8_*.cu: the few- and mid-row fp8 kernel (blocks of 32 rows over 16 rows per
// sequence). Throws for a device whose shared memory holds none of its configurations.
template <DType dtype>
KernelChoice choose_fp8_cache_kernel(const DecodeParams& params, const DeviceInfo& device);
template <DType dtype>
void launch_decode_fp8_cache(const DecodeParams& params, const KernelChoice& kernel, const DeviceInfo& device,
                             cudaStream_t stream);

// Lays out a call's balanced work items ahead of its main kernel (the planner kernel: item_table and split_table,
// bound in params; workspace.h planned_table_entries > 0), as launch_decode would for the chosen kernel. A later
// launch_decode with params.item_table_planned walks these tables instead of planning again.
template <DType dtype>
void launch_plan(const DecodeParams& params, const KernelChoice& kernel, const DeviceInfo& device, cudaStream_t stream);

// out = exp(lse_a - m) * out_a + exp(lse_b - m) * out_b normalised; both -inf gives out 0, lse -inf.
template <DType dtype>
void launch_merge_states(const MergeStatesParams& params, cudaStream_t stream);

}  // namespace mla::cuda
