// Shared helpers of the chat template tests: test data paths, file reading, the fixed date
// every test renders with, and rendering a template string against JSON variables.
#pragma once

#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/template.h"

namespace vesper::tokenizer::test {

// Tests run from the repository root (CTest sets the working directory).
inline std::string data_path(const std::string& name) { return "tests/chat_template/" + name; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::ordered_json read_json(const std::string& path) {
  return nlohmann::ordered_json::parse(read_file(path));
}

// Friday 26 July 2024, 12:30:00: what gen_expected.py gives strftime_now.
inline std::tm fixed_now() {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 12;
  t.tm_min = 30;
  t.tm_wday = 5;
  t.tm_yday = 207;
  return t;
}

// Renders `source` with `variables` (a JSON object); "!<error>" when parse or render fails.
inline std::string render(const std::string& source,
                          const nlohmann::ordered_json& variables = nlohmann::ordered_json::object(),
                          const jinja::RenderLimits& limits = {}) {
  auto t = jinja::Template::parse(source);
  if (!t.ok()) return "!" + t.error().message;
  jinja::RenderOptions options;
  options.now = fixed_now();
  options.limits = limits;
  auto vars = json_to_value(variables.is_null() ? nlohmann::ordered_json::object() : variables);
  if (!vars.ok()) return "!" + vars.error().message;
  auto r = t->render(*vars, options);
  if (!r.ok()) return "!" + r.error().message;
  return *r;
}

}  // namespace vesper::tokenizer::test
