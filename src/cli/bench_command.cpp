// `vesper bench`: the benchmark family (throughput, latency, serve, grammar).
#include "cli/bench_commands.h"

namespace vesper::cli {

void add_bench_commands(CLI::App& app, std::map<CLI::App*, CommandRunner>& runners) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: throughput, latency, serve, grammar");
  bench->require_subcommand(1);
  CommandRunner throughput = add_bench_throughput_command(*bench);
  runners[bench->get_subcommands({}).back()] = std::move(throughput);
  CommandRunner latency = add_bench_latency_command(*bench);
  runners[bench->get_subcommands({}).back()] = std::move(latency);
  CommandRunner serve = add_bench_serve_command(*bench);
  runners[bench->get_subcommands({}).back()] = std::move(serve);
  CommandRunner grammar = add_bench_grammar_command(*bench);
  runners[bench->get_subcommands({}).back()] = std::move(grammar);
}

}  // namespace vesper::cli
