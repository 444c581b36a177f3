// The op entry points, written once for every backend. A Backend supplies:
//   Guard                       device guard constructed from the inputs' device
//   check_strict_allowed()      raises where a host copy is not allowed (CUDA graph capture)
//   decode(problem, options, plan)
//                               the outputs are bound and a caller's split is set: chooses the split where the caller
//                               gave none, allocates the workspace the split needs (options: q's) and runs the kernels;
//                               a plan from plan() holds the part of the workspace planned ahead
//   plan(problem, options)      the int32 tables a decode call's schedule lays out from seq_lens ahead of its kernels,
//                               for every call of a step that shares the arguments' shapes and seq_lens (may be empty)
//   kDequantisesFp8Cache        whether it runs float8_e4m3fn caches by dequantising them, through (otherwise its
//                               kernels read them: params.cache_format)
//   dequantize_cache(kv, k_pe, kv_scale, format, block_table, seq_lens)
//                               the fp32 cache (and block table into it) that its fp32 kernels run instead
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

// The arguments of a call as the op received them.
struct DecodeCall {
  const at::Tensor& q;
  const at::Tensor& q_pe;
  const at::Tensor& kv;
  const at::Tensor& k_pe;
  std::optional<double> sm_scale;
  std::optional<int64_t> kv_len_per_split;
  const std::optional<at::Tensor>& block_table;
  const std::optional<at::Tensor>& seq_lens;
  bool causal;
  const std::optional<at::Tensor>& kv_scale;

  DecodeProblem check() const {
    return check_decode_args(q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal, kv_scale);
  }
};

template <class Backend>
void decode_into(const DecodeCall& call, DecodeProblem& problem, const std::optional<at::Tensor>& plan,
                 const at::Tensor& out, const at::Tensor& lse, bool values_checked = false);

// A float8_e4m3fn cache on a backend that dequantises it: the backend dequantises what the call reads and its fp32
// kernels run the call (q widened, the output rounded back to q's dtype). Plans of such calls are empty.
template <class Backend>
void decode_fp8_cache(const DecodeCall& call, const DecodeProblem& problem, const std::optional<at::Tensor>& plan,
                      const at::Tensor& out, const at::Tensor& lse) {
  if (plan.has_value()) check_plan_entries(*plan, 0);
  if constexpr (Backend::kDequantisesFp8Cache) {
    const auto cache = Backend::dequantize_cache(call.kv, call.k_pe, *call.kv_scale, problem.params.cache_format,
                                                 call.block_table, call.seq_lens);
    const at::Tensor q = call.q.to(at::kFloat), q_pe = call.q_pe.to(at::kFloat);
    const at::Tensor out_fp32 = at::empty(out_shape(call.q), q.options());
    const DecodeCall fp32_call{q,
                               q_pe,
                               cache.kv,
                               cache.k_pe,
                               call.sm_scale,
                               call.kv_len_per_split,
                               cache.block_table,
                               call.seq_lens,
                               call.causal,
                               std::nullopt};
    DecodeProblem fp32_problem = fp32_call.check();
    decode_into<Backend>(fp32_call, fp32_problem, std::nullopt, out_fp32, lse, /*values_checked=*/true);
    out.copy_(out_fp32);
  }
}

// Writes out and lse (bound with q's rank) for a checked call. values_checked: strict mode's value checks were made
// on the caller's tables already.
template <class Backend>
void decode_into(const DecodeCall& call, DecodeProblem& problem, const std::optional<at::Tensor>& plan,
                 const at::Tensor& out, const at::Tensor& lse, bool values_checked) {
  if (!values_checked) check_strict_values<Backend>(problem, call.block_table, call.seq_lens);
  if (plan.has_value()) check_plan_tensor(*plan, call.q);
  if (problem.params.cache_format != CacheFormat::kNative && Backend::kDequantisesFp8Cache) {
    decode_fp8_cache<Backend>(call, problem, plan, out, lse);
    return;
  }
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
  Backend::decode(problem, call.q.options(), plan);
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor> decode_with_lse(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv,
                                                   const at::Tensor& k_pe, std::optional<double> sm_scale,
                                                   std::optional<int64_t> kv_len_per_split,
                                                   const std::optional<at::Tensor>& block_table,
                                                   const std::optional<at::Tensor>& seq_lens, bool causal,
                                                   const std::optional<at::Tensor>& kv_scale,
                                                   const std::optional<at::Tensor>& plan) {
  typename Backend::Guard guard(q.device());
  const DecodeCall call{q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal, kv_scale};
  DecodeProblem problem = call.check();
  at::Tensor out = at::empty(out_shape(q), q.options());
  at::Tensor lse = at::empty(lse_shape(q), q.options().dtype(at::kFloat));
  decode_into<Backend>(call, problem, plan, out, lse);
  return {out, lse};
}

template <class Backend>
at::Tensor decode(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv, const at::Tensor& k_pe,
                  std::optional<double> sm_scale, std::optional<int64_t> kv_len_per_split,
                  const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens, bool causal,
                  const std::optional<at::Tensor>& kv_scale, const std::optional<at::Tensor>& plan) {
  return std::get<0>(decode_with_lse<Backend>(q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens,
                                              causal, kv_scale, plan));
}

template <class Backend>
void decode_out(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv, const at::Tensor& k_pe,
                std::optional<double> sm_scale, std::optional<int64_t> kv_len_per_split,
                const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens, bool causal,
                const std::optional<at::Tensor>& kv_scale, const std::optional<at::Tensor>& plan, const at::Tensor& out,
                const std::optional<at::Tensor>& lse) {
  typename Backend::Guard guard(q.device());
  const DecodeCall call{q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal, kv_scale};
  DecodeProblem problem = call.check();
  check_decode_outputs(q, out, lse);
  const at::Tensor lse_out = lse.has_value() ? *lse : at::empty(lse_shape(q), q.options().dtype(at::kFloat));
  decode_into<Backend>(call, problem, plan, out, lse_out);
}

// The schedule of a decode call with these arguments, laid out ahead (int32 on q's device): engines make it once per
// step and hand it to every layer's call, which then skips that part of its own planning.
template <class Backend>
at::Tensor plan(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv, const at::Tensor& k_pe,
                std::optional<double> sm_scale, std::optional<int64_t> kv_len_per_split,
                const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens, bool causal,
                const std::optional<at::Tensor>& kv_scale) {
  typename Backend::Guard guard(q.device());
  const DecodeCall call{q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal, kv_scale};
  DecodeProblem problem = call.check();
  check_strict_values<Backend>(problem, block_table, seq_lens);
  if (problem.params.cache_format != CacheFormat::kNative && Backend::kDequantisesFp8Cache) {
    return at::empty({0}, q.options().dtype(at::kInt));
  }
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
