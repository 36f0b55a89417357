// The `vesper` command line: subcommands generate, inspect and quantize. Each subcommand
// lives in its own file and registers itself on the CLI11 app.
#pragma once

namespace vesper::cli {

// Parses argv and runs the chosen subcommand. Returns the process exit code: 0 on success,
// 1 on a runtime error (message on stderr naming what is at fault), 2 on a usage error.
int run_main(int argc, char** argv);

}  // namespace vesper::cli
