// Hugging Face checkpoint directories loaded as models: the assembled GGUF against the GGUF
// conversion of the same weights, the forward pass against an f64 forward written from
// transformers' equations (reference_hf_forward.h) and against transformers' own logits, and
// the errors a malformed checkpoint gives.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/safetensors.h"
#include "hf/checkpoint.h"
#include "hf/model_file.h"
#include "hf/tensor_map.h"
#include "model/model_test_util.h"
#include "reference/reference_hf_forward.h"
#include "sample/sampler.h"

namespace vesper::hf {
namespace {

namespace fs = std::filesystem;
const std::string kHf = "../shared/models/hf/";

// The largest |a - b| / (1 + |b|) over all logits of all positions.
double max_relative_error(const std::vector<std::vector<float>>& got,
                          const std::vector<std::vector<double>>& want) {
  double worst = 0;
  for (size_t p = 0; p < want.size(); ++p)
    for (size_t v = 0; v < want[p].size(); ++v)
      worst = std::max(worst, std::abs(got[p][v] - want[p][v]) / (1 + std::abs(want[p][v])));
  return worst;
}

TEST(HfCheckpoint, Stories260KAssemblesToTheTensorsOfItsGgufConversion) {
  auto hf = open_model_file(kHf + "stories260K");
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  auto gguf = gguf::GgufFile::open("../shared/models/stories260K.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  EXPECT_TRUE(hf->assembled());
  ASSERT_EQ(hf->tensors().size(), gguf->tensors().size());
  for (const gguf::TensorInfo& want : gguf->tensors()) {
    const gguf::TensorInfo* got = hf->find_tensor(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    EXPECT_EQ(got->type, want.type) << want.name;
    ASSERT_EQ(got->size_bytes, want.size_bytes) << want.name;
    // Bit-identical, q/k included: the permutation undoes the fixture's rotate-half order.
    EXPECT_EQ(std::memcmp(got->data, want.data, want.size_bytes), 0) << want.name;
  }
  for (const char* key :
       {"llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
        "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    ASSERT_NE(hf->find(key), nullptr) << key;
    ASSERT_NE(gguf->find(key), nullptr) << key;
    EXPECT_EQ(hf->find(key)->as_int(), gguf->find(key)->as_int()) << key;
  }
}

TEST(HfCheckpoint, Stories260KLogitsEqualTheGgufModelsBitForBit) {
  auto hf = testing_util::load_model(kHf + "stories260K");
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  auto gguf = testing_util::load_model("../shared/models/stories260K.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
  EXPECT_EQ(testing_util::sequence_logits(**hf, tokens, 5, 16, 3),
            testing_util::sequence_logits(**gguf, tokens, 5, 16, 3));
  EXPECT_EQ(hf->model->config().context_length, 128);  // max_position_embeddings
}

// The random-weight fixtures of each supported shape against the f64 forward of transformers'
// equations on the weights as stored.
void expect_matches_hf_reference(const std::string& name, std::vector<int32_t> tokens) {
  SCOPED_TRACE(name);
  auto m = testing_util::load_model(kHf + name);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const auto want = reference::hf_forward_all_positions(kHf + name, tokens);
  const auto got = testing_util::sequence_logits(**m, tokens, 3, 4, 7);
  EXPECT_LT(max_relative_error(got, want), 2e-4);
  for (size_t p = 0; p < want.size(); ++p) {
    std::vector<float> w(want[p].begin(), want[p].end());
    EXPECT_EQ(sample::argmax(got[p]), sample::argmax(w)) << "position " << p;
  }
}

TEST(HfCheckpoint, Llama3ShapeWithLlama3RopeScalingMatchesTheReference) {
  expect_matches_hf_reference("tiny-random-llama3",
                              {1, 17, 200, 3, 99, 45, 128, 7, 250, 31, 64, 12});
}

TEST(HfCheckpoint, Qwen3ShapeWithQkNormsMatchesTheReference) {
  expect_matches_hf_reference("tiny-random-qwen3",
                              {1, 17, 200, 3, 99, 45, 128, 7, 250, 31, 64, 12});
}

// A fixture's weights under another rope_scaling (a scratch directory: its config.json edited,
// its model.safetensors linked).
std::string with_rope_scaling(const std::string& fixture, const nlohmann::json& scaling) {
  const fs::path dir =
      fs::temp_directory_path() / ("vesper-hf-rope-" + std::to_string(::getpid()) + "-" + fixture);
  fs::remove_all(dir);
  fs::create_directories(dir);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(kHf + fixture + "/config.json"));
  config["rope_scaling"] = scaling;
  std::ofstream(dir / "config.json") << config.dump(2);
  fs::create_symlink(fs::absolute(kHf + fixture + "/model.safetensors"), dir / "model.safetensors");
  return dir.string();
}

TEST(HfCheckpoint, YarnRopeScalingMatchesTheReferenceInBothRopeStyles) {
  // An original context of 32 puts YaRN's ramp inside the 8 rotated pairs of these heads.
  for (const std::string fixture : {"tiny-random-qwen3", "tiny-random-llama3"}) {
    SCOPED_TRACE(fixture);
    const std::string dir = with_rope_scaling(
        fixture,
        {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}});
    auto m = testing_util::load_model(dir);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const std::vector<int32_t> tokens = {1,  17, 200, 3,  99, 45, 128, 7,  250,
                                         31, 64, 12,  90, 91, 92, 93,  94, 95};
    const auto want = reference::hf_forward_all_positions(dir, tokens);
    EXPECT_LT(max_relative_error(testing_util::sequence_logits(**m, tokens, 5, 4, 1), want), 2e-4);
    // And not what the same weights give without YaRN: the reference is sensitive to it.
    const auto plain =
        reference::hf_forward_all_positions(with_rope_scaling(fixture, nullptr), tokens);
    std::vector<std::vector<float>> plain_f(plain.size());
    for (size_t p = 0; p < plain.size(); ++p) plain_f[p].assign(plain[p].begin(), plain[p].end());
    EXPECT_GT(max_relative_error(plain_f, want), 1e-3);
    fs::remove_all(dir);
  }
}

TEST(HfCheckpoint, MistralIsCappedToItsSlidingWindowAndMatchesTheReferenceWithinIt) {
  auto file = open_model_file(kHf + "tiny-random-mistral");
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(file->find("llama.context_length")->as_int(), 8);  // sliding_window 8 < 512
  expect_matches_hf_reference("tiny-random-mistral", {1, 17, 200, 3, 99, 45, 128, 7});
}

TEST(HfCheckpoint, StasTinyLlama2MatchesReferenceAndTransformersLogits) {
  expect_matches_hf_reference("stas-tiny-random-llama-2", {1, 42, 99, 7, 2999, 500, 13});
  const std::string dir = kHf + "stas-tiny-random-llama-2";
  std::ifstream in(dir + "/lunaflux_reference_corpus.json");
  const nlohmann::json corpus = nlohmann::json::parse(in);
  auto m = testing_util::load_model(dir);
  ASSERT_TRUE(m.ok()) << m.error().message;
  int cases = 0;
  for (const auto& c : corpus["model_cases"]) {
    const auto ids = c["input_ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE("input " + c["input_ids"].dump());
    // transformers' logits of the last position, at the ids it sampled.
    const auto got = testing_util::sequence_logits(**m, ids, 8, 16, 0);
    for (const auto& [id, want] : c["sampled_logits"].items())
      EXPECT_NEAR(got.back()[std::stoi(id)], want.get<double>(), 1e-5) << "logit " << id;
    // Its greedy continuation.
    std::vector<int32_t> seq = ids;
    for (size_t i = 0; i < c["greedy_continuation"].size(); ++i)
      seq.push_back(sample::argmax(testing_util::sequence_logits(**m, seq, 8, 16, 0).back()));
    EXPECT_EQ(std::vector<int32_t>(seq.begin() + static_cast<int64_t>(ids.size()), seq.end()),
              c["greedy_continuation"].get<std::vector<int32_t>>());
    ++cases;
  }
  EXPECT_EQ(cases, 3);
}

// A scratch checkpoint directory made from a fixture, to break one thing at a time.
class BrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vesper-hf-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(kHf + "tiny-random-llama3/config.json", dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes model.safetensors with the fixture's tensors, `edit` applied to the list first.
  void write_weights(const std::function<void(std::vector<gguf::SafetensorsTensorData>&)>& edit) {
    auto src = gguf::SafetensorsFile::open(kHf + "tiny-random-llama3/model.safetensors");
    ASSERT_TRUE(src.ok());
    source_ = std::make_unique<gguf::SafetensorsFile>(std::move(*src));
    std::vector<gguf::SafetensorsTensorData> tensors;
    for (const auto& t : source_->tensors()) tensors.push_back({t.name, t.type, t.shape, t.data});
    edit(tensors);
    ASSERT_TRUE(gguf::write_safetensors((dir_ / "model.safetensors").string(), tensors).ok());
  }
  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
    edit(j);
    std::ofstream(dir_ / "config.json") << j.dump(2);
  }
  std::string error() {
    auto f = open_model_file(dir_.string());
    return f.ok() ? "" : f.error().message;
  }

  fs::path dir_;
  std::unique_ptr<gguf::SafetensorsFile> source_;
};

TEST_F(BrokenCheckpoint, TheUnbrokenCopyLoads) {
  write_weights([](auto&) {});
  EXPECT_EQ(error(), "");
}

TEST_F(BrokenCheckpoint, AMissingTensorIsNamed) {
  write_weights([](auto& t) {
    std::erase_if(t, [](const auto& x) { return x.name == "model.layers.1.mlp.up_proj.weight"; });
  });
  EXPECT_NE(error().find("missing tensor model.layers.1.mlp.up_proj.weight"), std::string::npos)
      << error();
}

TEST_F(BrokenCheckpoint, AShapeThatDisagreesWithConfigJsonIsNamed) {
  edit_config([](nlohmann::json& j) { j["intermediate_size"] = 96; });
  write_weights([](auto&) {});
  EXPECT_NE(
      error().find(
          "model.safetensors: tensor model.layers.0.mlp.gate_proj.weight has shape [128, 64], "
          "config.json implies [96, 64]"),
      std::string::npos)
      << error();
}

TEST_F(BrokenCheckpoint, AnUnknownTensorIsNamed) {
  write_weights([](auto& t) {
    auto extra = t.back();
    extra.name = "model.layers.0.self_attn.rogue.weight";
    t.push_back(extra);
  });
  EXPECT_NE(
      error().find("tensor model.layers.0.self_attn.rogue.weight is not part of a llama model"),
      std::string::npos)
      << error();
}

TEST_F(BrokenCheckpoint, ConfigErrorsNameTheFieldOrValue) {
  write_weights([](auto&) {});
  edit_config([](nlohmann::json& j) { j["model_type"] = "gpt_neox"; });
  EXPECT_NE(
      error().find(
          "config.json: architecture \"gpt_neox\" is not supported; supported: LlamaForCausalLM"),
      std::string::npos)
      << error();
  edit_config([](nlohmann::json& j) {
    j["model_type"] = "llama";
    j.erase("num_hidden_layers");
  });
  EXPECT_NE(error().find("config.json: missing field \"num_hidden_layers\""), std::string::npos)
      << error();
  edit_config([](nlohmann::json& j) {
    j["num_hidden_layers"] = 2;
    j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  });
  EXPECT_NE(error().find("rope_scaling.rope_type \"dynamic\" is not supported"), std::string::npos)
      << error();
  edit_config([](nlohmann::json& j) {
    j.erase("rope_scaling");
    j["quantization_config"] = {{"quant_method", "gptq"}};
  });
  EXPECT_NE(error().find("quantization_config.quant_method \"gptq\" is not supported"),
            std::string::npos)
      << error();
}

TEST_F(BrokenCheckpoint, ADirectoryWithoutConfigJsonIsNotTakenForAGguf) {
  fs::remove(dir_ / "config.json");
  EXPECT_NE(error().find("a directory without config.json"), std::string::npos) << error();
}

// stories260K split into two shards named by model.safetensors.index.json, as transformers
// writes large checkpoints: the same tensors; then a shard removed, and one truncated.
class ShardedStories : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("vesper-hf-sharded-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json",
                          "generation_config.json", "special_tokens_map.json"})
      fs::copy_file(kHf + "stories260K/" + f, dir_ / f);
    auto src = gguf::SafetensorsFile::open(kHf + "stories260K/model.safetensors");
    ASSERT_TRUE(src.ok());
    source_ = std::make_unique<gguf::SafetensorsFile>(std::move(*src));
    std::vector<gguf::SafetensorsTensorData> shards[2];
    nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                            {"weight_map", nlohmann::json::object()}};
    for (const auto& t : source_->tensors()) {
      const int shard = t.name.find("layers.3") != std::string::npos ||
                                t.name.find("layers.4") != std::string::npos ||
                                t.name.starts_with("lm_head")
                            ? 1
                            : 0;
      shards[shard].push_back({t.name, t.type, t.shape, t.data});
      index["weight_map"][t.name] = shard_name(shard);
    }
    for (int i = 0; i < 2; ++i)
      ASSERT_TRUE(gguf::write_safetensors((dir_ / shard_name(i)).string(), shards[i]).ok());
    std::ofstream(dir_ / "model.safetensors.index.json") << index.dump(2);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string shard_name(int i) {
    return "model-0000" + std::to_string(i + 1) + "-of-00002.safetensors";
  }

  fs::path dir_;
  std::unique_ptr<gguf::SafetensorsFile> source_;
};

TEST_F(ShardedStories, ShardsLoadAsTheSingleFileDoes) {
  auto sharded = testing_util::load_model(dir_.string());
  ASSERT_TRUE(sharded.ok()) << sharded.error().message;
  auto single = testing_util::load_model(kHf + "stories260K");
  ASSERT_TRUE(single.ok());
  const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 432, 383};
  EXPECT_EQ(testing_util::sequence_logits(**sharded, tokens, 4, 16, 0),
            testing_util::sequence_logits(**single, tokens, 4, 16, 0));
}

TEST_F(ShardedStories, AMissingShardIsNamed) {
  fs::remove(dir_ / shard_name(1));
  auto f = open_model_file(dir_.string());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find(shard_name(1)), std::string::npos) << f.error().message;
}

TEST_F(ShardedStories, ATruncatedShardIsNamed) {
  fs::resize_file(dir_ / shard_name(0), fs::file_size(dir_ / shard_name(0)) - 100);
  auto f = open_model_file(dir_.string());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find(shard_name(0) + ": tensor"), std::string::npos)
      << f.error().message;
}

TEST(HfTensorMap, PermutationMatchesConvertHfToGgufsOrder) {
  // stories260K's README: within a head of 8 rows, gguf = hf[[0,4,1,5,2,6,3,7]].
  std::vector<uint8_t> hf(16), out(16);
  for (int i = 0; i < 16; ++i) hf[i] = static_cast<uint8_t>(i);
  permute_qk_rows(hf.data(), out.data(), 2, 8, 1);
  EXPECT_EQ(out, (std::vector<uint8_t>{0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15}));
}

}  // namespace
}  // namespace vesper::hf
