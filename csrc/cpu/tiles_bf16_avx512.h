// The bf16 policy of attend() for CPUs with AVX512-BF16: both products with vdpbf16ps, which multiplies pairs of
// bf16 values exactly and accumulates in fp32 (twice the fp32 FMA rate).
//   keys:   each chunk's keys are copied into one contiguous [keys][576] block while its values are packed, so the
//           tiles address every key from one base register (8 row pointers would not fit the registers).
//   scores: vectors run over 16 query rows; Q is packed once per task as [288][rows_pad] bf16 pairs, and each
//           key's pair (k[2i], k[2i+1]) is broadcast from the key block.
//   dot form (few rows, see kDotFormRows): vectors run along the key dims of Q rows [rows][576] and keys.
//   output: vectors run over 16 latent dims; values are packed per chunk as [keys/2][512] pairs of keys, the
//           probabilities as [keys/2][rows_pad] pairs (rounded to bf16, as GPU kernels do; sums and lse use fp32).
// The intrinsics need a target attribute, so the policy's hooks are real calls from the generic driver.
#pragma once

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/attend.h"
#include "cpu/convert.h"

#define MLA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))
#define MLA_AVX512_BF16_INLINE \
  inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))

// Vector types in inline helpers trigger "ABI changes with AVX" notes; nothing here crosses an ABI boundary.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mla::cpu {

MLA_AVX512_BF16_INLINE __m512bh broadcast_pair(const uint16_t* pair) {
  int32_t bits;
  std::memcpy(&bits, pair, sizeof(bits));
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(bits));
}

MLA_AVX512_BF16_INLINE __m512bh load_pairs(const uint16_t* pairs) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(pairs));
}

// scores[i][n*16 + lane] = scale * (q . key i) for MK keys and NR vectors of 16 rows; q_pairs is [288][rows_pad][2].
template <int MK, int NR>
MLA_AVX512_BF16_INLINE void score_tile_bf16(const uint16_t* keys, const uint16_t* q_pairs, int64_t rows_pad,
                                            float scale, const NextKeys<uint16_t>& next, float* scores) {
  __m512 acc[MK][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
    for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_setzero_ps();
  }
  for (int k = 0; k < kKeyDim / 2; ++k) {
    if (k % 32 == 0) prefetch_keys<MK>(next, 2 * k, 2 * k + 64);
    const uint16_t* q_col = q_pairs + k * rows_pad * 2;
    __m512bh q[NR];
#pragma GCC unroll 16
    for (int n = 0; n < NR; ++n) q[n] = load_pairs(q_col + n * 32);
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) {
      const __m512bh key = broadcast_pair(keys + i * kKeyDim + 2 * k);
#pragma GCC unroll 16
      for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_dpbf16_ps(acc[i][n], key, q[n]);
    }
  }
  const __m512 factor = _mm512_set1_ps(scale);
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
    for (int n = 0; n < NR; ++n) _mm512_storeu_ps(scores + i * rows_pad + n * 16, _mm512_mul_ps(acc[i][n], factor));
  }
}

// acc[i][r] += pairs of key_i[k .. k + 32) . q_r[k .. k + 32) (q at row stride 576).
template <int MK, int RR>
MLA_AVX512_BF16_INLINE void dot_step_bf16(const uint16_t* key_block, int k, const uint16_t* q, __m512 (&acc)[MK][RR]) {
  __m512bh keys[MK];
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) keys[i] = load_pairs(key_block + i * kKeyDim + k);
#pragma GCC unroll 16
  for (int r = 0; r < RR; ++r) {
    const __m512bh q_part = load_pairs(q + r * kKeyDim);
#pragma GCC unroll 16
    for (int i = 0; i < MK; ++i) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], keys[i], q_part);
  }
}

// Dot form: scores[i][r] = scale * (q_r . key i) for MK keys and RR rows; q_rows is [rows][576] bf16.
template <int MK, int RR>
MLA_AVX512_BF16_INLINE void score_dot_tile_bf16(const uint16_t* keys, const uint16_t* q_rows, float scale,
                                                int64_t rows_pad, const NextKeys<uint16_t>& next, float* scores) {
  __m512 acc[MK][RR];
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
    for (int r = 0; r < RR; ++r) acc[i][r] = _mm512_setzero_ps();
  }
  for (int k = 0; k < kKeyDim; k += 32) {
    if (k % 64 == 0) prefetch_keys<MK>(next, k, k + 64);
    dot_step_bf16<MK, RR>(keys, k, q_rows + k, acc);
  }
#pragma GCC unroll 16
  for (int i = 0; i < MK; ++i) {
#pragma GCC unroll 16
    for (int r = 0; r < RR; ++r)
      scores[i * rows_pad + r] = simd::reduce_add(reinterpret_cast<simd::VecF<16>>(acc[i][r])) * scale;
  }
}

template <int MK, int RR>
MLA_AVX512_BF16_INLINE void score_dot_tile_bf16_rows(int rr, const uint16_t* keys, const uint16_t* q_rows, float scale,
                                                     int64_t rows_pad, const NextKeys<uint16_t>& next, float* scores) {
  if constexpr (RR > 1) {
    if (rr < RR) return score_dot_tile_bf16_rows<MK, RR - 1>(rr, keys, q_rows, scale, rows_pad, next, scores);
  }
  score_dot_tile_bf16<MK, RR>(keys, q_rows, scale, rows_pad, next, scores);
}

// out[i][d0 + ...] = out * rescale[i] + sum over key pairs of p_pairs . v_pairs, for RM rows and ND vectors of dims.
template <int RM, int ND>
MLA_AVX512_BF16_INLINE void output_tile_bf16(const uint16_t* v_pairs, int num_pairs, int d0, const uint16_t* p_pairs,
                                             int64_t rows_pad, const float* rescale, bool first, float* out) {
  __m512 acc[RM][ND];
#pragma GCC unroll 16
  for (int i = 0; i < RM; ++i) {
    const __m512 factor = _mm512_set1_ps(rescale[i]);
#pragma GCC unroll 16
    for (int n = 0; n < ND; ++n) {
      acc[i][n] =
          first ? _mm512_setzero_ps() : _mm512_mul_ps(_mm512_loadu_ps(out + i * kHeadDim + d0 + n * 16), factor);
    }
  }
  for (int jp = 0; jp < num_pairs; ++jp) {
    const uint16_t* v_row = v_pairs + (jp * kHeadDim + d0) * 2;
    __m512bh values[ND];
#pragma GCC unroll 16
    for (int n = 0; n < ND; ++n) values[n] = load_pairs(v_row + n * 32);
    const uint16_t* p_row = p_pairs + jp * rows_pad * 2;
#pragma GCC unroll 16
    for (int i = 0; i < RM; ++i) {
      const __m512bh prob = broadcast_pair(p_row + 2 * i);
#pragma GCC unroll 16
      for (int n = 0; n < ND; ++n) acc[i][n] = _mm512_dpbf16_ps(acc[i][n], prob, values[n]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < RM; ++i) {
#pragma GCC unroll 16
    for (int n = 0; n < ND; ++n) _mm512_storeu_ps(out + i * kHeadDim + d0 + n * 16, acc[i][n]);
  }
}

template <int MK, int NR>
MLA_AVX512_BF16_INLINE void score_tile_bf16_rows(int nr, const uint16_t* keys, const uint16_t* q_pairs,
                                                 int64_t rows_pad, float scale, const NextKeys<uint16_t>& next,
                                                 float* scores) {
  if constexpr (NR > 1) {
    if (nr < NR) return score_tile_bf16_rows<MK, NR - 1>(nr, keys, q_pairs, rows_pad, scale, next, scores);
  }
  score_tile_bf16<MK, NR>(keys, q_pairs, rows_pad, scale, next, scores);
}

template <int RM, int ND>
MLA_AVX512_BF16_INLINE void output_tile_bf16_rows(int rm, const uint16_t* v_pairs, int num_pairs, int d0,
                                                  const uint16_t* p_pairs, int64_t rows_pad, const float* rescale,
                                                  bool first, float* out) {
  if constexpr (RM > 1) {
    if (rm < RM) {
      return output_tile_bf16_rows<RM - 1, ND>(rm, v_pairs, num_pairs, d0, p_pairs, rows_pad, rescale, first, out);
    }
  }
  output_tile_bf16<RM, ND>(v_pairs, num_pairs, d0, p_pairs, rows_pad, rescale, first, out);
}

struct Bf16DotPolicy {
  using IO = Bf16IO;
  using Elem = uint16_t;
  static constexpr int kLanes = 16;
  static constexpr int kScoreKeys = 8;             // keys per score tile
  static constexpr int kScoreRowVecs = 3;          // vectors of 16 rows per score tile
  static constexpr int kOutRows = 6;               // rows per output tile
  static constexpr int kOutDimVecs = 4;            // vectors of 16 dims per output tile
  static constexpr int kDotKeys = 4;               // keys per dot-form score tile
  static constexpr int kDotRows = 4;               // rows per dot-form score tile
  static constexpr int kKeyMultiple = kScoreKeys;  // even, as the pairing needs

  struct Chunk {
    const uint16_t* keys;  // [num_padded][576] bf16: the chunk's keys, contiguous (in s.key_buf)
  };

  // Row form: q_pairs[k][r] = (q[r][2k], q[r][2k + 1]) as one 32-bit word. Dot form: rows [rows][576].
  static MLA_CPU_INLINE void pack_q(const DecodeParams& p, const TaskSpec& task, int64_t rows_pad, bool dot_form,
                                    const TaskScratch& s) {
    uint32_t* q_pairs = static_cast<uint32_t*>(s.q_packed);
    if (dot_form) {
      uint16_t* q_rows = static_cast<uint16_t*>(s.q_packed);
      for (int r = 0; r < task.row_count; ++r) {
        const RowOffsets at = row_offsets(p, task.batch_index, task.row_begin + r);
        std::memcpy(q_rows + r * kKeyDim, static_cast<const uint16_t*>(p.q) + at.q, sizeof(uint16_t) * kHeadDim);
        std::memcpy(q_rows + r * kKeyDim + kHeadDim, static_cast<const uint16_t*>(p.q_pe) + at.q_pe,
                    sizeof(uint16_t) * kRopeDim);
      }
      return;
    }
    alignas(64) uint32_t row_buf[kKeyDim / 2];
    for (int r = 0; r < task.row_count; ++r) {
      const RowOffsets at = row_offsets(p, task.batch_index, task.row_begin + r);
      std::memcpy(row_buf, static_cast<const uint16_t*>(p.q) + at.q, sizeof(uint16_t) * kHeadDim);
      std::memcpy(row_buf + kHeadDim / 2, static_cast<const uint16_t*>(p.q_pe) + at.q_pe, sizeof(uint16_t) * kRopeDim);
      for (int k = 0; k < kKeyDim / 2; ++k) q_pairs[k * rows_pad + r] = row_buf[k];
    }
    for (int k = 0; k < kKeyDim / 2; ++k) {
      for (int64_t r = task.row_count; r < rows_pad; ++r) q_pairs[k * rows_pad + r] = 0;
    }
  }

  // Copies the keys into one [num_padded][576] block and packs the values as pairs of keys:
  // v_pairs[j/2][pos] = (v[j][d], v[j+1][d]). The pairing uses the cheap in-lane unpack, so within each 32 dims
  // position pos holds dim d = [0-3, 8-11, 16-19, 24-27, 4-7, 12-15, 20-23, 28-31][pos]; the accumulator keeps
  // that order until natural_order() restores it once per output row.
  MLA_AVX512_BF16 static void prepare_keys(const ChunkKeys<uint16_t>& keys, const TaskScratch& s, Chunk& chunk) {
    uint16_t* block = reinterpret_cast<uint16_t*>(s.key_buf);
    chunk.keys = block;
    for (int j = 0; j < keys.num_padded; j += 2) {
      uint16_t* even = block + j * kKeyDim;
      uint16_t* odd = even + kKeyDim;
      uint16_t* pairs = s.v_pairs + j * kHeadDim;
      for (int d = 0; d < kHeadDim; d += 32) {
        const __m512i a = _mm512_loadu_si512(keys.kv[j] + d);
        const __m512i b = _mm512_loadu_si512(keys.kv[j + 1] + d);
        _mm512_storeu_si512(even + d, a);
        _mm512_storeu_si512(odd + d, b);
        _mm512_storeu_si512(pairs + 2 * d, _mm512_unpacklo_epi16(a, b));
        _mm512_storeu_si512(pairs + 2 * d + 32, _mm512_unpackhi_epi16(a, b));
      }
      for (int d = 0; d < kRopeDim; d += 32) {
        _mm512_storeu_si512(even + kHeadDim + d, _mm512_loadu_si512(keys.k_pe[j] + d));
        _mm512_storeu_si512(odd + kHeadDim + d, _mm512_loadu_si512(keys.k_pe[j + 1] + d));
      }
    }
  }

  MLA_AVX512_BF16 static void scores(const Chunk& chunk, const ChunkKeys<uint16_t>* next, int num_padded, int rows,
                                     int64_t rows_pad, float scale, bool dot_form, const TaskScratch& s) {
    const uint16_t* q_pairs = static_cast<const uint16_t*>(s.q_packed);
    if (dot_form) {
      for (int r = 0; r < rows; r += kDotRows) {
        for (int j = 0; j < num_padded; j += kDotKeys) {
          score_dot_tile_bf16_rows<kDotKeys, kDotRows>(std::min(kDotRows, rows - r), chunk.keys + j * kKeyDim,
                                                       q_pairs + r * kKeyDim, scale, rows_pad, next_keys(next, j),
                                                       s.scores + j * rows_pad + r);
        }
      }
      for (int j = 0; j < num_padded; ++j) {
        for (int64_t r = rows; r < rows_pad; ++r) s.scores[j * rows_pad + r] = 0.0f;
      }
      return;
    }
    const int row_vecs = static_cast<int>(rows_pad / 16);
    for (int rv = 0; rv < row_vecs; rv += kScoreRowVecs) {
      const int nr = std::min(kScoreRowVecs, row_vecs - rv);
      for (int j = 0; j < num_padded; j += kScoreKeys) {
        score_tile_bf16_rows<kScoreKeys, kScoreRowVecs>(nr, chunk.keys + j * kKeyDim, q_pairs + rv * 32, rows_pad,
                                                        scale, next_keys(next, j), s.scores + j * rows_pad + rv * 16);
      }
    }
  }

  static MLA_CPU_INLINE const float* natural_order(const float* acc_row, float* buffer) {
    using F = simd::VecF<16>;
    for (int d = 0; d < kHeadDim; d += 32) {
      const F low = simd::load<F>(acc_row + d);        // dims 0-3, 8-11, 16-19, 24-27 of this block
      const F high = simd::load<F>(acc_row + d + 16);  // dims 4-7, 12-15, 20-23, 28-31
      simd::store(buffer + d,
                  __builtin_shufflevector(low, high, 0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23));
      simd::store(buffer + d + 16,
                  __builtin_shufflevector(low, high, 8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31));
    }
    return buffer;
  }

  // Rounds the probabilities to bf16 pairs of keys, then adds P.V into the accumulator.
  MLA_AVX512_BF16 static void accumulate(const Chunk&, int num_padded, int rows, int64_t rows_pad, bool first,
                                         const TaskScratch& s) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                                6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const int num_pairs = num_padded / 2;
    for (int jp = 0; jp < num_pairs; ++jp) {
      const float* even = s.scores + 2 * jp * rows_pad;
      const float* odd = even + rows_pad;
      uint16_t* dst = s.p_pairs + jp * rows_pad * 2;
      for (int64_t r = 0; r < rows_pad; r += 16) {
        // cvtne2ps puts its second operand in the low half: [even 0..15 | odd 0..15], then interleave them.
        const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(odd + r), _mm512_loadu_ps(even + r));
        _mm512_storeu_si512(dst + 2 * r, _mm512_permutexvar_epi16(interleave, reinterpret_cast<__m512i>(both)));
      }
    }
    for (int d0 = 0; d0 < kHeadDim; d0 += kOutDimVecs * 16) {
      for (int r = 0; r < rows; r += kOutRows) {
        output_tile_bf16_rows<kOutRows, kOutDimVecs>(std::min(kOutRows, rows - r), s.v_pairs, num_pairs, d0,
                                                     s.p_pairs + 2 * r, rows_pad, s.rescale + r, first,
                                                     s.out_acc + static_cast<int64_t>(r) * kHeadDim);
      }
    }
  }
};

}  // namespace mla::cpu

#pragma GCC diagnostic pop

#endif  // x86
