// Portable SIMD through GCC/Clang vector extensions. Nothing here carries a target attribute: the helpers are
// always inlined and take the ISA of the function they land in, so one source becomes zmm code in the AVX-512
// entry points, ymm code in the AVX2 ones and xmm code in the baseline one (see decode_cpu.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#define MLA_CPU_INLINE inline __attribute__((always_inline))

// Vector types in inline helpers trigger "ABI changes with AVX" notes; nothing here crosses an ABI boundary.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mla::cpu::simd {

template <int W>
struct VecTypes;
template <>
struct VecTypes<4> {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
  typedef uint32_t U __attribute__((vector_size(16)));
  typedef uint16_t H __attribute__((vector_size(8)));
};
template <>
struct VecTypes<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
  typedef uint32_t U __attribute__((vector_size(32)));
  typedef uint16_t H __attribute__((vector_size(16)));
};
template <>
struct VecTypes<16> {
  typedef float F __attribute__((vector_size(64)));
  typedef int32_t I __attribute__((vector_size(64)));
  typedef uint32_t U __attribute__((vector_size(64)));
  typedef uint16_t H __attribute__((vector_size(32)));
};

template <int W>
using VecF = typename VecTypes<W>::F;  // W floats
template <int W>
using VecI = typename VecTypes<W>::I;  // W int32 (also the type of a float comparison)

// Unaligned, aliasing-safe vector loads and stores.
template <class V, class T>
MLA_CPU_INLINE V load(const T* p) {
  typedef V Unaligned __attribute__((aligned(alignof(T)), may_alias));
  return *reinterpret_cast<const Unaligned*>(p);
}

template <class V, class T>
MLA_CPU_INLINE void store(T* p, V v) {
  typedef V Unaligned __attribute__((aligned(alignof(T)), may_alias));
  *reinterpret_cast<Unaligned*>(p) = v;
}

template <int W>
MLA_CPU_INLINE VecF<W> splat(float x) {
  return VecF<W>{} + x;
}

template <int W>
MLA_CPU_INLINE VecF<W> max(VecF<W> a, VecF<W> b) {
  return a > b ? a : b;
}

// 2^x to ~1 ulp for x in [-126, 128); exactly 0 below -126 (so 2^-inf = 0 and masked keys get weight 0).
template <int W>
MLA_CPU_INLINE VecF<W> exp2(VecF<W> x) {
  using F = VecF<W>;
  using I = VecI<W>;
  const F lowest = splat<W>(-126.0f);
  const F highest = splat<W>(127.0f);
  F xc = x < lowest ? lowest : x;
  xc = xc > highest ? highest : xc;
  const F round_magic = splat<W>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const F n = (xc + round_magic) - round_magic;
  const F f = xc - n;  // in [-0.5, 0.5]
  // 2^f = e^(f ln2): Taylor terms up to degree 7, error below 1e-8 on [-0.5, 0.5].
  F poly = splat<W>(1.5252733804059840e-05f);
  poly = poly * f + 1.5403530393381606e-04f;
  poly = poly * f + 1.3333558146428443e-03f;
  poly = poly * f + 9.6181291076284772e-03f;
  poly = poly * f + 5.5504108664821580e-02f;
  poly = poly * f + 2.4022650695910071e-01f;
  poly = poly * f + 6.9314718055994531e-01f;
  poly = poly * f + 1.0f;
  const I exponent = __builtin_convertvector(n, I) << 23;
  const F scaled = reinterpret_cast<F>(reinterpret_cast<I>(poly) + exponent);
  return x < lowest ? F{} : scaled;
}

// Sum of the W lanes (a tree of halving adds).
MLA_CPU_INLINE float reduce_add(VecF<4> v) {
  typedef float F2 __attribute__((vector_size(8)));
  const F2 pair = __builtin_shufflevector(v, v, 0, 1) + __builtin_shufflevector(v, v, 2, 3);
  return pair[0] + pair[1];
}
MLA_CPU_INLINE float reduce_add(VecF<8> v) {
  return reduce_add(__builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
MLA_CPU_INLINE float reduce_add(VecF<16> v) {
  return reduce_add(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                    __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

// bf16 <-> fp32 (bf16 is the top half of an fp32; rounding to nearest even, NaN kept a quiet NaN).
template <int W>
MLA_CPU_INLINE VecF<W> bf16_to_float(const uint16_t* src) {
  using U = typename VecTypes<W>::U;
  const U wide = __builtin_convertvector(load<typename VecTypes<W>::H>(src), U);
  return reinterpret_cast<VecF<W>>(wide << 16);
}

template <int W>
MLA_CPU_INLINE void float_to_bf16(VecF<W> v, uint16_t* dst) {
  using U = typename VecTypes<W>::U;
  using I = VecI<W>;
  const U bits = reinterpret_cast<U>(v);
  const U rounded = (bits + (((bits >> 16) & 1u) + 0x7fffu)) >> 16;
  const U quiet_nan = U{} + 0x7fc0u;
  const U result = reinterpret_cast<U>(v != v ? reinterpret_cast<I>(quiet_nan) : reinterpret_cast<I>(rounded));
  store(dst, __builtin_convertvector(result, typename VecTypes<W>::H));
}

}  // namespace mla::cpu::simd

#pragma GCC diagnostic pop
