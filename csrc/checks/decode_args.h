// Argument checks shared by every backend: one place turns the op's tensors into a DecodeParams, so the CPU and
// CUDA paths accept and reject exactly the same inputs with the same messages.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "params.h"

namespace mla {

// A checked decode call. `params` has every field filled except kv_len_per_split, num_splits, out, lse and the
// partials, which the backend sets once it has chosen the split and allocated the outputs.
struct DecodeProblem {
  DecodeParams params;
  DType dtype;                              // of q (and of the cache, except an fp8 one: params.cache_format)
  bool q_has_seq_dim;                       // q was [B, S_q, H, D] (else [B, H, D])
  std::optional<int64_t> kv_len_per_split;  // the caller's choice, validated; nullopt = backend default
};

DecodeProblem check_decode_args(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv,
                                const at::Tensor& k_pe, std::optional<double> sm_scale,
                                std::optional<int64_t> kv_len_per_split, const std::optional<at::Tensor>& block_table,
                                const std::optional<at::Tensor>& seq_lens, bool causal,
                                const std::optional<at::Tensor>& kv_scale);

// Shapes of the outputs for a checked call: out like q with last dim D, lse like q without the last dim.
std::vector<int64_t> out_shape(const at::Tensor& q);
std::vector<int64_t> lse_shape(const at::Tensor& q);

// Checks user-provided outputs of decode_out: shape, dtype, device, last dim contiguous, 16-byte rows.
void check_decode_outputs(const at::Tensor& q, const at::Tensor& out, const std::optional<at::Tensor>& lse);

// A plan given to a decode op: int32, one contiguous dim, on q's device. check_plan_entries: it holds as many
// entries as the backend's plan for this call would (a plan made for other shapes fails here).
void check_plan_tensor(const at::Tensor& plan, const at::Tensor& q);
void check_plan_entries(const at::Tensor& plan, int64_t expected);

// Points params at out/lse (given with q's rank) and records their strides.
void bind_decode_outputs(DecodeProblem& problem, const at::Tensor& out, const at::Tensor& lse);

// Sets kv_len_per_split = split and num_splits = max(1, ceil(capacity / split)).
void set_split(DecodeProblem& problem, int64_t split);

// Strict mode validates values that need a host copy (seq_lens, block_table); off by default.
bool strict_mode();
void set_strict_mode(bool enabled);
// Raises ValueError naming the tensor and the first bad entry. Copies seq_lens / block_table to the host.
void check_index_values(const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens,
                        const DecodeParams& params);

// merge_states: both states [..., dim] of one dtype with fp32 lse [...]; returns the flattened row count.
int64_t check_merge_args(const at::Tensor& out_a, const at::Tensor& lse_a, const at::Tensor& out_b,
                         const at::Tensor& lse_b);

// The kernel dtype of a float16/bfloat16/float32 tensor; raises naming `op` and the argument otherwise.
DType dtype_of(const at::Tensor& t, const char* op, const char* name);

}  // namespace mla
