// The `vesper` program. Everything lives in the cli module; this file only hands over argv.
#include "cli/cli.h"

int main(int argc, char** argv) { return vesper::cli::run_main(argc, argv); }
