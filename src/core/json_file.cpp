#include "core/json_file.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "core/json_nesting.h"

namespace vesper {
namespace {
constexpr int kMaxJsonDepth = 64;
}  // namespace

Result<JsonFile> read_json_file(const std::filesystem::path& path, bool required) {
  JsonFile f{path.string(), nullptr};
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    if (std::filesystem::exists(path, ec)) return make_error(f.path + ": is not a regular file");
    if (!required) return f;
    return make_error(f.path + ": not found");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return make_error(f.path + ": cannot be read");
  const std::string s = text.str();
  if (const size_t at = find_json_nesting_over(s, kMaxJsonDepth); at != std::string::npos)
    return make_error(f.path + ": JSON nests deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels (at byte " + std::to_string(at) + ")");
  try {
    f.doc = nlohmann::json::parse(s);
  } catch (const nlohmann::json::exception& e) {
    return make_error(f.path + ": invalid JSON: " + e.what());
  }
  if (!f.doc.is_object()) return make_error(f.path + ": is not a JSON object");
  return f;
}

const nlohmann::json* json_member(const nlohmann::json& obj, const std::string& key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<int64_t> json_int(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  return std::nullopt;
}

}  // namespace vesper
