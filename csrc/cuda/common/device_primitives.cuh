// Thin wrappers over the PTX the kernels use (cp.async, ldmatrix, mma.sync, named barriers) and the element-type
// traits, so the kernels read as tile algebra rather than inline assembly. sm_80 and newer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "params.h"

namespace mla::cuda {

// -inf: masked scores, empty rows' maxima and lse.
constexpr float kNegInf = -__builtin_huge_valf();

template <DType dtype>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat16> {
  using type = __half;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct ElementOf<DType::kFloat32> {
  using type = float;
};

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Two floats packed as one 32-bit register of T pairs (the mma A/B operand and 4-byte store format).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte global->shared copy; src_bytes = 0 writes zeros without reading src (invisible keys, padding rows).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// The memory clobber keeps the compiler from moving the caller's shared-memory reads of the copied data above the
// wait: a thread that reads back only its own copies needs no barrier after it, and nothing else would stop them.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D += A(16x16, row) * B(16x8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A(16x8, row) * B(8x8, col) on TF32 operands (fp32 bit patterns; the tensor core reads their top 19 bits),
// fp32 accumulators.
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x as hi + lo: hi is x rounded to TF32's 10 mantissa bits (to nearest, ties away: add half a unit to the magnitude
// bits, clear the 13 below; cvt.rna.tf32.f32 is a four-instruction sequence on sm_90), lo = x - hi exactly, which
// the tensor core truncates to TF32 when it reads it. Products of such pairs taken as hi.hi + hi.lo + lo.hi
// ("3xTF32") keep about 21 bits, close to fp32's 24. inf stays inf (lo is NaN then: callers take an infinite product
// from hi.hi alone). A NaN stays NaN unless its payload lies only in the 13 low bits (never the quiet NaN arithmetic
// makes): such a NaN reads as +-inf, as it would to the tensor core itself, which drops those bits too.
struct Tf32Pair {
  uint32_t hi;
  uint32_t lo;
};
__device__ __forceinline__ Tf32Pair split_tf32(float x) {
  const uint32_t hi = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  return {hi, __float_as_uint(x - __uint_as_float(hi))};
}

// The sum over the warp's lanes, in every lane; all 32 lanes call it.
template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Inclusive prefix sum over the warp's lanes (lane i gets the sum of lanes 0..i); all 32 lanes call it.
template <typename V>
__device__ __forceinline__ V warp_inclusive_sum(V value) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const V v = __shfl_up_sync(0xffffffffu, value, off);
    if (lane >= off) value += v;
  }
  return value;
}

// 2^x by the special function unit alone (ex2.approx.ftz), without the scaling exp2f wraps around it for results
// below 2^-126. The softmax kernels' arguments are a score or an old max minus the running max: <= 0 (<= 8 in the
// sm_90a kernel, whose running max may lag that far), -inf (masked key, or no key yet) or NaN (a NaN score, inf -
// inf). As with exp2f, -inf gives +0 and NaN gives NaN. ftz only flushes results below 2^-126 to zero: such a P term is
// under 2^-126 of the row maximum's own term, which is at least 1 (so the row sum is >= 1), i.e. far below the 2^-24
// resolution of that fp32 sum, and it moves an output row (divided by that sum) by under 2^-126 * max|v|, nothing at
// fp32, bf16 or fp16 precision. A flushed rescale factor likewise drops an old part weighing under 2^-126 * (keys so
// far) against the new maximum's term.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Barrier over a subset of the CTA's warps (id 0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// __syncthreads for code that a warp may reach diverged (one lane still finishing work its neighbours skipped):
// the non-aligned barrier counts threads, not warps, so it waits for every thread of the CTA.
__device__ __forceinline__ void cta_barrier_all_threads() {
  asm volatile("barrier.sync 0;\n" ::: "memory");
}
// One-way signal through a named barrier: the calling warps arrive without waiting; the barrier completes once
// `threads` have arrived, among them the warps that wait with named_barrier(id, threads). Memory accesses before
// the arrive are performed for the waiters when it completes. A warp must not arrive twice before that.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Configurations larger than sm_80's shared memory are launched on sm_90 only; elsewhere their kernel body is left
// out (it would not fit, and compiling it costs time).
template <bool kSm90Only>
__host__ __device__ constexpr bool body_compiled_here() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return !kSm90Only;
#else
  return true;
#endif
}

// Programmatic dependent launch (sm_90+; no-ops elsewhere and when the launch did not ask for it). A kernel launched
// with it may start while the previous kernel on the stream is finishing, so it must wait before touching memory.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel (if launched for it) start its CTAs once every CTA of this grid has run this or exited.
__device__ __forceinline__ void allow_next_grid_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Thread-block clusters (sm_90+; launched with a cluster dimension). Callers compile these for sm_90 only.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ uint32_t cluster_num_ctas() {
  uint32_t count;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(count));
  return count;
}
// Every thread of every CTA of the cluster; shared-memory writes before it are visible to the others' reads after.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The address of this CTA's shared-memory location `addr` in CTA `rank` of the cluster (distributed shared memory).
__device__ __forceinline__ uint32_t cluster_shared_address(uint32_t addr, uint32_t rank) {
  uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(addr), "r"(rank));
  return mapped;
}
__device__ __forceinline__ float load_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 load_cluster_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
#endif

}  // namespace mla::cuda
