// TORCH_LIBRARY_IMPL(mla, CUDA): the shared op entry points bound to the CUDA launchers, on the current stream of
// the inputs' device. No host synchronisation and shape-only allocation, so calls are CUDA-graph capturable.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "checks/build_checks.h"
#include "cuda/launch/device_info.h"
#include "cuda/launch/launch.h"
#include "cuda/launch/launch_counters.h"
#include "cuda/schedule/split_plan.h"
#include "cuda/schedule/workspace.h"
#include "decode_ops.h"

namespace mla {
namespace {

// The launchers are torch-free and report failures as std::runtime_error; re-raise them as torch errors.
template <class Fn>
void call_launcher(const char* op, Fn&& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, op, ": CUDA launch failed: ", e.what());
  }
}

// Refuses a device whose architecture this build has no kernels for, naming the compiled list and the rebuild
// command (CUDA itself would only say "no kernel image is available"). The device facts come from the launchers'
// cache; this only remembers, per device, that the check passed.
void check_device_arch() {
  static std::atomic<int> passed[cuda::kMaxDevices] = {};
  const cuda::DeviceInfo d = cuda::current_device_info();
  cuda::remembered_for_device(passed, d.device, [&] {
    if (!cuda_archs_run_on(compiled_cuda_archs(), d.major, d.minor)) {  // throws: nothing is remembered
      cudaDeviceProp properties{};
      C10_CUDA_CHECK(cudaGetDeviceProperties(&properties, d.device));
      const std::string name = "cuda:" + std::to_string(d.device) + " (" + properties.name + ")";
      TORCH_CHECK(false, cuda_arch_error(compiled_cuda_archs(), d.major, d.minor, name));
    }
    return 1;
  });
}

struct CudaBackend {
  // Every op enters through the guard: it selects the inputs' device and checks its architecture.
  struct Guard {
    explicit Guard(at::Device device) : device_guard(device) { check_device_arch(); }
    c10::cuda::CUDAGuard device_guard;
  };

  static void check_strict_allowed() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(), &status));
    TORCH_CHECK(status == cudaStreamCaptureStatusNone,
                "mla.decode: strict mode copies seq_lens and block_table to the host, which CUDA graph capture "
                "forbids; call mla_ext.set_strict(False) before capturing");
  }

  // Chooses the main kernel, plans the split for it where the caller gave none, allocates the split's workspace and
  // launches. With seq_lens the split is balanced on device from the actual lengths (no host sync); without, every
  // sequence holds `capacity` keys and the split follows from shapes.
  static void decode(DecodeProblem& problem, const at::TensorOptions& options) {
    DecodeParams& p = problem.params;
    const cuda::DeviceInfo device = cuda::current_device_info();
    cuda::KernelChoice kernel{};
    call_launcher("mla.decode", [&] {
      switch (problem.dtype) {
        case DType::kFloat16: kernel = cuda::choose_kernel<DType::kFloat16>(p, device); break;
        case DType::kBFloat16: kernel = cuda::choose_kernel<DType::kBFloat16>(p, device); break;
        case DType::kFloat32: kernel = cuda::choose_kernel<DType::kFloat32>(p, device); break;
      }
    });
    if (!problem.kv_len_per_split) {
      const int rows = p.seqlen_q * p.num_heads;
      if (p.seq_lens != nullptr) {
        cuda::set_balanced_split(
            p, cuda::balanced_split_for(p.batch, rows, p.capacity, device.sm_count, problem.dtype, kernel));
      } else {
        set_split(problem,
                  cuda::default_kv_len_per_split(p.batch, rows, p.capacity, device.sm_count, problem.dtype, kernel));
      }
    }
    // Kept alive until the kernels are enqueued (stream-ordered allocator).
    at::Tensor split_table;
    if (const int64_t entries = cuda::split_table_entries(p); entries > 0) {
      split_table = at::empty({entries}, options.dtype(at::kInt));
      p.split_table = split_table.data_ptr<int32_t>();
      p.item_table = cuda::items_planned_by_kernel(p) ? p.split_table + cuda::work_item_table_offset(p) : nullptr;
    }
    const SplitPartials partials = allocate_split_partials(p, options);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    call_launcher("mla.decode", [&] {
      switch (problem.dtype) {
        case DType::kFloat16: cuda::launch_decode<DType::kFloat16>(p, kernel, device, stream); break;
        case DType::kBFloat16: cuda::launch_decode<DType::kBFloat16>(p, kernel, device, stream); break;
        case DType::kFloat32: cuda::launch_decode<DType::kFloat32>(p, kernel, device, stream); break;
      }
    });
  }

  static void merge_states(const MergeStatesParams& p, DType dtype) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    call_launcher("mla.merge_states", [&] {
      switch (dtype) {
        case DType::kFloat16: cuda::launch_merge_states<DType::kFloat16>(p, stream); break;
        case DType::kBFloat16: cuda::launch_merge_states<DType::kBFloat16>(p, stream); break;
        case DType::kFloat32: cuda::launch_merge_states<DType::kFloat32>(p, stream); break;
      }
    });
  }
};

}  // namespace
}  // namespace mla

// Main-kernel launches per path since load (launch/launch_counters.h), for tests that check which kernel ran.
TORCH_LIBRARY_FRAGMENT(mla, m) {
  m.def("_kernel_launch_counts() -> int[]", &mla::cuda::kernel_launch_counts);
}

TORCH_LIBRARY_IMPL(mla, CUDA, m) {
  mla::register_backend<mla::CudaBackend>(m);
}
