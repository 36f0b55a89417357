#include "cli/cli.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/matmul_cpu.h"
#include "cli/commands.h"
#include "dist/launch.h"

namespace vesper::cli {

int fail(const std::string& message) {
  std::fprintf(stderr, "vesper: error: %s\n", message.c_str());
  return 1;
}

int run_main(int argc, char** argv) {
  CLI::App app{
      "Vesper: an LLM inference and serving engine for GGUF models.\n"
      "Run `vesper COMMAND --help` for the options of a command."};
  app.require_subcommand(1);
  std::map<CLI::App*, CommandRunner> runners;
  auto add = [&](CommandRunner runner) {
    runners[app.get_subcommands({}).back()] = std::move(runner);
  };
  add(add_serve_command(app));
  add(add_generate_command(app));
  add(add_inspect_command(app));
  add(add_perplexity_command(app));
  add(add_quantize_command(app));
  add(add_convert_command(app));
  add(add_synth_command(app));
  add_bench_commands(app, runners);
  // A first word that is neither a command nor an option gets a clearer word than CLI11's.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr,
                   "vesper: error: unknown command \"%s\"; commands: %s (see vesper --help)\n",
                   argv[1], names.c_str());
      return 2;
    }
  }
  // llama.cpp's single-dash spellings of the KV cache type flags (CLI11 reads "-ctk" as -c -t -k).
  std::vector<std::string> storage(argv, argv + argc);
  std::vector<char*> args;
  for (std::string& a : storage) {
    if (a == "-ctk") a = "--cache-type-k";
    if (a == "-ctv") a = "--cache-type-v";
    if (a == "-tp") a = "--tensor-parallel-size";  // vLLM's short forms
    if (a == "-pp") a = "--pipeline-parallel-size";
    args.push_back(a.data());
  }
  try {
    app.parse(argc, args.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message; add the usage of the command at fault.
    app.exit(e);
    for (CLI::App* sub : app.get_subcommands()) std::fprintf(stderr, "\n%s", sub->help().c_str());
    if (app.get_subcommands().empty()) std::fprintf(stderr, "\n%s", app.help().c_str());
    return 2;
  }
  // A bad instruction-set cap is the environment's fault: say so before any kernel runs.
  if (const std::string isa_error = backend::cpu::max_isa_error(); !isa_error.empty())
    return fail(isa_error);
  // The innermost chosen subcommand runs (e.g. `bench throughput`).
  CLI::App* chosen = nullptr;
  for (CLI::App* sub = app.get_subcommands().empty() ? nullptr : app.get_subcommands()[0];
       sub != nullptr; sub = sub->get_subcommands().empty() ? nullptr : sub->get_subcommands()[0])
    chosen = sub;
  auto it = runners.find(chosen);
  const int rc = it == runners.end() ? 2 : it->second();
  // Rank 0 of a parallel job that fails (its error printed above) ends the other ranks, which
  // may be waiting for a model that rank 0 will never drive.
  if (rc != 0)
    if (dist::Communicator* world = dist::started_world(); world != nullptr && world->rank() == 0)
      world->abort("the command failed (its error is above)");
  return rc;
}

}  // namespace vesper::cli
