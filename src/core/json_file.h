// JSON configuration files (a checkpoint's config.json, a tokenizer's tokenizer.json, ...): read
// whole, nesting bounded, required or optional, with errors that name the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/result.h"

namespace vesper {

// One JSON file. `doc` is null when an optional file is absent.
struct JsonFile {
  std::string path;
  nlohmann::json doc;

  // "<path>: <field> <what>".
  Error error(const std::string& field, const std::string& what) const {
    return make_error(path + ": " + field + " " + what);
  }
};

// Reads `path`, which must hold a JSON object nesting at most 64 levels. A missing file is an
// error when `required` and a null doc otherwise; every error names the file ("not found",
// "invalid JSON: ...", "is not a JSON object", ...).
Result<JsonFile> read_json_file(const std::filesystem::path& path, bool required);

// The member `key` of `obj`; nullptr when `obj` is not an object, or the member is missing or null.
const nlohmann::json* json_member(const nlohmann::json& obj, const std::string& key);

// An integer that fits int64_t; nullopt for anything else.
std::optional<int64_t> json_int(const nlohmann::json& j);

}  // namespace vesper
