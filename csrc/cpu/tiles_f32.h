// The fp32 policy of attend(): both products as register-blocked fp32 FMA tiles, any cache dtype (16-bit keys are
// converted to fp32 once per chunk, then every query row of the task reuses them from cache).
//   scores: vectors run over query rows. Q is packed transposed once per task ([576][rows_pad]), and each key
//           element is broadcast straight from the cache row, so keys need no packing.
//   output: vectors run over the 512 latent dims; each probability is broadcast, each value row loaded as is.
//   dot form (few rows, see kDotFormRows): vectors run along the 576 key dims of Q rows [rows][576] and keys,
//           one horizontal sum per (row, key).
// Generic in the vector width W; the ISA comes from the entry point it is inlined into.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/attend.h"
#include "cpu/simd.h"

// Vector types in inline helpers trigger "ABI changes with AVX" notes; nothing here crosses an ABI boundary.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mla::cpu {

constexpr int kScoreBlock = 64;  // key dims per partial sum of a score (see score_tile_f32)

// Tile shapes per vector width, chosen so accumulators + operands fit the register file (32 zmm, 16 ymm/xmm).
template <int W>
struct Fp32TileShape {
  static constexpr int kScoreKeys = 4;     // keys per score tile
  static constexpr int kScoreRowVecs = 2;  // row vectors per score tile
  static constexpr int kOutRows = 2;       // rows per output tile
  static constexpr int kOutDimVecs = 4;    // latent-dim vectors per output tile
  static constexpr int kDotKeys = 2;       // keys per dot-form score tile
  static constexpr int kDotRows = 4;       // rows per dot-form score tile
};
template <>
struct Fp32TileShape<8> {  // AVX2: 16 ymm registers
  static constexpr int kScoreKeys = 4;
  static constexpr int kScoreRowVecs = 3;
  static constexpr int kOutRows = 6;
  static constexpr int kOutDimVecs = 2;
  static constexpr int kDotKeys = 2;
  static constexpr int kDotRows = 4;
};
template <>
struct Fp32TileShape<16> {
  static constexpr int kScoreKeys = 8;
  static constexpr int kScoreRowVecs = 3;
  static constexpr int kOutRows = 6;
  static constexpr int kOutDimVecs = 4;
  static constexpr int kDotKeys = 4;
  static constexpr int kDotRows = 4;
};

// acc[i][n] += sum over k < kScoreBlock of key_i[k0 + k] * q_t[k][n*W + lane].
template <int W, int MK, int NR>
MLA_CPU_INLINE void score_block_f32(const float* const* key_rows, int k0, const float* q_t, int64_t rows_pad,
                                    simd::VecF<W> (&acc)[MK][NR]) {
  using F = simd::VecF<W>;
  for (int k = 0; k < kScoreBlock; ++k) {
    const float* q_col = q_t + k * rows_pad;
    F q[NR];
#pragma GCC unroll 16
    for (int n = 0; n < NR; ++n) q[n] = simd::load<F>(q_col + n * W);
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) {
      const float key = key_rows[i][k0 + k];
#pragma GCC unroll 16
      for (int n = 0; n < NR; ++n) acc[i][n] += key * q[n];
    }
  }
}

// scores[i][n*W + lane] = scale * (q . key i) for MK keys and NR vectors of W rows; q_t is [576][rows_pad].
// The 576 products are summed in blocks of kScoreBlock that are then added up: a 576-long running sum in fp32
// loses several times more precision (visible in lse when scores are large).
template <int W, int MK, int NR, class Elem>
MLA_CPU_INLINE void score_tile_f32(const float* const* kv, const float* const* k_pe, const float* q_t, int64_t rows_pad,
                                   float scale, const NextKeys<Elem>& next, float* scores) {
  using F = simd::VecF<W>;
  static_assert(kHeadDim % kScoreBlock == 0 && kRopeDim % kScoreBlock == 0);
  const float* kv_rows[MK];
  const float* pe_rows[MK];
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) {
    kv_rows[i] = kv[i];
    pe_rows[i] = k_pe[i];
  }
  for (int k0 = 0; k0 < kKeyDim; k0 += kScoreBlock) {
    prefetch_keys<MK>(next, k0, k0 + kScoreBlock);
    F acc[MK][NR];
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
      for (int n = 0; n < NR; ++n) acc[i][n] = F{};
    }
    if (k0 < kHeadDim) {
      score_block_f32<W, MK, NR>(kv_rows, k0, q_t + k0 * rows_pad, rows_pad, acc);
    } else {
      score_block_f32<W, MK, NR>(pe_rows, k0 - kHeadDim, q_t + k0 * rows_pad, rows_pad, acc);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
      for (int n = 0; n < NR; ++n) {
        float* total = scores + i * rows_pad + n * W;
        simd::store(total, k0 == 0 ? acc[i][n] : simd::load<F>(total) + acc[i][n]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
    for (int n = 0; n < NR; ++n) {
      float* total = scores + i * rows_pad + n * W;
      simd::store(total, simd::load<F>(total) * scale);
    }
  }
}

// acc[i][r] += key_i[k .. k + W) * q_r[k .. k + W) (q at row stride 576).
template <int W, int MK, int RR>
MLA_CPU_INLINE void dot_step(const float* const* key_rows, int k, const float* q, simd::VecF<W> (&acc)[MK][RR]) {
  using F = simd::VecF<W>;
  F keys[MK];
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) keys[i] = simd::load<F>(key_rows[i] + k);
#pragma GCC unroll 16
  for (int r = 0; r < RR; ++r) {
    const F q_part = simd::load<F>(q + r * kKeyDim);
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) acc[i][r] += keys[i] * q_part;
  }
}

// Dot form: scores[i][r] = scale * (q_r . key i) for MK keys and RR rows; q_rows is [rows][576].
template <int W, int MK, int RR, class Elem>
MLA_CPU_INLINE void score_dot_tile_f32(const float* const* kv, const float* const* k_pe, const float* q_rows,
                                       float scale, int64_t rows_pad, const NextKeys<Elem>& next, float* scores) {
  using F = simd::VecF<W>;
  F acc[MK][RR];
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
    for (int r = 0; r < RR; ++r) acc[i][r] = F{};
  }
  for (int k = 0; k < kHeadDim; k += kScoreBlock) {
    prefetch_keys<MK>(next, k, k + kScoreBlock);
    for (int kk = k; kk < k + kScoreBlock; kk += W) dot_step<W, MK, RR>(kv, kk, q_rows + kk, acc);
  }
  prefetch_keys<MK>(next, kHeadDim, kKeyDim);
  for (int k = 0; k < kRopeDim; k += W) dot_step<W, MK, RR>(k_pe, k, q_rows + kHeadDim + k, acc);
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
    for (int r = 0; r < RR; ++r) scores[i * rows_pad + r] = simd::reduce_add(acc[i][r]) * scale;
  }
}

// out[i][d0 + ...] = out * rescale[i] + sum_j probs[j][i] * v[j][d0 + ...] for RM rows and ND vectors of dims.
// The chunk's sum is formed on its own and then added to the running output: summing every key of a long split
// straight into the running output lets rounding grow with the split's length (e.g. 3e-5 relative after 1800
// equal keys, against the 1e-5 fp32 contract); per chunk it grows with 64 + keys / 64.
template <int W, int RM, int ND>
MLA_CPU_INLINE void output_tile_f32(const float* const* v, int num_keys, int d0, const float* probs, int64_t rows_pad,
                                    const float* rescale, bool first, float* out) {
  using F = simd::VecF<W>;
  F acc[RM][ND];
#pragma GCC unroll 16
  for (int i = 0; i < RM; ++i) {
#pragma GCC unroll 16
    for (int n = 0; n < ND; ++n) acc[i][n] = F{};
  }
  for (int j = 0; j < num_keys; ++j) {
    const float* v_row = v[j] + d0;
    F values[ND];
#pragma GCC unroll 16
    for (int n = 0; n < ND; ++n) values[n] = simd::load<F>(v_row + n * W);
    const float* p_row = probs + j * rows_pad;
#pragma GCC unroll 16
    for (int i = 0; i < RM; ++i) {
      const float prob = p_row[i];
#pragma GCC unroll 16
      for (int n = 0; n < ND; ++n) acc[i][n] += prob * values[n];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < RM; ++i) {
    const float factor = rescale[i];
#pragma GCC unroll 16
    for (int n = 0; n < ND; ++n) {
      float* dst = out + i * kHeadDim + d0 + n * W;
      simd::store(dst, first ? acc[i][n] : simd::load<F>(dst) * factor + acc[i][n]);
    }
  }
}

// Picks the tile with nr (1..NR) row vectors at run time.
template <int W, int MK, int NR, class Elem>
MLA_CPU_INLINE void score_tile_f32_rows(int nr, const float* const* kv, const float* const* k_pe, const float* q_t,
                                        int64_t rows_pad, float scale, const NextKeys<Elem>& next, float* scores) {
  if constexpr (NR > 1) {
    if (nr < NR) return score_tile_f32_rows<W, MK, NR - 1>(nr, kv, k_pe, q_t, rows_pad, scale, next, scores);
  }
  score_tile_f32<W, MK, NR>(kv, k_pe, q_t, rows_pad, scale, next, scores);
}

template <int W, int MK, int RR, class Elem>
MLA_CPU_INLINE void score_dot_tile_f32_rows(int rr, const float* const* kv, const float* const* k_pe,
                                            const float* q_rows, float scale, int64_t rows_pad,
                                            const NextKeys<Elem>& next, float* scores) {
  if constexpr (RR > 1) {
    if (rr < RR) {
      return score_dot_tile_f32_rows<W, MK, RR - 1>(rr, kv, k_pe, q_rows, scale, rows_pad, next, scores);
    }
  }
  score_dot_tile_f32<W, MK, RR>(kv, k_pe, q_rows, scale, rows_pad, next, scores);
}

// Picks the tile with rm (1..RM) rows at run time.
template <int W, int RM, int ND>
MLA_CPU_INLINE void output_tile_f32_rows(int rm, const float* const* v, int num_keys, int d0, const float* probs,
                                         int64_t rows_pad, const float* rescale, bool first, float* out) {
  if constexpr (RM > 1) {
    if (rm < RM) return output_tile_f32_rows<W, RM - 1, ND>(rm, v, num_keys, d0, probs, rows_pad, rescale, first, out);
  }
  output_tile_f32<W, RM, ND>(v, num_keys, d0, probs, rows_pad, rescale, first, out);
}

template <int W, class CacheIO>
struct Fp32Policy {
  using IO = CacheIO;
  using Elem = typename IO::Elem;
  using Shape = Fp32TileShape<W>;
  static constexpr int kLanes = W;
  static constexpr int kKeyMultiple = Shape::kScoreKeys;

  struct Chunk {
    const float* kv[kChunkKeys];    // each [512] fp32
    const float* k_pe[kChunkKeys];  // each [64] fp32
  };

  static MLA_CPU_INLINE void pack_q(const DecodeParams& p, const TaskSpec& task, int64_t rows_pad, bool dot_form,
                                    const TaskScratch& s) {
    float* q_t = static_cast<float*>(s.q_packed);
    alignas(64) float row_buf[kKeyDim];
    if (dot_form) {  // [rows][576]
      for (int r = 0; r < task.row_count; ++r) {
        float* dst = q_t + r * kKeyDim;
        const RowOffsets at = row_offsets(p, task.batch_index, task.row_begin + r);
        IO::template to_float<W>(static_cast<const Elem*>(p.q) + at.q, dst, kHeadDim);
        IO::template to_float<W>(static_cast<const Elem*>(p.q_pe) + at.q_pe, dst + kHeadDim, kRopeDim);
      }
      return;
    }
    for (int r = 0; r < task.row_count; ++r) {
      const RowOffsets at = row_offsets(p, task.batch_index, task.row_begin + r);
      IO::template to_float<W>(static_cast<const Elem*>(p.q) + at.q, row_buf, kHeadDim);
      IO::template to_float<W>(static_cast<const Elem*>(p.q_pe) + at.q_pe, row_buf + kHeadDim, kRopeDim);
      for (int k = 0; k < kKeyDim; ++k) q_t[k * rows_pad + r] = row_buf[k];
    }
    for (int k = 0; k < kKeyDim; ++k) {
      for (int64_t r = task.row_count; r < rows_pad; ++r) q_t[k * rows_pad + r] = 0.0f;
    }
  }

  static MLA_CPU_INLINE void prepare_keys(const ChunkKeys<Elem>& keys, const TaskScratch& s, Chunk& chunk) {
    for (int j = 0; j < keys.num_padded; ++j) {
      if constexpr (std::is_same_v<Elem, float>) {
        chunk.kv[j] = keys.kv[j];
        chunk.k_pe[j] = keys.k_pe[j];
      } else {
        float* key = s.key_buf + j * kKeyDim;
        IO::template to_float<W>(keys.kv[j], key, kHeadDim);
        IO::template to_float<W>(keys.k_pe[j], key + kHeadDim, kRopeDim);
        chunk.kv[j] = key;
        chunk.k_pe[j] = key + kHeadDim;
      }
    }
  }

  static MLA_CPU_INLINE void scores(const Chunk& chunk, const ChunkKeys<Elem>* next, int num_padded, int rows,
                                    int64_t rows_pad, float scale, bool dot_form, const TaskScratch& s) {
    constexpr int MK = Shape::kScoreKeys;
    constexpr int NR = Shape::kScoreRowVecs;
    const float* q_t = static_cast<const float*>(s.q_packed);
    if (dot_form) {
      constexpr int DK = Shape::kDotKeys;
      constexpr int DR = Shape::kDotRows;
      for (int r = 0; r < rows; r += DR) {
        for (int j = 0; j < num_padded; j += DK) {
          score_dot_tile_f32_rows<W, DK, DR>(std::min(DR, rows - r), chunk.kv + j, chunk.k_pe + j, q_t + r * kKeyDim,
                                             scale, rows_pad, next_keys(next, j), s.scores + j * rows_pad + r);
        }
      }
      for (int j = 0; j < num_padded; ++j) {
        for (int64_t r = rows; r < rows_pad; ++r) s.scores[j * rows_pad + r] = 0.0f;
      }
      return;
    }
    const int row_vecs = static_cast<int>(rows_pad / W);
    for (int rv = 0; rv < row_vecs; rv += NR) {
      const int nr = std::min(NR, row_vecs - rv);
      for (int j = 0; j < num_padded; j += MK) {
        score_tile_f32_rows<W, MK, NR>(nr, chunk.kv + j, chunk.k_pe + j, q_t + rv * W, rows_pad, scale,
                                       next_keys(next, j), s.scores + j * rows_pad + rv * W);
      }
    }
  }

  static MLA_CPU_INLINE const float* natural_order(const float* acc_row, float*) { return acc_row; }

  static MLA_CPU_INLINE void accumulate(const Chunk& chunk, int num_padded, int rows, int64_t rows_pad, bool first,
                                        const TaskScratch& s) {
    constexpr int RM = Shape::kOutRows;
    constexpr int ND = Shape::kOutDimVecs;
    for (int d0 = 0; d0 < kHeadDim; d0 += ND * W) {
      for (int r = 0; r < rows; r += RM) {
        output_tile_f32_rows<W, RM, ND>(std::min(RM, rows - r), chunk.kv, num_padded, d0, s.scores + r, rows_pad,
                                        s.rescale + r, first, s.out_acc + static_cast<int64_t>(r) * kHeadDim);
      }
    }
  }
};

}  // namespace mla::cpu

#pragma GCC diagnostic pop
