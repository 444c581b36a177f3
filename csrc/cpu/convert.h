// Row conversions between the cache / output dtypes and fp32. Each *IO struct names the stored element type and
// converts whole rows (n a multiple of 16). fp16 uses F16C where the CPU has it: those helpers carry their own
// target attribute, so they are called (not force-inlined) from the generic code.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "cpu/simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MLA_CPU_X86 1
#endif

// Vector types in inline helpers trigger "ABI changes with AVX" notes; nothing here crosses an ABI boundary.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mla::cpu {

struct Fp32IO {
  using Elem = float;
  template <int W>
  static MLA_CPU_INLINE void to_float(const float* src, float* dst, int n) {
    std::memcpy(dst, src, sizeof(float) * n);
  }
  template <int W>
  static MLA_CPU_INLINE void from_float(const float* src, float scale, float* dst, int n) {
    using F = simd::VecF<W>;
    for (int i = 0; i < n; i += W) simd::store(dst + i, simd::load<F>(src + i) * scale);
  }
};

struct Bf16IO {
  using Elem = uint16_t;  // bf16 bits
  template <int W>
  static MLA_CPU_INLINE void to_float(const uint16_t* src, float* dst, int n) {
    for (int i = 0; i < n; i += W) simd::store(dst + i, simd::bf16_to_float<W>(src + i));
  }
  template <int W>
  static MLA_CPU_INLINE void from_float(const float* src, float scale, uint16_t* dst, int n) {
    using F = simd::VecF<W>;
    for (int i = 0; i < n; i += W) simd::float_to_bf16<W>(simd::load<F>(src + i) * scale, dst + i);
  }
};

// fp16 without F16C: c10's scalar conversion (round to nearest even).
struct HalfIO {
  using Elem = uint16_t;  // fp16 bits
  template <int W>
  static MLA_CPU_INLINE void to_float(const uint16_t* src, float* dst, int n) {
    for (int i = 0; i < n; ++i) dst[i] = static_cast<float>(c10::Half(src[i], c10::Half::from_bits()));
  }
  template <int W>
  static MLA_CPU_INLINE void from_float(const float* src, float scale, uint16_t* dst, int n) {
    for (int i = 0; i < n; ++i) dst[i] = c10::Half(src[i] * scale).x;
  }
};

#ifdef MLA_CPU_X86
__attribute__((target("avx,f16c"))) inline void half_to_float_f16c(const uint16_t* src, float* dst, int n) {
  for (int i = 0; i < n; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
  }
}

__attribute__((target("avx,f16c"))) inline void float_to_half_f16c(const float* src, float scale, uint16_t* dst,
                                                                   int n) {
  const __m256 factor = _mm256_set1_ps(scale);
  for (int i = 0; i < n; i += 8) {
    const __m256 value = _mm256_mul_ps(_mm256_loadu_ps(src + i), factor);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT));
  }
}

// fp16 with F16C (every AVX2 and AVX-512 CPU has it).
struct HalfF16cIO {
  using Elem = uint16_t;
  template <int W>
  static MLA_CPU_INLINE void to_float(const uint16_t* src, float* dst, int n) {
    half_to_float_f16c(src, dst, n);
  }
  template <int W>
  static MLA_CPU_INLINE void from_float(const float* src, float scale, uint16_t* dst, int n) {
    float_to_half_f16c(src, scale, dst, n);
  }
};
#endif

}  // namespace mla::cpu

#pragma GCC diagnostic pop
