// Split-KV MLA decode main kernel for fp32 inputs on the tensor cores (mma.sync m16n8k8, TF32). Each operand is
// split into two TF32 parts, x = hi + lo, and each product taken as hi.hi + hi.lo + lo.hi ("3xTF32"): about 21 bits
// of every product survive (fp32 keeps 24), so results stay within ~1e-6 of a float64 reference. It keeps the
// structure of the dim-split kernel (decode_kernel_dim_split.cuh); its cost is instruction issue (the operand
// splits and three products per product), not bytes (perf-notes v23).
//
// One CTA = (sequence, 16 query rows, KV split), 8 warps. Warp w
//   - computes partial scores over k8 steps w, w + 8, ... (72 dims) for all keys of the tile, with Q split into
//     registers once, and independent accumulator chains per key block, k-step residue and product size; taking
//     every eighth step puts the swizzled chunks a lane reads at a lane constant plus an immediate;
//   - adds the eight warps' partial scores (exchanged through shared memory in fragment order, each score summed
//     by one thread, so every warp holds bitwise the same scores) and runs the online softmax redundantly; the score
//     accumulator layout is the A layout of P . V once its keys are taken in the order (2t, 2t + 1) per 8-key step;
//   - accumulates output column blocks w, w + 8, ... (64 columns): each tile's P . V in its own accumulator first,
//     then added to the running output (adding every product straight in lets fp32 rounding grow with the split's
//     length, as in the CUDA-core kernel).
// Three barriers per tile: the pipeline's and two for the partial-score exchange.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../params.h"
#include "decode_work.cuh"
#include "device_primitives.cuh"
#include "fragment_softmax.cuh"
#include "tile_loader.cuh"

namespace mla::cuda {

template <int kKeyTile_, int kStages_, bool kSm90Only_>
struct Tf32Tile {
  using Element = float;
  static constexpr int kRowTile = 16;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeyTile = kKeyTile_;
  static constexpr int kStages = kStages_;
  static constexpr bool kSm90Only = kSm90Only_;
  static constexpr bool kWalksRanges = true;  // balanced splits: walks ranges (several sequences per CTA)

  static constexpr int kKSteps = (kHeadDim + kRopeDim) / 8;  // 72 k8 steps over the 576 dims
  static constexpr int kWarpKSteps = kKSteps / kWarps;       // 9 per warp: k-steps w, w + 8, ...
  static constexpr int kKeyNTiles = kKeyTile / 8;
  static constexpr int kColNTiles = kHeadDim / 8 / kWarps;  // 8 per warp: column blocks w, w + 8, ...
  static constexpr int kParities = 3;                       // score accumulators per k-step residue mod 3

  using Row = RowLayout<float>;
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kRowTile * Row::kBytes;
  static constexpr int kPartialOffset = kKvOffset + kStages * kKeyTile * Row::kBytes;  // [warp][n-tile][lane] float4
  static constexpr int kScoreOffset = kPartialOffset + kWarps * kKeyNTiles * 32 * 16;  // [n-tile][lane] float4
  static constexpr int kValidOffset = kScoreOffset + kKeyNTiles * 32 * 16;
  static constexpr int kSmemBytes =
      kValidOffset + KvPipeline<float, kRowTile, kKeyTile, kStages, kThreads>::kValidBytes;

  static_assert(kKSteps % kWarps == 0 && kWarpKSteps % kParities == 0, "k-steps split evenly");
  static_assert(kKeyNTiles * 32 * 4 == kThreads, "one thread per score of the tile sums the warps' partials");
  static_assert(kKeyTile % 8 == 0 && kKeyTile <= 32, "key tile: whole 8-key blocks");
  static_assert(kStages >= 2, "pipeline depth");
};

template <class Cfg>
__device__ __forceinline__ void decode_tf32_body(const DecodeParams& p, const CtaWork& w) {
  using Row = typename Cfg::Row;
  constexpr int kW = Cfg::kWarps;
  constexpr int kNT = Cfg::kKeyNTiles;
  constexpr int kCT = Cfg::kColNTiles;
  constexpr int kWKS = Cfg::kWarpKSteps;
  constexpr int kPar = Cfg::kParities;
  constexpr int kRowBytes = Row::kBytes;
  constexpr int kStepBytes = 2 * kW * 16;  // chunk distance between a warp's consecutive k-steps / column blocks

  extern __shared__ __align__(128) uint8_t smem[];
  const uint8_t* q_smem = smem + Cfg::kQOffset;
  float4* partial = reinterpret_cast<float4*>(smem + Cfg::kPartialOffset);
  float4* scores = reinterpret_cast<float4*>(smem + Cfg::kScoreOffset);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;  // fragment row (A, C) / column (B)
  const int t = lane & 3;   // fragment column (A) / row (B)
  const float scale_log2 = p.sm_scale * 1.4426950408889634f;

  // Warp w takes k-steps w + 8 j (chunks 2w + 16 j and 2w + 1 + 16 j) and column blocks w + 8 j (chunk
  // 2w + g / 4 + 16 j). Rows read by this lane have r % 8 = g (Q, K) or 2t, 2t + 1 (V), so the swizzled chunk is
  // 16 j plus a lane constant: every load below is a base register plus an immediate.
  const int qk_off0 = (((2 * warp) ^ g) << 4) + 4 * t;
  const int qk_off1 = (((2 * warp + 1) ^ g) << 4) + 4 * t;
  const int v_chunk = 2 * warp + (g >> 2);
  const uint8_t* v_row0 = smem + Cfg::kKvOffset + 2 * t * kRowBytes + ((v_chunk ^ (2 * t)) << 4) + 4 * (g & 3);
  const uint8_t* v_row1 =
      smem + Cfg::kKvOffset + (2 * t + 1) * kRowBytes + ((v_chunk ^ (2 * t + 1)) << 4) + 4 * (g & 3);

  int row_limit[2];  // rows g and g + 8
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = w.row_begin + g + half * 8;
    row_limit[half] = r < w.rows ? row_key_limit(p, w.seq_len, r) : 0;
  }

  KvPipeline<float, Cfg::kRowTile, Cfg::kKeyTile, Cfg::kStages, Cfg::kThreads> pipe{
      smem + Cfg::kKvOffset, smem + Cfg::kValidOffset, {}};
  pipe.start(p, w, smem + Cfg::kQOffset);

  float acc[kCT][4];
#pragma unroll
  for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[ct][e] = 0.f;
  float row_max[2] = {kNegInf, kNegInf};  // running max, log2 domain (scaled)
  float row_sum[2] = {0.f, 0.f};          // this thread's share of the running denominator
  uint32_t q_hi[kWKS][4], q_lo[kWKS][4];  // A fragments of this warp's k-steps, split once (with tile 0)

  for (int tile = 0; tile < w.num_tiles; ++tile) {
    pipe.advance(p, w, tile);
    const int stage_bytes = (tile % Cfg::kStages) * Cfg::kKeyTile * kRowBytes;
    const uint8_t* kv_tile = pipe.stage(tile);
    const uint8_t* tile_valid = pipe.key_valid(tile);
    const int tile_begin = w.key_begin + tile * Cfg::kKeyTile;

    if (tile == 0) {  // the query block arrived with tile 0
#pragma unroll
      for (int j = 0; j < kWKS; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // a0..a3: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
          const int off = (e & 1) * 8 * kRowBytes + ((e >> 1) ? qk_off1 : qk_off0) + j * kStepBytes;
          const Tf32Pair split = split_tf32(*reinterpret_cast<const float*>(q_smem + g * kRowBytes + off));
          q_hi[j][e] = split.hi;
          q_lo[j][e] = split.lo;
        }
      }
    }

    // ---- partial scores over this warp's k-steps, all keys of the tile (B: key 8 nt + g) ----
    float big[kPar][kNT][4];    // hi . hi
    float small[kPar][kNT][4];  // hi . lo + lo . hi
#pragma unroll
    for (int par = 0; par < kPar; ++par)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) big[par][nt][e] = small[par][nt][e] = 0.f;
    const uint8_t* k_row = kv_tile + g * kRowBytes;
#pragma unroll
    for (int j = 0; j < kWKS; ++j) {
      const int par = j % kPar;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const uint8_t* key = k_row + nt * 8 * kRowBytes + j * kStepBytes;
        const Tf32Pair b0 = split_tf32(*reinterpret_cast<const float*>(key + qk_off0));
        const Tf32Pair b1 = split_tf32(*reinterpret_cast<const float*>(key + qk_off1));
        mma_1688_tf32(small[par][nt], q_lo[j], b0.hi, b1.hi);
        mma_1688_tf32(small[par][nt], q_hi[j], b0.lo, b1.lo);
        mma_1688_tf32(big[par][nt], q_hi[j], b0.hi, b1.hi);
      }
    }
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float b = big[0][nt][e];
        float c = small[0][nt][e];
#pragma unroll
        for (int par = 1; par < kPar; ++par) {
          b += big[par][nt][e];
          c += small[par][nt][e];
        }
        // An infinite operand (inf in a key's rotary part: a -inf score) makes the small products 0 * inf = NaN;
        // the big one alone carries the value then.
        s[nt][e] = isfinite(b) ? b + c : b;
      }
      partial[(warp * kNT + nt) * 32 + lane] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
    }
    // Thread i sums score i of the tile over the eight warps in warp order and every warp reads all sums back: the
    // same bits in every warp, for 8 scalar loads per thread instead of 16 vector loads and 56 adds per warp.
    named_barrier(1, Cfg::kThreads);
    {
      const float* part = reinterpret_cast<const float*>(partial) + threadIdx.x;
      float sum = part[0];
#pragma unroll
      for (int q = 1; q < kW; ++q) sum += part[q * kNT * 32 * 4];
      reinterpret_cast<float*>(scores)[threadIdx.x] = sum;
    }
    named_barrier(1, Cfg::kThreads);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float4 sum = scores[nt * 32 + lane];
      s[nt][0] = sum.x;
      s[nt][1] = sum.y;
      s[nt][2] = sum.z;
      s[nt][3] = sum.w;
    }

    // ---- mask, scale, online softmax (whole rows are in this warp) ----
    float alpha[2];
    float base[2];
    fragment_softmax_rescale</*kFtz=*/true>(s, tile_valid, tile_begin, row_limit, t, scale_log2, row_max, row_sum,
                                            alpha, base);
    // P as A fragments of P . V: 8-key step nt takes its keys in the order (2t, 2t + 1), so the accumulator's
    // (row g, key 2t), (row g + 8, key 2t), (row g, key 2t + 1), (row g + 8, key 2t + 1) are a0..a3.
    uint32_t pa_hi[kNT][4], pa_lo[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float p0 = exp2_ftz(s[nt][0] - base[0]);
      const float p1 = exp2_ftz(s[nt][1] - base[0]);
      const float p2 = exp2_ftz(s[nt][2] - base[1]);
      const float p3 = exp2_ftz(s[nt][3] - base[1]);
      row_sum[0] += p0 + p1;
      row_sum[1] += p2 + p3;
      const float pv[4] = {p0, p2, p1, p3};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const Tf32Pair split = split_tf32(pv[e]);
        pa_hi[nt][e] = split.hi;
        pa_lo[nt][e] = split.lo;
      }
    }

    // ---- this tile's P . V over this warp's columns, then acc = acc * alpha + it ----
    // B: V rows 8 nt + 2t, 8 nt + 2t + 1 (keys k = t, t + 4 of the step) at column 8 (w + 8 j) + g.
    float tile_acc[kCT][4];
#pragma unroll
    for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_acc[ct][e] = 0.f;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int ct = 0; ct < kCT; ++ct) {
        const int off = stage_bytes + nt * 8 * kRowBytes + ct * kStepBytes;
        const Tf32Pair b0 = split_tf32(*reinterpret_cast<const float*>(v_row0 + off));
        const Tf32Pair b1 = split_tf32(*reinterpret_cast<const float*>(v_row1 + off));
        mma_1688_tf32(tile_acc[ct], pa_lo[nt], b0.hi, b1.hi);
        mma_1688_tf32(tile_acc[ct], pa_hi[nt], b0.lo, b1.lo);
        mma_1688_tf32(tile_acc[ct], pa_hi[nt], b0.hi, b1.hi);
      }
    }
#pragma unroll
    for (int ct = 0; ct < kCT; ++ct) {
      acc[ct][0] = fmaf(acc[ct][0], alpha[0], tile_acc[ct][0]);
      acc[ct][1] = fmaf(acc[ct][1], alpha[0], tile_acc[ct][1]);
      acc[ct][2] = fmaf(acc[ct][2], alpha[1], tile_acc[ct][2]);
      acc[ct][3] = fmaf(acc[ct][3], alpha[1], tile_acc[ct][3]);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: each warp holds whole-row sums; write its columns 8 (w + 8 j) + 2t, + 1 ----
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = row_sum[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = w.row_begin + g + half * 8;
    if (r >= w.rows) continue;
    write_row_result<float, kCT, 8 * kW>(p, w, r, l, row_max[half], 8 * warp + 2 * t, warp == 0 && t == 0,
                                         [&](int ct) { return make_float2(acc[ct][half * 2], acc[ct][half * 2 + 1]); });
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) decode_tf32_kernel(const __grid_constant__ DecodeParams p) {
  wait_for_previous_grid();  // q may come from the kernel just before
  allow_next_grid_launch();
  if constexpr (body_compiled_here<Cfg::kSm90Only>()) {
    for_each_cta_work<Cfg::kRowTile, Cfg::kKeyTile>(p, [&](const CtaWork& w) { decode_tf32_body<Cfg>(p, w); });
  }
}

}  // namespace mla::cuda
