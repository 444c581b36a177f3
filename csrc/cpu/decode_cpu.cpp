// The CPU kernel: plans tasks of (sequence, block of query rows, split), runs them in parallel with the best entry
// point this CPU supports, then combines the splits in a fixed order (deterministic, batch invariant).
//
// Entry points per ISA: the task code (attend.h, tiles_*.h) is generic and always inlined, so each wrapper below
// compiles it for its own target: AVX-512 with BF16 dot products, AVX-512, AVX2 + FMA, or the baseline ISA.
// ATEN_CPU_CAPABILITY (default / avx2 / avx512), the variable ATen itself honours, caps the choice.
#include "cpu/decode_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>

#include "cpu/attend.h"
#include "cpu/convert.h"
#include "cpu/tiles_bf16_avx512.h"
#include "cpu/tiles_f32.h"

// The vector-typed helpers are instantiated at the end of this file; they never cross an ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mla::cpu {
namespace {

using TaskFn = void (*)(const DecodeParams&, const TaskSpec&, const TaskScratch&);

template <class Policy>
void attend_baseline(const DecodeParams& p, const TaskSpec& task, const TaskScratch& s) {
  attend<Policy>(p, task, s);
}

#ifdef MLA_CPU_X86
template <class Policy>
__attribute__((target("avx2,fma,f16c"))) void attend_avx2(const DecodeParams& p, const TaskSpec& task,
                                                          const TaskScratch& s) {
  attend<Policy>(p, task, s);
}

template <class Policy>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"))) void attend_avx512(const DecodeParams& p,
                                                                                          const TaskSpec& task,
                                                                                          const TaskScratch& s) {
  attend<Policy>(p, task, s);
}

MLA_AVX512_BF16 void attend_avx512_bf16(const DecodeParams& p, const TaskSpec& task, const TaskScratch& s) {
  attend<Bf16DotPolicy>(p, task, s);
}
#endif

enum class Isa { kBaseline, kAvx2, kAvx512, kAvx512Bf16 };

Isa detect_isa() {
#ifdef MLA_CPU_X86
  __builtin_cpu_init();
  Isa best = Isa::kBaseline;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    best = Isa::kAvx2;
  }
  if (best == Isa::kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    best = __builtin_cpu_supports("avx512bf16") ? Isa::kAvx512Bf16 : Isa::kAvx512;
  }
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  const std::string limit = cap ? cap : "";
  if (limit == "default") return Isa::kBaseline;
  if (limit == "avx2") return std::min(best, Isa::kAvx2);
  return best;
#else
  return Isa::kBaseline;
#endif
}

Isa cpu_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

TaskFn select_task_fn(DType dtype) {
  const Isa isa = cpu_isa();
#ifdef MLA_CPU_X86
  switch (isa) {
    case Isa::kAvx512Bf16:
    case Isa::kAvx512:
      if (dtype == DType::kBFloat16) {
        return isa == Isa::kAvx512Bf16 ? &attend_avx512_bf16 : &attend_avx512<Fp32Policy<16, Bf16IO>>;
      }
      if (dtype == DType::kFloat16) return &attend_avx512<Fp32Policy<16, HalfF16cIO>>;
      return &attend_avx512<Fp32Policy<16, Fp32IO>>;
    case Isa::kAvx2:
      if (dtype == DType::kBFloat16) return &attend_avx2<Fp32Policy<8, Bf16IO>>;
      if (dtype == DType::kFloat16) return &attend_avx2<Fp32Policy<8, HalfF16cIO>>;
      return &attend_avx2<Fp32Policy<8, Fp32IO>>;
    case Isa::kBaseline: break;
  }
#endif
  if (dtype == DType::kBFloat16) return &attend_baseline<Fp32Policy<4, Bf16IO>>;
  if (dtype == DType::kFloat16) return &attend_baseline<Fp32Policy<4, HalfIO>>;
  return &attend_baseline<Fp32Policy<4, Fp32IO>>;
}

// Each thread keeps one block of working memory across calls (no page faults per call), carved into TaskScratch.
class ThreadScratch {
 public:
  ThreadScratch() {
    constexpr int64_t rows = kMaxTaskRows;
    // Bytes of each TaskScratch field, in declaration order (about 0.8 MB: it stays in a 1-2 MB L2).
    const int64_t sizes[] = {
        kKeyDim * rows * 4,         // q_packed (fp32 worst case)
        kChunkKeys * rows * 4,      // scores
        rows * kHeadDim * 4,        // out_acc
        kChunkKeys * kKeyDim * 4,   // key_buf
        kChunkKeys * rows * 2,      // p_pairs
        kChunkKeys * kHeadDim * 2,  // v_pairs
        rows * 4,                   // row_max
        rows * 4,                   // row_sum
        rows * 4,                   // rescale
        rows * 4,                   // key_limit
    };
    int64_t offsets[std::size(sizes)];
    int64_t total = 0;
    for (size_t i = 0; i < std::size(sizes); ++i) {
      offsets[i] = total;
      total += round_up(sizes[i], 64);
    }
    base_ = static_cast<char*>(std::aligned_alloc(64, total));
    TORCH_CHECK(base_ != nullptr, "mla.decode (CPU): could not allocate ", total, " bytes of working memory");
    scratch_ = TaskScratch{base_ + offsets[0],
                           reinterpret_cast<float*>(base_ + offsets[1]),
                           reinterpret_cast<float*>(base_ + offsets[2]),
                           reinterpret_cast<float*>(base_ + offsets[3]),
                           reinterpret_cast<uint16_t*>(base_ + offsets[4]),
                           reinterpret_cast<uint16_t*>(base_ + offsets[5]),
                           reinterpret_cast<float*>(base_ + offsets[6]),
                           reinterpret_cast<float*>(base_ + offsets[7]),
                           reinterpret_cast<float*>(base_ + offsets[8]),
                           reinterpret_cast<int32_t*>(base_ + offsets[9])};
  }
  ~ThreadScratch() { std::free(base_); }
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;

  const TaskScratch& get() const { return scratch_; }

 private:
  char* base_ = nullptr;
  TaskScratch scratch_{};
};

const TaskScratch& thread_scratch() {
  thread_local ThreadScratch scratch;
  return scratch.get();
}

int ceil_div(int64_t a, int64_t b) {
  return static_cast<int>((a + b - 1) / b);
}

// Combines the splits of every row in split order: weights exp(lse_s - max) over the splits that saw a key.
template <class IO>
void combine_splits(const DecodeParams& p) {
  using Elem = typename IO::Elem;
  const int rows_per_seq = p.seqlen_q * p.num_heads;
  const int num_splits = p.num_splits;
  const float minus_inf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, static_cast<int64_t>(p.batch) * rows_per_seq, 16, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kHeadDim];
    for (int64_t entry = begin; entry < end; ++entry) {
      const int b = static_cast<int>(entry / rows_per_seq);
      const int row = static_cast<int>(entry - static_cast<int64_t>(b) * rows_per_seq);
      const float* lse_split = p.lse_partial + entry * num_splits;
      const float* out_split = p.out_partial + entry * num_splits * kHeadDim;
      const RowOffsets at = row_offsets(p, b, row);
      Elem* out = static_cast<Elem*>(p.out) + at.out;
      float& lse = p.lse[at.lse];
      float max_lse = minus_inf;
      bool nan = false;  // a split that saw a non-finite key makes the row NaN, as in the reference
      for (int s = 0; s < num_splits; ++s) {
        max_lse = std::max(max_lse, lse_split[s]);
        nan |= std::isnan(lse_split[s]);
      }
      if (nan) {
        const float quiet_nan = std::numeric_limits<float>::quiet_NaN();
        std::fill(acc, acc + kHeadDim, quiet_nan);
        IO::template from_float<4>(acc, 1.0f, out, kHeadDim);
        lse = quiet_nan;
        continue;
      }
      if (max_lse == minus_inf) {  // no split saw a key
        std::memset(out, 0, sizeof(Elem) * kHeadDim);
        lse = minus_inf;
        continue;
      }
      std::fill(acc, acc + kHeadDim, 0.0f);
      float total = 0.0f;
      for (int s = 0; s < num_splits; ++s) {
        if (lse_split[s] == minus_inf) continue;  // an empty split: its out_partial was never written
        const float weight = std::exp(lse_split[s] - max_lse);
        total += weight;
        const float* part = out_split + static_cast<int64_t>(s) * kHeadDim;
        for (int d = 0; d < kHeadDim; ++d) acc[d] += weight * part[d];
      }
      IO::template from_float<4>(acc, 1.0f / total, out, kHeadDim);
      lse = static_cast<float>(max_lse + std::log(static_cast<double>(total)));
    }
  });
}

void combine_splits(const DecodeParams& p, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return combine_splits<Fp32IO>(p);
    case DType::kBFloat16: return combine_splits<Bf16IO>(p);
    case DType::kFloat16:
#ifdef MLA_CPU_X86
      if (cpu_isa() != Isa::kBaseline) return combine_splits<HalfF16cIO>(p);
#endif
      return combine_splits<HalfIO>(p);
  }
}

template <class T>
void merge_rows(const MergeStatesParams& p) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max(p.dim, 1));
  at::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* a = static_cast<const T*>(p.out_a) + r * p.dim;
      const T* b = static_cast<const T*>(p.out_b) + r * p.dim;
      T* out = static_cast<T*>(p.out) + r * p.dim;
      const float lse_a = p.lse_a[r], lse_b = p.lse_b[r];
      const float max_lse = std::max(lse_a, lse_b);
      if (std::isnan(lse_a) || std::isnan(lse_b)) {  // NaN in, NaN out (std::max would drop it)
        for (int d = 0; d < p.dim; ++d) out[d] = T(std::numeric_limits<float>::quiet_NaN());
        p.lse[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      if (max_lse == minus_inf) {
        for (int d = 0; d < p.dim; ++d) out[d] = T(0.0f);
        p.lse[r] = minus_inf;
        continue;
      }
      // A side with lse -inf has weight 0 and is skipped, never multiplied (its values may be anything).
      const float weight_a = lse_a == minus_inf ? 0.0f : std::exp(lse_a - max_lse);
      const float weight_b = lse_b == minus_inf ? 0.0f : std::exp(lse_b - max_lse);
      const float total = weight_a + weight_b;
      const float scale_a = weight_a / total, scale_b = weight_b / total;
      if (weight_b == 0.0f) {
        for (int d = 0; d < p.dim; ++d) out[d] = T(static_cast<float>(a[d]) * scale_a);
      } else if (weight_a == 0.0f) {
        for (int d = 0; d < p.dim; ++d) out[d] = T(static_cast<float>(b[d]) * scale_b);
      } else {
        for (int d = 0; d < p.dim; ++d) {
          out[d] = T(static_cast<float>(a[d]) * scale_a + static_cast<float>(b[d]) * scale_b);
        }
      }
      p.lse[r] = max_lse + std::log(total);
    }
  });
}

}  // namespace

void decode(const DecodeParams& p, DType dtype) {
  if (p.batch == 0) return;
  const int rows_per_seq = p.seqlen_q * p.num_heads;
  const int threads = at::get_num_threads();
  // Row blocks of at most kMaxTaskRows rows; more (down to 16 rows) when batch x splits leaves threads idle.
  int groups = ceil_div(rows_per_seq, kMaxTaskRows);
  const int64_t seq_tasks = static_cast<int64_t>(p.batch) * p.num_splits;
  if (seq_tasks * groups < threads) {
    groups = std::max(groups, std::min(ceil_div(threads, seq_tasks), ceil_div(rows_per_seq, kRowAlign)));
  }
  const int group_rows = static_cast<int>(round_up(ceil_div(rows_per_seq, groups), kRowAlign));
  groups = ceil_div(rows_per_seq, group_rows);

  const TaskFn run_task = select_task_fn(dtype);
  const int64_t num_tasks = seq_tasks * groups;
  at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    const TaskScratch& scratch = thread_scratch();
    for (int64_t index = begin; index < end; ++index) {
      const int split = static_cast<int>(index % p.num_splits);
      const int64_t block = index / p.num_splits;
      const int group = static_cast<int>(block % groups);
      TaskSpec task;
      task.batch_index = static_cast<int>(block / groups);
      task.row_begin = group * group_rows;
      task.row_count = std::min(group_rows, rows_per_seq - task.row_begin);
      task.split = split;
      run_task(p, task, scratch);
    }
  });
  if (p.num_splits > 1) combine_splits(p, dtype);
}

void merge_states(const MergeStatesParams& p, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return merge_rows<float>(p);
    case DType::kBFloat16: return merge_rows<c10::BFloat16>(p);
    case DType::kFloat16: return merge_rows<c10::Half>(p);
  }
}

int default_kv_len_per_split(int batch, int rows_per_seq, int capacity, int num_threads) {
  constexpr int kMinSplitKeys = 256;  // below this the per-split Q packing and the combine stop paying off
  constexpr int64_t kLargestSplit = std::numeric_limits<int>::max() / 16 * 16;
  if (capacity <= 0 || batch <= 0) return 16;
  const int64_t units = static_cast<int64_t>(batch) * ceil_div(std::max(rows_per_seq, 1), kMaxTaskRows);
  const int max_splits = std::max(1, capacity / kMinSplitKeys);
  const int threads = std::max(num_threads, 1);
  // The fewest splits whose tasks spread over the threads with at most ~15% idle time.
  int splits = 1;
  for (; splits < max_splits; ++splits) {
    const int64_t tasks = units * splits;
    const int64_t waves = (tasks + threads - 1) / threads;
    if (tasks * 100 >= waves * threads * 85) break;
  }
  return static_cast<int>(std::min<int64_t>(round_up(ceil_div(capacity, splits), 16), kLargestSplit));
}

}  // namespace mla::cpu
