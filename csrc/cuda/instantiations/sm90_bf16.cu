// One translation unit per dtype so the kernels build in parallel.
#include "cuda/sm90/launch_sm90.cuh"

namespace mla::cuda {
template Sm90Launch launch_decode_sm90<DType::kBFloat16, false>(const DecodeParams&, cudaStream_t, const DeviceInfo&);
template bool sm90_kernel_ready<DType::kBFloat16, false>(int);
template bool sm90_pairs_items<DType::kBFloat16>(const DecodeParams&, const DeviceInfo&);
}  // namespace mla::cuda
