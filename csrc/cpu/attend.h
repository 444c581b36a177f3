// One task of the CPU kernel: a block of query rows of one sequence against the keys of one split, streamed in
// chunks of kChunkKeys keys with an online softmax. The arithmetic of the two products lives in a Policy (fp32 FMA
// tiles, or bf16 dot-product tiles); this file holds what every policy shares: visibility, key gathering,
// masking, the softmax update and the output.
//
// Everything here is always inlined into an ISA-specific entry point (decode_cpu.cpp), so it compiles once per ISA.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "cpu/convert.h"
#include "cpu/simd.h"
#include "params.h"

// Vector types in inline helpers trigger "ABI changes with AVX" notes; nothing here crosses an ABI boundary.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mla::cpu {

constexpr int kKeyDim = kHeadDim + kRopeDim;  // 576: a key is its latent row followed by its rotary row
constexpr int kChunkKeys = 64;                // keys per online-softmax step
constexpr int kMaxTaskRows = 128;             // query rows per task: Q, scores and output accumulator fit in L2
constexpr int kRowAlign = 16;                 // rows are padded to whole vectors of the widest ISA
// Sequences with at most this many query rows (S_q * H) take the dot form of the score product: vectors along the
// 576 key dims, one dot product per (row, key), instead of vectors over 16 rows that would be mostly padding.
// The choice depends on the shape only, never on the batch or thread count, so results stay batch invariant.
constexpr int kDotFormRows = 8;
constexpr double kLog2eDouble = 1.4426950408889634;
constexpr double kLn2Double = 0.6931471805599453;

// Read in place of a key that is not visible (page outside [0, P), or padding), so its cache slot is never read.
alignas(64) inline constexpr float kZeroKey[kKeyDim] = {};

// Element offsets of query row `row` (= t * H + h, t the query token) of sequence b in the tensors read or
// written per row.
struct RowOffsets {
  int64_t q, q_pe, out, lse;
};
MLA_CPU_INLINE RowOffsets row_offsets(const DecodeParams& p, int64_t b, int row) {
  const int t = row / p.num_heads;
  const int h = row - t * p.num_heads;
  return {b * p.q_batch_stride + t * p.q_seq_stride + h * p.q_head_stride,
          b * p.q_pe_batch_stride + t * p.q_pe_seq_stride + h * p.q_pe_head_stride,
          b * p.out_batch_stride + t * p.out_seq_stride + h * p.out_head_stride,
          b * p.lse_batch_stride + t * p.lse_seq_stride + h * p.lse_head_stride};
}

struct TaskSpec {
  int batch_index;
  int row_begin;  // first query row (r = t * H + h) of the block
  int row_count;  // at most kMaxTaskRows
  int split;
};

// One thread's working memory, sized for kMaxTaskRows rows (rows_pad below) and kChunkKeys keys.
struct TaskScratch {
  void* q_packed;      // row form: fp32 [576][rows_pad] (Q transposed) or bf16 [288][rows_pad] pairs;
                       // dot form: [rows][576] in the policy's element type
  float* scores;       // [kChunkKeys][rows_pad]: log2-domain scores, then probabilities
  float* out_acc;      // [rows_pad][512]: unnormalised output
  float* key_buf;      // [kChunkKeys][576]: the chunk's keys, contiguous: fp32 (fp32 policy, 16-bit caches) or
                       // bf16 (bf16 policy, in the first half)
  uint16_t* p_pairs;   // [kChunkKeys / 2][rows_pad][2]: probabilities as bf16, two keys per 32-bit lane
  uint16_t* v_pairs;   // [kChunkKeys / 2][512][2]: values as bf16, two keys per 32-bit lane
  float* row_max;      // [rows_pad]: running max of the log2-domain scores (-inf: nothing seen yet)
  float* row_sum;      // [rows_pad]: running sum of 2^(score - row_max)
  float* rescale;      // [rows_pad]: factor the output accumulator takes before this chunk is added
  int32_t* key_limit;  // [rows_pad]: row r sees keys j < key_limit[r]
};

// The rows of one chunk's keys; a key that is not visible, and every slot past num_keys, points at kZeroKey.
template <class Elem>
struct ChunkKeys {
  const Elem* kv[kChunkKeys];    // each [512]
  const Elem* k_pe[kChunkKeys];  // each [64]
  int num_keys;                  // real keys in the chunk
  int num_padded;                // num_keys rounded up to the policy's tile multiple
  bool all_visible;              // every real key is in a page inside [0, P)
};

// The rows of the next chunk's keys that a score tile prefetches while it computes its own keys: fetching ahead
// keeps the memory busy when the kernel is bandwidth-bound (few heads, long caches).
template <class Elem>
struct NextKeys {
  const Elem* const* kv;  // nullptr: no next chunk
  const Elem* const* k_pe;
};

// The next chunk's rows from key j on (none when there is no next chunk).
template <class Elem>
MLA_CPU_INLINE NextKeys<Elem> next_keys(const ChunkKeys<Elem>* next, int j) {
  return next ? NextKeys<Elem>{next->kv + j, next->k_pe + j} : NextKeys<Elem>{nullptr, nullptr};
}

// Prefetches dims [k_begin, k_end) of the key (kv dims are 0..511, k_pe dims 512..575) of kCount next keys.
template <int kCount, class Elem>
MLA_CPU_INLINE void prefetch_keys(const NextKeys<Elem>& next, int k_begin, int k_end) {
  if (next.kv == nullptr) return;
  for (int i = 0; i < kCount; ++i) {
    for (int k = k_begin; k < k_end; k += 64 / sizeof(Elem)) {  // one cache line at a time
      const Elem* at = k < kHeadDim ? next.kv[i] + k : next.k_pe[i] + (k - kHeadDim);
      __builtin_prefetch(at, 0, 2);  // to L2: a chunk of keys is larger than L1
    }
  }
}

MLA_CPU_INLINE int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Points `keys` at the cache rows of keys [key_begin, key_begin + num_keys) of sequence b; zero keys after them.
template <class Elem>
MLA_CPU_INLINE void gather_chunk(const DecodeParams& p, int b, int key_begin, int num_keys, int key_multiple,
                                 ChunkKeys<Elem>& keys) {
  const Elem* zero = reinterpret_cast<const Elem*>(kZeroKey);
  const int32_t* table = p.block_table ? p.block_table + b * p.block_table_batch_stride : nullptr;
  int slot = key_begin / p.page_size;
  int offset = key_begin - slot * p.page_size;
  bool all_visible = true;
  const Elem* kv_page = zero;
  const Elem* pe_page = zero;
  bool page_ok = false;
  for (int j = 0; j < num_keys; ++j) {
    if (j == 0 || offset == 0) {  // entering a page
      const int64_t page = table ? table[slot] : b;
      page_ok = page >= 0 && page < p.num_pages;
      if (page_ok) {
        kv_page = static_cast<const Elem*>(p.kv) + page * p.kv_page_stride;
        pe_page = static_cast<const Elem*>(p.k_pe) + page * p.k_pe_page_stride;
      }
      all_visible = all_visible && page_ok;
    }
    keys.kv[j] = page_ok ? kv_page + offset * p.kv_row_stride : zero;
    keys.k_pe[j] = page_ok ? pe_page + offset * p.k_pe_row_stride : zero;
    if (++offset == p.page_size) {
      offset = 0;
      ++slot;
    }
  }
  for (int j = num_keys; j < kChunkKeys; ++j) {
    keys.kv[j] = zero;
    keys.k_pe[j] = zero;
  }
  keys.num_keys = num_keys;
  keys.num_padded = static_cast<int>(round_up(num_keys, key_multiple));
  keys.all_visible = all_visible;
}

// Sets the scores of keys a row may not see to -inf: keys of pages outside [0, P), padding keys, and keys at or
// beyond the row's limit (seq_len, or the causal limit of its query token).
template <int W, class Elem>
MLA_CPU_INLINE void mask_scores(float* scores, int key_begin, int num_padded, int64_t rows_pad,
                                const ChunkKeys<Elem>& keys, const int32_t* key_limit) {
  using F = simd::VecF<W>;
  using I = simd::VecI<W>;
  const Elem* zero = reinterpret_cast<const Elem*>(kZeroKey);
  const F minus_inf = simd::splat<W>(-std::numeric_limits<float>::infinity());
  for (int j = 0; j < num_padded; ++j) {
    float* row = scores + j * rows_pad;
    if (keys.kv[j] == zero) {
      for (int64_t r = 0; r < rows_pad; r += W) simd::store(row + r, minus_inf);
      continue;
    }
    const I key_index = I{} + (key_begin + j);
    for (int64_t r = 0; r < rows_pad; r += W) {
      const I limit = simd::load<I>(key_limit + r);
      simd::store(row + r, key_index >= limit ? minus_inf : simd::load<F>(row + r));
    }
  }
}

// The online-softmax step: folds this chunk's scores into row_max / row_sum, turns the scores into
// probabilities 2^(score - new_max), and leaves in `rescale` the factor 2^(old_max - new_max) for the output.
template <int W>
MLA_CPU_INLINE void softmax_update(float* scores, int num_keys, int64_t rows_pad, float* row_max, float* row_sum,
                                   float* rescale) {
  using F = simd::VecF<W>;
  const F minus_inf = simd::splat<W>(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows_pad; r += W) {
    const F old_max = simd::load<F>(row_max + r);
    F new_max = old_max;
    for (int j = 0; j < num_keys; ++j) new_max = simd::max<W>(new_max, simd::load<F>(scores + j * rows_pad + r));
    // A row that has seen no key yet keeps max -inf; shifting by 0 then keeps every weight exactly 0 (no NaN).
    const F shift = new_max == minus_inf ? F{} : new_max;
    const F factor = simd::exp2<W>(old_max - shift);
    F sum = F{};
    for (int j = 0; j < num_keys; ++j) {
      float* score = scores + j * rows_pad + r;
      const F prob = simd::exp2<W>(simd::load<F>(score) - shift);
      simd::store(score, prob);
      sum += prob;
    }
    simd::store(row_max + r, new_max);
    simd::store(row_sum + r, simd::load<F>(row_sum + r) * factor + sum);
    simd::store(rescale + r, factor);
  }
}

// Writes the result of a task: normalised rows and lse into out / lse, or into the split partials.
template <class Policy>
MLA_CPU_INLINE void write_rows(const DecodeParams& p, const TaskSpec& task, const TaskScratch& s, bool no_keys) {
  using IO = typename Policy::IO;
  using Elem = typename IO::Elem;
  constexpr int W = Policy::kLanes;
  alignas(64) float row_buf[kHeadDim];
  const int rows_per_seq = p.seqlen_q * p.num_heads;
  const float minus_inf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < task.row_count; ++r) {
    const int row = task.row_begin + r;
    const float sum = no_keys ? 0.0f : s.row_sum[r];
    // The row saw no key: out 0, lse -inf. A NaN sum (a non-finite used key) is not empty: it reaches the output.
    const bool empty = sum == 0.0f;
    // In double: at |lse| ~ 50 each fp32 rounding here would cost about an ulp of lse.
    const float lse = empty
                          ? minus_inf
                          : static_cast<float>(
                                (static_cast<double>(s.row_max[r]) + std::log2(static_cast<double>(sum))) * kLn2Double);
    const float* acc = empty ? nullptr : Policy::natural_order(s.out_acc + static_cast<int64_t>(r) * kHeadDim, row_buf);
    if (p.num_splits > 1) {
      const int64_t entry = (static_cast<int64_t>(task.batch_index) * rows_per_seq + row) * p.num_splits + task.split;
      p.lse_partial[entry] = lse;  // the combine skips -inf entries, so their out_partial is never read
      if (!empty) Fp32IO::from_float<W>(acc, 1.0f / sum, p.out_partial + entry * kHeadDim, kHeadDim);
      continue;
    }
    const RowOffsets at = row_offsets(p, task.batch_index, row);
    Elem* out = static_cast<Elem*>(p.out) + at.out;
    if (empty) {
      std::memset(out, 0, sizeof(Elem) * kHeadDim);
    } else {
      IO::template from_float<W>(acc, 1.0f / sum, out, kHeadDim);
    }
    p.lse[at.lse] = lse;
  }
}

// Runs one task. Policy supplies: Elem, IO, kLanes, kKeyMultiple (chunks are padded to it), a Chunk type, and
//   pack_q(p, task, rows_pad, dot_form, s)       Q of the task's rows into s.q_packed
//   prepare_keys(keys, s, chunk)                whatever the products need from the chunk's keys
//   scores(chunk, next, num_padded, rows, rows_pad, scale, dot_form, s)
//                                               s.scores = scale * q.k ([key][row]; 0 for padding rows), while
//                                               prefetching the keys of `next` (the next chunk, or nullptr)
//   accumulate(chunk, num_padded, rows, rows_pad, first, s)  s.out_acc = s.out_acc * rescale + P.V
//   natural_order(acc_row, buffer)              an accumulator row with its 512 dims in natural order
template <class Policy>
MLA_CPU_INLINE void attend(const DecodeParams& p, const TaskSpec& task, const TaskScratch& s) {
  using Elem = typename Policy::Elem;
  constexpr int W = Policy::kLanes;
  const int b = task.batch_index;
  const int rows = task.row_count;
  const int64_t rows_pad = round_up(rows, kRowAlign);

  int seq_len = p.capacity;
  if (p.seq_lens) seq_len = std::clamp(p.seq_lens[b * p.seq_lens_stride], 0, p.capacity);
  int min_limit = std::numeric_limits<int>::max();
  int max_limit = 0;
  for (int64_t r = 0; r < rows_pad; ++r) {  // padding rows copy the last real row
    const int token = (task.row_begin + static_cast<int>(std::min<int64_t>(r, rows - 1))) / p.num_heads;
    const int limit = p.causal ? std::max(seq_len - p.seqlen_q + 1 + token, 0) : seq_len;
    s.key_limit[r] = limit;
    min_limit = std::min(min_limit, limit);
    max_limit = std::max(max_limit, limit);
  }
  const int64_t split_begin = static_cast<int64_t>(task.split) * p.kv_len_per_split;
  const int key_end = static_cast<int>(std::min<int64_t>(split_begin + p.kv_len_per_split, max_limit));
  if (split_begin >= key_end) {
    write_rows<Policy>(p, task, s, /*no_keys=*/true);
    return;
  }
  const int key_begin = static_cast<int>(split_begin);

  const bool dot_form = p.seqlen_q * p.num_heads <= kDotFormRows;
  Policy::pack_q(p, task, rows_pad, dot_form, s);
  for (int64_t r = 0; r < rows_pad; ++r) {
    s.row_max[r] = -std::numeric_limits<float>::infinity();
    s.row_sum[r] = 0.0f;
  }
  const float scale = static_cast<float>(p.sm_scale * kLog2eDouble);  // log2-domain scores: softmax uses exp2
  ChunkKeys<Elem> key_buffers[2];
  ChunkKeys<Elem>* keys = &key_buffers[0];
  ChunkKeys<Elem>* next = &key_buffers[1];
  typename Policy::Chunk chunk;
  gather_chunk(p, b, key_begin, std::min(kChunkKeys, key_end - key_begin), Policy::kKeyMultiple, *keys);
  for (int begin = key_begin; begin < key_end; begin += kChunkKeys) {
    const bool has_next = key_end - begin > kChunkKeys;
    if (has_next) {
      const int next_begin = begin + kChunkKeys;
      gather_chunk(p, b, next_begin, std::min(kChunkKeys, key_end - next_begin), Policy::kKeyMultiple, *next);
    }
    const int num_padded = keys->num_padded;
    Policy::prepare_keys(*keys, s, chunk);
    Policy::scores(chunk, has_next ? next : nullptr, num_padded, rows, rows_pad, scale, dot_form, s);
    if (!keys->all_visible || num_padded > keys->num_keys || begin + num_padded > min_limit) {
      mask_scores<W>(s.scores, begin, num_padded, rows_pad, *keys, s.key_limit);
    }
    softmax_update<W>(s.scores, num_padded, rows_pad, s.row_max, s.row_sum, s.rescale);
    Policy::accumulate(chunk, num_padded, rows, rows_pad, begin == key_begin, s);
    std::swap(keys, next);
  }
  write_rows<Policy>(p, task, s, /*no_keys=*/false);
}

}  // namespace mla::cpu

#pragma GCC diagnostic pop
