// The CPU kernel of mla.decode and mla.merge_states: split-KV attention over fp16 / bf16 / fp32 caches, fp32 math.
#pragma once

#include "params.h"

namespace mla::cpu {

// Writes params.out and params.lse. With params.num_splits > 1 it first fills params.out_partial / lse_partial
// (one entry per split, -inf lse for an empty split) and then combines the splits in a fixed order.
void decode(const DecodeParams& params, DType dtype);

// out = (w_a * out_a + w_b * out_b) / (w_a + w_b) with w = exp(lse - max); a side with lse -inf is skipped.
void merge_states(const MergeStatesParams& params, DType dtype);

// kv_len_per_split when the caller gives none (a multiple of 16): the fewest splits that keep `num_threads` threads
// evenly busy, with at least a few hundred keys per split so the combine stays cheap.
int default_kv_len_per_split(int batch, int rows_per_seq, int capacity, int num_threads);

}  // namespace mla::cpu
