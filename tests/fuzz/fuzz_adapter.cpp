// Fuzz target: the adapter readers (lora/adapter.h), both formats, against stories260K's shapes.
// The first input byte picks the format: even, the rest is a llama.cpp GGUF LoRA file; odd, the
// next two bytes give the length of adapter_config.json, which follows, and the rest is
// adapter_model.safetensors (a PEFT LoRA or VeRA directory). read_adapter either refuses the
// adapter with an error naming the file, or returns one whose every module fits the model: its
// rank within --max-lora-rank, its offsets and strides inside the data, its values finite.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/check.h"
#include "lora/adapter.h"
#include "model/adapter_source.h"

namespace vesper::lora {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxRank = 16;

model::ModelConfig stories260k() {
  model::ModelConfig c;
  c.arch.name = "llama";
  c.name = "stories260K";
  c.n_vocab = 512;
  c.n_embd = 64;
  c.n_layer = 5;
  c.n_head = 8;
  c.n_head_kv = 4;
  c.head_dim = 8;
  c.n_ff = 172;
  c.context_length = 512;
  return c;
}

const fs::path& work_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("vesper-fuzz-adapter-" + std::to_string(::getpid()));
    fs::create_directories(d / "peft");
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(work_dir(), ec);
    });
    return d;
  }();
  return dir;
}

void write_file(const fs::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

void check_adapter(const HostAdapter& a, const model::ModelConfig& c) {
  VESPER_CHECK(a.modules.size() == static_cast<size_t>(c.n_layer * model::kNumProjections));
  VESPER_CHECK(a.max_rank > 0 && a.max_rank <= kMaxRank, "rank %lld",
               static_cast<long long>(a.max_rank));
  const auto n = static_cast<int64_t>(a.data.size());
  for (const HostAdapter::Module& m : a.modules) {
    if (m.rank == 0) continue;
    VESPER_CHECK(m.rank <= a.max_rank && m.n_in > 0 && m.n_out > 0);
    // A's rows and B's rows (or the shared VeRA matrices' slices) lie inside the data.
    VESPER_CHECK(m.a >= 0 && m.a + (m.rank - 1) * m.a_stride + m.n_in <= n, "A out of range");
    VESPER_CHECK(m.b >= 0 && m.b + (m.n_out - 1) * m.b_stride + m.rank <= n, "B out of range");
    if (m.lambda_d >= 0) VESPER_CHECK(m.lambda_d + m.rank <= n);
    if (m.lambda_b >= 0) VESPER_CHECK(m.lambda_b + m.n_out <= n);
    VESPER_CHECK(std::isfinite(m.scale));
  }
  for (float v : a.data) VESPER_CHECK(std::isfinite(v), "a non-finite value was accepted");
}

}  // namespace
}  // namespace vesper::lora

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vesper::lora;
  if (size < 1) return 0;
  static const vesper::model::ModelConfig config = stories260k();
  const fs::path& dir = work_dir();
  std::string path;
  if (data[0] % 2 == 0) {
    path = (dir / "adapter.gguf").string();
    write_file(path, data + 1, size - 1);
  } else {
    if (size < 3) return 0;
    const size_t config_len = std::min<size_t>(size - 3, (size_t{data[1]} << 8) | data[2]);
    write_file(dir / "peft" / "adapter_config.json", data + 3, config_len);
    write_file(dir / "peft" / "adapter_model.safetensors", data + 3 + config_len,
               size - 3 - config_len);
    path = (dir / "peft").string();
  }
  bool recognized = false;
  auto read = read_adapter(path, config, kMaxRank, 1.0f, &recognized);
  if (!read) {
    VESPER_CHECK(!read.error().message.empty());
    return 0;
  }
  VESPER_CHECK(recognized, "an adapter read without being recognized");
  check_adapter(*read, config);
  return 0;
}
