// One translation unit per dtype so the kernels build in parallel.
#include "../launch_sm90.cuh"

namespace mla::cuda {
template bool launch_decode_sm90<DType::kBFloat16>(const DecodeParams&, cudaStream_t, int);
}  // namespace mla::cuda
