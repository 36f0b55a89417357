// `vesper quantize IN.gguf OUT.gguf --type TYPE`: writes a copy of a model with its weight
// matrices converted to TYPE (rules in model/quantize.h).
#include <unistd.h>

#include <cstdio>

#include "cli/commands.h"
#include "model/quantize.h"

namespace vesper::cli {
namespace {

struct QuantizeOptions {
  std::string in_path;
  std::string out_path;
  std::string type;
  int threads = 0;
};

int run_quantize(const QuantizeOptions& o) {
  auto type = tensor::parse_type_name(o.type);
  if (!type || !model::is_quantize_target(*type))
    return fail("--type \"" + o.type +
                "\" is not supported; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                "q2_k, q3_k, q4_k, q5_k, q6_k");
  if (o.in_path == o.out_path)
    return fail("the output path must differ from the input path " + o.in_path);
  ThreadPool pool(o.threads > 0 ? o.threads : ThreadPool::hardware_threads());
  const bool tty = isatty(fileno(stderr)) != 0;
  auto status = model::quantize_model(
      o.in_path, o.out_path, *type, pool, [&](const model::QuantizeProgress& p) {
        if (tty) {
          std::fprintf(stderr, "\r[%zu/%zu] %-40s %s -> %s\033[K", p.index, p.total, p.name.c_str(),
                       std::string(tensor::type_name(p.from)).c_str(),
                       std::string(tensor::type_name(p.to)).c_str());
          if (p.index == p.total) std::fputc('\n', stderr);
        }
      });
  if (!status) return fail(status.error().message);
  std::fprintf(stderr, "wrote %s (%s)\n", o.out_path.c_str(),
               std::string(tensor::type_name(*type)).c_str());
  return 0;
}

}  // namespace

CommandRunner add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd =
      app.add_subcommand("quantize", "Write a copy of a GGUF model with quantized weights");
  cmd->add_option("input", o->in_path, "Source GGUF model")->required();
  cmd->add_option("output", o->out_path, "Destination GGUF file")->required();
  cmd->add_option(
         "--type", o->type,
         "Target type: q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, f16, bf16, f32")
      ->required();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  return [o] { return run_quantize(*o); };
}

}  // namespace vesper::cli
