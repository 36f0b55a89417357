#include "spec/pass_timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace vesper::spec {

double time_pass(model::Model& m, backend::KvHandle kv, int64_t rows, int64_t block_size) {
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::vector<int32_t> tokens(static_cast<size_t>(rows), 1), table;
  for (int64_t b = 0; b * block_size < rows; ++b) table.push_back(static_cast<int32_t>(b));
  model::ForwardBatch batch;
  batch.add_sequence(tokens, 0, table, block_size, 1);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double start = now();
    m.forward(batch, kv);
    if (rep > 0) best = std::min(best, now() - start);
  }
  return best;
}

std::vector<int64_t> calibration_rows(int64_t limit) {
  std::vector<int64_t> rows;
  for (int64_t r : {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128})
    if (r <= limit) rows.push_back(r);
  return rows;
}

}  // namespace vesper::spec
