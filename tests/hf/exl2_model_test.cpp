// EXL2 checkpoints run: stories260K's layers quantized (hf/exl2_quantize.h) and packed as
// exllamav2 writes them (hf/exl2_pack.h), loaded through open_model_file, repacked into exact
// integer parts (hf/exl2_repack.h) and computed by the CPU backend's composite matmul. The parts
// are checked against the weights the independent reference decodes from the format description
// (tests/reference/reference_exl2.h), the forward pass against the f64 reference forward (which
// reads the same parts), batched against alone, and 8-bit EXL2 against f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/composite_weight.h"
#include "gguf/safetensors.h"
#include "hf/exl2_format.h"
#include "hf/exl2_quantize.h"
#include "hf/model_file.h"
#include "model/model_test_util.h"
#include "model/quantize.h"
#include "reference/reference_exl2.h"
#include "reference/reference_forward.h"
#include "sample/sampler.h"
#include "tensor/quant.h"

namespace vesper::hf {
namespace {

namespace fs = std::filesystem;
const std::string kStories = "../shared/models/hf/stories260K";

// A plan for a layer of k inputs: groups of `group` rows, the first `high_share` of the rows (in
// act order) at `high` bits and the rest at `bits`; act order reverses the inputs (a
// permutation that is not the identity).
Exl2LayerPlan plan_for(int64_t k, int bits, int high, double high_share, int64_t group) {
  Exl2LayerPlan p;
  const int64_t high_rows =
      static_cast<int64_t>(static_cast<double>(k) * high_share) / group * group;
  for (int64_t r = 0; r < k; r += group)
    p.groups.push_back({r < high_rows ? high : bits, std::min(group, k - r)});
  for (int64_t i = k - 1; i >= 0; --i) p.perm.push_back(static_cast<int32_t>(i));
  return p;
}

// stories260K as an EXL2 checkpoint in a scratch directory: every linear layer whose input
// count is a multiple of 32 quantized by `plan` (ffn_down's 172 inputs stay f32, as a plain
// .weight beside quantized layers); embeddings and norms as they are.
class Exl2Stories {
 public:
  Exl2Stories(const std::string& tag, const std::function<Exl2LayerPlan(int64_t k)>& plan) {
    dir_ = fs::temp_directory_path() / ("vesper-exl2-" + std::to_string(::getpid()) + "-" + tag);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                          "special_tokens_map.json"})
      fs::copy_file(kStories + "/" + f, dir_ / f);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(kStories + "/config.json"));
    config["quantization_config"] = {{"quant_method", "exl2"}, {"bits", 8.0}};
    std::ofstream(dir_ / "config.json") << config.dump(2);

    auto src = gguf::SafetensorsFile::open(kStories + "/model.safetensors");
    EXPECT_TRUE(src.ok());
    std::vector<gguf::SafetensorsTensorData> out;
    layers_.reserve(64);
    for (const auto& t : src->tensors()) {
      const bool linear = t.shape.size() == 2 && t.name != "model.embed_tokens.weight";
      if (!linear || t.shape[1] % 32 != 0) {
        plain_.emplace_back(t.data, t.data + t.size_bytes);
        out.push_back({t.name, t.type, t.shape, plain_.back().data()});
        continue;
      }
      const int64_t n = t.shape[0], k = t.shape[1];
      const auto* w = reinterpret_cast<const float*>(t.data);
      layers_.push_back(pack_exl2(quantize_exl2_layer(w, n, k, plan(k))));
      const std::string prefix = t.name.substr(0, t.name.size() - std::string(".weight").size());
      for (auto& d : layers_.back().tensors(prefix)) out.push_back(d);
    }
    EXPECT_TRUE(gguf::write_safetensors((dir_ / "model.safetensors").string(), out).ok());
  }
  ~Exl2Stories() { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }

 private:
  fs::path dir_;
  std::vector<Exl2PackedLayer> layers_;
  std::vector<std::vector<uint8_t>> plain_;
};

// Greedy continuation of `prompt` for n tokens, one token per forward pass after the prompt.
std::vector<int32_t> greedy(model::Model& m, std::vector<int32_t> tokens, int n) {
  for (int i = 0; i < n; ++i)
    tokens.push_back(sample::argmax(testing_util::sequence_logits(m, tokens, 64, 16, 0).back()));
  return tokens;
}

TEST(Exl2Model, RepackedLayersGiveTheFormatsWeightsExactly) {
  // Mixed widths (every kind of part), a reversed act order.
  for (const auto& widths : std::vector<std::pair<int, int>>{{2, 3}, {4, 5}, {6, 8}}) {
    const int bits = widths.first, high = widths.second;  // captured below (clang 14: no bindings)
    SCOPED_TRACE(std::to_string(bits) + "/" + std::to_string(high) + " bits");
    Exl2Stories ck("weights" + std::to_string(bits),
                   [&](int64_t k) { return plan_for(k, bits, high, 0.5, 32); });
    auto file = open_model_file(ck.dir());
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto raw = gguf::SafetensorsFile::open(ck.dir() + "/model.safetensors");
    ASSERT_TRUE(raw.ok());
    const auto bytes = [&](const std::string& name) {
      const gguf::SafetensorsTensor* t = raw->find(name);
      EXPECT_NE(t, nullptr) << name;
      return t == nullptr ? std::span<const uint8_t>()
                          : std::span<const uint8_t>(t->data, t->size_bytes);
    };
    // blk.1.attn_k (llama: q/k rows permuted too) and blk.2.ffn_gate, weight by weight.
    for (const auto& [hf_prefix, gguf_name, n, k, permuted] :
         std::vector<std::tuple<std::string, std::string, int64_t, int64_t, bool>>{
             {"model.layers.1.self_attn.k_proj", "blk.1.attn_k.weight", 32, 64, true},
             {"model.layers.2.mlp.gate_proj", "blk.2.ffn_gate.weight", 172, 64, false}}) {
      // The weights as the format describes them, decoded by the independent reference.
      const reference::Exl2Dequantized format = reference::dequantize_exl2(
          {k, n, bytes(hf_prefix + ".q_weight"), bytes(hf_prefix + ".q_invperm"),
           bytes(hf_prefix + ".q_scale"), bytes(hf_prefix + ".q_scale_max"),
           bytes(hf_prefix + ".q_groups")});
      const gguf::TensorInfo* order = file->find_tensor(gguf::composite_order_name(gguf_name));
      ASSERT_NE(order, nullptr);
      const auto* input_of = reinterpret_cast<const int32_t*>(order->data);
      int64_t offset = 0;
      for (int part = 0;; ++part) {
        const gguf::TensorInfo* t =
            file->find_tensor(gguf::composite_part_name(gguf_name, static_cast<size_t>(part)));
        if (t == nullptr) break;
        const int64_t inputs = t->shape[0];
        std::vector<float> row(static_cast<size_t>(inputs));
        for (int64_t o = 0; o < n; ++o) {
          tensor::dequantize_row(t->type, t->data + o * tensor::row_size(t->type, inputs),
                                 row.data(), inputs);
          // llama's q/k rows: output row 2j + i of a head is the checkpoint's column i * 4 + j.
          const int64_t head = o / 8, j = (o % 8) / 2, i = o % 2;
          const int64_t column = permuted ? head * 8 + i * 4 + j : o;
          for (int64_t x = 0; x < inputs; ++x) {
            const double want =
                format.weight[static_cast<size_t>(input_of[offset + x] * n + column)];
            // The parts hold (q - z) * scale with the scale in fp16, as exllamav2 computes it; the
            // reference's scale is exact: they differ by the scale's fp16 rounding (2^-11).
            ASSERT_NEAR(row[static_cast<size_t>(x)], want, std::abs(want) * 1e-3 + 1e-7)
                << gguf_name << " output " << o << " input " << input_of[offset + x];
          }
        }
        offset += inputs;
      }
      EXPECT_EQ(offset, k);
    }
  }
}

TEST(Exl2Model, ForwardMatchesTheReferenceAndEightBitsStayNearF32) {
  Exl2Stories ck("forward", [](int64_t k) { return plan_for(k, 8, 8, 0.0, 32); });
  auto m = testing_util::load_model(ck.dir());
  ASSERT_TRUE(m.ok()) << m.error().message;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  const auto got = testing_util::sequence_logits(**m, prompt, 4, 16, 5);
  const auto want = reference::forward_all_positions(**m, prompt);
  for (size_t p = 0; p < want.size(); ++p)
    for (size_t v = 0; v < want[p].size(); ++v)
      ASSERT_NEAR(got[p][v], want[p][v], 2e-3 * (1 + std::abs(want[p][v])))
          << "position " << p << " logit " << v;
  // 8-bit EXL2 against the f32 checkpoint: greedy tokens of four prompts.
  auto f32 = testing_util::load_model(kStories);
  ASSERT_TRUE(f32.ok());
  int same = 0, total = 0;
  for (const std::vector<int32_t>& p : std::vector<std::vector<int32_t>>{
           {1, 403, 407, 261, 378}, {1, 410, 454, 414, 411}, {1, 317, 269, 368}, {1, 10, 263}}) {
    const auto a = greedy(**m, p, 24), b = greedy(**f32, p, 24);
    for (size_t i = p.size(); i < a.size(); ++i) same += a[i] == b[i];
    total += 24;
  }
  std::printf("8-bit EXL2 stories260K: %d of %d greedy tokens equal f32's\n", same, total);
  EXPECT_GE(same, total * 9 / 10) << same << " of " << total << " greedy tokens equal f32's";
}

TEST(Exl2Model, BatchedAndChunkedRowsGiveEachRowsLogitsAlone) {
  Exl2Stories ck("invariance", [](int64_t k) { return plan_for(k, 3, 5, 0.25, 32); });
  auto m = testing_util::load_model(ck.dir());
  ASSERT_TRUE(m.ok()) << m.error().message;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
  EXPECT_EQ(testing_util::sequence_logits(**m, prompt, 1, 16, 0),
            testing_util::sequence_logits(**m, prompt, 12, 4, 3));
}

TEST(Exl2Model, AnEXL2CheckpointCannotBeWrittenAsGguf) {
  Exl2Stories ck("convert", [](int64_t k) { return plan_for(k, 4, 4, 0.0, 32); });
  ThreadPool pool(1);
  const auto st = model::quantize_model(ck.dir(), ck.dir() + "/out.gguf", std::nullopt, pool);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("an EXL2 checkpoint cannot be written as GGUF"),
            std::string::npos);
}

}  // namespace
}  // namespace vesper::hf
