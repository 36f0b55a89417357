#include "server/json_fields.h"

#include <cmath>
#include <sstream>

namespace vesper::server {

using nlohmann::json;

namespace {
std::string number_text(double d) {
  std::ostringstream os;
  os << d;
  return os.str();
}
}  // namespace

std::string describe_json_value(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
      return "an integer (" + std::to_string(v.get<int64_t>()) + ")";
    case json::value_t::number_unsigned:
      return "an integer (" + std::to_string(v.get<uint64_t>()) + ")";
    case json::value_t::number_float:
      return "a number (" + number_text(v.get<double>()) + ")";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    default:
      return "an object";
  }
}

JsonFields::JsonFields(const json& object, std::string path)
    : object_(object), path_(std::move(path)) {}

std::string JsonFields::name(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

bool JsonFields::contains(std::string_view key) const {
  return object_.is_object() && object_.find(key) != object_.end();
}

bool JsonFields::has(std::string_view key) const {
  if (!object_.is_object()) return false;
  auto it = object_.find(key);
  return it != object_.end() && !it->is_null();
}

const json* JsonFields::value(std::string_view key) const {
  if (!object_.is_object()) return nullptr;
  auto it = object_.find(key);
  return it == object_.end() || it->is_null() ? nullptr : &*it;
}

ApiError JsonFields::wrong(std::string_view key, const std::string& expected,
                           const json& value) const {
  const std::string n = name(key);
  return bad_request("'" + n + "' must be " + expected + ", got " + describe_json_value(value), n);
}

const json* JsonFields::get(std::string_view key, Null null, const std::string& expected,
                            std::optional<ApiError>& err) const {
  if (!object_.is_object()) return nullptr;
  auto it = object_.find(key);
  if (it == object_.end()) return nullptr;
  if (it->is_null()) {
    if (null == Null::kError) err = wrong(key, expected, *it);
    return nullptr;
  }
  return &*it;
}

std::optional<ApiError> JsonFields::boolean(std::string_view key, bool& out, Null null) const {
  std::optional<ApiError> err;
  const json* v = get(key, null, "a boolean", err);
  if (err || v == nullptr) return err;
  if (!v->is_boolean()) return wrong(key, "a boolean", *v);
  out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> JsonFields::string(std::string_view key, std::string& out,
                                           Null null) const {
  std::optional<ApiError> err;
  const json* v = get(key, null, "a string", err);
  if (err || v == nullptr) return err;
  if (!v->is_string()) return wrong(key, "a string", *v);
  out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> JsonFields::number(std::string_view key, float& out, double lo, double hi,
                                           Null null) const {
  const std::string expected = "a number between " + number_text(lo) + " and " + number_text(hi);
  std::optional<ApiError> err;
  const json* v = get(key, null, expected, err);
  if (err || v == nullptr) return err;
  if (!v->is_number()) return wrong(key, expected, *v);
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi)) return wrong(key, expected, *v);
  out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> JsonFields::integer(std::string_view key, int64_t& out, int64_t lo,
                                            int64_t hi, Null null) const {
  const std::string expected =
      "an integer between " + std::to_string(lo) + " and " + std::to_string(hi);
  std::optional<ApiError> err;
  const json* v = get(key, null, expected, err);
  if (err || v == nullptr) return err;
  int64_t i = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return wrong(key, expected, *v);
    i = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    i = v->get<int64_t>();
  } else if (v->is_number_float()) {
    // 3.0 is accepted as 3 (as pydantic, and so vLLM, does); a fraction, or a magnitude past
    // 2^53 (where doubles stop being exact integers, and where integers too long for 64 bits
    // land), is refused naming the value.
    const double d = v->get<double>();
    if (std::trunc(d) != d || std::fabs(d) > 9007199254740992.0) return wrong(key, expected, *v);
    i = static_cast<int64_t>(d);
  } else {
    return wrong(key, expected, *v);
  }
  if (i < lo || i > hi) return wrong(key, expected, *v);
  out = i;
  return std::nullopt;
}

std::optional<ApiError> JsonFields::object(std::string_view key, const json*& out,
                                           Null null) const {
  std::optional<ApiError> err;
  const json* v = get(key, null, "an object", err);
  if (err || v == nullptr) return err;
  if (!v->is_object()) return wrong(key, "an object", *v);
  out = v;
  return std::nullopt;
}

std::optional<ApiError> JsonFields::array(std::string_view key, const json*& out, Null null) const {
  std::optional<ApiError> err;
  const json* v = get(key, null, "an array", err);
  if (err || v == nullptr) return err;
  if (!v->is_array()) return wrong(key, "an array", *v);
  out = v;
  return std::nullopt;
}

std::optional<ApiError> JsonFields::require_string(std::string_view key, std::string& out) const {
  if (!contains(key)) return bad_request("'" + name(key) + "' is required", name(key));
  return string(key, out, Null::kError);
}

std::optional<ApiError> JsonFields::require_array(std::string_view key, const json*& out) const {
  if (!contains(key)) return bad_request("'" + name(key) + "' is required", name(key));
  return array(key, out, Null::kError);
}

}  // namespace vesper::server
