// One translation unit per dtype so the kernels build in parallel.
#include "cuda/launch/launch_decode.cuh"

namespace mla::cuda {
template KernelChoice choose_kernel<DType::kFloat32>(const DecodeParams&, const DeviceInfo&);
template void launch_decode<DType::kFloat32>(const DecodeParams&, const KernelChoice&, const DeviceInfo&, cudaStream_t);
template void launch_plan<DType::kFloat32>(const DecodeParams&, const KernelChoice&, const DeviceInfo&, cudaStream_t);
template void launch_merge_states<DType::kFloat32>(const MergeStatesParams&, cudaStream_t);
}  // namespace mla::cuda
