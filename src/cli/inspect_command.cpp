// `vesper inspect FILE.gguf`: prints a GGUF file's metadata (long arrays elided) and its tensor
// table, with the parameter count and size.
#include <cstdio>
#include <iterator>
#include <vector>

#include "backend/kv_cache_spec.h"
#include "cli/commands.h"
#include "gguf/gguf.h"
#include "hf/model_file.h"
#include "model/model_config.h"

namespace vesper::cli {
namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.2fK", n / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

// For a model file: what one token of KV cache costs in each --kv-cache-dtype (scales included,
// 16-token blocks; KIVI: quantized, in groups of 32) and how many tokens a GiB holds.
void print_kv_capacity(const gguf::GgufFile& file) {
  auto config = model::read_model_config(file);
  if (!config) return;  // not a model this engine runs (an adapter, a vocabulary, ...)
  std::printf("\nKV cache per token (--kv-cache-dtype; %lld layers x %lld KV heads x %lld):\n",
              static_cast<long long>(config->n_layer), static_cast<long long>(config->n_head_kv),
              static_cast<long long>(config->head_dim));
  std::vector<backend::KvDtype> types(std::begin(backend::kRowKvDtypes),
                                      std::end(backend::kRowKvDtypes));
  types.insert(types.end(), std::begin(backend::kKiviKvDtypes), std::end(backend::kKiviKvDtypes));
  for (backend::KvDtype d : types) {
    backend::KvCacheSpec spec;
    spec.dtypes = {d, d};
    if (backend::kv_is_kivi(d)) spec.block_size = 32;
    spec.n_layers = config->n_layer;
    spec.n_kv_heads = config->n_head_kv;
    spec.head_dim = config->head_dim;
    const double per_token = static_cast<double>(spec.bytes_per_token());
    std::printf("  %-9s %10s/token  %12.0f tokens per GiB%s\n",
                std::string(backend::kv_dtype_name(d)).c_str(), human_bytes(per_token).c_str(),
                static_cast<double>(int64_t{1} << 30) / per_token,
                d == backend::KvDtype::kF16 ? "  (auto)"
                : backend::kv_is_kivi(d)    ? "  (quantized groups; the newest tokens take f16)"
                                            : "");
  }
}

struct InspectOptions {
  std::string path;
  bool no_tensors = false;
  size_t max_items = 8;
};

int run_inspect(const InspectOptions& o) {
  auto file = hf::open_model_file(o.path);
  if (!file) return fail(file.error().message);
  std::printf("file: %s\n", o.path.c_str());
  std::printf(
      "GGUF version %u, %zu metadata keys, %zu tensors, alignment %zu, data offset %zu, file size "
      "%s\n",
      file->version(), file->metadata().size(), file->tensors().size(), file->alignment(),
      file->data_offset(), human_bytes(static_cast<double>(file->file_size())).c_str());
  std::printf("\nmetadata:\n");
  for (const auto& [key, value] : file->metadata()) {
    std::string type(gguf::value_type_name(value.type));
    if (const gguf::Array* a = value.as_array())
      type = "array<" + std::string(gguf::value_type_name(a->element_type)) + ">[" +
             std::to_string(a->items.size()) + "]";
    std::printf("  %-48s %-22s %s\n", key.c_str(), type.c_str(),
                value.to_string(o.max_items).c_str());
  }
  double params = 0, bytes = 0;
  for (const auto& t : file->tensors()) {
    params += static_cast<double>(t.num_elements());
    bytes += static_cast<double>(t.size_bytes);
  }
  if (!o.no_tensors && !file->tensors().empty()) {
    std::printf("\ntensors:\n  %-40s %-8s %-28s %12s\n", "name", "type", "shape", "bytes");
    for (const auto& t : file->tensors()) {
      std::string shape = "[";
      for (size_t i = 0; i < t.shape.size(); ++i)
        shape += (i ? ", " : "") + std::to_string(t.shape[i]);
      shape += "]";
      std::printf("  %-40s %-8s %-28s %12zu\n", t.name.c_str(),
                  std::string(tensor::type_name(t.type)).c_str(), shape.c_str(), t.size_bytes);
    }
  }
  std::printf("\nparameters: %s (%.0f), tensor data: %s", human_count(params).c_str(), params,
              human_bytes(bytes).c_str());
  if (params > 0) std::printf(" (%.2f bits per weight)", bytes * 8.0 / params);
  std::printf("\n");
  print_kv_capacity(*file);
  return 0;
}

}  // namespace

CommandRunner add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "Print a GGUF file's (or a checkpoint directory's, as GGUF) metadata and tensor table");
  cmd->add_option("file", o->path, "GGUF file or Hugging Face checkpoint directory")->required();
  cmd->add_flag("--no-tensors", o->no_tensors, "Print the metadata only");
  cmd->add_option("--max-array-items", o->max_items, "Array items shown before eliding")
      ->capture_default_str();
  return [o] { return run_inspect(*o); };
}

}  // namespace vesper::cli
