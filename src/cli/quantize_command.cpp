// `vesper quantize IN OUT --type TYPE`: writes a copy of a model with its weight matrices
// converted to TYPE (rules in model/quantize.h). `vesper convert DIR -o OUT.gguf [--type TYPE]`:
// writes a Hugging Face checkpoint as GGUF (the weights as stored unless --type says otherwise).
// Both read any model path (a GGUF file or a checkpoint directory).
#include <unistd.h>

#include <cstdio>
#include <optional>

#include "cli/commands.h"
#include "hf/checkpoint.h"
#include "hf/exl2_writer.h"
#include "model/quantize.h"

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
};

int run_exl2(const WriteOptions& o) {
  if (o.out_path.empty()) return fail("--to exl2 needs an output directory: -o OUTDIR");
  if (!hf::is_checkpoint_dir(o.in_path))
    return fail("--to exl2 reads a Hugging Face checkpoint directory; " + o.in_path +
                " is not one");
  const bool tty = isatty(fileno(stderr)) != 0;
  hf::Exl2WriteOptions options;
  options.bits = o.bits;
  options.head_bits = o.head_bits;
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
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  return [o] {
    if (o->type.empty() && o->to.empty()) return fail("pass --type TYPE (GGUF) or --to exl2");
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
