// Whether the tests run under a sanitizer: the asan and tsan test presets (CMakePresets.json) set
// VESPER_SANITIZED. There a test's run checks memory and races, not volume or figures: the heavy
// equivalence and accuracy tests take fewer prompts, chunks or shapes, each code path still
// taken, and assert only what holds on any input. The release run keeps the full sweeps.
#pragma once

#include <cstdlib>

namespace vesper::testing_util {

inline bool sanitized() {
  return std::getenv("VESPER_SANITIZED") != nullptr;
}

}  // namespace vesper::testing_util
