// The mla operator library: schemas only. Kernels are registered per backend (cpu/ops_cpu.cpp, cuda/ops_cuda.cpp,
// which also defines the private _kernel_launch_counts op for tests); fake (meta) kernels and the autograd error live
// in mla_ext/ops.py.
#include <torch/library.h>

#include "checks/decode_args.h"

namespace {

// A call's arguments; the decode ops also take the plan that mla.plan made from them.
#define MLA_CALL_ARGS                                                                                 \
  "Tensor q, Tensor q_pe, Tensor kv, Tensor k_pe, float? sm_scale=None, int? kv_len_per_split=None, " \
  "Tensor? block_table=None, Tensor? seq_lens=None, bool causal=False, Tensor? kv_scale=None"
#define MLA_DECODE_ARGS MLA_CALL_ARGS ", Tensor? plan=None"

bool is_strict() {
  return mla::strict_mode();
}
void set_strict(bool enabled) {
  mla::set_strict_mode(enabled);
}

}  // namespace

TORCH_LIBRARY(mla, m) {
  m.set_python_module("mla_ext.ops");
  m.def("decode(" MLA_DECODE_ARGS ") -> Tensor");
  m.def("decode_with_lse(" MLA_DECODE_ARGS ") -> (Tensor out, Tensor lse)");
  m.def("decode_out(" MLA_DECODE_ARGS ", *, Tensor(a!) out, Tensor(b!)? lse=None) -> ()");
  m.def("plan(" MLA_CALL_ARGS ") -> Tensor");
  m.def("merge_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b) -> (Tensor out, Tensor lse)");
  // Strict mode is process-wide state, so these are plain host functions, not tensor ops.
  m.def("set_strict(bool enabled) -> ()", &set_strict);
  m.def("is_strict() -> bool", &is_strict);
}
