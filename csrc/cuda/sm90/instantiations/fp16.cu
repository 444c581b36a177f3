// One translation unit per dtype so the kernels build in parallel.
#include "../launch_sm90.cuh"

namespace mla::cuda {
template Sm90Launch launch_decode_sm90<DType::kFloat16>(const DecodeParams&, cudaStream_t, const DeviceInfo&);
}  // namespace mla::cuda
