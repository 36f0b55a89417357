// Reading adapters (lora/adapter.h) from ../shared/models: llama.cpp GGUF and PEFT LoRA hold the
// same deltas once PEFT's q/k rows go through GGUF's rope permutation; VeRA keeps one shared
// A and B and only lambdas per module; every malformed file is an error naming the file and the
// tensor or field. And the registry (lora/adapter_registry.h): holding reads nothing;
// least-recently-used copies beyond --max-cpu-loras are dropped and reloaded, never while a
// running sequence pins them; removing a name lets its holders finish; a file that stops reading
// breaks its registration.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu_backend.h"
#include "backend/low_rank.h"
#include "gguf/gguf.h"
#include "gguf/safetensors.h"
#include "lora/adapter.h"
#include "lora/adapter_registry.h"
#include "model/model_config.h"

namespace vesper::lora {
namespace {
namespace fs = std::filesystem;
using model::kNumProjections;
using model::Projection;

const std::string kModels = "../shared/models/";

model::ModelConfig stories_config() {
  auto file = gguf::GgufFile::open(kModels + "stories260K.gguf");
  EXPECT_TRUE(file.ok());
  auto config = model::read_model_config(*file);
  EXPECT_TRUE(config.ok());
  return *config;
}

const HostAdapter::Module& module(const HostAdapter& a, int64_t layer, Projection p) {
  return a.modules[static_cast<size_t>(layer * kNumProjections + static_cast<int32_t>(p))];
}

// A scratch directory holding a copy of `from` (a PEFT adapter directory), for edits.
std::string copy_dir(const std::string& from, const std::string& name) {
  const std::string to = ::testing::TempDir() + "vesper_lora_" + name;
  fs::remove_all(to);
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from))
    fs::copy(e.path(), to + "/" + e.path().filename().string());
  for (const auto& e : fs::directory_iterator(to))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return to;
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  {
    std::ifstream in(dir + "/adapter_config.json");
    in >> j;
  }
  edit(j);
  std::ofstream(dir + "/adapter_config.json") << j.dump();
}

// The zed GGUF adapter rewritten without the tensors `drop` names, and with `edit` applied to
// each kept tensor's bytes.
std::string rewrite_gguf(
    const std::string& name, const std::string& drop,
    const std::function<void(const std::string&, std::vector<uint8_t>&)>& edit = nullptr) {
  auto src = gguf::GgufFile::open(kModels + "lora/zed/adapter.gguf");
  EXPECT_TRUE(src.ok());
  gguf::GgufWriter w;
  w.copy_metadata(*src);
  for (const gguf::TensorInfo& t : src->tensors()) {
    if (!drop.empty() && t.name == drop) continue;
    std::vector<uint8_t> bytes(t.data, t.data + t.size_bytes);
    if (edit) edit(t.name, bytes);
    EXPECT_TRUE(w.add_tensor(t.name, t.shape, t.type, bytes).ok());
  }
  const std::string path = ::testing::TempDir() + "vesper_lora_" + name + ".gguf";
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

TEST(Adapter, GgufAndPeftLoraHoldTheSameDeltas) {
  const model::ModelConfig c = stories_config();
  for (const std::string name : {"zed", "bim"}) {
    auto g = read_adapter(kModels + "lora/" + name + "/adapter.gguf", c, 16);
    auto p = read_adapter(kModels + "lora/" + name, c, 16);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(p.ok()) << p.error().message;
    EXPECT_EQ(g->kind, AdapterKind::kLora);
    EXPECT_EQ(p->kind, AdapterKind::kLora);
    EXPECT_EQ(g->max_rank, name == "zed" ? 8 : 4);
    int64_t targeted = 0;
    for (int64_t l = 0; l < c.n_layer; ++l)
      for (int32_t pi = 0; pi < kNumProjections; ++pi) {
        const auto proj = static_cast<Projection>(pi);
        const HostAdapter::Module& mg = module(*g, l, proj);
        const HostAdapter::Module& mp = module(*p, l, proj);
        ASSERT_EQ(mg.rank, mp.rank) << name << " layer " << l << " projection " << pi;
        if (mg.rank == 0) continue;
        ++targeted;
        EXPECT_FLOAT_EQ(mg.scale, 2.0f);  // alpha / r in both files
        EXPECT_FLOAT_EQ(mp.scale, 2.0f);
        EXPECT_EQ(mg.permute_head_dim, 0);
        const bool qk = proj == Projection::kQ || proj == Projection::kK;
        EXPECT_EQ(mp.permute_head_dim, qk ? c.head_dim : 0);
        for (int64_t i = 0; i < mg.rank * mg.n_in; ++i)
          ASSERT_EQ(g->data[static_cast<size_t>(mg.a + i)], p->data[static_cast<size_t>(mp.a + i)]);
        // GGUF row r is PEFT's row src(r): bit-identical (ADAPTERS.md).
        for (int64_t r = 0; r < mg.n_out; ++r)
          for (int64_t j = 0; j < mg.rank; ++j)
            ASSERT_EQ(g->data[static_cast<size_t>(mg.b + r * mg.b_stride + j)],
                      p->data[static_cast<size_t>(
                          mp.b +
                          backend::low_rank_source_row(r, mp.permute_head_dim) * mp.b_stride + j)]);
      }
    EXPECT_EQ(targeted, c.n_layer * (name == "zed" ? 7 : 5));
  }
}

TEST(Adapter, VeraSharesOneAAndBAndStoresOnlyLambdasPerModule) {
  const model::ModelConfig c = stories_config();
  auto v = read_adapter(kModels + "vera/zed", c, 32);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->kind, AdapterKind::kVera);
  EXPECT_EQ(v->max_rank, 32);
  int64_t lambdas = 0;
  const HostAdapter::Module& first = module(*v, 0, Projection::kQ);
  for (const HostAdapter::Module& m : v->modules) {
    ASSERT_EQ(m.rank, 32);
    EXPECT_EQ(m.a, first.a);
    EXPECT_EQ(m.b, first.b);
    EXPECT_EQ(m.a_stride, 172);
    EXPECT_EQ(m.b_stride, 32);
    EXPECT_GE(m.lambda_d, 0);
    EXPECT_GE(m.lambda_b, 0);
    EXPECT_FLOAT_EQ(m.scale, 1.0f);
    lambdas += m.rank + m.n_out;
  }
  EXPECT_EQ(static_cast<int64_t>(v->data.size()), 32 * 172 + 172 * 32 + lambdas);
  // Over a rank limit: refused, naming the flag.
  auto limited = read_adapter(kModels + "vera/zed", c, 16);
  ASSERT_FALSE(limited.ok());
  EXPECT_NE(limited.error().message.find("--max-lora-rank 16"), std::string::npos);
}

TEST(Adapter, RsloraScalesByTheSquareRootOfTheRank) {
  const model::ModelConfig c = stories_config();
  const std::string dir = copy_dir(kModels + "lora/zed", "rslora");
  edit_config(dir, [](nlohmann::json& j) { j["use_rslora"] = true; });
  auto a = read_adapter(dir, c, 16);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_FLOAT_EQ(module(*a, 0, Projection::kQ).scale, static_cast<float>(16.0 / std::sqrt(8.0)));
}

// Each case: a broken adapter and the words its error must contain.
void expect_error(const Result<HostAdapter>& r, std::initializer_list<std::string> words) {
  ASSERT_FALSE(r.ok());
  for (const std::string& w : words)
    EXPECT_NE(r.error().message.find(w), std::string::npos)
        << "\"" << w << "\" not in: " << r.error().message;
}

TEST(Adapter, MalformedPeftAdaptersAreErrorsNamingTheFieldOrTensor) {
  const model::ModelConfig c = stories_config();
  std::string dir = copy_dir(kModels + "lora/zed", "dora");
  edit_config(dir, [](nlohmann::json& j) { j["use_dora"] = true; });
  expect_error(read_adapter(dir, c, 16), {"adapter_config.json", "use_dora", "DoRA"});
  dir = copy_dir(kModels + "lora/zed", "ia3");
  edit_config(dir, [](nlohmann::json& j) { j["peft_type"] = "IA3"; });
  expect_error(read_adapter(dir, c, 16), {"adapter_config.json", "peft_type", "IA3"});
  dir = copy_dir(kModels + "lora/zed", "rank");
  edit_config(dir, [](nlohmann::json& j) { j["r"] = 4; });
  expect_error(read_adapter(dir, c, 16),
               {"adapter_model.safetensors", "lora_A.weight", "expected [4, "});
  dir = copy_dir(kModels + "lora/zed", "pattern");
  edit_config(dir, [](nlohmann::json& j) { j["rank_pattern"] = {{"q_proj", 4}}; });
  expect_error(read_adapter(dir, c, 16), {"rank_pattern"});
  dir = copy_dir(kModels + "lora/zed", "noconfig");
  fs::remove(dir + "/adapter_config.json");
  expect_error(read_adapter(dir, c, 16), {dir, "adapter_config.json"});
  dir = copy_dir(kModels + "lora/zed", "truncated");
  fs::resize_file(dir + "/adapter_model.safetensors", 1000);
  expect_error(read_adapter(dir, c, 16), {"adapter_model.safetensors"});
  dir = copy_dir(kModels + "vera/zed", "vera_noproj");
  edit_config(dir, [](nlohmann::json& j) { j["save_projection"] = false; });
  expect_error(read_adapter(dir, c, 32), {"save_projection"});
  expect_error(read_adapter(kModels + "medusa", c, 16), {"adapter_config.json"});
  expect_error(read_adapter("no/such/adapter", c, 16), {"no/such/adapter"});
}

TEST(Adapter, MalformedGgufAdaptersAreErrorsNamingTheTensor) {
  const model::ModelConfig c = stories_config();
  expect_error(read_adapter(rewrite_gguf("nob", "blk.2.attn_v.weight.lora_b"), c, 16),
               {"blk.2.attn_v.weight.lora_b", "missing"});
  expect_error(read_adapter(kModels + "stories260K.gguf", c, 16),
               {"stories260K.gguf", "not a LoRA adapter"});
  // A NaN in one tensor.
  const std::string nan =
      rewrite_gguf("nan", "", [](const std::string& name, std::vector<uint8_t>& b) {
        if (name == "blk.1.ffn_up.weight.lora_a") {
          const float v = std::nanf("");
          std::memcpy(b.data() + 8, &v, 4);
        }
      });
  expect_error(read_adapter(nan, c, 16), {"blk.1.ffn_up.weight.lora_a", "not finite"});
  expect_error(read_adapter(kModels + "lora/zed/adapter.gguf", c, 4),
               {"adapter.gguf", "rank 8", "--max-lora-rank 4"});
  // The draft model's shapes are not stories260K's: an adapter for one does not fit the other.
  auto draft_file = gguf::GgufFile::open(kModels + "stories-draft.gguf");
  ASSERT_TRUE(draft_file.ok());
  auto draft = model::read_model_config(*draft_file);
  ASSERT_TRUE(draft.ok());
  expect_error(read_adapter(kModels + "lora/zed/adapter.gguf", *draft, 16),
               {"adapter.gguf", "blk.0.attn_q.weight.lora_a", "expected [48, rank]"});
}

TEST(AdapterRegistry, KeepsAtMostMaxCpuLorasLoadedAndNeverDropsAPinnedOne) {
  backend::CpuBackend backend(1);
  LoraConfig config;
  config.enable_lora = true;
  config.max_loras = 1;
  config.max_cpu_loras = 1;
  config.modules = {{"zed", kModels + "lora/zed/adapter.gguf", ""},
                    {"bim", kModels + "lora/bim", ""}};
  AdapterRegistry r(config, stories_config(), backend);
  ASSERT_TRUE(r.init().ok());
  EXPECT_EQ(r.num_loaded(), 1);  // both were read to check them; zed, the older, was dropped
  EXPECT_EQ(r.num_loads(), 2);
  EXPECT_FALSE(r.any());

  // Holding reads nothing: a thousand waiting requests cost no adapter memory.
  auto zed = r.hold("zed");
  ASSERT_TRUE(zed.ok());
  EXPECT_EQ(r.num_loads(), 2);
  EXPECT_EQ(r.name_of(*zed), "zed");
  auto zed_slot = r.pin(*zed);  // running: read again
  ASSERT_TRUE(zed_slot.ok());
  EXPECT_EQ(r.num_loads(), 3);
  EXPECT_TRUE(r.any());
  EXPECT_EQ(r.modules(*zed_slot, 0, Projection::kK).size(), 1u);
  auto bim = r.hold("bim");
  ASSERT_TRUE(bim.ok());
  EXPECT_NE(*zed, *bim);
  auto bim_slot = r.pin(*bim);  // zed is pinned: both stay loaded while they run
  ASSERT_TRUE(bim_slot.ok());
  EXPECT_EQ(r.num_loaded(), 2);
  EXPECT_TRUE(r.modules(*bim_slot, 0, Projection::kK).empty());  // bim has no attn_k
  r.unpin(*bim_slot);
  EXPECT_EQ(r.num_loaded(), 1);  // bim, unpinned, goes; zed stays
  r.unhold(*bim);

  // Removing a held name: gone from the list at once, its copy freed with the last holder and
  // the last pin.
  EXPECT_TRUE(r.remove("zed"));
  EXPECT_FALSE(r.contains("zed"));
  EXPECT_FALSE(r.hold("zed").ok());
  EXPECT_EQ(r.num_loaded(), 1);
  EXPECT_EQ(r.modules(*zed_slot, 0, Projection::kQ).size(), 1u);
  r.unhold(*zed);
  EXPECT_EQ(r.num_loaded(), 1);  // still pinned by a running sequence
  r.unpin(*zed_slot);
  EXPECT_EQ(r.num_loaded(), 0);
  EXPECT_EQ(r.name_of(*zed), "");
  EXPECT_FALSE(r.remove("zed"));

  EXPECT_FALSE(r.add("bim", kModels + "lora/bim").ok());  // still registered
  auto bad = r.add("bad", kModels + "stories260K.gguf");
  ASSERT_FALSE(bad.ok());
  EXPECT_FALSE(r.contains("bad"));
}

TEST(AdapterRegistry, AFileThatStopsReadingBreaksItsRegistration) {
  backend::CpuBackend backend(1);
  const std::string dir = copy_dir(kModels + "lora/bim", "vanishing");
  LoraConfig config;
  config.enable_lora = true;
  config.max_loras = 1;
  config.max_cpu_loras = 1;
  config.modules = {{"bim", dir, ""}, {"zed", kModels + "lora/zed/adapter.gguf", ""}};
  AdapterRegistry r(config, stories_config(), backend);
  ASSERT_TRUE(r.init().ok());  // bim was read, checked and dropped for zed
  auto bim = r.hold("bim");
  ASSERT_TRUE(bim.ok());
  fs::remove_all(dir);
  auto slot = r.pin(*bim);
  ASSERT_FALSE(slot.ok());
  EXPECT_NE(slot.error().message.find("adapter 'bim'"), std::string::npos) << slot.error().message;
  EXPECT_NE(slot.error().message.find(dir), std::string::npos) << slot.error().message;
  // Broken for good: even were the file back, this registration never runs.
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kModels + "lora/bim"))
    fs::copy(e.path(), dir + "/" + e.path().filename().string());
  EXPECT_FALSE(r.pin(*bim).ok());
  r.unhold(*bim);
}

TEST(AdapterRegistry, MergedAdaptersFollowEveryRequestsOwn) {
  backend::CpuBackend backend(1);
  LoraConfig config;
  config.enable_lora = true;
  config.modules = {{"bim", kModels + "lora/bim/adapter.gguf", ""}};
  config.merged = {{kModels + "lora/zed/adapter.gguf", 0.5f}};
  AdapterRegistry r(config, stories_config(), backend);
  ASSERT_TRUE(r.init().ok());
  EXPECT_TRUE(r.any());
  EXPECT_EQ(r.modules(-1, 3, Projection::kK).size(), 1u);  // zed alone
  auto bim = r.hold("bim");
  ASSERT_TRUE(bim.ok());
  auto slot = r.pin(*bim);
  ASSERT_TRUE(slot.ok());
  const auto mods = r.modules(*slot, 3, Projection::kQ);
  ASSERT_EQ(mods.size(), 2u);  // bim's, then zed's
  EXPECT_EQ(mods[0].rank, 4);
  EXPECT_EQ(mods[1].rank, 8);
  EXPECT_FLOAT_EQ(mods[1].scale, 0.5f * 2.0f);
}

}  // namespace
}  // namespace vesper::lora
