// The planner kernel of balanced work items: one warp per call runs the batch's plan (balanced_items.cuh) once and
// writes every item's entry and every sequence's split_table row, so the main kernel's CTAs each read one entry
// instead of each repeating the plan's passes over seq_lens (perf-notes v14).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../params.h"
#include "balanced_items.cuh"
#include "device_primitives.cuh"
#include "split_table.cuh"

namespace mla::cuda {

// Items are numbered as the plan orders them: the pieces of the multi-split sequences first, sequence by sequence,
// then the one-piece sequences; items past the plan's (up to W = num_splits, one CTA each) are spares. Static: every
// translation unit that launches it compiles its own copy.
static __global__ void __launch_bounds__(32) plan_work_items_kernel(const __grid_constant__ DecodeParams p) {
  wait_for_previous_grid();  // seq_lens may come from the kernel just before
  allow_next_grid_launch();  // the main kernel may start its CTAs; they wait for this grid before reading the table
  const int lane = threadIdx.x;
  const BatchPlan plan = balanced_plan(p);
  int4* items = reinterpret_cast<int4*>(p.item_table);
  int long_before = 0, single_before = plan.long_items;
  for (int b0 = 0; b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    SequenceSplits s{0, 0};
    if (b < p.batch) s = splits_of(p, plan.chunk, clamped_seq_len(p, b));
    const int own_long = s.count > 1 ? s.count : 0;
    const int own_single = s.count == 1 ? 1 : 0;
    const int long_sum = warp_inclusive_sum(own_long);
    const int single_sum = warp_inclusive_sum(own_single);
    if (b < p.batch) {
      const int first = own_long > 0 ? long_before + long_sum - own_long : single_before + single_sum - 1;
      record_sequence_pieces(p, b, first, s.count);
      const int4 entry = make_int4(b, first, s.count, s.length);
      for (int k = 0; k < s.count && first + k < p.num_splits; ++k) items[first + k] = entry;
    }
    long_before += __shfl_sync(0xffffffffu, long_sum, 31);
    single_before += __shfl_sync(0xffffffffu, single_sum, 31);
  }
  // A spare item has no keys: its CTA writes -inf into its own partial slot, which no one reads.
  for (int i = single_before + lane; i < p.num_splits; i += 32) items[i] = make_int4(-1, 0, 1, 0);
}

// Launches the planner ahead of a many-row main kernel that takes balanced work items from item_table. With `overlap`
// (programmatic dependent launch, sm_90+) it starts while the previous kernel drains.
inline void launch_work_item_plan(const DecodeParams& p, cudaStream_t stream, bool overlap) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = stream;
  config.attrs = overlap ? &attribute : nullptr;
  config.numAttrs = overlap ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, plan_work_items_kernel, p);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("mla decode work-item planner launch: ") + cudaGetErrorString(err));
  }
}

}  // namespace mla::cuda
