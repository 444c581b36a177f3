// Hopper (sm_90a) warpgroup matrix multiply: shared-memory matrix descriptors, wgmma.mma_async for the two shapes
// the decode kernel uses, and the fences / commit / wait around them. Only meaningful inside code compiled for
// sm_90a (the callers guard on __CUDA_ARCH_FEAT_SM90_ALL).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace mla::cuda::sm90 {

// Descriptor of an operand tile stored with the 128-byte swizzle (rows of 128 bytes, 16-byte chunk c of row r at
// chunk c ^ (r % 8), 8-row groups of 1024 bytes; the tile base must be 1024-byte aligned).
//   K-major (A = Q or P, B = K):  stride_bytes = distance between 8-row groups (1024); leading_bytes is unused.
//   MN-major (B = V, transposed): leading_bytes = distance between 64-column blocks, stride_bytes = between 8-key
//   groups.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  uint64_t desc = (smem_addr & 0x3FFFFu) >> 4;
  desc |= static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFFu) << 16;
  desc |= static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFFu) << 32;
  desc |= uint64_t{1} << 62;  // 128-byte swizzle
  return desc;
}

// `desc` with its address advanced by `offset_bytes` (a multiple of 16), as one 32-bit add: shared-memory addresses
// stay below 2^18, so the address field (bits 0-13, address / 16) never carries into the fields above it, and the
// upper word (stride, swizzle) stays a constant the compiler sees. Each wgmma's descriptors are then one add from a
// base worked out once, instead of a mask, shift and or per operand.
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t desc, uint32_t offset_bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (offset_bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// Orders register accesses before the wgmma that reads/writes the accumulators.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of an accumulator register across wgmma issue / wait.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Writes by ordinary stores to shared memory become visible to the async proxy (wgmma operands, TMA).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Each instruction's asm is written once, in a macro taking its operand types ("bf16.bf16" or "f16.f16").

// D(64x64, fp32) (+)= A(64x16, K-major smem) . B(64x16, K-major smem)^T. SCALE_D "0" overwrites D; OUT "=f" then
// declares D's old value dead (write-only operands), so D holds no registers between its last read and the first
// product of the next tile. SCALE_D "1" with OUT "+f" accumulates.
#define MLA_WGMMA_M64N64K16_SS(TYPES, SCALE_D, OUT)                                                                 \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES                                                  \
               " {"                                                                                                 \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                             \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                     \
               "}, %32, %33, " SCALE_D ", 1, 1, 0, 0;\n"                                                            \
               : OUT(d[0]), OUT(d[1]), OUT(d[2]), OUT(d[3]), OUT(d[4]), OUT(d[5]), OUT(d[6]), OUT(d[7]), OUT(d[8]), \
                 OUT(d[9]), OUT(d[10]), OUT(d[11]), OUT(d[12]), OUT(d[13]), OUT(d[14]), OUT(d[15]), OUT(d[16]),     \
                 OUT(d[17]), OUT(d[18]), OUT(d[19]), OUT(d[20]), OUT(d[21]), OUT(d[22]), OUT(d[23]), OUT(d[24]),    \
                 OUT(d[25]), OUT(d[26]), OUT(d[27]), OUT(d[28]), OUT(d[29]), OUT(d[30]), OUT(d[31])                 \
               : "l"(desc_a), "l"(desc_b))

template <typename T, bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "wgmma wrappers take __nv_bfloat16 or __half");
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (kBf16 && kAccumulate) {
    MLA_WGMMA_M64N64K16_SS("bf16.bf16", "1", "+f");
  } else if constexpr (kBf16) {
    MLA_WGMMA_M64N64K16_SS("bf16.bf16", "0", "=f");
  } else if constexpr (kAccumulate) {
    MLA_WGMMA_M64N64K16_SS("f16.f16", "1", "+f");
  } else {
    MLA_WGMMA_M64N64K16_SS("f16.f16", "0", "=f");
  }
}

// D(64x256, fp32) (+)= A(64x16, K-major smem) . B(16x256, MN-major smem, i.e. stored [k][n]).
#define MLA_WGMMA_M64N256K16_SS_TB(TYPES)                                                                            \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPES                                                           \
      " {"                                                                                                           \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                       \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                             \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                             \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                             \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                             \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                             \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                 \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"               \
                                                                                                                     \
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"                                                                           \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),  \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),      \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),      \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),      \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),      \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),      \
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),      \
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),      \
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),      \
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),      \
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), \
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),            \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),            \
        "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),            \
        "+f"(d[126]), "+f"(d[127])                                                                                   \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16_ss_tb(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                       int accumulate) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    MLA_WGMMA_M64N256K16_SS_TB("bf16.bf16");
  } else {
    static_assert(std::is_same_v<T, __half>, "wgmma wrappers take __nv_bfloat16 or __half");
    MLA_WGMMA_M64N256K16_SS_TB("f16.f16");
  }
}

#undef MLA_WGMMA_M64N256K16_SS_TB
#undef MLA_WGMMA_M64N64K16_SS

}  // namespace mla::cuda::sm90
