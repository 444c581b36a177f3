// float8_e4m3fn caches with bf16 queries, in their own translation unit so the kernels build in parallel.
#include "cuda/launch/launch_fp8_cache.cuh"

namespace mla::cuda {
template KernelChoice choose_fp8_cache_kernel<DType::kBFloat16>(const DecodeParams&, const DeviceInfo&);
template void launch_decode_fp8_cache<DType::kBFloat16>(const DecodeParams&, const KernelChoice&, const DeviceInfo&,
                                                        cudaStream_t);
}  // namespace mla::cuda
