// The engine tests under mpirun. With VESPER_TEST_SPLIT=tp or pp in the environment of a job of
// 2 ranks, every engine testing_util::make_engine() builds is split across the job
// (--tensor-parallel-size 2 or --pipeline-parallel-size 2, 1 thread a rank): rank 0 runs the
// tests, and before each such engine tells rank 1 which model to follow; rank 1 loads its part
// and follows the engine until rank 0's is gone, then waits for the next (main.cpp). The tests'
// checks are the same: scheduling, chunking, preemption, prefix caching, speculation and adapters
// leave a split engine's outputs what they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "engine/engine_config.h"

namespace vesper::testing_util {

// The split the tests run under: 1 x 1 and no group without VESPER_TEST_SPLIT.
struct TestSplit {
  int64_t tensor = 1;
  int64_t pipeline = 1;
  dist::Communicator* world = nullptr;
};
inline TestSplit& test_split() {
  static TestSplit split;
  return split;
}

// Gives `config` the split, on either rank (1 thread a rank: 2 ranks share these 2-core machines).
inline void apply_split(engine::EngineConfig& config) {
  const TestSplit& split = test_split();
  config.threads = 1;
  config.parallel.tensor_parallel_size = split.tensor;
  config.parallel.pipeline_parallel_size = split.pipeline;
  config.parallel.group = split.world;
  config.parallel.tensor_group = split.world;  // one stage (tp) or one rank a stage (pp, unused)
}

// On rank 0 under a split: tells rank 1 to follow an engine of `config`'s model, and gives
// `config` the split.
inline void split_engine(engine::EngineConfig& config) {
  TestSplit& split = test_split();
  if (split.world == nullptr) return;
  apply_split(config);
  split.world->post_message(
      std::vector<uint8_t>(config.model_path.begin(), config.model_path.end()), 1);
}

}  // namespace vesper::testing_util
