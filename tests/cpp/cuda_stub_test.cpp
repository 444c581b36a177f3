// A CPU-only build of the operator library answers CUDA calls with an error that says it has no CUDA kernels and
// how to rebuild, rather than the dispatcher's generic "could not run". No GPU needed: the call is sent straight to
// the CUDA kernel, which refuses before looking at the tensors.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdio>
#include <string>

int main() {
  int failures = 0;
  for (const char* name :
       {"mla::decode", "mla::decode_with_lse", "mla::decode_out", "mla::plan", "mla::merge_states"}) {
    const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
    torch::jit::Stack stack;
    for (size_t i = 0; i < op.schema().arguments().size(); ++i) stack.emplace_back(at::zeros({1}));
    std::string message;
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CUDA), &stack);
    } catch (const c10::Error& error) {
      message = error.what_without_backtrace();
    }
    const bool ok = message.find("built without CUDA kernels") != std::string::npos &&
                    message.find("MLA_EXT_FORCE_CUDA=1") != std::string::npos;
    std::printf("%s on CUDA in a CPU-only build: %s\n", name, ok ? "refused with the rebuild command" : "WRONG");
    if (!ok) std::printf("  got: %s\n", message.c_str());
    failures += ok ? 0 : 1;
  }
  return failures == 0 ? 0 : 1;
}
