// The sm_90a kernel's tiles from a float8_e4m3fn cache stored per tensor (DecodeParams::cache_format). The copy engine
// brings each part's e4m3 bytes into the back of the part's own space in the stage ("raw" blocks: 64 keys x 64 bytes,
// 4 KB, unswizzled); thread 0 of the producer warpgroup issues the copies as soon as a part's space is free, so they
// run ahead of the conversion as a 16-bit cache's do. Warps 1-3 (96 threads) convert the bytes in place into q's
// dtype in the swizzled block layout that a 16-bit cache's tiles get from TMA (cta_tile_sm90.cuh), so the consumers'
// wgmma loop is the same. Every e4m3 value is an fp16 and a bf16 value: the conversion is exact, and the scale stays
// out of it (the consumers fold it into the softmax scale and the output). Each tile is converted once per CTA for its
// 64 query rows.
//
// In place: a V half is 4 blocks (32 KB) whose raw bytes (16 KB) sit in its back half, raw block j at 16 KB + 4 KB j.
// Writing block j covers raw blocks 2j - 4 and 2j - 3: blocks 0 and 1 cover nothing, block 2 raw blocks 0 and 1
// (converted before a barrier), block 3 raw blocks 2 and 3 (its own bytes: read before a barrier). The k_pe block
// holds its raw block at 4 KB and covers it: read before a barrier.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/device_primitives.cuh"
#include "cuda/common/fp8_fragments.cuh"
#include "cuda/sm90/cta_tile_sm90.cuh"

namespace mla::cuda::sm90 {

struct Fp8Tile {
  static constexpr int kThreads = 96;  // warps 1-3 of the producer warpgroup convert
  static constexpr int kRawBlockBytes = Sm90Tile::kKeyTile * Sm90Tile::kBlockCols;  // 64 keys x 64 e4m3 bytes
  static constexpr int kHalfRawOffset = Sm90Tile::kHalfBlocks * kRawBlockBytes;     // 16 KB into a V half
  static constexpr int kRopeRawOffset = kRawBlockBytes;                             // 4 KB into the k_pe block
  static constexpr int kPrefetchTiles = 3;  // tiles asked of L2 ahead of their copies
  static constexpr int kBarrier = 6;        // named barrier of the converting threads (cta_tile_sm90.cuh uses 1-5)
  // A part's e4m3 bytes (a V half's 4 raw blocks, or k_pe's one) and where in its space they land.
  static constexpr int raw_bytes(int part) {
    return part < Sm90Tile::kHalves ? Sm90Tile::kHalfBlocks * kRawBlockBytes : kRawBlockBytes;
  }
  static constexpr int raw_offset(int part) { return part < Sm90Tile::kHalves ? kHalfRawOffset : kRopeRawOffset; }
  static constexpr int kChunks = kRawBlockBytes / 16;  // 16-byte chunks of a raw block
  static constexpr int kChunksPerThread = (kChunks + kThreads - 1) / kThreads;
  static_assert(kHalfRawOffset + Sm90Tile::kHalfBlocks * kRawBlockBytes ==
                    Sm90Tile::kHalfBlocks * Sm90Tile::kBlockBytes,
                "a half's raw bytes fill its back half");
  static_assert(kRopeRawOffset + kRawBlockBytes == Sm90Tile::kBlockBytes, "k_pe's raw bytes fill its back half");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

namespace fp8_detail {

using C = Sm90Tile;
using F = Fp8Tile;

// Four e4m3 values (a word, low byte first) as two T pairs, exactly: fp16 holds every e4m3 value, and bf16 every
// value of those.
template <typename T>
__device__ __forceinline__ uint2 e4m3x4_to(uint32_t word) {
  uint2 pairs;
  e4m3x4_to_half2x2(word, pairs.x, pairs.y);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const auto to_bf16 = [](uint32_t pair) {
      return pack2<__nv_bfloat16>(__half2float(__ushort_as_half(static_cast<unsigned short>(pair & 0xffffu))),
                                  __half2float(__ushort_as_half(static_cast<unsigned short>(pair >> 16))));
    };
    pairs = make_uint2(to_bf16(pairs.x), to_bf16(pairs.y));
  }
  return pairs;
}

__device__ __forceinline__ uint4 load_chunk(uint32_t src) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(src));
  return v;
}

__device__ __forceinline__ void store_chunk(uint32_t dst, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// Raw chunk i of a raw block (key i / 4, values [16 (i % 4), +16) of its 64) is chunks 2 (i % 4) and 2 (i % 4) + 1
// of that key's row in the converted block. Lanes 8m..8m+7 hold keys 2m and 2m + 1, whose swizzles differ in the low
// bit: each store phase hits eight distinct bank groups.
template <typename T>
__device__ __forceinline__ void store_converted(uint32_t block, int i, const uint4& raw) {
  const int key = i >> 2;
  const int col = (i & 3) * 2;
  const uint32_t row = block + key * 128;
  const uint2 x = e4m3x4_to<T>(raw.x), y = e4m3x4_to<T>(raw.y), z = e4m3x4_to<T>(raw.z), w = e4m3x4_to<T>(raw.w);
  store_chunk(row + ((col ^ (key & 7)) << 4), x.x, x.y, y.x, y.y);
  store_chunk(row + (((col + 1) ^ (key & 7)) << 4), z.x, z.y, w.x, w.y);
}

// This thread's chunks of raw block `raw` into converted block `block`.
template <typename T>
__device__ __forceinline__ void convert_block(uint32_t raw, uint32_t block, int thread) {
#pragma unroll
  for (int k = 0; k < F::kChunksPerThread; ++k) {
    const int i = thread + k * F::kThreads;
    if (i < F::kChunks) store_converted<T>(block, i, load_chunk(raw + 16 * i));
  }
}

// Converts one raw block over its own bytes (and bytes others may still read): every converting thread reads its
// chunks, they meet, then each writes.
template <typename T>
__device__ __forceinline__ void convert_block_over_itself(uint32_t raw, uint32_t block, int thread) {
  uint4 chunks[F::kChunksPerThread];
#pragma unroll
  for (int k = 0; k < F::kChunksPerThread; ++k) {
    const int i = thread + k * F::kThreads;
    if (i < F::kChunks) chunks[k] = load_chunk(raw + 16 * i);
  }
  named_barrier(F::kBarrier, F::kThreads);
#pragma unroll
  for (int k = 0; k < F::kChunksPerThread; ++k) {
    const int i = thread + k * F::kThreads;
    if (i < F::kChunks) store_converted<T>(block, i, chunks[k]);
  }
}

// A V half (4 blocks from `half`) from its raw bytes at half + 16 KB (see the top of the file for the order).
template <typename T>
__device__ __forceinline__ void convert_half_in_place(uint32_t half, int thread) {
  const uint32_t raw = half + F::kHalfRawOffset;
  convert_block<T>(raw, half, thread);
  convert_block<T>(raw + F::kRawBlockBytes, half + C::kBlockBytes, thread);
  named_barrier(F::kBarrier, F::kThreads);  // raw blocks 0 and 1 read: block 2 covers them
  convert_block<T>(raw + 2 * F::kRawBlockBytes, half + 2 * C::kBlockBytes, thread);
  convert_block_over_itself<T>(raw + 3 * F::kRawBlockBytes, half + 3 * C::kBlockBytes, thread);
}

// The k_pe block from its raw bytes at 4 KB.
template <typename T>
__device__ __forceinline__ void convert_rope_in_place(uint32_t rope, int thread) {
  convert_block_over_itself<T>(rope + F::kRopeRawOffset, rope, thread);
}

}  // namespace fp8_detail

#endif  // sm_90a

}  // namespace mla::cuda::sm90
