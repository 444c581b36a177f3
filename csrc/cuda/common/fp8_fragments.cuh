// mma fragments from float8_e4m3fn bytes and queries for the fp8-cache kernel (kernels/few_rows_fp8.cuh). Every e4m3
// value is an fp16 value (4 significant bits, exponents -9 to 8), so the cache's values convert exactly and its mmas
// run in fp16. bf16 queries go to fp16 scaled by a power of two that keeps the warp's largest value below 2^15: exact
// down to 2^-29 of that maximum (fp16's subnormals below), far under what the fp32 sums resolve.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_primitives.cuh"

namespace mla::cuda {

// The two e4m3 pairs of `word` (bytes 0-1 and 2-3) as fp16 pairs, low byte in the low half. From sm_89 on, both
// conversions read their half of `word` in place (the high one as an operand half, no shift); before, the intrinsic
// converts in software.
__device__ __forceinline__ void e4m3x4_to_half2x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
#else
  const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
  const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
  lo = static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(a.y) << 16);
  hi = static_cast<uint32_t>(b.x) | (static_cast<uint32_t>(b.y) << 16);
#endif
}

// Bytes i of x and of y as one e4m3 pair (x's in the low byte), for i = 0..3: out[i / 2] holds pairs i and i + 1.
__device__ __forceinline__ void interleave_bytes(uint32_t x, uint32_t y, uint32_t (&out)[2]) {
  out[0] = __byte_perm(x, y, 0x5140);  // x.b0 y.b0 x.b1 y.b1
  out[1] = __byte_perm(x, y, 0x7362);  // x.b2 y.b2 x.b3 y.b3
}

// Largest |value| of a bf16 pair.
__device__ __forceinline__ float bf16x2_abs_max(uint32_t pair) {
  return fmaxf(fabsf(__uint_as_float(pair << 16)), fabsf(__uint_as_float(pair & 0xffff0000u)));
}

// A bf16 pair times `factor` (a power of two) as an fp16 pair.
__device__ __forceinline__ uint32_t bf16x2_to_half2(uint32_t pair, float factor) {
  return pack2<__half>(__uint_as_float(pair << 16) * factor, __uint_as_float(pair & 0xffff0000u) * factor);
}

// The exponent e with 2^14 <= m * 2^e < 2^15 (0 for 0, inf or NaN), kept where 2^e and 2^-e are normal floats.
__device__ __forceinline__ int fp16_exponent_for(float m) {
  if (!(m > 0.f) || m > 3.4e38f) return 0;
  int x;
  frexpf(m, &x);  // m = f 2^x, f in [0.5, 1)
  return max(-120, min(120, 15 - x));
}

}  // namespace mla::cuda
