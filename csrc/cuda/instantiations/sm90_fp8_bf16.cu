// float8_e4m3fn caches (per tensor) in the sm_90a kernel with bf16 queries, in their own translation unit so the
// kernels build in parallel.
#include "cuda/sm90/launch_sm90.cuh"

namespace mla::cuda {
template Sm90Launch launch_decode_sm90<DType::kBFloat16, true>(const DecodeParams&, cudaStream_t, const DeviceInfo&);
template bool sm90_kernel_ready<DType::kBFloat16, true>(int);
}  // namespace mla::cuda
