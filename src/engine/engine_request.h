// EngineRequest: one request as it travels from a front end (the HTTP server, `vesper generate`,
// the benchmarks) to the engine: one struct, so that a request field added later (an adapter,
// speculation settings) is added in one place and carried by every path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sample/sampling_params.h"

namespace vesper::engine {

struct EngineRequest {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  sample::SamplingParams params;
  int32_t priority = 0;  // lower is served first (vLLM)
  // The adapter (a name registered with --lora-modules or /v1/load_lora_adapter) the request
  // runs with; empty: the base model (plus any --lora adapters merged into every request).
  std::string lora_name = {};
};

}  // namespace vesper::engine
