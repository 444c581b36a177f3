// What one CTA of the decode kernels works on, and the per-row facts every kernel variant needs: which sequence,
// query rows and KV split it owns, how many keys it must load, and where each row's results go.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_primitives.cuh"
#include "cuda/schedule/balanced_items.cuh"
#include "cuda/schedule/balanced_ranges.cuh"
#include "cuda/schedule/split_table.cuh"
#include "params.h"

namespace mla::cuda {

// Grid order: row blocks fastest, then splits, then sequences (or balanced ranges), so the row blocks sharing one
// KV split run side by side and hit the same lines in L2. A 1-D grid keeps every count (splits can pass 65535)
// within launch limits.
struct CtaWork {
  int batch_index;
  int rows;           // S_q * H: query rows of the sequence
  int row_begin;      // first row of this CTA's row block
  int split;          // split (balanced: piece) index within the sequence
  int slot;           // balanced splits index partials by it
  bool single_split;  // the sequence has one split: write out / lse directly, no partials
  int seq_len;        // seq_lens[b] clamped to [0, capacity]
  int key_begin;      // first key of the split
  int key_end;        // one past the last key any row of this block can see (>= key_begin)
  int num_tiles;      // ceil((key_end - key_begin) / key_tile)
};

__device__ __forceinline__ int row_key_limit(const DecodeParams& p, int seq_len, int row) {
  // Bottom-right causal alignment: token t sees keys j < seq_len - S_q + 1 + t (may be <= 0: no key).
  if (!p.causal) return seq_len;
  const int token = row / p.num_heads;
  return seq_len - (p.seqlen_q - 1 - token);
}

// What a CTA works through: one (sequence, split) of a fixed split, one balanced work item, or the sequences of one
// balanced range. The few-row kernels (kWalksRanges) take ranges, the many-row kernels work items; the launcher
// hands each kernel's balanced calls in its form.
struct CtaWorkList {
  RangeCursor cursor;  // balanced ranges
  int index;           // the (sequence, split) pair, work item or range
  int row_begin;
  bool done;  // one-piece lists: the piece was handed out
};

// Called by every thread of the CTA (balanced splits need whole warps). kClustered (fixed splits launched in
// thread-block clusters of c CTAs, sm_90+): each cluster holds c consecutive splits of one (sequence, row block), CTA
// rank = split % c, and the clusters follow the grid order above.
template <int kRowTile, bool kWalksRanges, bool kClustered = false>
__device__ __forceinline__ CtaWorkList cta_work_list(const DecodeParams& p) {
  CtaWorkList list;
  const int rows = p.seqlen_q * p.num_heads;
  const int row_blocks = (rows + kRowTile - 1) / kRowTile;
  const int index = static_cast<int>(blockIdx.x);
  if constexpr (kClustered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int c = static_cast<int>(cluster_num_ctas());
    const int cluster = index / c;
    list.row_begin = (cluster % row_blocks) * kRowTile;
    list.index = cluster / row_blocks * c + (index - cluster * c);
#else
    __trap();  // clusters are launched on sm_90+ only
#endif
  } else {
    list.row_begin = (index % row_blocks) * kRowTile;
    list.index = index / row_blocks;
  }
  list.done = false;
  if constexpr (kWalksRanges) {
    if (p.balanced_target > 0) list.cursor = range_start(p, list.index);
  }
  return list;
}

// The CTA's next piece of work; false when there is none left. Every thread gets the same answer; the one with
// `record` set writes the balanced-split table. Whole warps call it.
template <int kRowTile, int kKeyTile, bool kWalksRanges>
__device__ __forceinline__ bool next_cta_work(const DecodeParams& p, CtaWorkList& list, CtaWork& w, bool record) {
  w.rows = p.seqlen_q * p.num_heads;
  w.row_begin = list.row_begin;
  int first = 0, pieces = 1;  // the sequence's first slot and piece count (balanced: for the combine)
  bool spare = false;         // a balanced work item beyond the plan's
  int64_t begin, end;
  if (kWalksRanges && p.balanced_target > 0) {
    RangeSegment s;
    if (!next_segment(p, list.index, list.cursor, s)) return false;
    w.batch_index = s.batch_index;
    w.split = s.piece;
    w.slot = s.slot;
    w.seq_len = s.seq_len;
    first = s.first_slot;
    pieces = s.pieces;
    begin = s.key_begin;
    end = min(s.key_end, s.seq_len);
  } else {
    if (list.done) return false;
    list.done = true;
    int split_len = p.kv_len_per_split;
    w.slot = list.index;
    if (!kWalksRanges && p.balanced_target > 0) {
      // (sequence, first item, pieces, keys per piece): the planner kernel wrote it before this grid's wait returned,
      // or, for one sequence, the CTA plans it
      const int4 item = p.item_table != nullptr ? reinterpret_cast<const int4*>(p.item_table)[list.index]
                                                : single_sequence_item(p, list.index);
      if (item.x >= 0) {
        w.batch_index = item.x;
        first = item.y;
        w.split = list.index - first;
        pieces = item.z;
        split_len = item.w;
      } else {  // a spare item: no keys; it writes -inf into its own partial slot, which no one reads
        w.batch_index = 0;
        w.split = 0;
        split_len = 0;
        pieces = 2;
        spare = true;
      }
    } else {
      w.split = list.index % p.num_splits;
      w.batch_index = list.index / p.num_splits;
      pieces = p.num_splits;
    }
    w.seq_len = clamped_seq_len(p, w.batch_index);
    // 64-bit: split * kv_len_per_split + kv_len_per_split can pass 2^31 for huge user splits.
    begin = static_cast<int64_t>(w.split) * split_len;
    end = min(begin + split_len, static_cast<int64_t>(w.seq_len));
  }
  w.single_split = pieces == 1;
  // split_table, unless the planner kernel wrote it; every row block writes the same values
  if (p.balanced_target > 0 && (kWalksRanges || p.item_table == nullptr) && w.split == 0 && !spare && record) {
    record_sequence_pieces(p, w.batch_index, first, pieces);
  }
  const int last_row = min(w.row_begin + kRowTile, w.rows) - 1;
  end = min(end, static_cast<int64_t>(row_key_limit(p, w.seq_len, last_row)));  // later tokens see the most keys
  w.key_begin = static_cast<int>(min(begin, static_cast<int64_t>(p.capacity)));
  w.key_end = static_cast<int>(max(end, static_cast<int64_t>(w.key_begin)));
  w.num_tiles = (w.key_end - w.key_begin + kKeyTile - 1) / kKeyTile;
  return true;
}

// In a launch in thread-block clusters of a many-row kernel: whether the CTA's piece merges with the other pieces of
// its cluster. Every piece of a fixed split does; of balanced work items (p.item_pairs_in_cluster), a piece of a
// sequence of exactly two, which the planner kernel placed on an aligned pair of items (the cluster), not a spare.
// Asked once the CTA's tiles are done: from the item table (a cached line by then), so that nothing more stays live
// through the loop.
__device__ __forceinline__ bool piece_merges_in_cluster(const DecodeParams& p, const CtaWork& w) {
  if (p.balanced_target == 0) return true;
  const int4 entry = reinterpret_cast<const int4*>(p.item_table)[w.slot];
  return entry.x >= 0 && entry.z == 2;
}

// The one piece of work of a CTA of the many-row kernels (a (sequence, split) pair or a balanced work item).
template <int kRowTile, int kKeyTile, bool kClustered = false>
__device__ __forceinline__ CtaWork single_cta_work(const DecodeParams& p) {
  CtaWorkList list = cta_work_list<kRowTile, false, kClustered>(p);
  CtaWork w;
  next_cta_work<kRowTile, kKeyTile, false>(p, list, w, threadIdx.x == 0);
  return w;
}

// Runs body(w) for each piece of work of a CTA of the few-row kernels (one, or a balanced range's sequences), with
// a CTA-wide barrier between two, so that no warp refills shared memory (query, KV stages) that another still
// reads.
template <int kRowTile, int kKeyTile, class Body>
__device__ __forceinline__ void for_each_cta_work(const DecodeParams& p, Body&& body) {
  CtaWorkList list = cta_work_list<kRowTile, true>(p);
  CtaWork w;
  const bool record = threadIdx.x == 0;
  bool more = next_cta_work<kRowTile, kKeyTile, true>(p, list, w, record);
  while (more) {
    body(w);
    more = next_cta_work<kRowTile, kKeyTile, true>(p, list, w, record);
    if (more) cta_barrier_all_threads();
  }
}

// Where a key of the sequence lives: page index into kv/k_pe and row inside the page; page < 0 means invisible
// (outside the split or seq_len, or a block_table entry outside [0, num_pages)): never read, zero-filled, masked.
struct KeySlot {
  int page;
  int offset;
};

// The block_table entry of page `page_in_seq` of sequence `batch_index` (paged caches only).
__device__ __forceinline__ int block_table_entry(const DecodeParams& p, int batch_index, int page_in_seq) {
  return p.block_table[static_cast<int64_t>(batch_index) * p.block_table_batch_stride + page_in_seq];
}

// A key's page lookup in two halves: fetch_key issues the block_table read, resolve_key checks its value later.
struct PendingKey {
  int raw_page;  // block_table entry (dense: the sequence index)
  int offset;    // row inside the page
  bool in_range;
};

// key < 0 (a lane with no row) gives an out-of-range key.
__device__ __forceinline__ PendingKey fetch_key(const DecodeParams& p, const CtaWork& w, int key) {
  PendingKey k{-1, 0, key >= w.key_begin && key < w.key_end};
  if (k.in_range && p.block_table == nullptr) {  // dense: the sequence's one page holds every key (no division)
    k.offset = key;
    k.raw_page = w.batch_index;
  } else if (k.in_range) {
    const int page_in_seq = key / p.page_size;  // key < capacity, so page_size >= 1 here
    k.offset = key - page_in_seq * p.page_size;
    k.raw_page = block_table_entry(p, w.batch_index, page_in_seq);
  }
  return k;
}

__device__ __forceinline__ KeySlot resolve_key(const DecodeParams& p, const PendingKey& k) {
  const bool valid = k.in_range && k.raw_page >= 0 && k.raw_page < p.num_pages;
  return KeySlot{valid ? k.raw_page : -1, k.offset};
}

// Output addresses of query row `row` (r = t * H + h) of the CTA's sequence.
__device__ __forceinline__ int64_t out_row_offset(const DecodeParams& p, int batch_index, int row) {
  const int token = row / p.num_heads;
  const int head = row - token * p.num_heads;
  return batch_index * p.out_batch_stride + token * p.out_seq_stride + head * p.out_head_stride;
}
__device__ __forceinline__ int64_t lse_row_offset(const DecodeParams& p, int batch_index, int row) {
  const int token = row / p.num_heads;
  const int head = row - token * p.num_heads;
  return batch_index * p.lse_batch_stride + token * p.lse_seq_stride + head * p.lse_head_stride;
}
// Global address of 16-byte chunk `chunk` of query row `row` (< rows) as one [q | q_pe] row: the latent chunks come
// from q, the rest from q_pe.
template <typename T>
__device__ __forceinline__ const T* query_chunk(const DecodeParams& p, int batch_index, int row, int chunk) {
  constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));
  constexpr int kLatentChunks = kHeadDim / kElemsPerChunk;
  const int token = row / p.num_heads;
  const int head = row - token * p.num_heads;
  if (chunk < kLatentChunks) {
    return static_cast<const T*>(p.q) +
           (batch_index * p.q_batch_stride + token * p.q_seq_stride + head * p.q_head_stride) + chunk * kElemsPerChunk;
  }
  return static_cast<const T*>(p.q_pe) +
         (batch_index * p.q_pe_batch_stride + token * p.q_pe_seq_stride + head * p.q_pe_head_stride) +
         (chunk - kLatentChunks) * kElemsPerChunk;
}

// Split partials are contiguous: out_partial [B, rows, num_splits, D], lse_partial [B, rows, num_splits]; balanced
// splits: out_partial [W, rows, D], lse_partial [W, rows] by slot.
__device__ __forceinline__ int64_t partial_row_index(const DecodeParams& p, const CtaWork& w, int row) {
  if (p.balanced_target > 0) return static_cast<int64_t>(w.slot) * w.rows + row;
  return (static_cast<int64_t>(w.batch_index) * w.rows + row) * p.num_splits + w.split;
}

// Writes one query row r from a thread's share of an mma accumulator: value pairs pair(j) (before normalisation)
// for columns col0 + kStride j, j < kPairs; l is the row's full sum, row_max its running max (log2 domain). One split:
// out (as T) and lse; several: the fp32 partial row (skipped when the split saw no key: the combine never reads it)
// and its lse. writes_lse picks the one thread of the row that writes the lse.
template <typename T, int kPairs, int kStride = 8, class Pair>
__device__ __forceinline__ void write_row_result(const DecodeParams& p, const CtaWork& w, int r, float l, float row_max,
                                                 int col0, bool writes_lse, Pair pair) {
  const bool seen = !(l == 0.f);  // NaN (a non-finite used key) must reach the output
  const float inv = seen ? 1.f / l : 0.f;
  const float lse = seen ? (row_max + log2f(l)) * 0.6931471805599453f : kNegInf;
  if (w.single_split) {
    T* out = static_cast<T*>(p.out) + out_row_offset(p, w.batch_index, r);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const float2 v = pair(j);
      if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2*>(out + col0 + j * kStride) = make_float2(v.x * inv, v.y * inv);
      } else {
        *reinterpret_cast<uint32_t*>(out + col0 + j * kStride) = pack2<T>(v.x * inv, v.y * inv);
      }
    }
    if (writes_lse) p.lse[lse_row_offset(p, w.batch_index, r)] = lse;
  } else {
    const int64_t prow = partial_row_index(p, w, r);
    if (seen) {
      float* out = p.out_partial + prow * kHeadDim;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const float2 v = pair(j);
        *reinterpret_cast<float2*>(out + col0 + j * kStride) = make_float2(v.x * inv, v.y * inv);
      }
    }
    if (writes_lse) p.lse_partial[prow] = lse;
  }
}

}  // namespace mla::cuda
