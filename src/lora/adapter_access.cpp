#include "lora/adapter_access.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>

namespace vesper::lora {

namespace fs = std::filesystem;

namespace {

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == ':' || c == '/';
}

// Whether `path` is `dir` or inside it (both canonical or both lexically normal).
bool under(const std::string& path, const std::string& dir) {
  if (dir == "/") return !path.empty() && path[0] == '/';
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

bool under_any(const std::string& path, const std::vector<std::string>& dirs) {
  return std::any_of(dirs.begin(), dirs.end(), [&](const auto& d) { return under(path, d); });
}

std::string strip_trailing_slash(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

Result<std::string> real_path(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return make_error("unresolvable");
  return std::string(buf);
}

}  // namespace

Status check_adapter_name(const std::string& name) {
  const std::string rule = "1 to " + std::to_string(kMaxAdapterNameLength) +
                           " letters, digits and . _ - : / (no empty, '.' or '..' part between "
                           "slashes)";
  if (name.empty() || name.size() > kMaxAdapterNameLength)
    return make_error("an adapter name must be " + rule + "; got " + std::to_string(name.size()) +
                      " characters");
  if (!std::all_of(name.begin(), name.end(), name_char))
    return make_error("an adapter name must be " + rule);
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    if (slash == std::string::npos) slash = name.size();
    const std::string part = name.substr(start, slash - start);
    if (part.empty() || part == "." || part == "..")
      return make_error("an adapter name must be " + rule + "; got '" + name + "'");
    start = slash + 1;
  }
  return {};
}

Result<std::vector<std::string>> canonical_dirs(const std::vector<std::string>& dirs,
                                                const std::string& flag) {
  std::vector<std::string> out;
  auto add = [&](const std::string& d) {
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  };
  for (const std::string& d : dirs) {
    struct stat st {};
    auto real = real_path(d);
    if (!real || ::stat(real->c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return make_error(flag + " " + d + ": not an existing directory");
    // Both the directory as named and as resolved: a client's path is first judged as written.
    std::error_code ec;
    const std::string lexical =
        strip_trailing_slash(fs::absolute(fs::path(d), ec).lexically_normal().string());
    if (!ec) add(lexical);
    add(*real);
  }
  return out;
}

std::vector<std::string> module_dirs(const std::vector<std::string>& module_paths) {
  std::vector<std::string> out;
  for (const std::string& p : module_paths) {
    std::error_code ec;
    const fs::path absolute = fs::absolute(fs::path(p), ec);
    if (ec) continue;
    std::string dir =
        fs::path(strip_trailing_slash(absolute.lexically_normal().string())).parent_path().string();
    if (dir.empty()) dir = "/";
    if (std::find(out.begin(), out.end(), dir) == out.end()) out.push_back(dir);
  }
  return out;
}

std::string not_an_adapter_message(const std::string& path) {
  return "'" + path +
         "' is not a readable LoRA adapter (a llama.cpp GGUF adapter file, or a PEFT directory "
         "with adapter_config.json and adapter_model.safetensors)";
}

Result<std::string> resolve_allowed_path(const std::string& path,
                                         const std::vector<std::string>& allowed) {
  const std::string outside =
      "'" + path + "' is outside the directories adapters may be loaded from (--lora-allowed-dirs)";
  if (allowed.empty())
    return make_error(
        "loading adapters by path is not allowed: no --lora-allowed-dirs (and no "
        "--lora-modules whose directories it defaults to)");
  if (path.empty() || path.find('\0') != std::string::npos) return make_error(outside);
  // First judged as written (nothing is touched on disk for a path outside), then as resolved
  // (a symlink inside may lead out).
  std::error_code ec;
  const std::string lexical =
      strip_trailing_slash(fs::absolute(fs::path(path), ec).lexically_normal().string());
  if (ec || !under_any(lexical, allowed)) return make_error(outside);
  auto real = real_path(path);
  if (!real) return make_error(not_an_adapter_message(path));
  if (!under_any(*real, allowed)) return make_error(outside);
  return *real;
}

}  // namespace vesper::lora
