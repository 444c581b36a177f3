// Torch-free entry points of the CUDA kernels. Each is explicitly instantiated once per dtype in
// instantiations/{fp16,bf16,fp32}.cu; the torch-facing launcher (decode_cuda.cpp) calls them.
#pragma once

#include <cuda_runtime_api.h>

#include "../params.h"

namespace mla::cuda {

// Runs the split-KV main kernel and, when params.num_splits > 1, the split-combine kernel, on `stream`.
// Writes params.out and params.lse for every row, including rows that see no key (out 0, lse -inf).
template <DType dtype>
void launch_decode(const DecodeParams& params, cudaStream_t stream);

// out = exp(lse_a - m) * out_a + exp(lse_b - m) * out_b normalised; both -inf gives out 0, lse -inf.
template <DType dtype>
void launch_merge_states(const MergeStatesParams& params, cudaStream_t stream);

}  // namespace mla::cuda
