#include "checks/decode_args.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "switches.h"

namespace mla {
namespace {

constexpr const char* kSupportedDims = "supported: D=512 with Dpe=64 (DeepSeek-V2/V3/R1, Kimi-K2)";

std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// Every stride but the last must keep rows 16-byte aligned, and the last dim must be contiguous.
void check_rows(const at::Tensor& t, const char* name) {
  const int64_t last = t.dim() - 1;
  TORCH_CHECK(t.size(last) <= 1 || t.stride(last) == 1, "mla.decode: ", name,
              " must be contiguous in its last dim, got strides ", t.strides());
  const int64_t elt = t.element_size();
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "mla.decode: ", name,
              " must start at a 16-byte aligned address (its storage offset is ", t.storage_offset(), " elements)");
  for (int64_t d = 0; d < last; ++d) {
    TORCH_CHECK(t.size(d) <= 1 || (t.stride(d) * elt) % 16 == 0, "mla.decode: ", name,
                " rows must be 16-byte aligned: stride ", t.stride(d), " of dim ", d, " is ", t.stride(d) * elt,
                " bytes, not a multiple of 16 (strides ", t.strides(), ")");
  }
}

void check_same_device(const at::Tensor& t, const at::Tensor& q, const char* name) {
  TORCH_CHECK(t.device() == q.device(), "mla.decode: ", name, " is on ", t.device(), " but q is on ", q.device(),
              "; all tensors must be on one device");
}

void check_index_tensor(const at::Tensor& t, const at::Tensor& q, const char* name, int64_t rank, const char* shape) {
  TORCH_CHECK(t.scalar_type() == at::kInt, "mla.decode: ", name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == rank, "mla.decode: ", name, " must be ", shape, ", got shape ", shape_str(t));
  check_same_device(t, q, name);
}

int to_int(int64_t v, const char* what) {
  TORCH_CHECK(v <= std::numeric_limits<int>::max(), "mla.decode: ", what, " = ", v, " is too large (max ",
              std::numeric_limits<int>::max(), ")");
  return static_cast<int>(v);
}

std::atomic<bool>& strict_flag() {
  static std::atomic<bool> flag{strict_from_environment()};
  return flag;
}

// The cache's dtypes against q's, and kv_scale where the cache is float8_e4m3fn.
CacheFormat check_cache_format(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& k_pe,
                               const std::optional<at::Tensor>& kv_scale) {
  if (kv.scalar_type() != at::kFloat8_e4m3fn) {
    for (auto [t, name] : {std::pair{&kv, "kv"}, {&k_pe, "k_pe"}}) {
      TORCH_CHECK(t->scalar_type() == q.scalar_type(), "mla.decode: ", name, " must have the dtype of q (",
                  q.scalar_type(), ") or, for kv, float8_e4m3fn with kv_scale; got ", t->scalar_type());
    }
    TORCH_CHECK(!kv_scale.has_value(), "mla.decode: kv_scale scales a float8_e4m3fn cache, but kv is ",
                kv.scalar_type());
    return CacheFormat::kNative;
  }
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "mla.decode: a float8_e4m3fn cache takes float16 or bfloat16 queries, got ", q.scalar_type());
  TORCH_CHECK(kv_scale.has_value(), "mla.decode: kv is float8_e4m3fn and needs kv_scale: float32 [] or [1] (one ",
              "scale for kv and k_pe) or [", kv.size(0), ", ", kv.size(1), ", 4] (one per 128 values of each kv row)");
  const at::Tensor& scale = *kv_scale;
  TORCH_CHECK(scale.scalar_type() == at::kFloat, "mla.decode: kv_scale must be float32, got ", scale.scalar_type());
  check_same_device(scale, q, "kv_scale");
  if (scale.dim() <= 1 && scale.numel() == 1) {
    TORCH_CHECK(k_pe.scalar_type() == at::kFloat8_e4m3fn, "mla.decode: with one kv_scale for the cache, k_pe must ",
                "be float8_e4m3fn like kv, got ", k_pe.scalar_type());
    return CacheFormat::kFp8PerTensor;
  }
  const std::vector<int64_t> blocks{kv.size(0), kv.size(1), kHeadDim / kFp8BlockValues};
  TORCH_CHECK(scale.sizes().vec() == blocks, "mla.decode: kv_scale must be [] or [1] (per tensor) or ",
              at::IntArrayRef(blocks), " (per 128 values of each kv row), got ", shape_str(scale));
  check_rows(scale, "kv_scale");
  TORCH_CHECK(k_pe.scalar_type() == q.scalar_type(), "mla.decode: with per-block kv_scale, k_pe holds the rope ",
              "values unscaled in the dtype of q (", q.scalar_type(), "), got ", k_pe.scalar_type());
  return CacheFormat::kFp8PerBlock;
}

}  // namespace

DType dtype_of(const at::Tensor& t, const char* op, const char* name) {
  switch (t.scalar_type()) {
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kFloat: return DType::kFloat32;
    default: TORCH_CHECK(false, op, ": ", name, " must be float16, bfloat16 or float32, got ", t.scalar_type());
  }
}

DecodeProblem check_decode_args(const at::Tensor& q, const at::Tensor& q_pe, const at::Tensor& kv,
                                const at::Tensor& k_pe, std::optional<double> sm_scale,
                                std::optional<int64_t> kv_len_per_split, const std::optional<at::Tensor>& block_table,
                                const std::optional<at::Tensor>& seq_lens, bool causal,
                                const std::optional<at::Tensor>& kv_scale) {
  // Ranks and head dims first: they say what the caller meant.
  TORCH_CHECK(q.dim() == 3 || q.dim() == 4, "mla.decode: q must be [B, H, D] or [B, S_q, H, D], got shape ",
              shape_str(q));
  TORCH_CHECK(q_pe.dim() == q.dim(), "mla.decode: q_pe must have the rank of q (", q.dim(), "), got shape ",
              shape_str(q_pe));
  TORCH_CHECK(kv.dim() == 3, "mla.decode: kv must be [B, S_kv, D] (dense) or [P, page_size, D] (paged), got shape ",
              shape_str(kv));
  TORCH_CHECK(k_pe.dim() == 3,
              "mla.decode: k_pe must be [B, S_kv, Dpe] (dense) or [P, page_size, Dpe] (paged), got shape ",
              shape_str(k_pe));
  TORCH_CHECK(q.size(-1) == kHeadDim, "mla.decode: q has head dim ", q.size(-1), "; ", kSupportedDims);
  TORCH_CHECK(kv.size(-1) == kHeadDim, "mla.decode: kv has head dim ", kv.size(-1), "; ", kSupportedDims);
  TORCH_CHECK(q_pe.size(-1) == kRopeDim, "mla.decode: q_pe has rope dim ", q_pe.size(-1), "; ", kSupportedDims);
  TORCH_CHECK(k_pe.size(-1) == kRopeDim, "mla.decode: k_pe has rope dim ", k_pe.size(-1), "; ", kSupportedDims);

  DecodeProblem problem{};
  problem.dtype = dtype_of(q, "mla.decode", "q");
  for (auto [t, name] : {std::pair{&q_pe, "q_pe"}, {&kv, "kv"}, {&k_pe, "k_pe"}}) {
    check_same_device(*t, q, name);
  }
  TORCH_CHECK(q_pe.scalar_type() == q.scalar_type(), "mla.decode: q_pe must have the dtype of q (", q.scalar_type(),
              "), got ", q_pe.scalar_type());
  problem.params.cache_format = check_cache_format(q, kv, k_pe, kv_scale);
  if (problem.params.cache_format != CacheFormat::kNative) {
    problem.params.kv_scale = kv_scale->data_ptr<float>();
    if (problem.params.cache_format == CacheFormat::kFp8PerBlock) {
      problem.params.kv_scale_page_stride = kv_scale->stride(0);
      problem.params.kv_scale_row_stride = kv_scale->stride(1);
    }
  }

  const bool has_seq_dim = q.dim() == 4;
  const int64_t batch = q.size(0);
  const int64_t seqlen_q = has_seq_dim ? q.size(1) : 1;
  const int64_t num_heads = q.size(-2);
  TORCH_CHECK(num_heads >= 1, "mla.decode: q must have at least one head, got shape ", shape_str(q));
  TORCH_CHECK(seqlen_q >= 1, "mla.decode: q must have at least one query token, got shape ", shape_str(q));
  auto expected_q_pe = q.sizes().vec();
  expected_q_pe.back() = kRopeDim;
  TORCH_CHECK(q_pe.sizes().vec() == expected_q_pe, "mla.decode: q_pe must have shape ", at::IntArrayRef(expected_q_pe),
              " to match q ", shape_str(q), ", got ", shape_str(q_pe));
  TORCH_CHECK(kv.size(0) == k_pe.size(0) && kv.size(1) == k_pe.size(1), "mla.decode: kv ", shape_str(kv), " and k_pe ",
              shape_str(k_pe), " must agree in their first two dims");
  for (auto [t, name] : {std::pair{&q, "q"}, {&q_pe, "q_pe"}, {&kv, "kv"}, {&k_pe, "k_pe"}}) {
    check_rows(*t, name);
  }

  DecodeParams& p = problem.params;
  if (block_table.has_value()) {
    TORCH_CHECK(seq_lens.has_value(),
                "mla.decode: block_table was given without seq_lens; a paged cache needs seq_lens [B] (int32)");
    check_index_tensor(*block_table, q, "block_table", 2, "[B, max_pages]");
    TORCH_CHECK(block_table->size(0) == batch, "mla.decode: block_table has ", block_table->size(0),
                " rows but q has batch ", batch);
    TORCH_CHECK(block_table->size(1) <= 1 || block_table->stride(1) == 1,
                "mla.decode: block_table must be contiguous in its last dim, got strides ", block_table->strides());
    p.block_table = block_table->data_ptr<int32_t>();
    p.block_table_batch_stride = block_table->stride(0);
    p.num_pages = to_int(kv.size(0), "number of pages");
    p.page_size = to_int(kv.size(1), "page_size");
    p.max_pages = to_int(block_table->size(1), "max_pages");
  } else {
    TORCH_CHECK(kv.size(0) == batch, "mla.decode: dense kv has batch ", kv.size(0), " but q has batch ", batch,
                " (for a paged cache pass block_table and seq_lens)");
    p.block_table = nullptr;
    p.block_table_batch_stride = 0;
    p.num_pages = to_int(batch, "batch");
    p.page_size = to_int(kv.size(1), "S_kv");
    p.max_pages = 1;
  }
  const int64_t capacity = static_cast<int64_t>(p.page_size) * p.max_pages;
  p.capacity = to_int(capacity, "cache capacity (max_pages * page_size)");

  if (seq_lens.has_value()) {
    check_index_tensor(*seq_lens, q, "seq_lens", 1, "[B]");
    TORCH_CHECK(seq_lens->size(0) == batch, "mla.decode: seq_lens has ", seq_lens->size(0), " entries but q has batch ",
                batch);
    p.seq_lens = seq_lens->data_ptr<int32_t>();
    p.seq_lens_stride = seq_lens->stride(0);
  } else {
    p.seq_lens = nullptr;
    p.seq_lens_stride = 0;
  }

  if (kv_len_per_split.has_value()) {
    TORCH_CHECK(*kv_len_per_split > 0 && *kv_len_per_split % 16 == 0,
                "mla.decode: kv_len_per_split must be a positive multiple of 16, got ", *kv_len_per_split);
    problem.kv_len_per_split = std::min<int64_t>(*kv_len_per_split, std::numeric_limits<int>::max() / 2 / 16 * 16);
  }
  const double scale = sm_scale.value_or(1.0 / std::sqrt(static_cast<double>(kHeadDim + kRopeDim)));
  TORCH_CHECK(std::isfinite(scale), "mla.decode: sm_scale must be finite, got ", scale);

  p.q = q.data_ptr();
  p.q_pe = q_pe.data_ptr();
  p.q_batch_stride = q.stride(0);
  p.q_seq_stride = has_seq_dim ? q.stride(1) : 0;
  p.q_head_stride = q.stride(-2);
  p.q_pe_batch_stride = q_pe.stride(0);
  p.q_pe_seq_stride = has_seq_dim ? q_pe.stride(1) : 0;
  p.q_pe_head_stride = q_pe.stride(-2);
  p.kv = kv.data_ptr();
  p.k_pe = k_pe.data_ptr();
  p.kv_page_stride = kv.stride(0);
  p.kv_row_stride = kv.stride(1);
  p.k_pe_page_stride = k_pe.stride(0);
  p.k_pe_row_stride = k_pe.stride(1);
  p.batch = to_int(batch, "batch");
  p.seqlen_q = to_int(seqlen_q, "S_q");
  p.num_heads = to_int(num_heads, "H");
  to_int(seqlen_q * num_heads, "S_q * H");
  p.sm_scale = static_cast<float>(scale);
  p.causal = causal;
  problem.q_has_seq_dim = has_seq_dim;
  return problem;
}

std::vector<int64_t> out_shape(const at::Tensor& q) {
  auto shape = q.sizes().vec();
  shape.back() = kHeadDim;
  return shape;
}

std::vector<int64_t> lse_shape(const at::Tensor& q) {
  auto shape = q.sizes().vec();
  shape.pop_back();
  return shape;
}

void check_decode_outputs(const at::Tensor& q, const at::Tensor& out, const std::optional<at::Tensor>& lse) {
  TORCH_CHECK(out.sizes().vec() == out_shape(q), "mla.decode_out: out must have shape ", at::IntArrayRef(out_shape(q)),
              ", got ", shape_str(out));
  TORCH_CHECK(out.scalar_type() == q.scalar_type(), "mla.decode_out: out must have the dtype of q (", q.scalar_type(),
              "), got ", out.scalar_type());
  TORCH_CHECK(out.device() == q.device(), "mla.decode_out: out is on ", out.device(), " but q is on ", q.device());
  check_rows(out, "out");
  if (lse.has_value()) {
    TORCH_CHECK(lse->sizes().vec() == lse_shape(q), "mla.decode_out: lse must have shape ",
                at::IntArrayRef(lse_shape(q)), ", got ", shape_str(*lse));
    TORCH_CHECK(lse->scalar_type() == at::kFloat, "mla.decode_out: lse must be float32, got ", lse->scalar_type());
    TORCH_CHECK(lse->device() == q.device(), "mla.decode_out: lse is on ", lse->device(), " but q is on ", q.device());
  }
}

void check_plan_tensor(const at::Tensor& plan, const at::Tensor& q) {
  TORCH_CHECK(plan.scalar_type() == at::kInt, "mla.decode: plan must be int32 (made by mla.plan), got ",
              plan.scalar_type());
  TORCH_CHECK(plan.dim() == 1 && plan.is_contiguous(), "mla.decode: plan must be one contiguous dim (made by ",
              "mla.plan), got shape ", shape_str(plan), " and strides ", plan.strides());
  TORCH_CHECK(plan.device() == q.device(), "mla.decode: plan is on ", plan.device(), " but q is on ", q.device());
}

void check_plan_entries(const at::Tensor& plan, int64_t expected) {
  TORCH_CHECK(plan.numel() == expected, "mla.decode: plan holds ", plan.numel(), " entries but this call's needs ",
              expected, "; make the plan with mla.plan from this call's arguments (same batch, heads, query tokens, ",
              "cache capacity, dtype and seq_lens)");
}

void bind_decode_outputs(DecodeProblem& problem, const at::Tensor& out, const at::Tensor& lse) {
  DecodeParams& p = problem.params;
  const bool seq = problem.q_has_seq_dim;
  p.out = out.data_ptr();
  p.out_batch_stride = out.stride(0);
  p.out_seq_stride = seq ? out.stride(1) : 0;
  p.out_head_stride = out.stride(-2);
  p.lse = lse.data_ptr<float>();
  p.lse_batch_stride = lse.stride(0);
  p.lse_seq_stride = seq ? lse.stride(1) : 0;
  p.lse_head_stride = lse.stride(-1);
}

void set_split(DecodeProblem& problem, int64_t split) {
  DecodeParams& p = problem.params;
  TORCH_CHECK(split > 0 && split % 16 == 0, "mla.decode: internal error: split ", split, " is not a multiple of 16");
  p.kv_len_per_split = static_cast<int>(split);
  p.num_splits = static_cast<int>(std::max<int64_t>(1, (p.capacity + split - 1) / split));
  p.balanced_target = 0;
  p.balanced_split_cost = 0.f;
  p.balanced_seq_cost = 0;
  p.split_table = nullptr;
  p.item_table = nullptr;
}

bool strict_mode() {
  return strict_flag().load(std::memory_order_relaxed);
}

void set_strict_mode(bool enabled) {
  strict_flag().store(enabled, std::memory_order_relaxed);
}

void check_index_values(const std::optional<at::Tensor>& block_table, const std::optional<at::Tensor>& seq_lens,
                        const DecodeParams& p) {
  if (!seq_lens.has_value()) {
    return;
  }
  const at::Tensor lens = seq_lens->cpu();
  const int32_t* len = lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < lens.size(0); ++b) {
    const int32_t n = len[b * lens.stride(0)];
    TORCH_CHECK_VALUE(n >= 0 && n <= p.capacity, "mla.decode (strict): seq_lens[", b, "] = ", n, " is outside [0, ",
                      p.capacity, "] (the cache holds ", p.max_pages, " pages of ", p.page_size, " keys per sequence)");
  }
  if (!block_table.has_value()) {
    return;
  }
  const at::Tensor table = block_table->cpu();
  const int32_t* page = table.data_ptr<int32_t>();
  for (int64_t b = 0; b < table.size(0); ++b) {
    const int64_t used = (static_cast<int64_t>(len[b * lens.stride(0)]) + p.page_size - 1) / p.page_size;
    for (int64_t i = 0; i < used; ++i) {
      const int32_t v = page[b * table.stride(0) + i * table.stride(1)];
      TORCH_CHECK_VALUE(v >= 0 && v < p.num_pages, "mla.decode (strict): block_table[", b, ", ", i, "] = ", v,
                        " is outside [0, ", p.num_pages, ") (the cache has ", p.num_pages, " pages)");
    }
  }
}

int64_t check_merge_args(const at::Tensor& out_a, const at::Tensor& lse_a, const at::Tensor& out_b,
                         const at::Tensor& lse_b) {
  TORCH_CHECK(out_a.dim() >= 1, "mla.merge_states: out_a must have at least one dim, got shape ", shape_str(out_a));
  TORCH_CHECK(out_b.sizes() == out_a.sizes(), "mla.merge_states: out_b must have the shape of out_a ", shape_str(out_a),
              ", got ", shape_str(out_b));
  TORCH_CHECK(out_b.scalar_type() == out_a.scalar_type(), "mla.merge_states: out_b must have the dtype of out_a (",
              out_a.scalar_type(), "), got ", out_b.scalar_type());
  dtype_of(out_a, "mla.merge_states", "out_a");
  auto expected_lse = out_a.sizes().vec();
  expected_lse.pop_back();
  for (auto [t, name] : {std::pair{&lse_a, "lse_a"}, {&lse_b, "lse_b"}}) {
    TORCH_CHECK(t->sizes().vec() == expected_lse, "mla.merge_states: ", name, " must have shape ",
                at::IntArrayRef(expected_lse), " (out_a without its last dim), got ", shape_str(*t));
    TORCH_CHECK(t->scalar_type() == at::kFloat, "mla.merge_states: ", name, " must be float32, got ", t->scalar_type());
  }
  for (auto [t, name] : {std::pair{&lse_a, "lse_a"}, {&out_b, "out_b"}, {&lse_b, "lse_b"}}) {
    TORCH_CHECK(t->device() == out_a.device(), "mla.merge_states: ", name, " is on ", t->device(), " but out_a is on ",
                out_a.device());
  }
  return out_a.numel() / std::max<int64_t>(1, out_a.size(-1));
}

}  // namespace mla
