// Calling the mla ops from C++ through the PyTorch dispatcher, as a libtorch program would, on inputs whose answer
// is known in closed form. The program links the operator library (CMakeLists.txt: mla_ops), whose static
// TORCH_LIBRARY registrations make "mla::decode" and friends available at load time.
//
//   mla_decode_example [cpu|cuda]...     (default: cpu). Exit 0: all match; 1: mismatch; 77: no CUDA device.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kBatch = 2, kHeads = 2, kKeys = 4, kDim = 512, kRopeDim = 64;

// The ops' C++ signatures, from their schemas: decode(q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table,
// seq_lens, causal) -> out, and decode_with_lse(...) -> (out, lse).
// (q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal, kv_scale, plan)
using DecodeSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   std::optional<double>, std::optional<int64_t>, const std::optional<at::Tensor>&,
                                   const std::optional<at::Tensor>&, bool, const std::optional<at::Tensor>&,
                                   const std::optional<at::Tensor>&);
using DecodeWithLseSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, std::optional<double>,
    std::optional<int64_t>, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&);

// Key j of every sequence is the unit vector e_j in both kv and k_pe. Head h's query holds half of log(w[h][j]) in
// q and half in q_pe, so with sm_scale = 1 its score for key j is log(w[h][j]): softmax gives w / sum(w), the output
// is that distribution over dims 0..3, and lse = log(sum(w)). Sequence 1 holds 3 keys, so key 3 drops out.
constexpr double kWeights[kHeads][kKeys] = {{1, 2, 3, 4}, {4, 3, 2, 1}};
constexpr int kSeqLens[kBatch] = {4, 3};

struct Inputs {
  at::Tensor q, q_pe, kv, k_pe, seq_lens;  // [B, H, D], [B, H, Dpe], [B, S, D], [B, S, Dpe], int32 [B]
};

Inputs make_inputs() {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  Inputs in{at::zeros({kBatch, kHeads, kDim}, f32), at::zeros({kBatch, kHeads, kRopeDim}, f32),
            at::zeros({kBatch, kKeys, kDim}, f32), at::zeros({kBatch, kKeys, kRopeDim}, f32),
            at::tensor({kSeqLens[0], kSeqLens[1]}, at::TensorOptions().dtype(at::kInt))};
  auto q = in.q.accessor<float, 3>(), q_pe = in.q_pe.accessor<float, 3>();
  auto kv = in.kv.accessor<float, 3>(), k_pe = in.k_pe.accessor<float, 3>();
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t j = 0; j < kKeys; ++j) {
      kv[b][j][j] = 1.0f;
      k_pe[b][j][j] = 1.0f;
      for (int64_t h = 0; h < kHeads; ++h) {
        q[b][h][j] = q_pe[b][h][j] = static_cast<float>(0.5 * std::log(kWeights[h][j]));
      }
    }
  }
  return in;
}

// The closed-form answer: out [B, H, D] and lse [B, H].
std::tuple<at::Tensor, at::Tensor> expected_outputs() {
  at::Tensor out = at::zeros({kBatch, kHeads, kDim}, at::kDouble), lse = at::zeros({kBatch, kHeads}, at::kDouble);
  auto o = out.accessor<double, 3>();
  auto l = lse.accessor<double, 2>();
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t h = 0; h < kHeads; ++h) {
      double total = 0;
      for (int j = 0; j < kSeqLens[b]; ++j) total += kWeights[h][j];
      for (int j = 0; j < kSeqLens[b]; ++j) o[b][h][j] = kWeights[h][j] / total;
      l[b][h] = std::log(total);
    }
  }
  return {out, lse};
}

double max_error(const at::Tensor& actual, const at::Tensor& expected) {
  return (actual.cpu().to(at::kDouble) - expected).abs().max().item<double>();
}

bool check_device(const at::Device device) {
  const auto decode = c10::Dispatcher::singleton().findSchemaOrThrow("mla::decode", "").typed<DecodeSignature>();
  const auto decode_with_lse =
      c10::Dispatcher::singleton().findSchemaOrThrow("mla::decode_with_lse", "").typed<DecodeWithLseSignature>();

  const Inputs cpu = make_inputs();
  const at::Tensor q = cpu.q.to(device), q_pe = cpu.q_pe.to(device), kv = cpu.kv.to(device);
  const at::Tensor k_pe = cpu.k_pe.to(device), seq_lens = cpu.seq_lens.to(device);
  const at::Tensor out =
      decode.call(q, q_pe, kv, k_pe, 1.0, std::nullopt, std::nullopt, seq_lens, false, std::nullopt, std::nullopt);
  const auto [out_again, lse] = decode_with_lse.call(q, q_pe, kv, k_pe, 1.0, std::nullopt, std::nullopt, seq_lens,
                                                     false, std::nullopt, std::nullopt);

  const auto [expected_out, expected_lse] = expected_outputs();
  const double out_error = std::max(max_error(out, expected_out), max_error(out_again, expected_out));
  const double lse_error = max_error(lse, expected_lse);
  const bool ok = out_error < 1e-5 && lse_error < 1e-5;
  std::printf("%s: mla::decode max |out error| %.2e, mla::decode_with_lse max |lse error| %.2e: %s\n",
              device.str().c_str(), out_error, lse_error, ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> devices(argv + 1, argv + argc);
  if (devices.empty()) devices.emplace_back("cpu");
  bool ok = true;
  for (const std::string& name : devices) {
    const at::Device device(name);
    if (device.is_cuda() && !at::hasCUDA()) {
      std::printf("%s: no CUDA device, skipped\n", name.c_str());
      return 77;
    }
    ok = check_device(device) && ok;
  }
  return ok ? 0 : 1;
}
