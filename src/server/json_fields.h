// JsonFields: the typed accessor every field of a request goes through. Each read checks the
// field's JSON type and range and answers an ApiError (400) that names the field by its full
// path ("messages[2].content[0].type") and says what was expected and what came; nothing here
// can throw. Handlers never index a request's JSON directly.
//
// null: OpenAI's optional parameters are nullable, so by default a field holding null reads as
// absent (the default stays). Fields where null makes no sense are read with Null::kError, and
// required fields with the require_* readers: a null there is a 400 like any wrong type.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/api_error.h"

namespace vesper::server {

// How a read treats a field that is present but null.
enum class Null { kAbsent, kError };

class JsonFields {
 public:
  // `object` is the JSON value whose fields are read (a non-object has no fields); `path` is its
  // place in the request ("" for the body, "response_format", "messages[0]"), used in messages.
  explicit JsonFields(const nlohmann::json& object, std::string path = "");
  // The fields are read from `object` in place: it must outlive the accessor.
  JsonFields(nlohmann::json&& object, std::string path = "") = delete;

  // The full name of field `key` as messages show it.
  std::string name(std::string_view key) const;
  // Present (null included).
  bool contains(std::string_view key) const;
  // Present and not null.
  bool has(std::string_view key) const;
  // The field's value when present and not null (for fields of several shapes, such as "stop":
  // a string or an array), else nullptr.
  const nlohmann::json* value(std::string_view key) const;

  std::optional<ApiError> boolean(std::string_view key, bool& out, Null null = Null::kAbsent) const;
  std::optional<ApiError> string(std::string_view key, std::string& out,
                                 Null null = Null::kAbsent) const;
  std::optional<ApiError> number(std::string_view key, float& out, double lo, double hi,
                                 Null null = Null::kAbsent) const;
  std::optional<ApiError> integer(std::string_view key, int64_t& out, int64_t lo, int64_t hi,
                                  Null null = Null::kAbsent) const;
  template <class Int>
  std::optional<ApiError> integer(std::string_view key, Int& out, int64_t lo, int64_t hi,
                                  Null null = Null::kAbsent) const {
    int64_t v = static_cast<int64_t>(out);
    auto err = integer(key, v, lo, hi, null);
    if (!err) out = static_cast<Int>(v);
    return err;
  }
  // Sub-documents: `out` points at the field's value when it is present, not null and an object
  // (array); it stays null when the field is absent.
  std::optional<ApiError> object(std::string_view key, const nlohmann::json*& out,
                                 Null null = Null::kAbsent) const;
  std::optional<ApiError> array(std::string_view key, const nlohmann::json*& out,
                                Null null = Null::kAbsent) const;

  // Required fields: absent or null is a 400.
  std::optional<ApiError> require_string(std::string_view key, std::string& out) const;
  std::optional<ApiError> require_array(std::string_view key, const nlohmann::json*& out) const;

  // The error for field `key` holding `value` when `expected` was wanted: "'<name>' must be
  // <expected>, got <what value is>".
  ApiError wrong(std::string_view key, const std::string& expected,
                 const nlohmann::json& value) const;

 private:
  // The field's value, or nullptr when absent (or null and null == kAbsent). Sets `err` for a
  // null read with Null::kError.
  const nlohmann::json* get(std::string_view key, Null null, const std::string& expected,
                            std::optional<ApiError>& err) const;

  const nlohmann::json& object_;
  std::string path_;
};

// "null", "a boolean", "an integer (12)", "a number (1e+30)", "a string", "an array", "an object".
std::string describe_json_value(const nlohmann::json& value);

// Returns the error from a field read, if any: `VESPER_FIELD(fields.integer(...));`
#define VESPER_FIELD(expr)                                        \
  do {                                                            \
    if (auto field_err_ = (expr); field_err_) return *field_err_; \
  } while (0)

}  // namespace vesper::server
