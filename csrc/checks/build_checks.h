// Which GPUs this build of the library can run on. The CUDA glue checks the device before the first launch, so a
// missing architecture is reported with what was compiled and how to rebuild, instead of CUDA's "no kernel image is
// available for execution on the device". Torch-free and CUDA-free.
#pragma once

#include <string>
#include <string_view>

namespace mla {

// Oldest compute capability the CUDA kernels support (tensor-core mma and cp.async).
inline constexpr int kMinComputeCapabilityMajor = 8;

// The compute capabilities the CUDA kernels were compiled for, in MLA_EXT_CUDA_ARCHS notation ("8.0+PTX;9.0a");
// empty for a CPU-only build.
std::string_view compiled_cuda_archs();

// Whether kernels compiled for `archs` run on a device of compute capability major.minor: an sm_XY binary runs on
// X.Y and later minors of X, an arch-specific one (9.0a) only on X.Y, and PTX ("+PTX") is compiled by the driver for
// X.Y and every later device.
bool cuda_archs_run_on(std::string_view archs, int major, int minor);

// "" when kernels compiled for `archs` run on the device; otherwise the error to raise, naming what was compiled,
// the device (`device`, e.g. "cuda:0 (NVIDIA H200)") and how to rebuild. Empty `archs` means a CPU-only build.
std::string cuda_arch_error(std::string_view archs, int major, int minor, std::string_view device);

}  // namespace mla
