// `vesper quantize IN OUT --type TYPE`: writes a copy of a model with its weight matrices
// converted to TYPE (rules in model/quantize.h). `vesper convert DIR -o OUT.gguf [--type TYPE]`:
// writes a Hugging Face checkpoint as GGUF (the weights as stored unless --type says otherwise).
// Both read any model path (a GGUF file or a checkpoint directory).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "backend/cpu_backend.h"
#include "cli/commands.h"
#include "hf/checkpoint.h"
#include "hf/exl2_writer.h"
#include "model/calibration.h"
#include "model/model.h"
#include "model/quantize.h"
#include "tokenizer/tokenizer.h"

namespace vesper::cli {
namespace {

constexpr const char* kTypes =
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k";

struct WriteOptions {
  std::string in_path;
  std::string out_path;
  std::string type;  // empty or "auto" (convert only): keep each tensor's type
  int threads = 0;
  // quantize --to exl2: a checkpoint directory written as EXL2 (hf/exl2_writer.h).
  std::string to;
  double bits = 4.0;
  double head_bits = 6.0;
  std::string calibration;      // text file: bits allocated by output error on it
  int64_t calibration_ctx = 0;  // 0: 512, or the model's context length if shorter
  int64_t calibration_chunks = 16;
  bool calibration_given = false;  // --calibration-ctx or --calibration-chunks passed
};

// The input energy of every linear layer of the checkpoint's model over the first chunks of
// `o.calibration` (model/calibration.h), into `options`.
Status calibrate_exl2(const WriteOptions& o, hf::Exl2WriteOptions& options, bool tty) {
  if (o.calibration_ctx < 0)
    return make_error("--calibration-ctx must be positive, got " +
                      std::to_string(o.calibration_ctx));
  if (o.calibration_chunks < 1)
    return make_error("--calibration-chunks must be positive, got " +
                      std::to_string(o.calibration_chunks));
  std::ifstream in(o.calibration, std::ios::binary);
  if (!in) return make_error("--calibration " + o.calibration + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  backend::CpuBackend backend(o.threads > 0 ? o.threads : ThreadPool::hardware_threads());
  VESPER_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::Model::load(o.in_path, backend));
  VESPER_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::from_gguf(m->file()));
  std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
  const int64_t trained = m->config().context_length;
  const int64_t ctx = o.calibration_ctx > 0          ? o.calibration_ctx
                      : trained > 0 && trained < 512 ? trained
                                                     : 512;
  if (trained > 0 && ctx > trained)
    return make_error("--calibration-ctx " + std::to_string(ctx) +
                      " exceeds the model's context length " + std::to_string(trained));
  const int64_t chunks = std::min(o.calibration_chunks, static_cast<int64_t>(tokens.size()) / ctx);
  if (chunks < 1)
    return make_error("--calibration " + o.calibration + ": " + std::to_string(tokens.size()) +
                      " tokens, fewer than one chunk of --calibration-ctx " + std::to_string(ctx));
  tokens.resize(static_cast<size_t>(chunks * ctx));
  // Each chunk is a sequence of its own: where the tokenizer starts text with BOS, every chunk
  // starts with it (as in perplexity, and llama.cpp's imatrix), so position 0 sees what it sees
  // in use.
  if (const std::optional<int32_t> bos = tok.bos_id(); bos && tokens[0] == *bos)
    for (int64_t c = 0; c < chunks; ++c) tokens[static_cast<size_t>(c * ctx)] = *bos;
  auto energy = model::measure_input_energy(*m, tokens, ctx, [&](int64_t done, int64_t total) {
    if (tty)
      std::fprintf(stderr, "\rcalibrating: chunk %lld of %lld\033[K", static_cast<long long>(done),
                   static_cast<long long>(total));
  });
  if (tty) std::fputc('\n', stderr);
  if (!energy) return make_error("--calibration " + o.calibration + ": " + energy.error().message);
  options.input_energy = std::move(energy->mean_square);
  options.calibration = std::filesystem::path(o.calibration).filename().string() + ": " +
                        std::to_string(energy->tokens) + " tokens in chunks of " +
                        std::to_string(ctx);
  std::fprintf(stderr, "calibration: %s\n", options.calibration.c_str());
  return {};
}

int run_exl2(const WriteOptions& o) {
  if (o.out_path.empty()) return fail("--to exl2 needs an output directory: -o OUTDIR");
  if (!hf::is_checkpoint_dir(o.in_path))
    return fail("--to exl2 reads a Hugging Face checkpoint directory; " + o.in_path +
                " is not one");
  const bool tty = isatty(fileno(stderr)) != 0;
  hf::Exl2WriteOptions options;
  options.bits = o.bits;
  options.head_bits = o.head_bits;
  if (!o.calibration.empty()) {
    if (Status s = calibrate_exl2(o, options, tty); !s) return fail(s.error().message);
  } else if (o.calibration_given) {
    return fail("--calibration-ctx and --calibration-chunks need --calibration FILE");
  }
  ThreadPool pool(o.threads > 0 ? o.threads : ThreadPool::hardware_threads());
  auto report =
      hf::write_exl2_checkpoint(o.in_path, o.out_path, options, pool, [&](const std::string& step) {
        if (tty) std::fprintf(stderr, "\r%-70s\033[K", step.c_str());
      });
  if (tty) std::fputc('\n', stderr);
  if (!report) return fail(report.error().message);
  std::fprintf(stderr,
               "wrote %s: EXL2, %d layers quantized at %.3f bits per weight on average (scales "
               "included)%s\n",
               o.out_path.c_str(), report->layers, report->bits,
               report->plain_layers > 0 ? ", some layers unquantized (see above)" : "");
  return 0;
}

int run_write(const WriteOptions& o) {
  if (!o.to.empty()) {
    if (o.to != "exl2") return fail("--to \"" + o.to + "\" is not supported; supported: exl2");
    return run_exl2(o);
  }
  if (o.out_path.empty()) return fail("no output file: pass OUTPUT (or -o)");
  std::optional<tensor::GgmlType> target;
  if (!o.type.empty() && o.type != "auto") {
    target = tensor::parse_type_name(o.type);
    if (!target || !model::is_quantize_target(*target))
      return fail("--type \"" + o.type + "\" is not supported; supported: " + kTypes);
  }
  if (o.in_path == o.out_path)
    return fail("the output path must differ from the input path " + o.in_path);
  ThreadPool pool(o.threads > 0 ? o.threads : ThreadPool::hardware_threads());
  const bool tty = isatty(fileno(stderr)) != 0;
  auto status = model::quantize_model(
      o.in_path, o.out_path, target, pool, [&](const model::QuantizeProgress& p) {
        if (tty) {
          std::fprintf(stderr, "\r[%zu/%zu] %-40s %s -> %s\033[K", p.index, p.total, p.name.c_str(),
                       std::string(tensor::type_name(p.from)).c_str(),
                       std::string(tensor::type_name(p.to)).c_str());
          if (p.index == p.total) std::fputc('\n', stderr);
        }
      });
  if (!status) return fail(status.error().message);
  std::fprintf(stderr, "wrote %s (%s)\n", o.out_path.c_str(),
               target ? std::string(tensor::type_name(*target)).c_str() : "tensor types as stored");
  return 0;
}

}  // namespace

CommandRunner add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<WriteOptions>();
  CLI::App* cmd = app.add_subcommand("quantize",
                                     "Write a copy of a model as GGUF with quantized weights "
                                     "(--type), or a Hugging Face checkpoint as EXL2 "
                                     "(--to exl2)");
  cmd->add_option("input", o->in_path,
                  "Source model: a GGUF file or a Hugging Face checkpoint directory")
      ->required();
  cmd->add_option("output", o->out_path, "Destination GGUF file (or, with --to exl2, directory)");
  cmd->add_option("-o,--output", o->out_path, "The destination, as OUTPUT");
  auto* type = cmd->add_option("--type", o->type, std::string("Target type: ") + kTypes);
  auto* to = cmd->add_option(
      "--to", o->to,
      "exl2: write an EXL2 checkpoint directory (exllamav2's format; Vesper runs it on "
      "the CPU), bits allocated by measured error");
  type->excludes(to);
  cmd->add_option("--bits", o->bits,
                  "--to exl2: average bits per weight of the blocks' linear layers")
      ->capture_default_str();
  cmd->add_option("--head-bits", o->head_bits, "--to exl2: bits of lm_head (2, 3, 4, 5, 6 or 8)")
      ->capture_default_str();
  cmd->add_option(
      "--calibration", o->calibration,
      "--to exl2: a text file to calibrate on: each layer's bits are allocated by the error its "
      "quantization adds to the layer's output on this text (without it, by weight error)");
  auto* cal_ctx = cmd->add_option("--calibration-ctx", o->calibration_ctx,
                                  "--to exl2: tokens per calibration chunk (default: 512, or "
                                  "the model's context length if shorter)");
  auto* cal_chunks = cmd->add_option("--calibration-chunks", o->calibration_chunks,
                                     "--to exl2: calibration chunks (at most; fewer if the text "
                                     "is shorter)")
                         ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  return [o, cal_ctx, cal_chunks] {
    o->calibration_given = cal_ctx->count() > 0 || cal_chunks->count() > 0;
    if (o->type.empty() && o->to.empty()) return fail("pass --type TYPE (GGUF) or --to exl2");
    if (!o->calibration.empty() && o->to != "exl2")
      return fail("--calibration applies to --to exl2 only");
    return run_write(*o);
  };
}

CommandRunner add_convert_command(CLI::App& app) {
  auto o = std::make_shared<WriteOptions>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Write a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json) as a "
      "GGUF "
      "file llama.cpp loads: q/k rows permuted for its RoPE, norms in f32, the tokenizer as "
      "tokenizer.ggml.* metadata");
  cmd->add_option("input", o->in_path, "Checkpoint directory (or a GGUF file)")->required();
  cmd->add_option("-o,--outfile", o->out_path, "Destination GGUF file")->required();
  cmd->add_option(
         "--type,--outtype", o->type,
         std::string("Weight type: auto (as stored: f32, f16 or bf16; the default), ") + kTypes)
      ->default_val("auto");
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  return [o] { return run_write(*o); };
}

}  // namespace vesper::cli
