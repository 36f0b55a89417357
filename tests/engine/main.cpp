// test_engine's main: GoogleTest's, and under mpirun with VESPER_TEST_SPLIT the split of
// test_split.h: rank 0 runs the tests, rank 1 follows each engine they build.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "dist/launch.h"
#include "engine/follower.h"
#include "test_split.h"

namespace {

// Rank 1: follows an engine of each model rank 0 names, until an empty name (no more tests).
int follow_engines(vesper::dist::Communicator& world) {
  for (;;) {
    std::vector<uint8_t> message;
    world.receive_message(message, 0, /*unbounded=*/true);
    if (message.empty()) return 0;
    vesper::engine::EngineConfig config;
    config.model_path.assign(message.begin(), message.end());
    vesper::testing_util::apply_split(config);
    if (vesper::Status s = vesper::engine::run_follower(config); !s)
      world.abort(config.model_path + ": " + s.error().message);
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const char* split_name = std::getenv("VESPER_TEST_SPLIT");
  if (split_name == nullptr || *split_name == '\0') return RUN_ALL_TESTS();
  const std::string split(split_name);
  if (split != "tp" && split != "pp") {
    std::fprintf(stderr, "VESPER_TEST_SPLIT=%s: tp or pp\n", split_name);
    return 2;
  }
  auto world = vesper::dist::world(2);
  if (!world) {
    std::fprintf(stderr, "VESPER_TEST_SPLIT=%s: %s\n", split_name, world.error().message.c_str());
    return 2;
  }
  vesper::testing_util::TestSplit& s = vesper::testing_util::test_split();
  s.world = *world;
  (split == "tp" ? s.tensor : s.pipeline) = 2;
  if (s.world->rank() != 0) return follow_engines(*s.world);
  const int rc = RUN_ALL_TESTS();
  s.world->post_message({}, 1);  // no more engines
  return rc;
}
