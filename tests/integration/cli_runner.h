// Runs the vesper binary (path baked in at build time as VESPER_BINARY) with arguments and
// captures its exit code, stdout and stderr. Used by the end-to-end CLI tests.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace vesper::testing_util {

// The shared test data the CLI tests run on (paths from the repository root).
inline const std::string kStories = "../shared/models/stories260K.gguf";
inline const std::string kStoriesF32 = "../shared/models/stories260K-f32.gguf";
inline const std::string kHeldoutText = "../shared/data/tinystories-heldout.txt";

// `a` followed by `b`: a command line with more flags.
inline std::vector<std::string> with(std::vector<std::string> a,
                                     const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `launcher` (a shell prefix such as "timeout 180 mpiexec -n 2", or nothing) runs vesper.
inline CommandResult run_vesper_with(const std::string& launcher,
                                     const std::vector<std::string>& args,
                                     const std::string& tag = "cmd") {
  const std::string base = "/tmp/vesper_it_" + std::to_string(::getpid()) + "_" + tag;
  std::string cmd = (launcher.empty() ? "" : launcher + " ") + shell_quote(VESPER_BINARY);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " >" + base + ".out 2>" + base + ".err </dev/null";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

inline CommandResult run_vesper(const std::vector<std::string>& args,
                                const std::string& tag = "cmd") {
  return run_vesper_with("", args, tag);
}

// The JSON objects among the lines of `out` (`generate --json` prints one per prompt).
inline std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace vesper::testing_util
