// The planner kernel of balanced work items: one CTA per call runs the batch's plan (balanced_items.cuh) once and
// writes every item's entry and every sequence's split_table row, so the main kernel's CTAs each read one entry
// instead of each repeating the plan's passes over seq_lens (perf-log v14). Its threads share the batch, one
// sequence each up to 512 sequences (a warp up to 32; perf-log v26, v27).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common/device_primitives.cuh"
#include "cuda/schedule/balanced_items.cuh"
#include "cuda/schedule/plan_groups.cuh"
#include "cuda/schedule/split_table.cuh"
#include "params.h"

namespace mla::cuda {

constexpr int kPlannerMaxThreads = 512;

// Items are numbered as the plan orders them: the pieces of the multi-split sequences first, sequence by sequence,
// then the one-piece sequences; items past the plan's (up to W = num_splits, one CTA each) are spares. With
// item_pairs_in_cluster the sequences of exactly two pieces come first, so each takes an aligned pair of items (one
// cluster, which merges them: their split_table row says one piece, and the combine leaves them alone). The launcher
// pairs only batches the group covers in one round, so that round's pair total places the other long sequences.
template <class Group>
__device__ __forceinline__ void plan_work_items(const DecodeParams& p, const Group& g) {
  const BatchPlan plan = balanced_plan(p, g);
  const bool pairs = p.item_pairs_in_cluster;
  int4* items = reinterpret_cast<int4*>(p.item_table);
  int long_before = 0, single_before = plan.long_items;
  for (int b0 = 0; b0 < p.batch; b0 += g.size()) {
    const int b = b0 + g.rank();
    SequenceSplits s{0, 0};
    if (b < p.batch) s = splits_of(p, plan.chunk, clamped_seq_len(p, b));
    const bool paired = pairs && s.count == 2;
    const int own_long = s.count > 1 && !paired ? s.count : 0;
    const int own_single = s.count == 1 ? 1 : 0;
    int2 total;
    const int2 upto = g.inclusive_sum(make_int2(own_long, own_single), total);
    int2 pair_total = make_int2(0, 0), pair_upto = make_int2(0, 0);
    if (pairs) pair_upto = g.inclusive_sum(make_int2(paired ? 2 : 0, 0), pair_total);
    if (b < p.batch) {
      const int first = paired         ? pair_upto.x - 2
                        : own_long > 0 ? pair_total.x + long_before + upto.x - own_long
                                       : single_before + upto.y - 1;
      record_sequence_pieces(p, b, first, paired ? 1 : s.count);
      const int4 entry = make_int4(b, first, s.count, s.length);
      // One thread stores a sequence's entries, up to ~100 for a small batch's long sequence: a loop of known trip
      // count, which the compiler unrolls (left rolled, it cost 1.4 us of planner at two sequences of 64 pieces,
      // perf-log v27).
      const int end = min(first + s.count, p.num_splits);
      for (int i = first; i < end; ++i) items[i] = entry;
    }
    long_before += total.x;
    single_before += total.y;
  }
  // A spare item has no keys: its CTA writes -inf into its own partial slot, which no one reads.
  for (int i = single_before + g.rank(); i < p.num_splits; i += g.size()) items[i] = make_int4(-1, 0, 1, 0);
}

// Static: every translation unit that launches them compiles its own copy. A batch of up to 32 sequences takes the
// warp kernel, which needs no shared memory or barriers.
static __global__ void __launch_bounds__(32) plan_work_items_warp_kernel(const __grid_constant__ DecodeParams p) {
  wait_for_previous_grid();  // seq_lens may come from the kernel just before
  allow_next_grid_launch();  // the main kernel may start its CTAs; they wait for this grid before reading the table
  plan_work_items(p, WarpGroup{});
}
static __global__ void __launch_bounds__(kPlannerMaxThreads)
    plan_work_items_block_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ int64_t slots[32][2];
  wait_for_previous_grid();
  allow_next_grid_launch();
  plan_work_items(p, BlockGroup{slots});
}

// Launches the planner ahead of a main kernel that takes balanced work items from item_table; nothing where the call
// has no item table or its table came laid out by mla.plan (item_table_planned). With `overlap` (programmatic
// dependent launch, sm_90+) it starts while the previous kernel drains.
inline void launch_work_item_plan(const DecodeParams& p, cudaStream_t stream, bool overlap) {
  if (p.item_table == nullptr || p.item_table_planned) return;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  // whole warps, one thread per sequence up to the limit
  const int64_t threads = std::min<int64_t>(kPlannerMaxThreads, (static_cast<int64_t>(p.batch) + 31) / 32 * 32);
  config.gridDim = dim3(1);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.stream = stream;
  config.attrs = overlap ? &attribute : nullptr;
  config.numAttrs = overlap ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(
      &config, config.blockDim.x == 32 ? plan_work_items_warp_kernel : plan_work_items_block_kernel, p);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("mla decode work-item planner launch: ") + cudaGetErrorString(err));
  }
}

}  // namespace mla::cuda
