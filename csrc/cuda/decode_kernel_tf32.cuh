// Split-KV MLA decode main kernel for fp32 inputs on the tensor cores (mma.sync m16n8k8, TF32). Each operand is
// split into two TF32 parts, x = hi + lo, and each product taken as hi.hi + hi.lo + lo.hi ("3xTF32"): about 21 bits
// of every product survive (fp32 keeps 24), so results stay within ~1e-6 of a float64 reference. It keeps the
// structure of the dim-split kernel (decode_kernel_dim_split.cuh); its cost is instruction issue (the operand
// splits and three products per product), not bytes (perf-notes v23).
//
// One CTA = (sequence, 16 query rows, KV split), 8 warps. Warp w
//   - computes partial scores over k8 steps w, w + 8, ... (72 dims) for all keys of the tile, with Q split into
//     registers once, and independent accumulator chains per key block, k-step residue and product size; taking
//     every eighth step puts the swizzled chunks a lane reads at a lane constant plus an immediate; a step's k slots
//     t and t + 4 hold dims 2t and 2t + 1 (any order of a step's dims gives the same products, if Q and K agree), so
//     a lane reads both of its K elements with one 8-byte load;
//   - adds the eight warps' partial scores (exchanged through shared memory in fragment order, each score summed
//     by one thread, so every warp holds bitwise the same scores) and runs the online softmax redundantly; the score
//     accumulator layout is the A layout of P . V once its keys are taken in the order (2t, 2t + 1) per 8-key step;
//   - accumulates output columns [64w, 64w + 64) as 8 column blocks: n slot s of block ct is column
//     64w + 8s + (ct ^ 4 (s / 4)), so a lane's B elements of all 8 blocks are one V row's 8 consecutive columns, two
//     16-byte loads (the lanes of slots 4-7 take their two halves in the other order, which keeps each load free of
//     bank conflicts); each tile's P . V goes in its own accumulator first, then is added to the running output
//     (adding every product straight in lets fp32 rounding grow with the split's length, as in the CUDA-core kernel).
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
  static constexpr int kColNTiles = kHeadDim / 8 / kWarps;  // 8 per warp: columns [64w, 64w + 64)
  // Independent S accumulator chains per key block and product size: 16-key tiles (2 key blocks) keep three, one per
  // k-step residue mod 3, to hide the mma latency; 32-key tiles have 4 key blocks, enough chains of their own.
  static constexpr int kParities = kKeyTile >= 32 ? 1 : 3;
  static constexpr int kScoresPerThread = kKeyNTiles * 32 * 4 / kThreads;  // of the tile's 16 x kKeyTile scores

  using Row = RowLayout<float>;
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kRowTile * Row::kBytes;
  static constexpr int kPartialOffset = kKvOffset + kStages * kKeyTile * Row::kBytes;  // [warp][n-tile][lane] float4
  static constexpr int kScoreOffset = kPartialOffset + kWarps * kKeyNTiles * 32 * 16;  // [n-tile][lane] float4
  static constexpr int kValidOffset = kScoreOffset + kKeyNTiles * 32 * 16;
  static constexpr int kSmemBytes =
      kValidOffset + KvPipeline<float, kRowTile, kKeyTile, kStages, kThreads>::kValidBytes;

  static_assert(kKSteps % kWarps == 0 && kWarpKSteps % kParities == 0, "k-steps split evenly");
  static_assert(kKeyNTiles * 32 * 4 % kThreads == 0, "each thread sums whole scores of the tile over the warps");
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
  constexpr int kStepBytes = 2 * kW * 16;  // byte distance between a warp's consecutive k-steps

  extern __shared__ __align__(128) uint8_t smem[];
  const uint8_t* q_smem = smem + Cfg::kQOffset;
  float4* partial = reinterpret_cast<float4*>(smem + Cfg::kPartialOffset);
  float4* scores = reinterpret_cast<float4*>(smem + Cfg::kScoreOffset);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;  // fragment row (A, C) / column (B)
  const int t = lane & 3;   // fragment column (A) / row (B)
  const float scale_log2 = p.sm_scale * 1.4426950408889634f;

  // Warp w takes k-steps w + 8 j: this lane's dims 2t, 2t + 1 of step j lie in chunk 2w + t / 2 + 16 j. Q and K rows
  // read by this lane have r % 8 = g, so the swizzled chunk is 16 j plus a lane constant: every Q / K load below is a
  // base register plus an immediate. V rows 2t and 2t + 1 of each 8-key step hold this lane's 8 columns
  // 64w + 8g + [0, 8) in chunks c and c ^ 1 (c = 16w + 2g, swizzled by the row); the first load takes half g / 4.
  const int qk_off = ((((2 * warp) + (t >> 1)) ^ g) << 4) + 8 * (t & 1);
  const int v_first = 16 * warp + ((2 * g + (g >> 2)) ^ (2 * t));  // swizzled chunk of the first half, row 2t
  const uint8_t* v_base = smem + Cfg::kKvOffset + 2 * t * kRowBytes;
  // Rows 2t and 2t + 1, first and second load: row 2t + 1 swizzles by one more, so its halves swap chunks.
  const int v_off[2][2] = {{v_first << 4, (v_first ^ 1) << 4},
                           {kRowBytes + ((v_first ^ 1) << 4), kRowBytes + (v_first << 4)}};

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
        for (int half = 0; half < 2; ++half) {  // a0..a3: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
          const float2 v =
              *reinterpret_cast<const float2*>(q_smem + (g + 8 * half) * kRowBytes + qk_off + j * kStepBytes);
          const Tf32Pair x = split_tf32(v.x);
          const Tf32Pair y = split_tf32(v.y);
          q_hi[j][half] = x.hi;
          q_lo[j][half] = x.lo;
          q_hi[j][2 + half] = y.hi;
          q_lo[j][2 + half] = y.lo;
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
        const float2 k = *reinterpret_cast<const float2*>(k_row + nt * 8 * kRowBytes + j * kStepBytes + qk_off);
        const Tf32Pair b0 = split_tf32(k.x);
        const Tf32Pair b1 = split_tf32(k.y);
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
    // Thread i sums scores i, i + 256, ... of the tile over the eight warps in warp order and every warp reads all
    // sums back: the same bits in every warp, for 8 scalar loads per score instead of a warp's vector loads and adds
    // over all of them.
    named_barrier(1, Cfg::kThreads);
#pragma unroll
    for (int i = 0; i < Cfg::kScoresPerThread; ++i) {
      const float* part = reinterpret_cast<const float*>(partial) + i * Cfg::kThreads + threadIdx.x;
      float sum = part[0];
#pragma unroll
      for (int q = 1; q < kW; ++q) sum += part[q * kNT * 32 * 4];
      reinterpret_cast<float*>(scores)[i * Cfg::kThreads + threadIdx.x] = sum;
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
    // B: V rows 8 nt + 2t, 8 nt + 2t + 1 (keys k = t, t + 4 of the step); block ct at column
    // 64w + 8g + (ct ^ 4 (g / 4)).
    float tile_acc[kCT][4];
#pragma unroll
    for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_acc[ct][e] = 0.f;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      float v[2][kCT];  // rows 2t, 2t + 1: element ct is block ct's B element
#pragma unroll
      for (int row = 0; row < 2; ++row) {
#pragma unroll
        for (int part = 0; part < 2; ++part) {
          const float4 x =
              *reinterpret_cast<const float4*>(v_base + stage_bytes + nt * 8 * kRowBytes + v_off[row][part]);
          v[row][4 * part] = x.x;
          v[row][4 * part + 1] = x.y;
          v[row][4 * part + 2] = x.z;
          v[row][4 * part + 3] = x.w;
        }
      }
#pragma unroll
      for (int ct = 0; ct < kCT; ++ct) {
        const Tf32Pair b0 = split_tf32(v[0][ct]);
        const Tf32Pair b1 = split_tf32(v[1][ct]);
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

  // ---- epilogue: each warp holds whole-row sums; write its columns 64w + 16t + [0, 16) ----
  // acc[ct][2 half + e] is n slot 2t + e of block ct: column 64w + 16t + 8e + (ct ^ swap), swap = 4 (t / 2). Pair j
  // (columns 64w + 16t + 2j, + 1) is blocks 2q, 2q + 1 of slot e = j / 4, q = (j % 4) ^ (swap / 2): a select between
  // two register pairs, once per CTA.
  const bool swap = (t >> 1) != 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = row_sum[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = w.row_begin + g + half * 8;
    if (r >= w.rows) continue;
    write_row_result<float, kCT, 2>(p, w, r, l, row_max[half], 64 * warp + 16 * t, warp == 0 && t == 0, [&](int j) {
      const int e = half * 2 + j / 4;
      const int q = j % 4;
      const float2 straight = make_float2(acc[2 * q][e], acc[2 * q + 1][e]);
      const float2 swapped = make_float2(acc[2 * (q ^ 2)][e], acc[2 * (q ^ 2) + 1][e]);
      return swap ? swapped : straight;
    });
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
