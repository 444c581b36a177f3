// Split-KV MLA decode main kernel for fp32 inputs on the tensor cores (mma.sync m16n8k8, TF32). Each operand is
// split into two TF32 parts, x = hi + lo, and each product taken as hi.hi + hi.lo + lo.hi ("3xTF32"): about 21 bits
// of every product survive (fp32 keeps 24), so results stay within ~1e-6 of a float64 reference. It keeps the
// structure of the few-row kernel (few_rows.cuh); its cost is instruction issue (the operand
// splits and three products per product), not bytes (perf-log v23).
//
// One CTA = (sequence, 16 query rows, KV split), 8 warps. Warp w
//   - computes partial scores over k8 steps w, w + 8, ... (72 dims) for all keys of the tile, with Q split into
//     registers once, and independent accumulator chains per key block, k-step residue and product size; taking
//     every eighth step puts the swizzled chunks a lane reads at a lane constant plus an immediate;
//   - writes its partial scores to shared memory in fragment order. Thread (warp w, lane l) then runs the online
//     softmax of row w + 8 (l / 16), keys kKeyTile / 16 * (l % 16) + [0, kKeyTile / 16) of the tile: it sums those
//     scores over the eight warps in warp order, masks and scales them, takes the row's tile max over the row's 16
//     lanes, and writes P, split into TF32 parts, in fragment order, and (one lane per row) the row's rescale factor.
//     Each score's softmax runs once per CTA, not once per warp. The score accumulator layout is the A layout of
//     P . V once its keys are taken in the order (2t, 2t + 1) per 8-key step;
//   - accumulates output column blocks w, w + 8, ... (64 columns): each tile's P . V in its own accumulator first,
//     then added to the running output (adding every product straight in lets fp32 rounding grow with the split's
//     length, as in the CUDA-core kernel).
// Three barriers per tile: the pipeline's, one before the softmax reads the partial scores, one before P . V reads P.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/decode_work.cuh"
#include "cuda/common/device_primitives.cuh"
#include "cuda/common/tile_loader.cuh"
#include "params.h"

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
  // Independent S accumulator chains per key block and product size: 16-key tiles (2 key blocks) keep three, one per
  // k-step residue mod 3, to hide the mma latency; 32-key tiles have 4 key blocks, enough chains of their own.
  static constexpr int kParities = kKeyTile >= 32 ? 1 : 3;
  static constexpr int kKeysPerLane = kKeyTile / 16;  // the softmax's share of a thread: one row, 1 or 2 keys

  using Row = RowLayout<float>;
  static constexpr int kFragmentBytes = kKeyNTiles * 32 * 16;  // a 16 x kKeyTile tile in fragment order (float4)
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kRowTile * Row::kBytes;
  static constexpr int kPartialOffset = kKvOffset + kStages * kKeyTile * Row::kBytes;  // [warp] fragment tiles
  static constexpr int kPOffset = kPartialOffset + kWarps * kFragmentBytes;            // P's hi, then lo parts
  static constexpr int kAlphaOffset = kPOffset + 2 * kFragmentBytes;                   // [warp g] (alpha_g, alpha_g+8)
  static constexpr int kRowStatOffset = kAlphaOffset + kWarps * 8;  // [warp g] (l_g, l_g+8, m_g, m_g+8)
  static constexpr int kValidOffset = kRowStatOffset + kWarps * 16;
  static constexpr int kSmemBytes =
      kValidOffset + KvPipeline<float, kRowTile, kKeyTile, kStages, kThreads>::kValidBytes;

  static_assert(kKSteps % kWarps == 0 && kWarpKSteps % kParities == 0, "k-steps split evenly");
  static_assert(kWarps == 8 && kRowTile == 16, "warp w owns rows w and w + 8 in the softmax");
  static_assert(kKeyTile == 16 || kKeyTile == 32, "key tile: 16 lanes per row own 1 or 2 keys each");
  static_assert(kStages >= 2, "pipeline depth");
};

// Float4 slot of lane (g, t) in the block of 8-key step nt of a tile in fragment order. g is XOR-ed with nt so that a
// warp's 8-byte accesses to its two softmax rows (g and g + 8 of every step) fall on each of the 32 banks twice, not on
// 16 banks four times; for whole float4s it only permutes aligned groups of 8 slots.
__device__ __forceinline__ int fragment_slot(int g, int t, int nt) {
  return ((g ^ nt) << 2) + t;
}

template <class Cfg>
__device__ __forceinline__ void decode_tf32_body(const DecodeParams& p, const CtaWork& w) {
  using Row = typename Cfg::Row;
  constexpr int kW = Cfg::kWarps;
  constexpr int kNT = Cfg::kKeyNTiles;
  constexpr int kCT = Cfg::kColNTiles;
  constexpr int kWKS = Cfg::kWarpKSteps;
  constexpr int kPar = Cfg::kParities;
  constexpr int kKPL = Cfg::kKeysPerLane;
  constexpr int kFragFloats = Cfg::kFragmentBytes / 4;  // floats of a tile in fragment order
  constexpr int kRowBytes = Row::kBytes;
  constexpr int kStepBytes = 2 * kW * 16;  // chunk distance between a warp's consecutive k-steps / column blocks

  extern __shared__ __align__(128) uint8_t smem[];
  const uint8_t* q_smem = smem + Cfg::kQOffset;
  float4* partial = reinterpret_cast<float4*>(smem + Cfg::kPartialOffset);
  uint32_t* p_hi = reinterpret_cast<uint32_t*>(smem + Cfg::kPOffset);  // P's TF32 parts in fragment order
  uint32_t* p_lo = p_hi + kFragFloats;
  float* row_alpha = reinterpret_cast<float*>(smem + Cfg::kAlphaOffset);   // [g][half]
  float* row_stat = reinterpret_cast<float*>(smem + Cfg::kRowStatOffset);  // [g]: l of g, g + 8; m of g, g + 8

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

  // The softmax's share of this thread: row warp + 8 own_half, keys own_key + [0, kKPL) of each tile. Key k of it is
  // element 2 own_half + k % 2 of lane (warp, k % 8 / 2)'s accumulator in step k / 8 (own_score + k - own_key in the
  // partial scores), and element own_half + 2 (k % 2) of that lane's A fragment of P (own_p + 2 (k - own_key)).
  const int own_half = lane >> 4;
  const int own_key = (lane & 15) * kKPL;
  const int own_slot = (own_key >> 3) * 128 + fragment_slot(warp, (own_key & 7) >> 1, own_key >> 3) * 4;
  const int own_score = own_slot + 2 * own_half + (own_key & 1);
  const int own_p = own_slot + own_half + 2 * (own_key & 1);
  const int own_r = w.row_begin + warp + 8 * own_half;
  const int own_limit = own_r < w.rows ? row_key_limit(p, w.seq_len, own_r) : 0;

  KvPipeline<float, Cfg::kRowTile, Cfg::kKeyTile, Cfg::kStages, Cfg::kThreads> pipe{
      smem + Cfg::kKvOffset, smem + Cfg::kValidOffset, {}};
  pipe.start(p, w, smem + Cfg::kQOffset);

  float acc[kCT][4];
#pragma unroll
  for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[ct][e] = 0.f;
  float own_max = kNegInf;                // own row's running max, log2 domain (scaled)
  float own_sum = 0.f;                    // this thread's share of its row's running denominator
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
      partial[(warp * kNT + nt) * 32 + fragment_slot(g, t, nt)] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
    }
    named_barrier(1, Cfg::kThreads);

    // ---- this thread's share of the softmax: its scores summed over the warps in warp order, masked, scaled ----
    float sc[kKPL];
    float tile_max = kNegInf;
#pragma unroll
    for (int i = 0; i < kKPL; ++i) {
      const float* part = reinterpret_cast<const float*>(partial) + own_score + i;
      float sum = part[0];
#pragma unroll
      for (int q = 1; q < kW; ++q) sum += part[q * kFragFloats];
      const bool visible = tile_valid[own_key + i] != 0 && tile_begin + own_key + i < own_limit;
      sc[i] = visible ? sum * scale_log2 : kNegInf;
      tile_max = fmaxf(tile_max, sc[i]);
    }
#pragma unroll
    for (int off = 1; off < 16; off <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    const float m_new = fmaxf(own_max, tile_max);
    const float base = m_new == kNegInf ? 0.f : m_new;  // no key yet: keep exp2 arguments finite (-inf - -inf)
    const float own_alpha = exp2_ftz(own_max - base);
    own_max = m_new;
    own_sum *= own_alpha;
#pragma unroll
    for (int i = 0; i < kKPL; ++i) {
      const float pv = exp2_ftz(sc[i] - base);
      own_sum += pv;
      const Tf32Pair split = split_tf32(pv);
      p_hi[own_p + 2 * i] = split.hi;
      p_lo[own_p + 2 * i] = split.lo;
    }
    if ((lane & 15) == 0) row_alpha[2 * warp + own_half] = own_alpha;
    named_barrier(1, Cfg::kThreads);

    // P's A fragments (8-key step nt takes its keys in the order (2t, 2t + 1)): (row g, key 2t), (row g + 8, key 2t),
    // (row g, key 2t + 1), (row g + 8, key 2t + 1), as written above.
    const float2 alpha = *reinterpret_cast<const float2*>(row_alpha + 2 * g);  // rows g, g + 8

    // ---- this tile's P . V over this warp's columns, then acc = acc * alpha + it ----
    // B: V rows 8 nt + 2t, 8 nt + 2t + 1 (keys k = t, t + 4 of the step) at column 8 (w + 8 j) + g.
    float tile_acc[kCT][4];
#pragma unroll
    for (int ct = 0; ct < kCT; ++ct)
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_acc[ct][e] = 0.f;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int slot = (nt * 32 + fragment_slot(g, t, nt)) * 4;
      const uint4 hi = *reinterpret_cast<const uint4*>(p_hi + slot);
      const uint4 lo = *reinterpret_cast<const uint4*>(p_lo + slot);
      const uint32_t pa_hi[4] = {hi.x, hi.y, hi.z, hi.w};
      const uint32_t pa_lo[4] = {lo.x, lo.y, lo.z, lo.w};
#pragma unroll
      for (int ct = 0; ct < kCT; ++ct) {
        const int off = stage_bytes + nt * 8 * kRowBytes + ct * kStepBytes;
        const Tf32Pair b0 = split_tf32(*reinterpret_cast<const float*>(v_row0 + off));
        const Tf32Pair b1 = split_tf32(*reinterpret_cast<const float*>(v_row1 + off));
        mma_1688_tf32(tile_acc[ct], pa_lo, b0.hi, b1.hi);
        mma_1688_tf32(tile_acc[ct], pa_hi, b0.lo, b1.lo);
        mma_1688_tf32(tile_acc[ct], pa_hi, b0.hi, b1.hi);
      }
    }
#pragma unroll
    for (int ct = 0; ct < kCT; ++ct) {
      acc[ct][0] = fmaf(acc[ct][0], alpha.x, tile_acc[ct][0]);
      acc[ct][1] = fmaf(acc[ct][1], alpha.x, tile_acc[ct][1]);
      acc[ct][2] = fmaf(acc[ct][2], alpha.y, tile_acc[ct][2]);
      acc[ct][3] = fmaf(acc[ct][3], alpha.y, tile_acc[ct][3]);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: the softmax's owners publish their rows' sums and maxima; each warp writes its columns ----
  float own_l = own_sum;
#pragma unroll
  for (int off = 1; off < 16; off <<= 1) own_l += __shfl_xor_sync(0xffffffffu, own_l, off);
  if ((lane & 15) == 0) {
    row_stat[4 * warp + own_half] = own_l;
    row_stat[4 * warp + 2 + own_half] = own_max;
  }
  named_barrier(1, Cfg::kThreads);
  const float4 stat = *reinterpret_cast<const float4*>(row_stat + 4 * g);  // rows g, g + 8

  // Columns 8 (w + 8 j) + 2t, + 1 of rows g, g + 8:
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = w.row_begin + g + half * 8;
    if (r >= w.rows) continue;
    const float l = half == 0 ? stat.x : stat.y;
    const float m = half == 0 ? stat.z : stat.w;
    write_row_result<float, kCT, 8 * kW>(p, w, r, l, m, 8 * warp + 2 * t, warp == 0 && t == 0,
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
