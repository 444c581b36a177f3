#include "cuda/schedule/workspace.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace mla::cuda {

void set_balanced_split(DecodeParams& p, const BalancedSplit& split) {
  const int align = split.align;
  if (!(split.target > 0 && static_cast<int64_t>(split.target) + p.batch <= std::numeric_limits<int>::max() / 2 &&
        align > 0 && align % 16 == 0 && (align & (align - 1)) == 0 && split.seq_cost >= 0)) {
    throw std::logic_error("mla.decode: internal error: balanced split target " + std::to_string(split.target) +
                           " align " + std::to_string(align) + " for batch " + std::to_string(p.batch));
  }
  p.kv_len_per_split = align;  // the alignment of the cuts made on device
  // Work items run in thread-block clusters of two on Hopper (launch_sm90.cuh): an even count of CTAs per row block.
  p.num_splits = split.seq_cost == 0 ? (split.target + p.batch + 1) / 2 * 2 : split.target + p.batch;
  p.balanced_target = split.target;
  p.balanced_split_cost = split.split_cost;
  p.balanced_seq_cost = split.seq_cost;
}

int64_t work_item_table_offset(const DecodeParams& p) {
  return (2 * static_cast<int64_t>(p.batch) + 3) / 4 * 4;  // int4 entries: 16-byte aligned
}

bool items_planned_by_kernel(const DecodeParams& p) {
  return p.balanced_target > 0 && p.balanced_seq_cost == 0 && p.batch > 1;
}

int64_t split_table_entries(const DecodeParams& p) {
  if (p.balanced_target == 0) return 0;
  const int64_t items = items_planned_by_kernel(p) ? 4 * static_cast<int64_t>(p.num_splits) : 0;
  return work_item_table_offset(p) + items;
}

int64_t planned_table_entries(const DecodeParams& p) {
  return items_planned_by_kernel(p) ? split_table_entries(p) : 0;
}

void bind_split_tables(DecodeParams& p, int32_t* table) {
  p.split_table = table;
  p.item_table = items_planned_by_kernel(p) ? table + work_item_table_offset(p) : nullptr;
}

}  // namespace mla::cuda
