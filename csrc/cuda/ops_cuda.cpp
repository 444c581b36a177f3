// TORCH_LIBRARY_IMPL(mla, CUDA): the shared op entry points bound to the CUDA launchers, on the current stream of
// the inputs' device. No host synchronisation and shape-only allocation, so calls are CUDA-graph capturable.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

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

  // float8_e4m3fn caches: the fp8 kernel (kernels/few_rows_fp8.cuh) converts them into its fragments
  static constexpr bool kDequantisesFp8Cache = false;

  static void check_strict_allowed() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(), &status));
    TORCH_CHECK(status == cudaStreamCaptureStatusNone,
                "mla.decode: strict mode copies seq_lens and block_table to the host, which CUDA graph capture "
                "forbids; call mla_ext.set_strict(False) before capturing");
  }

  // Dispatches fn(std::integral_constant<DType, dtype>) for the call's dtype, re-raising launcher errors.
  template <class Fn>
  static void for_dtype(const char* op, DType dtype, Fn&& fn) {
    call_launcher(op, [&] {
      switch (dtype) {
        case DType::kFloat16: fn(std::integral_constant<DType, DType::kFloat16>{}); break;
        case DType::kBFloat16: fn(std::integral_constant<DType, DType::kBFloat16>{}); break;
        case DType::kFloat32: fn(std::integral_constant<DType, DType::kFloat32>{}); break;
      }
    });
  }

  struct Schedule {
    cuda::DeviceInfo device;
    cuda::KernelChoice kernel;
  };

  // Chooses the main kernel and plans the split for it where the caller gave none. With seq_lens the split is
  // balanced on device from the actual lengths (no host sync); without, every sequence holds `capacity` keys and the
  // split follows from shapes.
  static Schedule schedule(DecodeProblem& problem, const char* op) {
    DecodeParams& p = problem.params;
    Schedule s{cuda::current_device_info(), {}};
    for_dtype(op, problem.dtype,
              [&](auto dtype) { s.kernel = cuda::choose_kernel<decltype(dtype)::value>(p, s.device); });
    if (!problem.kv_len_per_split) {
      const int rows = p.seqlen_q * p.num_heads;
      if (p.seq_lens != nullptr) {
        cuda::set_balanced_split(
            p, cuda::balanced_split_for(p.batch, rows, p.capacity, s.device.sm_count, problem.dtype, s.kernel));
      } else {
        set_split(problem, cuda::default_kv_len_per_split(p.batch, rows, p.capacity, s.device.sm_count, problem.dtype,
                                                          s.kernel));
      }
    }
    return s;
  }

  // The tables of the planner kernel, laid out now on the current stream (empty where the call has none).
  static at::Tensor plan(DecodeProblem& problem, const at::TensorOptions& options) {
    const Schedule s = schedule(problem, "mla.plan");
    DecodeParams& p = problem.params;
    at::Tensor table = at::empty({cuda::planned_table_entries(p)}, options.dtype(at::kInt));
    if (table.numel() > 0) {
      cuda::bind_split_tables(p, table.data_ptr<int32_t>());
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      for_dtype("mla.plan", problem.dtype,
                [&](auto dtype) { cuda::launch_plan<decltype(dtype)::value>(p, s.kernel, s.device, stream); });
    }
    return table;
  }

  // Schedules the call, allocates the split's workspace (the tables come from `plan` where it holds them) and
  // launches.
  static void decode(DecodeProblem& problem, const at::TensorOptions& options, const std::optional<at::Tensor>& plan) {
    const Schedule s = schedule(problem, "mla.decode");
    DecodeParams& p = problem.params;
    // Kept alive until the kernels are enqueued (stream-ordered allocator).
    at::Tensor split_table;
    if (plan.has_value()) {
      check_plan_entries(*plan, cuda::planned_table_entries(p));
      if (plan->numel() > 0) {
        // read only: the planner kernel wrote it, the main and combine kernels read it
        cuda::bind_split_tables(p, const_cast<int32_t*>(plan->const_data_ptr<int32_t>()));
        p.item_table_planned = true;
      }
    }
    if (!p.item_table_planned) {
      if (const int64_t entries = cuda::split_table_entries(p); entries > 0) {
        split_table = at::empty({entries}, options.dtype(at::kInt));
        cuda::bind_split_tables(p, split_table.data_ptr<int32_t>());
      }
    }
    const SplitPartials partials = allocate_split_partials(p, options);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    for_dtype("mla.decode", problem.dtype,
              [&](auto dtype) { cuda::launch_decode<decltype(dtype)::value>(p, s.kernel, s.device, stream); });
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
