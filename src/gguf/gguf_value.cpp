// Metadata value helpers: type names, conversions and printing.
#include <cmath>
#include <limits>
#include <sstream>

#include "gguf/gguf.h"

namespace vesper::gguf {

std::string_view value_type_name(ValueType type) {
  switch (type) {
    case ValueType::kUint8: return "uint8";
    case ValueType::kInt8: return "int8";
    case ValueType::kUint16: return "uint16";
    case ValueType::kInt16: return "int16";
    case ValueType::kUint32: return "uint32";
    case ValueType::kInt32: return "int32";
    case ValueType::kFloat32: return "float32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "uint64";
    case ValueType::kInt64: return "int64";
    case ValueType::kFloat64: return "float64";
  }
  return "unknown";
}

Value Value::string_array(const std::vector<std::string>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (const auto& s : items) values.push_back(Value::string(s));
  return array(ValueType::kString, std::move(values));
}

Value Value::f32_array(const std::vector<float>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (float f : items) values.push_back(Value::f32(f));
  return array(ValueType::kFloat32, std::move(values));
}

Value Value::i32_array(const std::vector<int32_t>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (int32_t i : items) values.push_back(Value::i32(i));
  return array(ValueType::kInt32, std::move(values));
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kUint16:
    case ValueType::kInt16: case ValueType::kUint32: case ValueType::kInt32:
    case ValueType::kUint64: case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

std::optional<int64_t> Value::as_int() const {
  if (!is_integer()) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  return std::get<int64_t>(data);
}

std::optional<double> Value::as_double() const {
  if (is_float()) return std::get<double>(data);
  if (const auto* u = std::get_if<uint64_t>(&data); u && is_integer()) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&data); i && is_integer()) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
  if (type != ValueType::kBool) return std::nullopt;
  return std::get<bool>(data);
}

namespace {
std::string quote(const std::string& s, size_t max_chars) {
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ >= max_chars) {
      out += "...";
      break;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"') out += "\\\"";
    else if (static_cast<unsigned char>(c) < 32) out += "?";
    else out += c;
  }
  return out + "\"";
}
}  // namespace

std::string Value::to_string(size_t max_items) const {
  std::ostringstream os;
  switch (type) {
    case ValueType::kBool: os << (std::get<bool>(data) ? "true" : "false"); break;
    case ValueType::kString: os << quote(std::get<std::string>(data), 200); break;
    case ValueType::kFloat32: case ValueType::kFloat64: os << std::get<double>(data); break;
    case ValueType::kArray: {
      const Array& a = std::get<Array>(data);
      os << "[";
      for (size_t i = 0; i < a.items.size() && i < max_items; ++i)
        os << (i ? ", " : "") << a.items[i].to_string(max_items);
      if (a.items.size() > max_items) os << ", ... (" << a.items.size() << " " << value_type_name(a.element_type) << "s)";
      os << "]";
      break;
    }
    default:
      if (const auto* u = std::get_if<uint64_t>(&data)) os << *u;
      else os << std::get<int64_t>(data);
  }
  return os.str();
}

}  // namespace vesper::gguf
