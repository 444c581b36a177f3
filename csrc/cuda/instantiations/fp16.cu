// One translation unit per dtype so the kernels build in parallel.
#include "cuda/launch/launch_decode.cuh"

namespace mla::cuda {
template KernelChoice choose_kernel<DType::kFloat16>(const DecodeParams&, const DeviceInfo&);
template void launch_decode<DType::kFloat16>(const DecodeParams&, const KernelChoice&, const DeviceInfo&, cudaStream_t);
template void launch_plan<DType::kFloat16>(const DecodeParams&, const KernelChoice&, const DeviceInfo&, cudaStream_t);
template void launch_merge_states<DType::kFloat16>(const MergeStatesParams&, cudaStream_t);
}  // namespace mla::cuda
