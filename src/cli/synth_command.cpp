// `vesper synth`: writes a random-weight llama-family model of any shape and weight type, with a
// real tokenizer copied from a donor (a GGUF, or a directory with a tokenizer.json), as a GGUF or
// (--format hf) a Hugging Face checkpoint: benchmark inputs at realistic sizes (never committed).
#include <filesystem>

#include "cli/commands.h"
#include "gguf/safetensors.h"
#include "hf/checkpoint_writer.h"
#include "lora/synth_adapter.h"
#include "model/synth.h"
#include "model/widen.h"
#include "spec/medusa_widen.h"

namespace vesper::cli {
namespace {

struct SynthOptions {
  model::SynthSpec spec;
  std::string type = "f32";
  bool type_given = false;
  std::string out;
  std::string format = "gguf";  // --format: gguf, or hf (a checkpoint directory)
  int threads = 0;
  std::string
      widen_from;  // --widen-from: widen this trained model instead of writing random weights
  std::string widen_medusa;  // --widen-medusa: pad these Medusa heads to --n-embd
  // A LoRA adapter for --base instead of a model: --lora-rank, --lora-targets, --lora-alpha.
  std::string lora_base;
  int64_t lora_rank = 0;
  std::string lora_targets = "q,k,v,o";
  float lora_alpha = 32.0f;
};

// --format hf: the model is written as GGUF beside the checkpoint first, then as the checkpoint
// (hf::write_checkpoint), so both formats hold the same weights.
int write_checkpoint(const SynthOptions& o, ThreadPool& pool) {
  if (!gguf::is_float_dtype(o.spec.type))
    return fail("--format hf: --type \"" + o.type + "\" is not a checkpoint's (f32, f16 or bf16)");
  if (o.spec.vocab_from.empty() ||
      !std::filesystem::exists(std::filesystem::path(o.spec.vocab_from) / "tokenizer.json"))
    return fail(
        "--format hf: --vocab-from must name a directory with a tokenizer.json (a "
        "checkpoint's), which the checkpoint gets");
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return fail(o.out + ": cannot create the directory: " + ec.message());
  const std::string staging = o.out + "/.synth.gguf.partial";
  auto written = model::write_synthetic_model(o.spec, staging, pool);
  if (written) {
    auto gguf = gguf::GgufFile::open(staging);
    written = gguf ? hf::write_checkpoint(*gguf, o.out, o.spec.vocab_from) : Status(gguf.error());
  }
  std::filesystem::remove(staging, ec);
  if (!written) return fail(written.error().message);
  std::fprintf(stderr, "wrote %s\n", o.out.c_str());
  return 0;
}

int run_synth(SynthOptions& o) {
  if (o.format == "hf" &&
      (o.lora_rank > 0 || !o.lora_base.empty() || !o.widen_medusa.empty() || !o.widen_from.empty()))
    return fail(
        "--format hf writes a random-weight model: not with --base, --lora-rank, "
        "--widen-from or --widen-medusa");
  if (o.lora_rank > 0 || !o.lora_base.empty()) {
    if (o.lora_base.empty() || o.lora_rank <= 0)
      return fail("a synthetic adapter needs both --base MODEL.gguf and --lora-rank R");
    lora::SynthAdapterSpec a;
    a.base_model = o.lora_base;
    a.rank = o.lora_rank;
    a.alpha = o.lora_alpha;
    a.seed = o.spec.seed;
    auto targets = lora::parse_lora_targets(o.lora_targets);
    if (!targets) return fail(targets.error().message);
    a.targets = *targets;
    auto type = tensor::parse_type_name(o.type == "f32" && !o.type_given ? "f16" : o.type);
    if (!type || !(*type == tensor::GgmlType::kF32 || *type == tensor::GgmlType::kF16 ||
                   *type == tensor::GgmlType::kBF16 || *type == tensor::GgmlType::kQ8_0))
      return fail("--type \"" + o.type + "\": an adapter's tensors are f32, f16, bf16 or q8_0");
    a.type = *type;
    if (auto st = lora::write_synthetic_adapter(a, o.out); !st) return fail(st.error().message);
    std::fprintf(stderr, "wrote %s\n", o.out.c_str());
    return 0;
  }
  if (!o.widen_medusa.empty()) {
    if (auto st = spec::widen_medusa(o.widen_medusa, o.spec.n_embd, o.out); !st)
      return fail(st.error().message);
    std::fprintf(stderr, "wrote %s\n", o.out.c_str());
    return 0;
  }
  auto type = tensor::parse_type_name(o.type);
  if (!type || !tensor::traits(*type).supported)
    return fail("--type \"" + o.type +
                "\" is not supported; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                "q2_k, q3_k, q4_k, q5_k, q6_k");
  o.spec.type = *type;
  ThreadPool pool(o.threads > 0 ? o.threads : ThreadPool::hardware_threads());
  if (!o.widen_from.empty()) {
    const model::WidenSpec w{o.spec.n_embd, o.spec.n_head, o.spec.n_head_kv, o.spec.n_ff, *type};
    if (auto st = model::widen_model(o.widen_from, w, o.out, pool); !st)
      return fail(st.error().message);
    std::fprintf(stderr, "wrote %s\n", o.out.c_str());
    return 0;
  }
  if (o.format == "hf") return write_checkpoint(o, pool);
  if (auto st = model::write_synthetic_model(o.spec, o.out, pool); !st)
    return fail(st.error().message);
  std::fprintf(stderr, "wrote %s\n", o.out.c_str());
  return 0;
}

}  // namespace

CommandRunner add_synth_command(CLI::App& app) {
  auto o = std::make_shared<SynthOptions>();
  auto& s = o->spec;
  CLI::App* cmd =
      app.add_subcommand("synth", "Write a random-weight llama-family model (benchmark input)");
  cmd->add_option("--arch", s.arch, "llama, qwen2 or qwen3")->capture_default_str();
  cmd->add_option("--n-layer", s.n_layer, "Layers")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--n-embd", s.n_embd, "Embedding size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--n-head", s.n_head, "Attention heads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--n-head-kv", s.n_head_kv, "Key/value heads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--n-ff", s.n_ff, "Feed-forward size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--n-vocab", s.n_vocab,
                  "Vocabulary size without --vocab-from (a byte vocabulary)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--context-length", s.context_length, "Context length")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option(
      "--vocab-from", s.vocab_from,
      "Donor of the tokenizer: a GGUF, or a directory with a Hugging Face tokenizer.json");
  cmd->add_option("--type", o->type,
                  "Weight type (q4_0, q8_0, q4_k, f16, ...); an adapter's: f16 (default), f32, "
                  "bf16 or q8_0")
      ->capture_default_str()
      ->each([o](const std::string&) { o->type_given = true; });
  cmd->add_option("--base", o->lora_base,
                  "Write a random LoRA adapter (llama.cpp GGUF) for this model instead of a model");
  cmd->add_option("--lora-rank", o->lora_rank, "The adapter's rank (with --base)")
      ->check(CLI::Range(int64_t{1}, int64_t{512}));
  cmd->add_option("--lora-targets", o->lora_targets,
                  "Projections the adapter targets: q, k, v, o, gate, up, down, or all")
      ->capture_default_str();
  cmd->add_option("--lora-alpha", o->lora_alpha, "The adapter's alpha (scale alpha / rank)")
      ->capture_default_str();
  cmd->add_option("--seed", s.seed, "Random seed")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads")->check(CLI::PositiveNumber);
  cmd->add_option("--widen-from", o->widen_from,
                  "Widen this trained llama GGUF to --n-embd / --n-head / --n-head-kv / --n-ff "
                  "instead of writing "
                  "random weights: the original weights in each matrix's top-left corner, zeros "
                  "elsewhere, norms "
                  "rescaled, so the larger model computes the same function (a memory-bound "
                  "benchmark input with "
                  "real outputs)");
  cmd->add_option(
         "--widen-medusa", o->widen_medusa,
         "Pad these Medusa heads (a directory: config.json and .safetensors) to --n-embd, as "
         "--widen-from pads a model, so they propose for the widened model exactly what they "
         "propose for the original; -o names the output directory")
      ->excludes("--widen-from");
  cmd->add_option("--format", o->format,
                  "gguf, or hf: a Hugging Face checkpoint directory (config.json, "
                  "model.safetensors, and --vocab-from's tokenizer files, which it must hold); "
                  "--type f32, f16 or bf16")
      ->check(CLI::IsMember({"gguf", "hf"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", o->out,
                  "Output GGUF file (a directory with --format hf or --widen-medusa)")
      ->required();
  return [o] { return run_synth(*o); };
}

}  // namespace vesper::cli
