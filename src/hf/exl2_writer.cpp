#include "hf/exl2_writer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "core/fp16.h"
#include "core/logging.h"
#include "gguf/composite_weight.h"
#include "gguf/safetensors.h"
#include "hf/checkpoint.h"
#include "hf/exl2_quantize.h"
#include "hf/hf_config.h"
#include "hf/tensor_map.h"
#include "tensor/quant.h"

namespace vesper::hf {
namespace {

namespace fs = std::filesystem;
using tensor::GgmlType;

constexpr int kWidths[] = {2, 3, 4, 5, 6, 8};
constexpr int64_t kGroupRows = 32;
// Bits per weight the scales add: a 4-bit code per column and 32-row group.
constexpr double kScaleBits = 4.0 / kGroupRows;

int supported_width(double bits) {
  for (int w : kWidths)
    if (bits <= w + 1e-9) return w;
  return 8;
}

// The ladder of plans a layer of k inputs can take, narrowest first: each width, and between two
// widths the first (most important) half of the rows at the wider one.
std::vector<Exl2LayerPlan> ladder(int64_t k, const std::vector<int32_t>& perm) {
  std::vector<Exl2LayerPlan> plans;
  const int64_t half = k / 2 / kGroupRows * kGroupRows;
  for (size_t i = 0; i < std::size(kWidths); ++i) {
    for (int step = 0; step < 2; ++step) {
      if (step == 1 && (i + 1 == std::size(kWidths) || half == 0)) continue;
      Exl2LayerPlan p;
      p.perm = perm;
      for (int64_t r = 0; r < k; r += kGroupRows) {
        const int wide = step == 1 && r < half ? kWidths[i + 1] : kWidths[i];
        p.groups.push_back({wide, std::min(kGroupRows, k - r)});
      }
      plans.push_back(std::move(p));
    }
  }
  return plans;
}

double plan_bits(const Exl2LayerPlan& p, int64_t k) {
  double bits = 0;
  for (const Exl2PackGroup& g : p.groups) bits += static_cast<double>(g.bits * g.rows);
  return bits / static_cast<double>(k) + kScaleBits;
}

// One linear layer to quantize: its stored weights ([n][k], f32, f16 or bf16, in the mapped
// file), the importance of each input row, and the measured error and bits of each plan of its
// ladder. The weights are widened to f32 only while a thread measures or quantizes the layer, so
// the writer holds one layer in f32 per thread, not the model (a 7B checkpoint would need 28 GB).
struct Layer {
  std::string name;  // the Hugging Face tensor name (".weight")
  int64_t n = 0, k = 0;
  const gguf::SafetensorsTensor* stored = nullptr;
  std::vector<int32_t> perm;
  const std::vector<double>* input_energy = nullptr;  // calibration, if any ([k])
  std::vector<Exl2LayerPlan> plans;
  std::vector<double> error, bits;
  size_t chosen = 0;
};

// A layer's weights widened to f32 (its dtype was checked to be a float type when it was listed).
std::vector<float> to_f32(const gguf::SafetensorsTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  tensor::dequantize_row(t.type, t.data, out.data(), t.num_elements());
  return out;
}

void measure(Layer& l) {
  const std::vector<float> w = to_f32(*l.stored);
  // Importance of input row i: the mean square of its input on the calibration text, or without
  // calibration its squared norm across the outputs; act order by importance.
  std::vector<double> importance(static_cast<size_t>(l.k), 0.0);
  if (l.input_energy != nullptr) {
    importance = *l.input_energy;
  } else {
    for (int64_t o = 0; o < l.n; ++o)
      for (int64_t i = 0; i < l.k; ++i)
        importance[static_cast<size_t>(i)] += double{w[o * l.k + i]} * w[o * l.k + i];
  }
  l.perm.resize(static_cast<size_t>(l.k));
  std::iota(l.perm.begin(), l.perm.end(), 0);
  std::stable_sort(l.perm.begin(), l.perm.end(),
                   [&](int32_t a, int32_t b) { return importance[a] > importance[b]; });
  double norm = 0;
  for (int64_t o = 0; o < l.n; ++o)
    for (int64_t i = 0; i < l.k; ++i)
      norm += importance[static_cast<size_t>(i)] * w[o * l.k + i] * w[o * l.k + i];
  // A group's quantization depends only on its rows and its width, so each width is quantized
  // once for every group, and a plan's error is the sum of its groups' errors at their widths.
  const size_t n_groups = static_cast<size_t>((l.k + kGroupRows - 1) / kGroupRows);
  std::vector<std::vector<double>> group_error(std::size(kWidths));  // [width][group]
  for (size_t wi = 0; wi < std::size(kWidths); ++wi) {
    Exl2LayerPlan uniform;
    uniform.perm = l.perm;
    for (int64_t r = 0; r < l.k; r += kGroupRows)
      uniform.groups.push_back({kWidths[wi], std::min(kGroupRows, l.k - r)});
    const std::vector<float> q =
        dequantize_exl2_layer(quantize_exl2_layer(w.data(), l.n, l.k, uniform));
    std::vector<double>& errors = group_error[wi];
    errors.assign(n_groups, 0.0);
    for (int64_t o = 0; o < l.n; ++o)
      for (int64_t r = 0; r < l.k; ++r) {
        const size_t i = static_cast<size_t>(l.perm[static_cast<size_t>(r)]);
        const double d = double{w[o * l.k + static_cast<int64_t>(i)]} - q[o * l.k + i];
        errors[static_cast<size_t>(r / kGroupRows)] += importance[i] * d * d;
      }
  }
  l.plans = ladder(l.k, l.perm);
  for (const Exl2LayerPlan& p : l.plans) {
    double error = 0;
    for (size_t g = 0; g < p.groups.size(); ++g) {
      const size_t wi =
          static_cast<size_t>(std::find(std::begin(kWidths), std::end(kWidths), p.groups[g].bits) -
                              std::begin(kWidths));
      error += group_error[wi][g];
    }
    l.error.push_back(norm > 0 ? error / norm : 0.0);
    l.bits.push_back(plan_bits(p, l.k));
  }
}

// Runs fn(i) for each i in [0, n) on the pool's threads, each taking the next index as it is
// free (layers differ in size); `progress` is called with each index as it starts, one call at
// a time.
void for_each_layer(ThreadPool& pool, size_t n, const std::function<void(size_t)>& fn,
                    const std::function<void(size_t)>& progress) {
  std::atomic<size_t> next{0};
  std::mutex progress_mutex;
  pool.run([&](int, int) {
    for (size_t i = next++; i < n; i = next++) {
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        progress(i);
      }
      fn(i);
    }
  });
}

// Greedy allocation: the move with the largest error reduction per extra bit, while the average
// stays within the target.
double allocate(std::vector<Layer>& layers, double target) {
  double weights = 0, total_bits = 0;
  for (const Layer& l : layers) {
    weights += static_cast<double>(l.n * l.k);
    total_bits += l.bits[0] * static_cast<double>(l.n * l.k);
  }
  while (true) {
    Layer* best = nullptr;
    double best_gain = -1;
    for (Layer& l : layers) {
      if (l.chosen + 1 >= l.plans.size()) continue;
      const double extra =
          (l.bits[l.chosen + 1] - l.bits[l.chosen]) * static_cast<double>(l.n * l.k);
      if ((total_bits + extra) / weights > target + 1e-9) continue;
      const double gain =
          (l.error[l.chosen] - l.error[l.chosen + 1]) * static_cast<double>(l.n * l.k) / extra;
      if (gain > best_gain) {
        best_gain = gain;
        best = &l;
      }
    }
    if (best == nullptr) break;
    total_bits += (best->bits[best->chosen + 1] - best->bits[best->chosen]) *
                  static_cast<double>(best->n * best->k);
    ++best->chosen;
  }
  return weights > 0 ? total_bits / weights : 0.0;
}

}  // namespace

Result<Exl2WriteReport> write_exl2_checkpoint(
    const std::string& in_dir, const std::string& out_dir, const Exl2WriteOptions& options,
    ThreadPool& pool, const std::function<void(const std::string&)>& progress) {
  if (options.bits < 2.0 + kScaleBits || options.bits > 8.0 + kScaleBits)
    return make_error("--bits " + std::to_string(options.bits) + " is outside [2.125, 8.125]");
  // Everything the loader checks (shapes against config.json, names, dtypes) holds first.
  VESPER_ASSIGN_OR_RETURN(gguf::GgufFile checked, load_checkpoint(in_dir));
  for (const gguf::TensorInfo& t : checked.tensors())
    if (gguf::is_composite_tensor(t.name))
      return make_error(in_dir + ": is already an EXL2 checkpoint");
  VESPER_ASSIGN_OR_RETURN(HfConfig config, read_config(in_dir));
  VESPER_ASSIGN_OR_RETURN(std::vector<std::string> paths, checkpoint_weight_files(in_dir));
  std::vector<gguf::SafetensorsFile> files;
  for (const std::string& p : paths) {
    VESPER_ASSIGN_OR_RETURN(gguf::SafetensorsFile f, gguf::SafetensorsFile::open(p));
    files.push_back(std::move(f));
  }
  std::map<std::string, ExpectedTensor> expected;
  for (const ExpectedTensor& e : expected_tensors(config)) expected[e.hf_name] = e;

  Exl2WriteReport report;
  std::vector<Layer> blocks;  // the blocks' linear layers, allocated together
  Layer head;
  bool has_head = false;
  std::vector<gguf::SafetensorsTensorData> out;
  for (const gguf::SafetensorsFile& f : files)
    for (const gguf::SafetensorsTensor& t : f.tensors()) {
      auto e = expected.find(t.name);
      if (e == expected.end()) continue;  // ignorable (rotary inv_freq) or tied lm_head
      const bool linear = t.shape.size() == 2 && t.name != "model.embed_tokens.weight";
      if (linear && t.shape[1] % kGroupRows == 0) {
        Layer l;
        l.name = t.name;
        l.n = t.shape[0];
        l.k = t.shape[1];
        if (!gguf::is_float_dtype(t.type))
          return make_error(f.path() + ": " + t.name + " is not a float tensor");
        l.stored = &t;
        if (!options.input_energy.empty() && t.name != "lm_head.weight") {
          const auto energy = options.input_energy.find(e->second.gguf_name);
          if (energy == options.input_energy.end() ||
              static_cast<int64_t>(energy->second.size()) != l.k)
            return make_error(in_dir + ": " + t.name + ": no calibration statistics of " +
                              std::to_string(l.k) + " inputs");
          l.input_energy = &energy->second;
        }
        if (t.name == "lm_head.weight") {
          head = std::move(l);
          has_head = true;
        } else {
          blocks.push_back(std::move(l));
        }
        continue;
      }
      if (linear) {
        log_warning(
            "%s: %s has %lld inputs, not a multiple of 32: written unquantized (Vesper loads it; "
            "exllamav2 does not)",
            f.path().c_str(), t.name.c_str(), static_cast<long long>(t.shape[1]));
        ++report.plain_layers;
      }
      out.push_back(
          {t.name, t.type, t.shape, t.data});  // as stored (the mapping outlives the write)
    }

  for_each_layer(
      pool, blocks.size(), [&](size_t i) { measure(blocks[i]); },
      [&](size_t i) {
        if (progress) progress("measuring " + blocks[i].name);
      });
  report.bits = allocate(blocks, options.bits);

  // Each layer quantized at its chosen plan (lm_head at --head-bits), in parallel, then written
  // in the checkpoint's order.
  std::vector<const Layer*> layers;
  std::vector<Exl2LayerPlan> plans;
  for (const Layer& l : blocks) {
    layers.push_back(&l);
    plans.push_back(l.plans[l.chosen]);
  }
  if (has_head) {
    Exl2LayerPlan plan;
    for (int64_t r = 0; r < head.k; r += kGroupRows)
      plan.groups.push_back({supported_width(options.head_bits), std::min(kGroupRows, head.k - r)});
    layers.push_back(&head);
    plans.push_back(std::move(plan));
  }
  std::vector<Exl2PackedLayer> packed(layers.size());
  for_each_layer(
      pool, layers.size(),
      [&](size_t i) {
        const Layer& l = *layers[i];
        const std::vector<float> w = to_f32(*l.stored);
        packed[i] = pack_exl2(quantize_exl2_layer(w.data(), l.n, l.k, plans[i]));
      },
      [&](size_t i) {
        if (progress) progress("quantizing " + layers[i]->name);
      });
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string& name = layers[i]->name;
    const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
    for (gguf::SafetensorsTensorData& d : packed[i].tensors(prefix)) out.push_back(std::move(d));
    ++report.layers;
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return make_error(out_dir + ": cannot create (" + ec.message() + ")");
  VESPER_TRY(gguf::write_safetensors(out_dir + "/model.safetensors", out));
  // config.json with quantization_config; the tokenizer and generation files as they are.
  std::ifstream in(config.path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text.str());
  j["quantization_config"] = {
      {"quant_method", "exl2"},
      {"version", "vesper"},
      {"bits", options.bits},
      {"head_bits", supported_width(options.head_bits)},
      {"calibration", options.input_energy.empty()
                          ? nlohmann::ordered_json{{"method", "weight error, importance-weighted"}}
                          : nlohmann::ordered_json{{"method",
                                                    "output error on calibration text (input "
                                                    "mean squares)"},
                                                   {"text", options.calibration}}}};
  std::ofstream(out_dir + "/config.json") << j.dump(2) << "\n";
  for (const auto& entry : fs::directory_iterator(in_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name == "config.json" ||
        entry.path().extension() == ".safetensors" || name == "model.safetensors.index.json")
      continue;
    fs::copy_file(entry.path(), fs::path(out_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(out_dir + "/" + name + ": cannot copy (" + ec.message() + ")");
  }
  return report;
}

}  // namespace vesper::hf
