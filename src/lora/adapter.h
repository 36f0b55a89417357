// Adapter: one LoRA or VeRA adapter of a base model, read from a file, checked against the
// model's shapes and held in a backend buffer as low-rank modules the forward pass applies
// (backend::LowRankModule, model/adapter_source.h).
//
// Formats (lora/README.md has the details):
//  - llama.cpp GGUF LoRA: general.type = adapter, adapter.type = lora, adapter.lora.alpha,
//    tensors blk.N.<proj>.weight.lora_a [n_in, r] and .lora_b [r, n_out] (ggml order), f32, f16,
//    bf16 or q8_0; rows already in GGUF's order.
//  - PEFT LoRA: a directory with adapter_config.json (peft_type LORA) and
//    adapter_model.safetensors (lora_A [r, in], lora_B [out, r] per Hugging Face module, in HF
//    row order: q and k rows are read through GGUF's rope permutation); use_rslora honoured,
//    DoRA refused.
//  - PEFT VeRA: the same directory layout with peft_type VERA: the shared vera_A / vera_B stored
//    in the file and per-module vera_lambda_d / vera_lambda_b; each module uses the top-left
//    slice of the shared matrices, never a matrix of its own.
// Errors name the file and the tensor or field at fault.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "model/adapter_source.h"
#include "model/model_config.h"

namespace vesper::lora {

enum class AdapterKind { kLora, kVera };
const char* kind_name(AdapterKind kind);

// An adapter's tensors in host memory, before they go to the backend: every module's offsets
// into `data` (f32).
struct HostAdapter {
  struct Module {
    int64_t rank = 0;  // 0: the adapter does not target this projection
    int64_t a = 0, a_stride = 0, b = 0, b_stride = 0;
    int64_t lambda_d = -1, lambda_b = -1;  // -1: none
    int64_t n_in = 0, n_out = 0;
    float scale = 1.0f;
    int64_t permute_head_dim = 0;
  };
  std::string path;
  AdapterKind kind = AdapterKind::kLora;
  int64_t max_rank = 0;  // the largest module rank
  // Every value came from an fp16 tensor (and there are no lambdas): the backend keeps the
  // adapter in fp16, half the bytes a step reads, with the same values.
  bool f16_exact = true;
  std::vector<float> data;
  std::vector<Module> modules;  // [layer * kNumProjections + projection]
};

// Reads the adapter at `path` (a GGUF file, or a PEFT directory) for a model of `config`. Its
// deltas are multiplied by `scale` (llama.cpp's --lora-scaled). A module whose rank exceeds
// `max_rank` is an error naming --max-lora-rank. Files are opened without blocking and must be
// regular files (a FIFO or a device is refused at once). `recognized`, when given, tells whether
// the path was recognized as an adapter (a GGUF file of general.type "adapter", or a directory
// with a JSON adapter_config.json of a known peft_type) before any error: errors before that may
// quote the file's bytes (a wrong magic) and a server answers them with one message instead.
Result<HostAdapter> read_adapter(const std::string& path, const model::ModelConfig& config,
                                 int64_t max_rank, float scale = 1.0f, bool* recognized = nullptr);

// An adapter in a backend buffer; the buffer is released with the object.
class Adapter {
 public:
  static std::unique_ptr<Adapter> upload(const HostAdapter& host, backend::Backend& backend);
  ~Adapter();
  Adapter(const Adapter&) = delete;
  Adapter& operator=(const Adapter&) = delete;

  const std::string& path() const { return path_; }
  AdapterKind kind() const { return kind_; }
  int64_t max_rank() const { return max_rank_; }
  int64_t bytes() const { return bytes_; }
  // Every module, [layer * kNumProjections + projection]; rank 0 where not targeted.
  const std::vector<backend::LowRankModule>& modules() const { return modules_; }

 private:
  Adapter(backend::Backend& backend) : backend_(backend) {}
  backend::Backend& backend_;
  backend::Tensor buffer_;
  std::string path_;
  AdapterKind kind_ = AdapterKind::kLora;
  int64_t max_rank_ = 0;
  int64_t bytes_ = 0;
  std::vector<backend::LowRankModule> modules_;
};

}  // namespace vesper::lora
