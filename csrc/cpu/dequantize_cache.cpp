#include "cpu/dequantize_cache.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mla::cpu {
namespace {

// The fp32 values of cache rows [n, rows, width] (any strides, last dim contiguous).
at::Tensor dequantize_rows(const at::Tensor& kv, const at::Tensor& k_pe, const at::Tensor& kv_scale, CacheFormat format,
                           at::Tensor& k_pe_out) {
  at::Tensor values = kv.to(at::kFloat);
  if (format == CacheFormat::kFp8PerTensor) {
    const at::Tensor scale = kv_scale.reshape({});
    k_pe_out = k_pe.to(at::kFloat).mul_(scale);
    return values.mul_(scale);
  }
  // One scale per 128 values of each kv row; the rope values are stored unscaled.
  k_pe_out = k_pe.to(at::kFloat);
  const int64_t n = kv.size(0), rows = kv.size(1);
  const at::Tensor blocks = values.reshape({n, rows, kHeadDim / kFp8BlockValues, kFp8BlockValues});
  return blocks.mul(kv_scale.unsqueeze(-1)).reshape({n, rows, kHeadDim});
}

}  // namespace

DequantizedCache dequantize_cache(const at::Tensor& kv, const at::Tensor& k_pe, const at::Tensor& kv_scale,
                                  CacheFormat format, const std::optional<at::Tensor>& block_table,
                                  const std::optional<at::Tensor>& seq_lens) {
  DequantizedCache cache;
  if (!block_table.has_value()) {  // dense: one page per sequence, all converted
    cache.kv = dequantize_rows(kv, k_pe, kv_scale, format, cache.k_pe);
    return cache;
  }
  // Paged (seq_lens always given): the pages each sequence reads, numbered in the order first read.
  const int64_t num_pages = kv.size(0), page_size = kv.size(1);
  const auto table = block_table->accessor<int32_t, 2>();
  const auto lens = seq_lens->accessor<int32_t, 1>();
  const int64_t batch = table.size(0), max_pages = table.size(1);
  at::Tensor remapped = at::full({batch, max_pages}, -1, block_table->options());
  auto remapped_table = remapped.accessor<int32_t, 2>();
  std::vector<int32_t> new_index(static_cast<size_t>(num_pages), -1);
  std::vector<int64_t> read;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = std::clamp<int64_t>(lens[b], 0, max_pages * page_size);
    for (int64_t slot = 0; slot < (len + page_size - 1) / page_size; ++slot) {
      const int64_t page = table[b][slot];
      if (page < 0 || page >= num_pages) continue;  // stays -1: no visible key, as in the original table
      if (new_index[page] < 0) {
        new_index[page] = static_cast<int32_t>(read.size());
        read.push_back(page);
      }
      remapped_table[b][slot] = new_index[page];
    }
  }
  const at::Tensor pages = at::tensor(read, block_table->options().dtype(at::kLong));
  cache.kv = dequantize_rows(kv.index_select(0, pages), k_pe.index_select(0, pages),
                             format == CacheFormat::kFp8PerBlock ? kv_scale.index_select(0, pages) : kv_scale, format,
                             cache.k_pe);
  cache.block_table = remapped;
  return cache;
}

}  // namespace mla::cpu
