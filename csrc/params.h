// Plain structs the kernels take: pointers, sizes, and strides in elements. No torch headers here, so .cu files
// that include this compile quickly and stay reusable outside PyTorch.
#pragma once

#include <cstdint>

namespace mla {

constexpr int kHeadDim = 512;  // D: the latent (kv_lora_rank) width of DeepSeek-V2/V3/R1 and Kimi-K2
constexpr int kRopeDim = 64;   // Dpe: the decoupled rotary part

enum class DType { kFloat16, kBFloat16, kFloat32 };

// How the cache stores its values. fp8: float8_e4m3fn with kv_scale, per tensor (kv and k_pe in fp8, one scale for
// both) or per block (one scale per 128 values of each kv row, [..., 4]; k_pe unscaled in q's dtype).
enum class CacheFormat { kNative, kFp8PerTensor, kFp8PerBlock };
constexpr int kFp8BlockValues = 128;  // values of a kv row under one per-block scale

// One decode call. Query rows of a sequence are ordered r = t * num_heads + h (t: query token, h: head); all rows
// of one sequence attend to the same keys, so a CTA / task handles a block of rows against a block of keys.
// Dense caches are described as paged ones: one page per sequence (page_size = S_kv, block_table = nullptr).
struct DecodeParams {
  const void* q;     // [B, S_q, H, D]
  const void* q_pe;  // [B, S_q, H, Dpe]
  int64_t q_batch_stride, q_seq_stride, q_head_stride;
  int64_t q_pe_batch_stride, q_pe_seq_stride, q_pe_head_stride;

  const void* kv;    // [P, page_size, D]     (dense: [B, S_kv, D])
  const void* k_pe;  // [P, page_size, Dpe]   (dense: [B, S_kv, Dpe])
  int64_t kv_page_stride, kv_row_stride;
  int64_t k_pe_page_stride, k_pe_row_stride;

  const int32_t* block_table;  // [B, max_pages]; nullptr for dense caches (page of sequence b is b)
  int64_t block_table_batch_stride;
  const int32_t* seq_lens;  // [B]; nullptr means every sequence holds `capacity` keys
  int64_t seq_lens_stride;

  int batch;       // B
  int seqlen_q;    // S_q
  int num_heads;   // H
  int num_pages;   // P: page indices outside [0, P) are treated as empty pages (never read)
  int page_size;   // keys per page (dense: S_kv)
  int max_pages;   // pages per sequence (dense: 1)
  int capacity;    // page_size * max_pages: seq_lens are clamped to [0, capacity] on device
  float sm_scale;  // softmax scale applied to q.k (natural-exp domain)
  bool causal;     // bottom-right aligned: token t sees keys j < seq_len - S_q + 1 + t
  // Balanced work items (below), set by the sm_90a launcher for its clustered launch: each sequence of exactly two
  // items takes an aligned pair (items 2k, 2k + 1, one cluster), which merges in the cluster; its split_table row
  // then says one piece (nothing left to combine). Here, beside `causal`, it takes no room of its own.
  bool item_pairs_in_cluster;
  // The item table (and split_table) came laid out from mla.plan: the launchers run no planner kernel. Host-only, and
  // beside the flag above it takes no room either.
  bool item_table_planned;

  // Split-KV: split s of a sequence covers keys [s * kv_len_per_split, (s + 1) * kv_len_per_split).
  int kv_len_per_split;  // positive multiple of 16
  int num_splits;        // ceil(capacity / kv_len_per_split), at least 1; balanced splits: W (below)

  // Balanced splits (CUDA, default split of a call with seq_lens; balanced_target = 0 means off), planned on device
  // from seq_lens so that a few long sequences among many short ones still load every SM evenly. Two plans:
  // - ranges (balanced_seq_cost > 0; few-row kernels, balanced_ranges.cuh): the batch's keys laid end to end, each
  //   sequence followed by balanced_seq_cost keys' worth of set-up, cut into balanced_target equal ranges, one per
  //   CTA (per row block), which walks the sequences its range covers;
  // - work items (balanced_seq_cost == 0; many-row kernels, balanced_items.cuh): each sequence cut into splits of
  //   about total / balanced_target keys, one CTA per split.
  // A sequence's n_b pieces write partial slots first_b .. first_b + n_b - 1; num_splits then holds
  // W = balanced_target + B (work items: rounded up to even), which bounds the slots, and kv_len_per_split holds the
  // alignment of every cut (16, or the key tile of a kernel that needs whole tiles).
  int balanced_target;        // ranges, or work items, about one wave of CTAs (one sequence: see balanced_split_for)
  float balanced_split_cost;  // cuts are at least sqrt(cost * sequence length) keys apart (combine traffic)
  int balanced_seq_cost;      // ranges: keys' worth of one sequence's set-up in a CTA (query load, pipeline fill)
  int32_t* split_table;       // [B, 2]: first slot and piece count of each sequence, for the combine; written by
                              // the planner kernel where item_table is set, else by the main kernel; allocated by
                              // the CUDA backend (cuda/schedule/workspace.h)
  int32_t* item_table;        // work items of a batch of several sequences: [W, 4] (sequence or -1 for a spare, its
                              // first item, its pieces, keys per piece) per item, written by the planner kernel;
                              // 16-byte aligned. Null for one sequence: its CTAs plan their own item

  void* out;  // [B, S_q, H, D], dtype of q
  int64_t out_batch_stride, out_seq_stride, out_head_stride;
  float* lse;  // [B, S_q, H], natural log; -inf for a row that sees no key
  int64_t lse_batch_stride, lse_seq_stride, lse_head_stride;

  // Split partials, used only when num_splits > 1 (contiguous fp32, allocated by the caller). Balanced splits
  // index them by slot instead: out_partial [W, S_q * H, D], lse_partial [W, S_q * H].
  float* out_partial;  // [B, S_q * H, num_splits, D]
  float* lse_partial;  // [B, S_q * H, num_splits], natural log; -inf for an empty split

  // A float8_e4m3fn cache (CUDA: kernels/few_rows_fp8.cuh): kv, and k_pe per tensor, hold e4m3 bytes (strides
  // above in bytes). Per tensor kv_scale is [1]; per block [P, page_size, 4], row and page strides in floats.
  CacheFormat cache_format;
  const float* kv_scale;
  int64_t kv_scale_page_stride, kv_scale_row_stride;
};

// CTAs per block of query rows: one per (sequence, split), per balanced range, or per (possibly spare) work item.
inline int64_t work_items(const DecodeParams& p) {
  if (p.balanced_target > 0) return p.balanced_seq_cost > 0 ? p.balanced_target : p.num_splits;
  return static_cast<int64_t>(p.num_splits) * p.batch;
}
// Partial rows per query row: one per split of each sequence, or the W slots of balanced splits.
inline int64_t partial_slots(const DecodeParams& p) {
  return p.balanced_target > 0 ? p.num_splits : static_cast<int64_t>(p.num_splits) * p.batch;
}
// Fp32 partial rows (of D values) the kernels need for the bound split: 0 when they write the outputs directly.
inline int64_t partial_rows(const DecodeParams& p) {
  const bool has_partials = p.balanced_target > 0 || p.num_splits > 1;
  return has_partials ? partial_slots(p) * p.seqlen_q * p.num_heads : 0;
}

// merge_states on flattened rows: two partial attentions over disjoint key sets, all tensors contiguous.
struct MergeStatesParams {
  const void* out_a;   // [rows, dim], dtype T
  const float* lse_a;  // [rows]
  const void* out_b;   // [rows, dim], dtype T
  const float* lse_b;  // [rows]
  void* out;           // [rows, dim], dtype T
  float* lse;          // [rows]
  int64_t rows;
  int dim;
};

}  // namespace mla
