// Medusa heads on stories260K: the heads computed on the backend against the same formula in
// double on the host, the reference trace of ../shared/models/medusa/reference.json (the heads'
// best guesses after the target read "Once upon a time"), the tree builder, and the load errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu_backend.h"
#include "model/model.h"
#include "spec/medusa_heads.h"
#include "spec/medusa_proposer.h"

namespace vesper::spec {
namespace {

const char* kModel = "../shared/models/stories260K.gguf";
const char* kHeads = "../shared/models/medusa";
constexpr int64_t kEmbd = 64, kVocab = 512;

// The target's final hidden state at the last position of `tokens` (one prefill pass).
std::vector<float> last_hidden(model::Model& m, const std::vector<int32_t>& tokens) {
  backend::Backend& b = m.backend();
  const backend::KvHandle kv = b.create_kv(m.kv_spec(16), 16, backend::MemoryKind::kDevice);
  model::ForwardBatch batch;
  const std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7};
  batch.add_sequence(tokens, 0, table, 16, 1);
  m.forward(batch, kv);
  std::vector<float> h(m.hidden_rows().begin(), m.hidden_rows().end());
  b.release_kv(kv);
  return h;
}

// Head k's logits for hidden state h, from the safetensors file, in double.
std::vector<double> reference_head(const gguf::SafetensorsFile& f, int k,
                                   const std::vector<float>& h) {
  auto values = [&](const std::string& name) {
    const gguf::SafetensorsTensor* t = f.find(name);
    EXPECT_NE(t, nullptr) << name;
    const auto* p = reinterpret_cast<const float*>(t->data);
    return std::vector<float>(p, p + t->num_elements());
  };
  const std::vector<float> w = values(std::to_string(k) + ".0.linear.weight");
  const std::vector<float> bias = values(std::to_string(k) + ".0.linear.bias");
  const std::vector<float> u = values(std::to_string(k) + ".1.weight");
  std::vector<double> x(kEmbd);
  for (int64_t o = 0; o < kEmbd; ++o) {
    double s = bias[o];
    for (int64_t i = 0; i < kEmbd; ++i) s += double{w[o * kEmbd + i]} * h[i];
    x[o] = h[o] + s / (1.0 + std::exp(-s));
  }
  std::vector<double> logits(kVocab);
  for (int64_t t = 0; t < kVocab; ++t) {
    double s = 0;
    for (int64_t i = 0; i < kEmbd; ++i) s += double{u[t * kEmbd + i]} * x[i];
    logits[t] = s;
  }
  return logits;
}

TEST(MedusaHeads, TopCandidatesMatchTheReferenceTraceAndADoubleComputation) {
  backend::CpuBackend backend(2);
  auto m = model::Model::load(kModel, backend);
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto heads = MedusaHeads::load(kHeads, backend, kEmbd, kVocab, tensor::GgmlType::kF32);
  ASSERT_TRUE(heads.ok()) << heads.error().message;
  EXPECT_EQ((*heads)->num_heads(), 4);
  std::ifstream in(std::string(kHeads) + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in)["once_upon_a_time"];
  const std::vector<int32_t> prompt = ref["prompt"];
  const std::vector<int32_t> greedy = ref["greedy"];
  const std::vector<std::vector<int32_t>> per_position = ref["head_top1_per_position"];
  auto file = gguf::SafetensorsFile::open((*heads)->path());
  ASSERT_TRUE(file.ok());

  // The prompt's last position, then the first positions of the greedy continuation, two rows in
  // one call.
  std::vector<float> hidden = last_hidden(**m, prompt);
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), greedy.begin(), greedy.begin() + 3);
  const std::vector<float> h2 = last_hidden(**m, longer);
  hidden.insert(hidden.end(), h2.begin(), h2.end());
  std::vector<int32_t> top;
  (*heads)->top_k(hidden, 2, 3, top);
  ASSERT_EQ(top.size(), 2u * 4 * 3);
  for (int row = 0; row < 2; ++row) {
    const std::vector<float> h(hidden.begin() + row * kEmbd, hidden.begin() + (row + 1) * kEmbd);
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(top[(row * 4 + k) * 3], per_position[row == 0 ? 0 : 3][k])
          << "row " << row << " head " << k;
      const std::vector<double> logits = reference_head(*file, k, h);
      std::vector<int32_t> order(kVocab);
      for (int32_t t = 0; t < kVocab; ++t) order[t] = t;
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      for (int r = 0; r < 3; ++r)
        EXPECT_EQ(top[(row * 4 + k) * 3 + r], order[r]) << "row " << row << " head " << k;
    }
  }
}

TEST(MedusaTree, BestFirstTreeIsAChainForSureHeadsAndWidensNearTheRootForUnsureOnes) {
  // Sure heads: every rank-0 candidate right: the tree is the chain of each head's best.
  std::vector<double> sure(4 * 3, 0.0);
  for (int h = 0; h < 4; ++h) sure[h * 3] = 0.99;
  const auto chain = best_medusa_tree(sure, 4, 3, 4);
  ASSERT_EQ(chain.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(chain[i].parent, i - 1);
    EXPECT_EQ(chain[i].head, i);
    EXPECT_EQ(chain[i].rank, 0);
  }
  // Unsure heads: the second guess at depth 1 is worth more than a fourth level.
  std::vector<double> unsure = {0.5, 0.3, 0.1, 0.5, 0.2, 0.1, 0.5, 0.2, 0.1, 0.5, 0.2, 0.1};
  const auto tree = best_medusa_tree(unsure, 4, 3, 5);
  ASSERT_EQ(tree.size(), 5u);
  // 0.5 (h0 r0), 0.3 (h0 r1), 0.25 (h1 r0 under the first), 0.15 (h1 r0 under the second),
  // 0.125 (h2 r0 under h1 r0).
  EXPECT_EQ(tree[0].parent, -1);
  EXPECT_EQ(tree[1].parent, -1);
  EXPECT_EQ(tree[1].rank, 1);
  EXPECT_EQ(tree[2].parent, 0);
  EXPECT_EQ(tree[3].parent, 1);
  EXPECT_EQ(tree[4].parent, 2);
  for (size_t i = 0; i < tree.size(); ++i) EXPECT_LT(tree[i].parent, static_cast<int32_t>(i));
}

TEST(MedusaHeads, LoadErrorsNameTheFileAndField) {
  backend::CpuBackend backend(1);
  const std::string dir = ::testing::TempDir() + "vesper_medusa_bad";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(kHeads) + "/stories260K-medusa4.safetensors",
                             dir + "/heads.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  auto error_with_config = [&](const std::string& config) {
    std::ofstream(dir + "/config.json") << config;
    auto r = MedusaHeads::load(dir, backend, kEmbd, kVocab, tensor::GgmlType::kF32);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.error().message;
  };
  std::string e = error_with_config(R"({"medusa_num_layers":1})");
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("medusa_num_heads"), std::string::npos) << e;
  e = error_with_config(R"({"medusa_num_heads":4,"hidden_size":128})");
  EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
  EXPECT_NE(e.find("64"), std::string::npos) << e;
  e = error_with_config(R"({"medusa_num_heads":5})");
  EXPECT_NE(e.find("4.0.linear.weight"), std::string::npos) << e;
  e = error_with_config("{not json");
  EXPECT_NE(e.find("not a JSON object"), std::string::npos) << e;
  // A wrong target: the heads' shapes do not fit a model of another width.
  std::ofstream(dir + "/config.json") << R"({"medusa_num_heads":4})";
  auto wrong = MedusaHeads::load(dir, backend, 48, kVocab, tensor::GgmlType::kF32);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("0.0.linear.weight"), std::string::npos)
      << wrong.error().message;
  // A truncated weights file.
  std::filesystem::resize_file(dir + "/heads.safetensors", 1000);
  auto cut = MedusaHeads::load(dir, backend, kEmbd, kVocab, tensor::GgmlType::kF32);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.error().message.find("heads.safetensors"), std::string::npos)
      << cut.error().message;
  auto missing = MedusaHeads::load(dir + "/nope", backend, kEmbd, kVocab, tensor::GgmlType::kF32);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("nope"), std::string::npos);
}

}  // namespace
}  // namespace vesper::spec
