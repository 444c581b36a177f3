// On/off switches read from the environment (A/B measurements, strict mode). Plain C++, no torch or CUDA headers.
#pragma once

#include <cstdlib>
#include <cstring>

namespace mla {

// The switch `name`: unset or empty gives `fallback`, "0" false, any other value true. Callers read it once per
// process (a function-local static), so a replayed CUDA graph and every call see the same choice.
inline bool env_switch(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return fallback;
  return std::strcmp(value, "0") != 0;
}

}  // namespace mla
