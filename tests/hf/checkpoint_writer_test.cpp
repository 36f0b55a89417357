// hf::write_checkpoint, the inverse of the loader: a GGUF written as a checkpoint directory loads
// back to the same tensors, bit for bit, for every architecture and float type; what config.json
// cannot say is an error naming the key or tensor.
#include "hf/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/thread_pool.h"
#include "hf/model_file.h"
#include "model/synth.h"

namespace vesper::hf {
namespace {

namespace fs = std::filesystem;

// Every tensor of `want` is in `got` with the same shape, type and bytes, and nothing else is.
void expect_same_tensors(const gguf::GgufFile& got, const gguf::GgufFile& want) {
  ASSERT_EQ(got.tensors().size(), want.tensors().size());
  for (const gguf::TensorInfo& w : want.tensors()) {
    const gguf::TensorInfo* g = got.find_tensor(w.name);
    ASSERT_NE(g, nullptr) << w.name;
    EXPECT_EQ(g->shape, w.shape) << w.name;
    EXPECT_EQ(g->type, w.type) << w.name;
    ASSERT_EQ(g->size_bytes, w.size_bytes) << w.name;
    EXPECT_EQ(std::memcmp(g->data, w.data, w.size_bytes), 0) << w.name;
  }
}

void expect_same_ints(const gguf::GgufFile& got, const gguf::GgufFile& want,
                      const std::string& arch) {
  for (const char* key :
       {"embedding_length", "block_count", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "context_length", "rope.dimension_count"}) {
    const std::string k = arch + "." + key;
    auto g = got.get_int(k), w = want.get_int(k);
    ASSERT_TRUE(g.ok() && w.ok()) << k;
    EXPECT_EQ(g->value_or(-1), w->value_or(-2)) << k;
  }
}

struct Shape {
  std::string arch;
  tensor::GgmlType type;
  int64_t head_dim;
  bool tied;
};

TEST(HfCheckpointWriter, SyntheticModelsOfEveryArchitectureAndFloatTypeLoadBackBitForBit) {
  ThreadPool pool(2);
  const std::string dir = ::testing::TempDir() + "vesper_ckpt_writer";
  for (const Shape& shape : {Shape{"llama", tensor::GgmlType::kF16, 0, false},
                             Shape{"llama", tensor::GgmlType::kBF16, 24, true},
                             Shape{"qwen2", tensor::GgmlType::kF32, 0, false},
                             Shape{"qwen3", tensor::GgmlType::kF16, 16, false}}) {
    SCOPED_TRACE(shape.arch + " " + std::string(tensor::type_name(shape.type)));
    fs::remove_all(dir);
    fs::create_directories(dir);
    model::SynthSpec s;
    s.arch = shape.arch;
    s.n_layer = 2;
    s.n_embd = 64;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = shape.head_dim;
    s.n_ff = 96;
    s.type = shape.type;
    s.tied_embeddings = shape.tied;
    s.rope_linear_factor = shape.arch == "qwen2" ? 2.0f : 0.0f;
    s.vocab_from = "../shared/models/hf/stories260K";
    ASSERT_TRUE(model::write_synthetic_model(s, dir + "/synth.gguf", pool).ok());
    auto want = gguf::GgufFile::open(dir + "/synth.gguf");
    ASSERT_TRUE(want.ok()) << want.error().message;
    const std::string ckpt = dir + "/checkpoint";
    auto st = write_checkpoint(*want, ckpt, "../shared/models/hf/stories260K");
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_TRUE(fs::exists(ckpt + "/tokenizer.json"));
    auto got = open_model_file(ckpt);
    ASSERT_TRUE(got.ok()) << got.error().message;
    expect_same_tensors(*got, *want);
    expect_same_ints(*got, *want, shape.arch);
    auto scale = got->get_float(shape.arch + ".rope.scaling.factor");
    ASSERT_TRUE(scale.ok());
    EXPECT_EQ(scale->value_or(0), shape.arch == "qwen2" ? 2.0 : 0.0);
  }
  fs::remove_all(dir);
}

TEST(HfCheckpointWriter, Stories260KRoundTripsThroughACheckpoint) {
  auto want = gguf::GgufFile::open("../shared/models/stories260K.gguf");
  ASSERT_TRUE(want.ok()) << want.error().message;
  const std::string dir = ::testing::TempDir() + "vesper_ckpt_stories";
  fs::remove_all(dir);
  ASSERT_TRUE(write_checkpoint(*want, dir, "../shared/models/hf/stories260K").ok());
  auto got = open_model_file(dir);
  ASSERT_TRUE(got.ok()) << got.error().message;
  expect_same_tensors(*got, *want);
  auto tokens = got->get_array("tokenizer.ggml.tokens", gguf::ValueType::kString);
  ASSERT_TRUE(tokens.ok() && *tokens != nullptr);
  EXPECT_EQ((*tokens)->items.size(), 512u);
  fs::remove_all(dir);
}

TEST(HfCheckpointWriter, WhatConfigJsonCannotSayIsNamed) {
  ThreadPool pool(1);
  const std::string dir = ::testing::TempDir() + "vesper_ckpt_refused";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto refusal = [&](model::SynthSpec s) {
    s.n_layer = 1;
    s.n_embd = 64;
    s.n_ff = 64;
    EXPECT_TRUE(model::write_synthetic_model(s, dir + "/m.gguf", pool).ok());
    auto f = gguf::GgufFile::open(dir + "/m.gguf");
    EXPECT_TRUE(f.ok());
    auto st = write_checkpoint(*f, dir + "/out", "");
    EXPECT_FALSE(st.ok());
    return st.ok() ? std::string() : st.error().message;
  };
  model::SynthSpec quantized;
  quantized.type = tensor::GgmlType::kQ4_0;
  EXPECT_NE(refusal(quantized).find("tensor token_embd.weight is q4_0"), std::string::npos)
      << refusal(quantized);
  model::SynthSpec llama3;
  llama3.rope_freq_factors = true;
  EXPECT_NE(refusal(llama3).find("rope_freqs.weight"), std::string::npos);
  model::SynthSpec partial;
  partial.rope_dims = 8;
  EXPECT_NE(refusal(partial).find("rope.dimension_count 8"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace vesper::hf
