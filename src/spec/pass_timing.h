// What a forward pass costs, measured at start for --num-speculative-tokens auto's cost model
// (spec/speculation_policy.h): the target's passes and a draft model's.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace vesper::spec {

// Seconds one pass of `rows` rows costs `m` (one sequence's prompt of that many tokens in the
// first blocks of `kv`, free at start): the best of two after a warm-up.
double time_pass(model::Model& m, backend::KvHandle kv, int64_t rows, int64_t block_size);

// Row counts the cost tables are measured at: every count up to 8 (where a step turns from
// memory- to compute-bound on these machines), then sparser, up to `limit`.
std::vector<int64_t> calibration_rows(int64_t limit);

}  // namespace vesper::spec
