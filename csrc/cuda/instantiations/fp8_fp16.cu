// float8_e4m3fn caches with fp16 queries, in their own translation unit so the kernels build in parallel.
#include "cuda/launch/launch_fp8_cache.cuh"

namespace mla::cuda {
template KernelChoice choose_fp8_cache_kernel<DType::kFloat16>(const DecodeParams&, const DeviceInfo&);
template void launch_decode_fp8_cache<DType::kFloat16>(const DecodeParams&, const KernelChoice&, const DeviceInfo&,
                                                       cudaStream_t);
}  // namespace mla::cuda
