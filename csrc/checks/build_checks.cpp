// The architecture check of build_checks.h, an op that exposes it to Python (so it is tested without a GPU), and,
// in a CPU-only build, CUDA kernels that say the build has none instead of the dispatcher's generic error.
#include "checks/build_checks.h"

#include <torch/library.h>

#include <optional>
#include <string>

// setup.py and CMakeLists.txt pass the list the kernels were compiled with ("" for a CPU-only build).
#ifndef MLA_EXT_CUDA_ARCHS
#error "MLA_EXT_CUDA_ARCHS must name the compiled CUDA archs, e.g. \"8.0+PTX;9.0a\" (\"\" for a CPU-only build)"
#endif

namespace mla {
namespace {

struct CudaArch {
  int major = 0;
  int minor = 0;
  bool arch_specific = false;  // "9.0a": runs only on exactly 9.0
  bool ptx = false;            // "+PTX": the driver compiles it for any later device
};

bool read_number(std::string_view& text, int& value) {
  size_t digits = 0;
  value = 0;
  while (digits < text.size() && digits < 4 && text[digits] >= '0' && text[digits] <= '9') {
    value = value * 10 + (text[digits] - '0');
    ++digits;
  }
  text.remove_prefix(digits);
  return digits > 0;
}

// "8.0", "9.0a", "8.0+PTX"; false for anything else (the build scripts reject such lists before compiling).
bool parse_arch(std::string_view text, CudaArch& arch) {
  if (!read_number(text, arch.major) || text.empty() || text.front() != '.') return false;
  text.remove_prefix(1);
  if (!read_number(text, arch.minor)) return false;
  if (!text.empty() && text.front() == 'a') {
    arch.arch_specific = true;
    text.remove_prefix(1);
  }
  constexpr std::string_view kPtx = "+PTX";
  if (text.substr(0, kPtx.size()) == kPtx) {
    arch.ptx = true;
    text.remove_prefix(kPtx.size());
  }
  return text.empty();
}

bool arch_runs_on(const CudaArch& arch, int major, int minor) {
  if (arch.arch_specific) return major == arch.major && minor == arch.minor;
  const bool binary_runs = major == arch.major && minor >= arch.minor;
  const bool ptx_runs = arch.ptx && (major > arch.major || (major == arch.major && minor >= arch.minor));
  return binary_runs || ptx_runs;
}

std::string capability(int major, int minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace

std::string_view compiled_cuda_archs() {
  return MLA_EXT_CUDA_ARCHS;
}

bool cuda_archs_run_on(std::string_view archs, int major, int minor) {
  while (!archs.empty()) {
    const size_t end = archs.find(';');
    CudaArch arch;
    if (parse_arch(archs.substr(0, end), arch) && arch_runs_on(arch, major, minor)) return true;
    archs.remove_prefix(end == std::string_view::npos ? archs.size() : end + 1);
  }
  return false;
}

std::string cuda_arch_error(std::string_view archs, int major, int minor, std::string_view device) {
  if (archs.empty()) {
    return "mla_ext was built without CUDA kernels (CPU only), so it cannot run on " + std::string(device) +
           ". Rebuild it with a CUDA build of torch and the CUDA toolkit: CUDA_HOME=/usr/local/cuda "
           "MLA_EXT_FORCE_CUDA=1 pip install --no-build-isolation --no-deps . (CMake: -DMLA_EXT_WITH_CUDA=ON)";
  }
  if (cuda_archs_run_on(archs, major, minor)) return "";
  std::string error = "mla_ext's CUDA kernels were compiled for compute capabilities " + std::string(archs) +
                      " (MLA_EXT_CUDA_ARCHS), none of which runs on " + std::string(device) +
                      ", which has compute capability " + capability(major, minor) + ". ";
  if (major < kMinComputeCapabilityMajor) {
    return error + "mla_ext's CUDA kernels need compute capability " + std::to_string(kMinComputeCapabilityMajor) +
           ".0 or newer; use CPU tensors on this machine";
  }
  const std::string wanted = std::string(archs) + ";" + capability(major, minor);
  return error + "Rebuild mla_ext for it: MLA_EXT_CUDA_ARCHS=\"" + wanted +
         "\" pip install --no-build-isolation --no-deps . (CMake: -DMLA_EXT_CUDA_ARCHS=\"" + wanted + "\")";
}

}  // namespace mla

namespace {

// The architecture check for any capability and arch list (default: this build's), for tests and diagnostics.
std::string cuda_arch_error_op(int64_t major, int64_t minor, std::optional<std::string> archs) {
  const std::string_view list = archs.has_value() ? std::string_view(*archs) : mla::compiled_cuda_archs();
  return mla::cuda_arch_error(list, static_cast<int>(major), static_cast<int>(minor), "this GPU");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mla, m) {
  m.def("_cuda_arch_error(int major, int minor, str? archs=None) -> str", &cuda_arch_error_op);
}

#ifndef MLA_EXT_WITH_CUDA
namespace {

void refuse_cuda_tensors(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK(false, op.schema().name(), ": ", mla::cuda_arch_error("", 0, 0, "CUDA tensors"));
}

}  // namespace

TORCH_LIBRARY_IMPL(mla, CUDA, m) {
  for (const char* name : {"decode", "decode_with_lse", "decode_out", "plan", "merge_states"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&refuse_cuda_tensors>());
  }
}
#endif
