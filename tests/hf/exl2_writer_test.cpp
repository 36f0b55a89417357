// hf::write_exl2_checkpoint with calibration statistics (Exl2WriteOptions::input_energy): they
// set each layer's act order (the inputs of largest mean square first) and its bit allocation;
// a layer without them is an error naming the tensor.
#include "hf/exl2_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "gguf/safetensors.h"
#include "hf/exl2_format.h"
#include "model/calibration.h"
#include "model/model_test_util.h"

namespace vesper::hf {
namespace {

const std::string kHfStories = "../shared/models/hf/stories260K";

// stories260K's input energies over a few chunks of token ids.
std::map<std::string, std::vector<double>> stories_energy() {
  auto m = testing_util::load_model(kHfStories);
  EXPECT_TRUE(m) << m.error().message;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 256; ++i) tokens.push_back(1 + (i * 53 + i * i * 7) % 500);
  auto energy = model::measure_input_energy(**m, tokens, 64);
  EXPECT_TRUE(energy) << energy.error().message;
  return energy->mean_square;
}

// The packed row that input row `k` of `prefix` took in the checkpoint written to `dir`.
int64_t packed_row_of(const std::string& dir, const std::string& prefix, int64_t k_rows, int64_t n,
                      int64_t k) {
  auto file = gguf::SafetensorsFile::open(dir + "/model.safetensors");
  EXPECT_TRUE(file) << file.error().message;
  std::vector<gguf::SafetensorsFile> files;
  files.push_back(std::move(*file));
  auto layer = read_exl2_layer(lookup_in(files, dir), prefix, k_rows, n);
  EXPECT_TRUE(layer) << layer.error().message;
  return exl2_packed_row(*layer, k);
}

TEST(Exl2Writer, CalibrationSetsTheActOrderAndEveryLayerNeedsIt) {
  ThreadPool pool(2);
  const std::string dir = ::testing::TempDir() + "vesper_exl2_writer_cal";
  std::filesystem::remove_all(dir);
  Exl2WriteOptions options;
  options.bits = 4.0;
  options.input_energy = stories_energy();
  ASSERT_EQ(options.input_energy.count("blk.0.attn_q.weight"), 1u);
  // Input 37 of layer 0's q projection made the loudest by far: act order puts it first.
  std::vector<double>& q0 = options.input_energy["blk.0.attn_q.weight"];
  ASSERT_EQ(q0.size(), 64u);
  q0[37] = 1e9;
  options.calibration = "test: 256 tokens in chunks of 64";
  auto report = write_exl2_checkpoint(kHfStories, dir, options, pool);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(packed_row_of(dir, "model.layers.0.self_attn.q_proj", 64, 64, 37), 0);
  // The same statistics with input 21 loudest instead: it moves to the front.
  q0[37] = 0.0;
  q0[21] = 1e9;
  std::filesystem::remove_all(dir);
  report = write_exl2_checkpoint(kHfStories, dir, options, pool);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(packed_row_of(dir, "model.layers.0.self_attn.q_proj", 64, 64, 21), 0);
  EXPECT_NE(packed_row_of(dir, "model.layers.0.self_attn.q_proj", 64, 64, 37), 0);

  // Statistics that miss a layer, or have the wrong width for it: errors naming the tensor.
  options.input_energy.erase("blk.1.ffn_up.weight");
  auto missing = write_exl2_checkpoint(kHfStories, dir, options, pool);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find(
                "model.layers.1.mlp.up_proj.weight: no calibration statistics of 64 inputs"),
            std::string::npos)
      << missing.error().message;
  options.input_energy["blk.1.ffn_up.weight"] = std::vector<double>(63, 1.0);
  auto wrong = write_exl2_checkpoint(kHfStories, dir, options, pool);
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.error().message.find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
      << wrong.error().message;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vesper::hf
