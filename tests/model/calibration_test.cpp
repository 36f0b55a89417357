// model::measure_input_energy: every linear layer's input, observed during the fast forward,
// against the same inputs of the f64 reference forward.
#include "model/calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "reference/reference_forward.h"

namespace vesper::model {
namespace {

TEST(Calibration, InputEnergyIsEveryLinearLayersInputMeanSquare) {
  auto m = testing_util::load_model("../shared/models/stories260K.gguf");
  ASSERT_TRUE(m) << m.error().message;
  const ModelConfig& c = (*m)->config();
  // Two chunks of 40 tokens and 7 more that make no whole chunk (left out).
  std::vector<int32_t> tokens;
  for (int i = 0; i < 87; ++i) tokens.push_back(1 + (i * 37 + i * i) % 500);
  auto energy = measure_input_energy(**m, tokens, 40);
  ASSERT_TRUE(energy) << energy.error().message;
  EXPECT_EQ(energy->tokens, 80);

  // The reference's inputs, chunk by chunk (each from position 0), averaged the same way.
  std::map<std::string, std::vector<double>> want;
  for (int chunk = 0; chunk < 2; ++chunk) {
    const std::vector<int32_t> part(tokens.begin() + chunk * 40, tokens.begin() + chunk * 40 + 40);
    reference::forward_all_positions(
        **m, part, nullptr, [&want](const std::string& weight, const std::vector<double>& x) {
          std::vector<double>& s = want[weight];
          if (s.empty()) s.assign(x.size(), 0.0);
          for (size_t i = 0; i < x.size(); ++i) s[i] += x[i] * x[i] / 80.0;
        });
  }
  ASSERT_EQ(energy->mean_square.size(), want.size());
  ASSERT_EQ(want.size(), static_cast<size_t>(7 * c.n_layer + 1));
  for (const auto& [weight, expected] : want) {
    const auto got = energy->mean_square.find(weight);
    ASSERT_NE(got, energy->mean_square.end()) << weight;
    ASSERT_EQ(got->second.size(), expected.size()) << weight;
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(got->second[i], expected[i], 1e-3 * expected[i] + 1e-9) << weight << " " << i;
  }
  EXPECT_EQ(energy->mean_square.at("blk.0.ffn_down.weight").size(), static_cast<size_t>(c.n_ff));
  EXPECT_EQ(energy->mean_square.at("blk.1.attn_output.weight").size(),
            static_cast<size_t>(c.q_dim()));
  EXPECT_EQ(energy->mean_square.at("output.weight").size(), static_cast<size_t>(c.n_embd));

  // Fewer tokens than one chunk, or no chunk length: errors.
  EXPECT_FALSE(measure_input_energy(**m, tokens, 88));
  EXPECT_FALSE(measure_input_energy(**m, tokens, 0));
}

}  // namespace
}  // namespace vesper::model
