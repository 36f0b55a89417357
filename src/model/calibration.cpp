#include "model/calibration.h"

#include <numeric>

#include "model/forward_batch.h"

namespace vesper::model {

Result<InputEnergy> measure_input_energy(Model& model, std::span<const int32_t> tokens, int64_t ctx,
                                         const std::function<void(int64_t, int64_t)>& progress) {
  if (ctx < 1) return make_error("calibration context " + std::to_string(ctx) + " is below 1");
  const int64_t chunks = static_cast<int64_t>(tokens.size()) / ctx;
  if (chunks < 1)
    return make_error("calibration text has " + std::to_string(tokens.size()) +
                      " tokens, fewer than one chunk of " + std::to_string(ctx));
  // f32 KV: the statistics are of the model as stored, not of a compressed cache.
  const backend::KvCacheSpec spec =
      model.kv_spec(16, backend::KvDtypes{backend::KvDtype::kF32, backend::KvDtype::kF32});
  const KvTableLayout layout(spec);
  const int64_t blocks = layout.entries_for(ctx);
  backend::Backend& backend = model.backend();
  const backend::KvHandle kv = backend.create_kv(spec, blocks, backend::MemoryKind::kDevice);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  model.reserve(StepCapacity{ctx, ctx, 1, blocks});

  InputEnergy energy;
  std::map<std::string, std::vector<double>>& sums = energy.mean_square;
  model.set_linear_input_observer(
      [&sums](const std::string& weight, const float* x, int64_t n_rows, int64_t n_in) {
        std::vector<double>& s = sums[weight];
        if (s.empty()) s.assign(static_cast<size_t>(n_in), 0.0);
        for (int64_t r = 0; r < n_rows; ++r)
          for (int64_t i = 0; i < n_in; ++i) {
            const double v = x[r * n_in + i];
            s[static_cast<size_t>(i)] += v * v;
          }
      });
  ForwardBatch batch;
  for (int64_t c = 0; c < chunks; ++c) {
    batch.clear();
    batch.add_sequence(tokens.subspan(static_cast<size_t>(c * ctx), static_cast<size_t>(ctx)), 0,
                       table, layout, ctx);
    model.forward(batch, kv);
    if (progress) progress(c + 1, chunks);
  }
  model.set_linear_input_observer({});
  backend.release_kv(kv);
  energy.tokens = chunks * ctx;
  for (auto& [name, s] : sums)
    for (double& v : s) v /= static_cast<double>(energy.tokens);
  return energy;
}

}  // namespace vesper::model
