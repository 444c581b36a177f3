// Calls on a float8_e4m3fn cache (launch.h: choose_fp8_cache_kernel, launch_decode_fp8_cache): the few- and mid-row
// kernel that converts the stored bytes into its mma fragments (kernels/few_rows_fp8.cuh), or on Hopper, over 16 rows
// per sequence of a cache stored per tensor, the sm_90a kernel, whose producer converts each tile in shared memory
// once for 64 rows (sm90/fp8_tiles_sm90.cuh). The split planners and the combine are those of a 16-bit cache of the
// same rows; only the main kernel and its configurations differ.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda/kernels/few_rows_fp8.cuh"
#include "cuda/launch/launch_decode.cuh"
#include "cuda/sm90/launch_sm90.h"

namespace mla::cuda {

template <typename T, CacheFormat kCache, int kRowGroups, int kKeyTile, int kStages, bool kSm90Only>
struct KernelOf<Fp8DimSplitTile<T, kCache, kRowGroups, kKeyTile, kStages, kSm90Only>> {
  static constexpr auto kernel =
      decode_fp8_dim_split_kernel<Fp8DimSplitTile<T, kCache, kRowGroups, kKeyTile, kStages, kSm90Only>>;
};

// A stage holds 32 keys as stored (21 KB per block, 18.4 KB per tensor, against 36.9 KB for a 16-bit cache), so the
// configurations keep twice the tiles in flight of the 16-bit ones they follow (launch_decode.cuh), in about the
// same shared memory.
template <typename T, CacheFormat kCache>
struct Fp8CacheConfigs {
  //                                     row groups, keys, stages, sm90-only
  using FewRowsSm90 = Fp8DimSplitTile<T, kCache, 1, 32, 4, false>;  // two CTAs per Hopper SM
  using FewRowsDeep = Fp8DimSplitTile<T, kCache, 1, 32, 8, true>;   // at most one CTA per SM: 7 tiles in flight
  using FewRowsSm80 = Fp8DimSplitTile<T, kCache, 1, 32, 6, false>;
  using MidRowsSm90 = Fp8DimSplitTile<T, kCache, 2, 32, 8, true>;
  using MidRowsSm80 = Fp8DimSplitTile<T, kCache, 2, 32, 5, false>;
  static_assert(2 * (FewRowsSm90::kSmemBytes + 1024) <= 233472, "two few-row CTAs per Hopper SM");
  static_assert(FewRowsSm80::kSmemBytes <= 166912 && MidRowsSm80::kSmemBytes <= 166912, "sm_80 configs fit 163 KB");
  static_assert(FewRowsDeep::kSmemBytes <= 232448 && MidRowsSm90::kSmemBytes <= 232448, "sm_90 configs fit 227 KB");
};

template <DType dtype>
KernelChoice choose_fp8_cache_kernel(const DecodeParams& p, const DeviceInfo& d) {
  using T = typename ElementOf<dtype>::type;
  // Both formats take the same shared memory within a few KB: the per-block configurations decide.
  using C = Fp8CacheConfigs<T, CacheFormat::kFp8PerBlock>;
  const bool hopper = sm90_kernel_enabled(d.major);
  const int64_t rows = static_cast<int64_t>(p.seqlen_q) * p.num_heads;
  // Hopper's kernel converts each tile once for its 64 rows; per tensor only (per-block scales would have to be
  // applied to the values, rounding them to 16 bits).
  if (hopper && p.cache_format == CacheFormat::kFp8PerTensor && sm90_takes_layout(p) &&
      sm90_kernel_ready<dtype, true>(d.device)) {
    return {MainKernel::kSm90, kLargeRowTile, hopper};
  }
  // Elsewhere over 16 rows per sequence the mid-row kernel runs blocks of 32 (adjacent CTAs: each tile is read from
  // HBM once, but converted by each).
  if (rows <= kSmallRowTile && (detail::fits<typename C::FewRowsSm90>(d) || detail::fits<typename C::FewRowsSm80>(d))) {
    return {MainKernel::kFewRows, kSmallRowTile, hopper};
  }
  if (detail::fits<typename C::MidRowsSm90>(d) || detail::fits<typename C::MidRowsSm80>(d)) {
    return {MainKernel::kMidRows, kMidRowTile, hopper};
  }
  throw std::runtime_error("float8_e4m3fn caches need " + std::to_string(C::FewRowsSm90::kSmemBytes) +
                           " bytes of shared memory per block on CUDA; the device allows " +
                           std::to_string(d.smem_optin));
}

template <DType dtype, CacheFormat kCache>
bool launch_fp8_cache_with(const DecodeParams& p, const KernelChoice& choice, const DeviceInfo& d,
                           cudaStream_t stream) {
  using C = Fp8CacheConfigs<typename ElementOf<dtype>::type, kCache>;
  if (choice.kernel == MainKernel::kMidRows) {
    return launch_first_fitting<typename C::MidRowsSm90, typename C::MidRowsSm80>(p, stream, d);
  }
  if (choice.hopper && few_row_grid_is_lone(p, d)) {
    return launch_first_fitting<typename C::FewRowsDeep, typename C::FewRowsSm80>(p, stream, d);
  }
  if (choice.hopper) return launch_first_fitting<typename C::FewRowsSm90, typename C::FewRowsSm80>(p, stream, d);
  return launch_first_fitting<typename C::FewRowsSm80>(p, stream, d);
}

template <DType dtype>
void launch_decode_fp8_cache(const DecodeParams& p, const KernelChoice& choice, const DeviceInfo& d,
                             cudaStream_t stream) {
  static_assert(dtype != DType::kFloat32, "fp8 caches take fp16 or bf16 queries");
  if (choice.kernel == MainKernel::kSm90) {
    if (!launch_sm90_with_combine<dtype, true>(p, d, stream)) {
      throw std::runtime_error(
          "mla decode: the sm_90a kernel cannot launch (the driver refused the fp8 cache's tensor maps, or too many "
          "work items)");
    }
    return;
  }
  const bool launched = p.cache_format == CacheFormat::kFp8PerTensor
                            ? launch_fp8_cache_with<dtype, CacheFormat::kFp8PerTensor>(p, choice, d, stream)
                            : launch_fp8_cache_with<dtype, CacheFormat::kFp8PerBlock>(p, choice, d, stream);
  if (!launched) throw std::runtime_error("mla decode: internal error: no fp8-cache configuration fits the device");
  count_launch(KernelPath::kPortable);
}

}  // namespace mla::cuda
