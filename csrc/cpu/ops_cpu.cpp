// TORCH_LIBRARY_IMPL(mla, CPU): the shared op entry points bound to the CPU kernel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../decode_ops.h"
#include "decode_cpu.h"

namespace mla {
namespace {

struct CpuBackend {
  struct Guard {
    explicit Guard(at::Device) {}
  };
  static void check_strict_allowed() {}
  static void set_default_split(DecodeProblem& problem) {
    const DecodeParams& p = problem.params;
    set_split(problem,
              cpu::default_kv_len_per_split(p.batch, p.seqlen_q * p.num_heads, p.capacity, at::get_num_threads()));
  }
  static void decode(const DecodeParams& p, DType dtype) { cpu::decode(p, dtype); }
  static void merge_states(const MergeStatesParams& p, DType dtype) { cpu::merge_states(p, dtype); }
};

}  // namespace
}  // namespace mla

TORCH_LIBRARY_IMPL(mla, CPU, m) {
  mla::register_backend<mla::CpuBackend>(m);
}
