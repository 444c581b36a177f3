// float8_e4m3fn caches on the CPU: the pages a call reads, dequantised to fp32 (value x scale), which the fp32 kernel
// then runs as the contract's reference semantics say (dequantise, then the usual fp32 math).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "checks/decode_args.h"

namespace mla::cpu {

struct DequantizedCache {
  at::Tensor kv;                          // fp32 [pages read, page_size, 512]; dense caches: [B, S_kv, 512]
  at::Tensor k_pe;                        // fp32 [pages read, page_size, 64];  dense caches: [B, S_kv, 64]
  std::optional<at::Tensor> block_table;  // int32 [B, max_pages] into kv: a slot the call does not read, or whose
                                          // page was outside [0, P), is -1 (a page that holds no visible key)
};

// For a checked call (format kFp8PerTensor or kFp8PerBlock, CPU tensors). Only the pages holding a visible key are
// converted, each once however many sequences share it, so the copy follows the call's work, not the pool's size.
DequantizedCache dequantize_cache(const at::Tensor& kv, const at::Tensor& k_pe, const at::Tensor& kv_scale,
                                  CacheFormat format, const std::optional<at::Tensor>& block_table,
                                  const std::optional<at::Tensor>& seq_lens);

}  // namespace mla::cpu
