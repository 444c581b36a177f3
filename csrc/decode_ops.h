// The op entry points, written once for every backend. A Backend supplies:
//   Guard                       device guard constructed from the inputs' device
//   check_strict_allowed()      raises where a host copy is not allowed (CUDA graph capture)
//   decode(problem, options, plan)
//                               the outputs are bound and a caller's split is set: chooses the split where the caller
//                               gave none, allocates the workspace the split needs (options: q's) and runs the kernels;
//                               a plan from plan() holds the part of the workspace planned ahead
//   plan(problem, options)      the int32 tables a decode call's schedule lays out from seq_lens ahead of its kernels,
//                               for every call of a step that shares the arguments' shapes and seq_lens (may be empty)
//   merge_states(params, dtype)
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <tuple>

#include "checks/decode_args.h"

namespace mla {

// The fp32 split partials of a bound split (none where the kernels write the outputs directly), pointed to by params.
// The caller keeps the tensors alive until the kernels are enqueued (stream-ordered allocator).
struct SplitPartials {
  at::Tensor out, lse;
};
inline SplitPartials allocate_split_partials(DecodeParams& p, const at::TensorOptions& options) {
  SplitPartials partials;
  if (const int64_t rows = partial_rows(p); rows > 0) {
    partials.out = at::empty({rows, kHeadDim}, options.dtype(at::kFloat));
    partials.lse = at::empty({rows}, options.dtype(at::kFloat));
  }
  p.out_partial = partials.out.defined() ? partials.out.data_ptr<float>() : nullptr;
  p.lse_partial = partials.lse.defined() ? partials.lse.data_ptr<float>() : nullptr;
  return partials;
}

template <class Backend>
void check_strict_values(const DecodeProblem& problem, const std::optional<at::Tensor>& block_table,
                         const std::optional<at::Tensor>& seq_lens) {
  if (strict_mode()) {
    Backend::check_strict_allowed();
    check_index_values(block_table, seq_lens, problem.params);
  }
}

// Whether a checked call has any key to attend to (with batch 0 or capacity 0 no kernel runs).
inline bool has_work(const DecodeParams& p) {
  return p.batch > 0 && p.capacity > 0;
}

template <class Backend>
void run_decode(DecodeProblem& problem, const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse,
                const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens,
                const std::optional<at::Tensor>& plan) {
  check_strict_values<Backend>(problem, block_table, seq_lens);
  if (plan.has_value()) check_plan_tensor(*plan, q);
  bind_decode_outputs(problem, out, lse);
  const DecodeParams& p = problem.params;
  if (!has_work(p)) {
    if (plan.has_value()) check_plan_entries(*plan, 0);
    if (p.batch > 0) {  // no key can be visible (S_kv = 0 or no pages): the empty-attention result
      out.zero_();
      lse.fill_(-std::numeric_limits<float>::infinity());
    }
    return;
  }
  if (problem.kv_len_per_split) {
    set_split(problem, *problem.kv_len_per_split);
  }
  Backend::decode(problem, q.options(), plan);
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor> decode_with_lse(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv,
                                                   const at::Tensor& k_pe, std::optional<double> sm_scale,
                                                   std::optional<int64_t> kv_len_per_split,
                                                   const std::optional<at::Tensor>& block_table,
                                                   const std::optional<at::Tensor>& seq_lens, bool causal,
                                                   const std::optional<at::Tensor>& plan) {
  typename Backend::Guard guard(q.device());
  DecodeProblem problem =
      check_decode_args(q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal);
  at::Tensor out = at::empty(out_shape(q), q.options());
  at::Tensor lse = at::empty(lse_shape(q), q.options().dtype(at::kFloat));
  run_decode<Backend>(problem, q, out, lse, block_table, seq_lens, plan);
  return {out, lse};
}

template <class Backend>
at::Tensor decode(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv, const at::Tensor& k_pe,
                  std::optional<double> sm_scale, std::optional<int64_t> kv_len_per_split,
                  const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens, bool causal,
                  const std::optional<at::Tensor>& plan) {
  return std::get<0>(
      decode_with_lse<Backend>(q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal, plan));
}

template <class Backend>
void decode_out(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv, const at::Tensor& k_pe,
                std::optional<double> sm_scale, std::optional<int64_t> kv_len_per_split,
                const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens, bool causal,
                const std::optional<at::Tensor>& plan, const at::Tensor& out, const std::optional<at::Tensor>& lse) {
  typename Backend::Guard guard(q.device());
  DecodeProblem problem =
      check_decode_args(q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal);
  check_decode_outputs(q, out, lse);
  const at::Tensor lse_out = lse.has_value() ? *lse : at::empty(lse_shape(q), q.options().dtype(at::kFloat));
  run_decode<Backend>(problem, q, out, lse_out, block_table, seq_lens, plan);
}

// The schedule of a decode call with these arguments, laid out ahead (int32 on q's device): engines make it once per
// step and hand it to every layer's call, which then skips that part of its own planning.
template <class Backend>
at::Tensor plan(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv, const at::Tensor& k_pe,
                std::optional<double> sm_scale, std::optional<int64_t> kv_len_per_split,
                const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens, bool causal) {
  typename Backend::Guard guard(q.device());
  DecodeProblem problem =
      check_decode_args(q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal);
  check_strict_values<Backend>(problem, block_table, seq_lens);
  if (!has_work(problem.params)) return at::empty({0}, q.options().dtype(at::kInt));
  if (problem.kv_len_per_split) {
    set_split(problem, *problem.kv_len_per_split);
  }
  return Backend::plan(problem, q.options());
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor> merge_states(const at::Tensor& out_a, const at::Tensor& lse_a,
                                                const at::Tensor& out_b, const at::Tensor& lse_b) {
  typename Backend::Guard guard(out_a.device());
  const int64_t rows = check_merge_args(out_a, lse_a, out_b, lse_b);
  const at::Tensor a = out_a.contiguous(), b = out_b.contiguous();
  const at::Tensor la = lse_a.contiguous(), lb = lse_b.contiguous();
  at::Tensor out = at::empty(out_a.sizes(), out_a.options());
  at::Tensor lse = at::empty(lse_a.sizes(), lse_a.options());
  if (rows > 0) {
    MergeStatesParams params{a.data_ptr(),   la.data_ptr<float>(),  b.data_ptr(), lb.data_ptr<float>(),
                             out.data_ptr(), lse.data_ptr<float>(), rows,         static_cast<int>(out_a.size(-1))};
    Backend::merge_states(params, dtype_of(out_a, "mla.merge_states", "out_a"));
  }
  return {out, lse};
}

// Registers the five ops of one backend (call inside TORCH_LIBRARY_IMPL(mla, <key>, m)).
template <class Backend>
void register_backend(torch::Library& m) {
  m.impl("decode", &decode<Backend>);
  m.impl("decode_with_lse", &decode_with_lse<Backend>);
  m.impl("decode_out", &decode_out<Backend>);
  m.impl("plan", &plan<Backend>);
  m.impl("merge_states", &merge_states<Backend>);
}

}  // namespace mla
