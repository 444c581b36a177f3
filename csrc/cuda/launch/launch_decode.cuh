// Definitions of the torch-free launchers declared in launch.h: choose the main kernel for the problem and the device,
// pick its tile configuration, raise the kernel's shared-memory limit once per device, launch the main kernel and, for
// more than one split, the combine kernel. Errors come back as std::runtime_error carrying the CUDA error string.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/combine/merge_states.cuh"
#include "cuda/combine/split_combine.cuh"
#include "cuda/kernels/few_rows.cuh"
#include "cuda/kernels/fp32_simt.cuh"
#include "cuda/kernels/fp32_tf32.cuh"
#include "cuda/kernels/many_rows.cuh"
#include "cuda/launch/cluster_residency.h"
#include "cuda/launch/device_info.h"
#include "cuda/launch/kernel_choice.h"
#include "cuda/launch/launch.h"
#include "cuda/launch/launch_counters.h"
#include "cuda/launch/launch_options.h"
#include "cuda/schedule/tile_plan.h"
#include "cuda/schedule/work_item_planner.cuh"
#include "cuda/sm90/launch_sm90.h"
#include "params.h"
#include "switches.h"

namespace mla::cuda {

// Tile configurations, tuned on an H200 (see docs/perf-log.md). "Sm90" ones need Hopper's 227 KB of shared
// memory; "Sm80" ones fit an A100 (163 KB); "Compact" ones fit the 99 KB of sm_86 / sm_89.
template <typename T>
struct TensorCoreConfigs {
  //                                   row groups, keys, stages, sm90-only
  using FewRowsSm90 = DimSplitTile<T, 1, 32, 2, false>;  // H * S_q <= 16; two CTAs per Hopper SM
  using FewRowsDeep = DimSplitTile<T, 1, 32, 4, true>;   // at most one CTA per SM: 3 tiles in flight each
  using FewRowsSm80 = DimSplitTile<T, 1, 32, 3, false>;
  using FewRowsCompact = FewRowsSm90;
  using MidRowsSm90 = DimSplitTile<T, 2, 32, 4, true>;  // H * S_q <= 32
  using MidRowsSm80 = DimSplitTile<T, 2, 32, 2, false>;
  //                                   rows, warp rows, warps along keys/columns, keys, stages, sm90-only
  using ManyRowsSm90 = KeySplitTile<T, 64, 32, 4, 64, 2, true>;
  using ManyRowsSm80 = KeySplitTile<T, 64, 32, 4, 32, 2, false>;
  static_assert(FewRowsSm80::kSmemBytes <= 166912 && MidRowsSm80::kSmemBytes <= 166912 &&
                    ManyRowsSm80::kSmemBytes <= 166912,
                "sm_80 configs fit 163 KB");
  static_assert(FewRowsCompact::kSmemBytes <= 101376, "compact config fits 99 KB");
  static_assert(FewRowsDeep::kSmemBytes <= 232448 && MidRowsSm90::kSmemBytes <= 232448 &&
                    ManyRowsSm90::kSmemBytes <= 232448,
                "sm_90 configs fit 227 KB");
};
struct SimtConfigs {
  using Sm90 = SimtTile<16, 4>;
  using Sm80 = SimtTile<16, 3>;
  using Compact = SimtTile<8, 3>;
  static_assert(Sm80::kSmemBytes <= 166912 && Compact::kSmemBytes <= 101376, "fp32 configs fit their devices");
};
// fp32 on the tensor cores (3xTF32), 16 query rows per CTA; devices with 99 KB keep the CUDA-core kernel.
struct Tf32Configs {
  //                        keys, stages, sm90-only
  using Sm90 = Tf32Tile<32, 2, true>;  // one 32-key tile in flight: half the per-tile work per key of 16-key tiles
  using Sm80 = Tf32Tile<16, 3, false>;
  static_assert(Sm90::kSmemBytes <= 232448 && Sm80::kSmemBytes <= 166912, "fp32 tensor-core configs fit");
};

// The kernel that runs a configuration.
template <class Cfg>
struct KernelOf;

// The Hopper few-row configurations have a second kernel that merges a fixed split's pieces in thread-block
// clusters (cluster_merge.cuh).
template <class Cfg>
constexpr bool has_cluster_kernel() {
  using T = typename Cfg::Element;
  if constexpr (sizeof(T) == 2) {
    using C = TensorCoreConfigs<T>;
    return std::is_same_v<Cfg, typename C::FewRowsSm90> || std::is_same_v<Cfg, typename C::FewRowsDeep>;
  } else {
    return false;
  }
}

template <typename T, int kRowGroups, int kKeyTile, int kStages, bool kSm90Only>
struct KernelOf<DimSplitTile<T, kRowGroups, kKeyTile, kStages, kSm90Only>> {
  static constexpr auto kernel = decode_dim_split_kernel<DimSplitTile<T, kRowGroups, kKeyTile, kStages, kSm90Only>>;
};
template <typename T, int kRowTile, int kWarpRows, int kWarpsN, int kKeyTile, int kStages, bool kSm90Only>
struct KernelOf<KeySplitTile<T, kRowTile, kWarpRows, kWarpsN, kKeyTile, kStages, kSm90Only>> {
  static constexpr auto kernel =
      decode_key_split_kernel<KeySplitTile<T, kRowTile, kWarpRows, kWarpsN, kKeyTile, kStages, kSm90Only>>;
};
template <int kKeyTile, int kStages>
struct KernelOf<SimtTile<kKeyTile, kStages>> {
  static constexpr auto kernel = decode_simt_kernel<SimtTile<kKeyTile, kStages>>;
};
template <int kKeyTile, int kStages, bool kSm90Only>
struct KernelOf<Tf32Tile<kKeyTile, kStages, kSm90Only>> {
  static constexpr auto kernel = decode_tf32_kernel<Tf32Tile<kKeyTile, kStages, kSm90Only>>;
};

namespace detail {

// Whether this build holds sm_90 code for kKernel. A build without 9.0a (e.g. 8.0+PTX) runs on Hopper through
// compute_80 PTX, where the bodies compiled for sm_90 only are left out (body_compiled_here): such a kernel would
// launch and write nothing. Asked once per device.
template <auto kKernel>
bool compiled_for_sm90(int device) {
  static std::atomic<int> state[kMaxDevices] = {};
  return remembered_for_device(state, device, [] {
           cudaFuncAttributes attr{};
           const bool yes = cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess && attr.ptxVersion >= 90;
           if (!yes) cudaGetLastError();
           return yes ? 1 : 0;
         }) == 1;
}

// Whether configuration Cfg runs on the device: its shared memory fits, and a Hopper-only one needs Hopper, where
// MLA_EXT_DISABLE_SM90 turns those off too (sm90_kernel_enabled), which is how a Hopper machine tests the A100 ones.
template <class Cfg>
bool fits(const DeviceInfo& d) {
  return Cfg::kSmemBytes <= d.smem_optin &&
         (!Cfg::kSm90Only || (sm90_kernel_enabled(d.major) && compiled_for_sm90<KernelOf<Cfg>::kernel>(d.device)));
}

// cudaFuncSetAttribute once per (kernel, device); repeating it from racing threads is harmless.
template <class Cfg, auto kKernel>
void ensure_shared_memory(int device) {
  static std::atomic<int> done[kMaxDevices] = {};
  remembered_for_device(done, device, [] {
    throw_on_error(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
                   "cudaFuncSetAttribute(max dynamic shared memory)");
    return 1;
  });
}

// Launches kernel(p). With `overlap` (sm_90+), programmatic dependent launch lets its CTAs start while the previous
// kernel on the stream drains; the kernels wait (wait_for_previous_grid) before touching memory. Saves a launch
// gap per kernel, which is most of the cost left for small batches (use_programmatic_launch decides). Works inside
// CUDA graph capture. cluster > 1 groups consecutive CTAs into thread-block clusters of that size (sm_90+).
template <class Params>
void launch_overlapped(void (*kernel)(Params), dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream, bool overlap,
                       const Params& p, const char* what, int cluster = 1) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (overlap) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  throw_on_error(cudaLaunchKernelEx(&config, kernel, p), what);
}

template <typename T>
void launch_combine(const DecodeParams& p, cudaStream_t stream, bool overlap, int sm_count) {
  const int64_t rows = static_cast<int64_t>(p.seqlen_q) * p.num_heads;
  // A warp per whole row (perf-log v38-v40): a fixed split of at most kRowCombineSplits pieces, all in one round
  // trip (from 5 pieces on it would need a second where the unit kernel below needs one up to 8), and balanced calls
  // walked as ranges over more than 32 sequences, whose alternative is the fixed-count unit kernel sized for twice the
  // average pieces, a warp per 128 columns looping over a long sequence's pieces anyway.
  const bool fixed_rows = p.balanced_target == 0 && p.num_splits <= kRowCombineSplits;
  const bool balanced_rows = p.balanced_target > 0 && p.balanced_seq_cost > 0 && p.batch > NarrowBatchLayout::kMaxBatch;
  if (fixed_rows || balanced_rows) {
    const int warps = balanced_rows ? RowCombineShape<true>::kWarps : RowCombineShape<false>::kWarps;
    const int64_t row_ctas = (p.batch * rows + warps - 1) / warps;
    if (row_ctas > INT_MAX) throw std::runtime_error("mla decode: too many query rows for one combine launch");
    launch_overlapped(balanced_rows ? combine_rows_kernel<T, true> : combine_rows_kernel<T, false>,
                      dim3(static_cast<unsigned>(row_ctas)), dim3(32 * warps), 0, stream, overlap, p,
                      "mla decode split-combine kernel launch");
    return;
  }
  const int64_t units = p.batch * rows * kCombineChunks;
  // Balanced calls: warps per unit follow each sequence's split count on the device; the CTAs stride over the
  // sequences' chunks, two resident per SM (512 threads of 64 registers). Up to 32 sequences, one lane each
  // (perf-log v18). More sequences when the many-row kernels' work items split them (balanced_seq_cost == 0): that
  // plan gives each sequence one piece once the batch fills a wave, where the fixed count below launches thousands of
  // CTAs with nothing to merge (v19). A batch of one is never ragged, and the fixed sizing measured faster for it at
  // 16 heads (v18). Wider batches walked as ranges take the row kernel above (v40). Its chunk arithmetic is 32-bit.
  const bool narrow = p.batch >= 2 && p.batch <= NarrowBatchLayout::kMaxBatch;
  const bool wide = p.batch > NarrowBatchLayout::kMaxBatch && p.balanced_seq_cost == 0;
  const bool fits_int = units * kCombineMaxWarps <= INT_MAX;
  if (p.balanced_target > 0 && (narrow || wide) && fits_int) {
    const int64_t ctas = std::min<int64_t>(units, 2 * static_cast<int64_t>(sm_count));
    launch_overlapped(narrow ? combine_by_sequence_kernel<T, false> : combine_by_sequence_kernel<T, true>,
                      dim3(static_cast<unsigned>(ctas)), dim3(32, kCombineMaxWarps), 0, stream, overlap, p,
                      "mla decode split-combine kernel launch");
    return;
  }
  // Warps per unit (a power of two): enough that each sums at most one batch of splits, up to 16; then units per CTA
  // to reach 8 warps.
  // Balanced splits vary per sequence: size for twice the average, but no sequence gets more than the target.
  int64_t splits = p.num_splits;
  if (p.balanced_target > 0) {
    const int64_t target = p.balanced_target;
    splits = std::min(target, (2 * target + p.batch - 1) / p.batch);
  }
  const int groups = combine_warps_for(splits);
  const int units_per_cta = groups >= 8 ? 1 : 8 / groups;
  const int64_t ctas = (units + units_per_cta - 1) / units_per_cta;
  if (ctas > INT_MAX) throw std::runtime_error("mla decode: too many query rows for one combine launch");
  launch_overlapped(combine_splits_kernel<T>, dim3(static_cast<unsigned>(ctas)), dim3(32, groups, units_per_cta), 0,
                    stream, overlap, p, "mla decode split-combine kernel launch");
}

}  // namespace detail

// Whether a call's fixed split merges in clusters of one sequence's pieces instead of the combine kernel: 2, 4 or 8
// pieces of at most kClusterMergeMaxKeys keys, a row block per sequence (the pieces are then consecutive CTAs: CTA
// rank = piece), on sm_90+. The merge saves the combine's launch and the partials' round trip, a few us per call;
// the cluster kernel's loop runs ~1 % slower (its registers are laid out around the merge), so long pieces lose
// more than the merge saves (perf-log v45).
inline bool merge_in_cluster(const DecodeParams& p, int64_t row_blocks, const DeviceInfo& d) {
  const bool pieces_fit = p.num_splits == 2 || p.num_splits == 4 || p.num_splits == kMaxClusterSplits;
  return d.major >= 9 && p.balanced_target == 0 && pieces_fit && p.kv_len_per_split <= kClusterMergeMaxKeys &&
         row_blocks == 1;
}

// Main kernel with configuration Cfg, then the combine when the problem has several splits (or, see
// merge_in_cluster, the main kernel alone, merging in clusters). A balanced split comes planned for the chosen kernel
// (choose_kernel): ranges for the few-row kernels, work items for the many-row ones.
template <class Cfg>
void launch_decode_with(const DecodeParams& p, cudaStream_t stream, const DeviceInfo& d) {
  if (p.balanced_target > 0 && Cfg::kWalksRanges != (p.balanced_seq_cost > 0)) {
    throw std::runtime_error("mla decode: internal error: the balanced split was planned for another kernel");
  }
  const int64_t rows = static_cast<int64_t>(p.seqlen_q) * p.num_heads;
  if (p.batch == 0 || rows == 0) return;
  const int64_t row_blocks = (rows + Cfg::kRowTile - 1) / Cfg::kRowTile;
  const int64_t ctas = row_blocks * work_items(p);
  if (ctas > INT_MAX) throw std::runtime_error("mla decode: grid too large (batch x splits x row blocks)");
  constexpr auto kernel = KernelOf<Cfg>::kernel;
  detail::ensure_shared_memory<Cfg, kernel>(d.device);
  const bool overlap = d.major >= 9 && use_programmatic_launch(p);
  launch_work_item_plan(p, stream, overlap);
  if constexpr (has_cluster_kernel<Cfg>()) {
    constexpr auto cluster_kernel = decode_dim_split_kernel<Cfg, true>;  // compiled for sm_90 only
    if (merge_in_cluster(p, row_blocks, d) && detail::compiled_for_sm90<cluster_kernel>(d.device)) {
      detail::ensure_shared_memory<Cfg, cluster_kernel>(d.device);
      if (detail::clusters_keep_residency<Cfg, cluster_kernel>(p.num_splits, ctas, d)) {
        detail::launch_overlapped(cluster_kernel, dim3(static_cast<unsigned>(ctas)), dim3(Cfg::kThreads),
                                  Cfg::kSmemBytes, stream, overlap, p, "mla decode main kernel launch", p.num_splits);
        count_launch(KernelPath::kClusterMerge);
        return;
      }
    }
  }
  detail::launch_overlapped(kernel, dim3(static_cast<unsigned>(ctas)), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream,
                            overlap, p, "mla decode main kernel launch");
  if (p.num_splits > 1 || p.balanced_target > 0)
    detail::launch_combine<typename Cfg::Element>(p, stream, overlap, d.sm_count);
}

// Whether a few-row grid leaves SMs free: it gains more from deeper prefetch (one CTA per SM) than from a second
// CTA per SM.
inline bool few_row_grid_is_lone(const DecodeParams& p, const DeviceInfo& d) {
  return p.balanced_target > 0 ? p.balanced_target <= d.sm_count
                               : static_cast<int64_t>(p.batch) * p.num_splits <= d.sm_count;
}

// Launches the first configuration that fits the device; false when none does.
template <class Cfg, class... Fallbacks>
bool launch_first_fitting(const DecodeParams& p, cudaStream_t stream, const DeviceInfo& d) {
  if (detail::fits<Cfg>(d)) {
    launch_decode_with<Cfg>(p, stream, d);
    if constexpr (Cfg::kSm90Only) count_launch(KernelPath::kHopperConfig);
    return true;
  }
  if constexpr (sizeof...(Fallbacks) > 0) {
    return launch_first_fitting<Fallbacks...>(p, stream, d);
  } else {
    return false;
  }
}

// The sm_90a main kernel, then the combine where the call has splits not merged in clusters; false where it does not
// launch (the driver refused the caches' tensor maps), so the caller falls back.
template <DType dtype, bool kFp8Cache = false>
bool launch_sm90_with_combine(const DecodeParams& p, const DeviceInfo& d, cudaStream_t stream) {
  const Sm90Launch sm90 = launch_decode_sm90<dtype, kFp8Cache>(p, stream, d);
  if (!sm90.launched) return false;
  count_launch(KernelPath::kSm90);
  if (sm90.item_pairs) count_launch(KernelPath::kItemPairs);
  if (sm90.merged_in_cluster) {
    count_launch(KernelPath::kClusterMerge);
  } else if (p.num_splits > 1 || p.balanced_target > 0) {
    detail::launch_combine<typename ElementOf<dtype>::type>(p, stream, use_programmatic_launch(p), d.sm_count);
  }
  return true;
}

template <DType dtype>
KernelChoice choose_kernel(const DecodeParams& p, const DeviceInfo& d) {
  using T = typename ElementOf<dtype>::type;
  if constexpr (dtype != DType::kFloat32) {
    if (p.cache_format != CacheFormat::kNative) return choose_fp8_cache_kernel<dtype>(p, d);
  }
  const bool hopper = sm90_kernel_enabled(d.major);
  if constexpr (dtype == DType::kFloat32) {
    if (!fp32_on_cuda_cores() && (detail::fits<Tf32Configs::Sm90>(d) || detail::fits<Tf32Configs::Sm80>(d))) {
      return {MainKernel::kFp32TensorCore, kSmallRowTile, hopper};
    }
    if (detail::fits<SimtConfigs::Sm90>(d) || detail::fits<SimtConfigs::Sm80>(d) ||
        detail::fits<SimtConfigs::Compact>(d)) {
      return {MainKernel::kFp32CudaCore, kSmallRowTile, hopper};
    }
  } else {
    // Hopper: the wgmma + TMA kernel where it takes the call (over 16 rows per sequence), else the portable ones.
    if (hopper && sm90_takes_layout(p) && sm90_kernel_ready<dtype>(d.device)) {
      return {MainKernel::kSm90, kLargeRowTile, hopper};
    }
    using C = TensorCoreConfigs<T>;
    const int row_tile = row_tile_for(p.seqlen_q * p.num_heads, dtype);
    if (row_tile == kLargeRowTile &&
        (detail::fits<typename C::ManyRowsSm90>(d) || detail::fits<typename C::ManyRowsSm80>(d))) {
      return {MainKernel::kManyRows, kLargeRowTile, hopper};
    }
    if (row_tile == kMidRowTile &&
        (detail::fits<typename C::MidRowsSm90>(d) || detail::fits<typename C::MidRowsSm80>(d))) {
      return {MainKernel::kMidRows, kMidRowTile, hopper};
    }
    // 16-row blocks for every head count where the larger tiles do not fit (devices with 99 KB of shared memory).
    if (detail::fits<typename C::FewRowsCompact>(d)) return {MainKernel::kFewRows, kSmallRowTile, hopper};
  }
  throw std::runtime_error("mla decode: the device allows " + std::to_string(d.smem_optin) +
                           " bytes of shared memory per block; the smallest kernel configuration needs more");
}

template <DType dtype>
void launch_decode(const DecodeParams& p, const KernelChoice& choice, const DeviceInfo& d, cudaStream_t stream) {
  using T = typename ElementOf<dtype>::type;
  bool launched = false;
  if constexpr (dtype != DType::kFloat32) {
    if (p.cache_format != CacheFormat::kNative) {
      launch_decode_fp8_cache<dtype>(p, choice, d, stream);
      return;
    }
  }
  if constexpr (dtype == DType::kFloat32) {
    if (choice.kernel == MainKernel::kFp32TensorCore) {
      launched = launch_first_fitting<Tf32Configs::Sm90, Tf32Configs::Sm80>(p, stream, d);
      if (launched) count_launch(KernelPath::kFp32TensorCore);
    } else {
      launched = launch_first_fitting<SimtConfigs::Sm90, SimtConfigs::Sm80, SimtConfigs::Compact>(p, stream, d);
      if (launched) count_launch(KernelPath::kPortable);
    }
  } else {
    using C = TensorCoreConfigs<T>;
    switch (choice.kernel) {
      case MainKernel::kSm90: {
        if (launch_sm90_with_combine<dtype>(p, d, stream)) return;
        // The driver refused the caches' tensor maps: the many-row kernel walks the same plan (64-row work items).
        launched = launch_first_fitting<typename C::ManyRowsSm90, typename C::ManyRowsSm80>(p, stream, d);
        break;
      }
      case MainKernel::kManyRows:
        launched = launch_first_fitting<typename C::ManyRowsSm90, typename C::ManyRowsSm80>(p, stream, d);
        break;
      case MainKernel::kMidRows:
        launched = launch_first_fitting<typename C::MidRowsSm90, typename C::MidRowsSm80>(p, stream, d);
        break;
      default:
        if (choice.hopper && few_row_grid_is_lone(p, d)) {
          launched = launch_first_fitting<typename C::FewRowsDeep, typename C::FewRowsSm80, typename C::FewRowsCompact>(
              p, stream, d);
        } else if (choice.hopper) {
          launched = launch_first_fitting<typename C::FewRowsSm90, typename C::FewRowsCompact>(p, stream, d);
        } else {
          launched = launch_first_fitting<typename C::FewRowsSm80, typename C::FewRowsCompact>(p, stream, d);
        }
    }
    if (launched) count_launch(KernelPath::kPortable);
  }
  if (!launched) throw std::runtime_error("mla decode: internal error: the chosen kernel does not fit the device");
}

template <DType dtype>
void launch_plan(const DecodeParams& params, const KernelChoice& choice, const DeviceInfo& d, cudaStream_t stream) {
  if (params.item_table == nullptr) throw std::runtime_error("mla plan: internal error: the call plans no work items");
  DecodeParams p = params;
  if constexpr (dtype != DType::kFloat32) {
    // the sm_90a launcher pairs items the same way for the same call
    if (choice.kernel == MainKernel::kSm90) p.item_pairs_in_cluster = sm90_pairs_items<dtype>(p, d);
  }
  launch_work_item_plan(p, stream, d.major >= 9 && use_programmatic_launch(p));
}

template <DType dtype>
void launch_merge_states(const MergeStatesParams& p, cudaStream_t stream) {
  using T = typename ElementOf<dtype>::type;
  if (p.rows == 0) return;
  const int64_t ctas = (p.rows + 3) / 4;
  if (ctas > INT_MAX) throw std::runtime_error("mla merge_states: too many rows for one launch");
  merge_states_kernel<T><<<static_cast<unsigned>(ctas), 128, 0, stream>>>(p);
  throw_on_error(cudaGetLastError(), "mla merge_states kernel launch");
}

}  // namespace mla::cuda
