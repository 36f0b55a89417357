// The `vesper bench` family: each benchmark registers itself on the `bench` subcommand.
#pragma once

#include "cli/commands.h"

namespace vesper::cli {

CommandRunner add_bench_throughput_command(CLI::App& bench);
CommandRunner add_bench_latency_command(CLI::App& bench);
CommandRunner add_bench_serve_command(CLI::App& bench);

}  // namespace vesper::cli
