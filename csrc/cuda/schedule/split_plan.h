// The split planners of the CUDA decode (split_plan.cpp): how many keys each CTA takes, from shapes alone or, for
// calls with seq_lens, as a plan the device completes from the lengths. Plain C++ (no CUDA or torch headers), so the
// planning rules are tested on any machine (tests/cpp/split_plan_test.cpp).
#pragma once

#include "cuda/launch/kernel_choice.h"
#include "params.h"

namespace mla::cuda {

// Default kv_len_per_split from shapes and the SM count only (no seq_lens: CUDA-graph safe).
// rows_per_seq = S_q * H; capacity = keys a sequence can hold; kernel: the main kernel that will run the call
// (kernel_choice.h). Returns a positive multiple of 16.
int default_kv_len_per_split(int batch, int rows_per_seq, int capacity, int num_sms, DType dtype,
                             const KernelChoice& kernel);

// Balanced splits for a call with seq_lens (see DecodeParams): `target` ranges or work items, about one wave of
// CTAs of the kernel that will run (one sequence of work items: at most the pieces its capacity allows); `seq_cost`
// is one sequence's set-up in keys for the range plan of the few-row kernels, 0 for the work-item plan of the
// many-row ones; split_cost weighs the combine traffic of one more cut (it grows with the rows).
struct BalancedSplit {
  int target;
  float split_cost;
  int seq_cost;
  int align;  // cuts fall on multiples of it: the key tile of the kernels that walk the plan (32 or 64 keys)
};
BalancedSplit balanced_split_for(int batch, int rows_per_seq, int capacity, int num_sms, DType dtype,
                                 const KernelChoice& kernel);

}  // namespace mla::cuda
