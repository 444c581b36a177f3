// One translation unit per dtype so the kernels build in parallel.
#include "../launch_decode.cuh"

namespace mla::cuda {
template void launch_decode<DType::kFloat32>(const DecodeParams&, cudaStream_t);
template void launch_merge_states<DType::kFloat32>(const MergeStatesParams&, cudaStream_t);
}  // namespace mla::cuda
