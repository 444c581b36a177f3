// TORCH_LIBRARY_IMPL(mla, CPU): the shared op entry points bound to the CPU kernel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu/decode_cpu.h"
#include "cpu/dequantize_cache.h"
#include "decode_ops.h"

namespace mla {
namespace {

struct CpuBackend {
  struct Guard {
    explicit Guard(at::Device) {}
  };
  static void check_strict_allowed() {}
  // The caller's split, else one sized for the threads; the partials it needs live until the kernel returns.
  static void decode(DecodeProblem& problem, const at::TensorOptions& options, const std::optional<at::Tensor>& plan) {
    DecodeParams& p = problem.params;
    if (plan.has_value()) check_plan_entries(*plan, 0);
    if (!problem.kv_len_per_split) {
      set_split(problem,
                cpu::default_kv_len_per_split(p.batch, p.seqlen_q * p.num_heads, p.capacity, at::get_num_threads()));
    }
    const SplitPartials partials = allocate_split_partials(p, options);
    cpu::decode(p, problem.dtype);
  }
  // float8_e4m3fn caches: the pages a call reads, dequantised for the fp32 kernel (cpu/dequantize_cache.h).
  static constexpr bool kDequantisesFp8Cache = true;
  static cpu::DequantizedCache dequantize_cache(const at::Tensor& kv, const at::Tensor& k_pe,
                                                const at::Tensor& kv_scale, CacheFormat format,
                                                const std::optional<at::Tensor>& block_table,
                                                const std::optional<at::Tensor>& seq_lens) {
    return cpu::dequantize_cache(kv, k_pe, kv_scale, format, block_table, seq_lens);
  }
  // The CPU kernel plans nothing ahead: its plan is empty.
  static at::Tensor plan(DecodeProblem&, const at::TensorOptions& options) {
    return at::empty({0}, options.dtype(at::kInt));
  }
  static void merge_states(const MergeStatesParams& p, DType dtype) { cpu::merge_states(p, dtype); }
};

}  // namespace
}  // namespace mla

TORCH_LIBRARY_IMPL(mla, CPU, m) {
  mla::register_backend<mla::CpuBackend>(m);
}
