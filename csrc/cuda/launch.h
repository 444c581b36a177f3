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

// Default kv_len_per_split from shapes and the SM count only (no seq_lens: CUDA-graph safe).
// rows_per_seq = S_q * H; capacity = keys a sequence can hold; sm90: plan for the sm_90a kernel where it takes the
// call's row count (tile_plan.h). Returns a positive multiple of 16.
int default_kv_len_per_split(int batch, int rows_per_seq, int capacity, int num_sms, DType dtype, bool sm90);

// Balanced splits for a call with seq_lens (see DecodeParams): `target` ranges or work items, about one wave of
// CTAs of the kernel that will run; `seq_cost` is one sequence's set-up in keys for the range plan of the few-row
// kernels, 0 for the work-item plan of the many-row ones; split_cost weighs the combine traffic of one more cut
// (it grows with the rows).
struct BalancedSplit {
  int target;
  float split_cost;
  int seq_cost;
  int align;  // cuts fall on multiples of it: the key tile of the kernels that walk the plan (32 or 64 keys)
};
BalancedSplit balanced_split_for(int batch, int rows_per_seq, int num_sms, DType dtype, bool sm90);

}  // namespace mla::cuda
