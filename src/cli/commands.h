// Registration of the subcommands (one file each). Each `add_*` adds its subcommand with its
// options to `app`; the returned callable runs it after parsing and returns the exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <map>

namespace vesper::cli {

using CommandRunner = std::function<int()>;

CommandRunner add_generate_command(CLI::App& app);
CommandRunner add_inspect_command(CLI::App& app);
CommandRunner add_perplexity_command(CLI::App& app);
CommandRunner add_quantize_command(CLI::App& app);
CommandRunner add_convert_command(CLI::App& app);
CommandRunner add_serve_command(CLI::App& app);
CommandRunner add_synth_command(CLI::App& app);
// `vesper bench ...`: adds the bench command and its benchmarks; registers their runners.
void add_bench_commands(CLI::App& app, std::map<CLI::App*, CommandRunner>& runners);

// Prints "vesper: error: <message>" to stderr and returns exit code 1.
int fail(const std::string& message);

}  // namespace vesper::cli
