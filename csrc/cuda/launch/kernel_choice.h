// The main kernel of a call, chosen once on the host (choose_kernel, launch.h) before the split is planned: the split
// planners size the grid for it and the launcher runs it, so the plan always fits the kernel that walks it. Plain C++.
#pragma once

namespace mla::cuda {

enum class MainKernel : int {
  kSm90,            // sm90/: wgmma + TMA, fp16/bf16 with more than 16 rows per sequence on Hopper; work items
  kManyRows,        // kernels/many_rows.cuh: fp16/bf16, 64-row tiles; work items
  kMidRows,         // kernels/few_rows.cuh with two 16-row groups (17-32 rows); ranges
  kFewRows,         // kernels/few_rows.cuh, 16-row tiles (also any row count on devices of 99 KB); ranges
  kFp32TensorCore,  // kernels/fp32_tf32.cuh: fp32 as 3xTF32, 16-row tiles; ranges
  kFp32CudaCore,    // kernels/fp32_simt.cuh: plain fp32 on the CUDA cores, 16-row tiles; ranges
};

struct KernelChoice {
  MainKernel kernel;
  int row_tile;  // query rows per CTA (schedule/tile_plan.h)
  bool hopper;   // the device runs Hopper's kernel and configurations (sm90_kernel_enabled): deeper pipelines,
                 // fp32 on 32-key tiles
};

}  // namespace mla::cuda
