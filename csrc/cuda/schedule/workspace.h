// The CUDA decode's split layout and its workspace: balanced splits bound into DecodeParams, and the int32 tables
// they need (split_table, item_table), which the CUDA backend allocates. The fp32 partials are sized in params.h
// (partial_rows), as the CPU kernel uses them too. Plain C++ (no CUDA or torch headers).
#pragma once

#include <cstdint>

#include "cuda/schedule/split_plan.h"
#include "params.h"

namespace mla::cuda {

// Binds a balanced split planned on device from seq_lens (see DecodeParams): `split.target` ranges (seq_cost > 0) or
// work items (seq_cost == 0).
void set_balanced_split(DecodeParams& params, const BalancedSplit& split);
// Balanced work items for several sequences come from a planner kernel (DecodeParams::item_table); a batch of one
// sequence is planned in the main kernel's CTAs, where the planner's launch would cost more than the plan.
bool items_planned_by_kernel(const DecodeParams& params);
// int32 entries of the balanced-split tables, 0 for fixed splits: split_table (2 per sequence) and, when the planner
// kernel runs, the item table (4 per item) from work_item_table_offset on.
int64_t split_table_entries(const DecodeParams& params);
int64_t work_item_table_offset(const DecodeParams& params);
// The entries mla.plan lays out ahead for a call: the tables the planner kernel writes, or none where the main
// kernel plans in its own CTAs (ranges, one sequence) or the split is fixed.
int64_t planned_table_entries(const DecodeParams& params);
// Points split_table and item_table into `table` (split_table_entries of int32, 16-byte aligned).
void bind_split_tables(DecodeParams& params, int32_t* table);

}  // namespace mla::cuda
