// Host side of the sm_90a decode kernel: decides whether it can run the problem, describes the caches to the
// bulk tensor copy engine (tensor maps built with the driver's cuTensorMapEncodeTiled, reached through the runtime
// so nothing links against libcuda), and launches it. Any reason not to run returns false: the caller falls back.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/common/device_primitives.cuh"
#include "cuda/launch/cluster_residency.h"
#include "cuda/launch/device_info.h"
#include "cuda/launch/launch_options.h"
#include "cuda/schedule/tile_plan.h"
#include "cuda/schedule/work_item_planner.cuh"
#include "cuda/sm90/decode_kernel_sm90.cuh"
#include "cuda/sm90/launch_sm90.h"
#include "params.h"

namespace mla::cuda {
namespace sm90_detail {

using sm90::Sm90Tile;

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not sticky, but leave no error behind for the next launch check
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The kernel with or without warpgroup 0's early scores. Both schedules are built together and take the same
// resources (ptxas: 168 registers and the same shared memory), so a check made on one holds for the other.
template <typename T, bool kMergeInCluster, bool kFp8Cache = false>
auto decode_kernel(bool early_scores) {
  return early_scores ? sm90::decode_sm90_kernel<T, kMergeInCluster, true, kFp8Cache>
                      : sm90::decode_sm90_kernel<T, kMergeInCluster, false, kFp8Cache>;
}

// Whether this build holds the kernel's sm_90a code for `device` (an sm_80 or PTX-only build compiles an empty
// body without the static shared memory), and the dynamic shared-memory limit of both its schedules is raised. Once
// per device.
template <typename T, bool kMergeInCluster, bool kFp8Cache = false>
bool kernel_ready(int device) {
  static std::atomic<int> state[kMaxDevices] = {};
  return remembered_for_device(state, device, [] {
           cudaFuncAttributes attr{};
           bool ready =
               cudaFuncGetAttributes(&attr, decode_kernel<T, kMergeInCluster, kFp8Cache>(false)) == cudaSuccess &&
               attr.binaryVersion >= 90 && attr.sharedSizeBytes >= static_cast<size_t>(Sm90Tile::kStaticSmemBytes);
           for (const bool early_scores : {false, true}) {
             ready = ready && cudaFuncSetAttribute(decode_kernel<T, kMergeInCluster, kFp8Cache>(early_scores),
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   Sm90Tile::kSmemBytes) == cudaSuccess;
           }
           if (!ready) cudaGetLastError();
           return ready ? 1 : 0;
         }) == 1;
}

// A cache [P, page_size, width] (row and page strides in elements) as a 4-D tensor map [P, width / 64, page_size,
// 64]: a box of 64 rows x `blocks` 64-column blocks lands block after block. A 16-bit cache's blocks take 8 KB each
// in the 128-byte swizzle, the layout the kernel's operand tiles use, so one copy fills a whole part of a stage; an
// fp8 cache's (bytes) 4 KB each, unswizzled, for the producer to convert (fp8_tiles_sm90.cuh). Rows past page_size
// read as zeros.
template <typename T, bool kFp8Cache>
bool encode_cache_map(CUtensorMap* map, const void* data, int width, int blocks, int64_t row_stride,
                      int64_t page_stride, const DecodeParams& p) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  constexpr int64_t kElement = kFp8Cache ? 1 : 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(Sm90Tile::kBlockCols), static_cast<cuuint64_t>(p.page_size),
                              static_cast<cuuint64_t>(width / Sm90Tile::kBlockCols),
                              static_cast<cuuint64_t>(p.num_pages)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(row_stride * kElement),
                                 static_cast<cuuint64_t>(Sm90Tile::kBlockCols * kElement),
                                 static_cast<cuuint64_t>(page_stride * kElement)};
  const cuuint32_t box[4] = {Sm90Tile::kBlockCols, Sm90Tile::kKeyTile, static_cast<cuuint32_t>(blocks), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = kFp8Cache                          ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult result =
      encode(map, type, 4, const_cast<void*>(data), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             kFp8Cache ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS;
}

// Whether the clustered kernel (clusters of two CTAs) was compiled and its clusters keep the grid of `ctas` resident
// (either schedule: see decode_kernel): the condition both clustered launches below share.
template <typename T>
bool clusters_of_two_fit(int64_t ctas, const DeviceInfo& d) {
  return kernel_ready<T, true>(d.device) &&
         detail::clusters_keep_residency<Sm90Tile, sm90::decode_sm90_kernel<T, true>>(kSm90ClusterPieces, ctas, d);
}

// A fixed split of two pieces of at most kClusterMergeMaxKeys keys runs as clusters of a (sequence, row block)'s two
// pieces, which merge through distributed shared memory instead of the combine kernel, where the clusters keep the
// grid resident. Measured (perf-log v50): B = 28-56 with 32-128 heads 1.9-5.5 us faster at 1K keys, 0.9-5.0 at 4K;
// longer pieces, and more pieces per sequence (clusters of 4 or 8, or clusters writing partials for the combine),
// slower or level.
template <typename T>
bool merge_fixed_split_in_cluster(const DecodeParams& p, int64_t ctas, const DeviceInfo& d) {
  return p.balanced_target == 0 && sm90_merges_fixed_split(p.num_splits, p.kv_len_per_split) &&
         clusters_of_two_fit<T>(ctas, d);
}

// A call with seq_lens whose work items the planner kernel lays out (several sequences) runs its items in clusters
// of two as well: the planner gives each sequence of exactly two pieces an aligned pair, merged in its cluster, and
// the combine takes the rest. Only for batches of B sequences that equal lengths would cut in two pieces each within
// one wave of `target` items (target / 3 < B <= target / 2; ragged batches there mostly pair too): a wider batch fits
// one wave in single pieces or runs its pairs in more than one (B = 44, H = 128, S = 16K: 5 % slower in clusters),
// and where no sequence pairs the launch gains nothing (perf-log v53).
template <typename T>
bool pair_items_in_cluster(const DecodeParams& p, int64_t ctas, const DeviceInfo& d) {
  static_assert(kSm90ClusterPieces == 2, "the planner kernel pairs items");
  const int64_t target = p.balanced_target, batch = p.batch;
  const bool two_pieces_each = 3 * batch > target && 2 * batch <= target;
  // the planner places pairs in one round of its threads (work_item_planner.cuh)
  const bool one_planner_round = batch <= kPlannerMaxThreads;
  return p.item_table != nullptr && two_pieces_each && one_planner_round && work_items(p) % kSm90ClusterPieces == 0 &&
         clusters_of_two_fit<T>(ctas, d);
}

// How the kernel would launch a call, decided once for launch_decode_sm90 and sm90_pairs_items: not at all (runs
// false: the grid is too large or the driver refuses the caches' tensor maps, and the caller falls back), else its
// CTAs, tensor maps and use of clusters of two (merging a fixed split's two pieces, or pairing work items). An fp8
// cache runs without clusters.
struct LaunchShape {
  bool runs = false;
  int64_t ctas = 0;
  CUtensorMap kv_map, k_pe_map;
  bool merged = false;
  bool item_pairs = false;
};

template <typename T, bool kFp8Cache = false>
LaunchShape launch_shape(const DecodeParams& p, const DeviceInfo& d) {
  LaunchShape shape;
  const int64_t rows = static_cast<int64_t>(p.seqlen_q) * p.num_heads;
  shape.ctas = (rows + Sm90Tile::kRowTile - 1) / Sm90Tile::kRowTile * work_items(p);
  if (p.batch == 0 || shape.ctas > INT_MAX) return shape;
  if (!encode_cache_map<T, kFp8Cache>(&shape.kv_map, p.kv, kHeadDim, Sm90Tile::kHalfBlocks, p.kv_row_stride,
                                      p.kv_page_stride, p) ||
      !encode_cache_map<T, kFp8Cache>(&shape.k_pe_map, p.k_pe, kRopeDim, 1, p.k_pe_row_stride, p.k_pe_page_stride, p)) {
    return shape;
  }
  shape.runs = true;
  if constexpr (!kFp8Cache) {
    shape.merged = merge_fixed_split_in_cluster<T>(p, shape.ctas, d);
    shape.item_pairs = !shape.merged && pair_items_in_cluster<T>(p, shape.ctas, d);
  }
  return shape;
}

}  // namespace sm90_detail

template <DType dtype>
bool sm90_pairs_items(const DecodeParams& p, const DeviceInfo& d) {
  return p.cache_format == CacheFormat::kNative &&
         sm90_detail::launch_shape<typename ElementOf<dtype>::type>(p, d).item_pairs;
}

template <DType dtype, bool kFp8Cache>
bool sm90_kernel_ready(int device) {
  static_assert(sm90_detail::Sm90Tile::kKeyTile == kSm90KeyTile && sm90_detail::Sm90Tile::kRowTile == kLargeRowTile,
                "the planners and the kernel choice size calls for these tiles");
  return sm90_detail::kernel_ready<typename ElementOf<dtype>::type, false, kFp8Cache>(device) &&
         sm90_detail::tensor_map_encoder() != nullptr;
}

template <DType dtype, bool kFp8Cache>
Sm90Launch launch_decode_sm90(const DecodeParams& params, cudaStream_t stream, const DeviceInfo& d) {
  using T = typename ElementOf<dtype>::type;
  using C = sm90_detail::Sm90Tile;
  static_assert(dtype != DType::kFloat32, "the sm_90a kernel takes fp16 or bf16");
  const sm90_detail::LaunchShape shape = sm90_detail::launch_shape<T, kFp8Cache>(params, d);
  if (!shape.runs) return {};
  DecodeParams p = params;
  p.item_pairs_in_cluster = shape.item_pairs;
  const int64_t rows = static_cast<int64_t>(p.seqlen_q) * p.num_heads;
  const bool clustered = shape.merged || shape.item_pairs;
  // Programmatic dependent launch for small calls: the CTAs may start while the previous kernel on the stream drains
  // (the kernel waits before reading memory), which hides the launch gap.
  const bool use_overlap = use_programmatic_launch(p);
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (use_overlap) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (clustered) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {static_cast<unsigned>(kSm90ClusterPieces), 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(shape.ctas));
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = C::kSmemBytes;
  config.stream = stream;
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  launch_work_item_plan(p, stream, use_overlap);
  // A sequence's row blocks read the same tiles, one of them mostly from L2: with two or more, warpgroup 0's early
  // scores pay (perf-log v60, v61).
  const bool early_scores = rows > C::kRowTile;
  const auto kernel = [&] {
    if constexpr (kFp8Cache) {
      return sm90_detail::decode_kernel<T, false, true>(early_scores);
    } else {
      return clustered ? sm90_detail::decode_kernel<T, true>(early_scores)
                       : sm90_detail::decode_kernel<T, false>(early_scores);
    }
  }();
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, p, shape.kv_map, shape.k_pe_map);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("mla decode sm90 kernel launch: ") + cudaGetErrorString(err));
  }
  return Sm90Launch{true, shape.merged, shape.item_pairs};
}

}  // namespace mla::cuda
