// Helpers for engine tests on stories260K: engine creation with overrides, prompt sets, and
// running a set of requests to completion while checking invariants after every step.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace vesper::testing_util {

inline const char* kStoriesLong = "../shared/models/stories260K-f32.gguf";

inline engine::EngineConfig stories_config() {
  engine::EngineConfig c;
  c.model_path = kStoriesLong;
  c.threads = 2;
  c.cache.num_gpu_blocks_override = 1024;
  c.cache.swap_space_gib = 0.01;
  c.scheduler.max_model_len = 512;
  return c;
}

inline std::unique_ptr<engine::Engine> make_engine(const engine::EngineConfig& c) {
  auto e = engine::Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(*e) : nullptr;
}

// Runs until every request finished; returns the final output of each request by id. Checks
// the engine's invariants after every step.
inline std::map<std::string, engine::RequestOutput> run_to_completion(engine::Engine& e, int64_t max_steps = 100000) {
  std::map<std::string, engine::RequestOutput> done;
  for (int64_t step = 0; e.has_unfinished(); ++step) {
    EXPECT_LT(step, max_steps) << "engine did not finish";
    if (step >= max_steps) break;
    for (auto& out : e.step())
      if (out.finished) done[out.request_id] = std::move(out);
    e.check_invariants();
  }
  return done;
}

// Checks that no KV block is held: every device block free, the swap pool empty.
inline void expect_no_leaks(const engine::Engine& e) {
  const auto s = e.stats();
  EXPECT_EQ(s.kv_blocks_used, 0) << "device blocks leaked";
  EXPECT_EQ(s.swap_blocks_used, 0) << "swap blocks leaked";
  EXPECT_EQ(s.num_running + s.num_waiting + s.num_swapped, 0);
}

// 64 prompts of varied lengths made from story sentences.
inline std::vector<std::string> varied_prompts(int n = 64) {
  const std::vector<std::string> parts = {
      "Once upon a time", " there was a little girl named Lily.", " She loved to play outside in the park.",
      " One day, she saw a big red ball.", " Tom and his dog went to the beach.", " The sun was hot and bright.",
      " They found a shiny shell in the sand.", " Mom said it was time to go home.", " The cat was very hungry.",
      " Ben wanted to help his friend.",
  };
  std::vector<std::string> prompts;
  for (int i = 0; i < n; ++i) {
    std::string p = parts[i % 3 == 0 ? 0 : (i % parts.size())];
    const int extra = (i * 7) % 9;
    for (int k = 0; k < extra; ++k) p += parts[(i + k * 3) % parts.size()];
    prompts.push_back(p);
  }
  return prompts;
}

}  // namespace vesper::testing_util
