#include "tokenizer/jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja {

Value Value::undefined(std::string hint) {
  Value v;
  v.v_ = Undefined{std::move(hint)};
  return v;
}

Value Value::none() {
  Value v;
  v.v_ = None{};
  return v;
}

Value Value::list(ValueList items) {
  Value v;
  v.v_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

Value Value::dict() {
  Value v;
  v.v_ = std::make_shared<ValueDict>();
  return v;
}

Value Value::namespace_object() {
  Value v = dict();
  v.as_dict().is_namespace = true;
  return v;
}

Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> impl) {
  Value v;
  v.v_ = std::make_shared<Function>(Function{std::move(name), std::move(impl)});
  return v;
}

bool Value::is_namespace() const { return is_dict() && as_dict().is_namespace; }

std::string Value::undefined_hint() const {
  const auto* u = std::get_if<Undefined>(&v_);
  return (u != nullptr && !u->hint.empty()) ? u->hint : "value is undefined";
}

double Value::to_double() const {
  switch (kind()) {
    case ValueKind::kInt: return static_cast<double>(as_int());
    case ValueKind::kFloat: return as_float();
    case ValueKind::kBool: return as_bool() ? 1.0 : 0.0;
    default: return 0.0;
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone: return false;
    case ValueKind::kBool: return as_bool();
    case ValueKind::kInt: return as_int() != 0;
    case ValueKind::kFloat: return as_float() != 0.0;
    case ValueKind::kString: return !as_string().empty();
    case ValueKind::kList: return !as_list().empty();
    case ValueKind::kDict: return is_namespace() || !as_dict().entries.empty();
    case ValueKind::kFunction: return true;
  }
  return false;
}

std::string Value::to_str() const {
  switch (kind()) {
    case ValueKind::kUndefined: return "";
    case ValueKind::kString: return as_string();
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind()) {
    case ValueKind::kUndefined: return "";
    case ValueKind::kNone: return "None";
    case ValueKind::kBool: return as_bool() ? "True" : "False";
    case ValueKind::kInt: return std::to_string(as_int());
    case ValueKind::kFloat: return format_python_float(as_float());
    case ValueKind::kString: return python_string_repr(as_string());
    case ValueKind::kList: {
      std::string out = tuple_ ? "(" : "[";
      bool first = true;
      for (const auto& item : as_list()) {
        if (!first) out += ", ";
        first = false;
        out += item.repr();
      }
      if (tuple_ && as_list().size() == 1) out += ",";
      out += tuple_ ? ")" : "]";
      return out;
    }
    case ValueKind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : as_dict().entries) {
        if (!first) out += ", ";
        first = false;
        out += k.repr();
        out += ": ";
        out += v.repr();
      }
      out += "}";
      return is_namespace() ? "<Namespace " + out + ">" : out;
    }
    case ValueKind::kFunction: return "<function " + as_function().name + ">";
  }
  return "";
}

bool Value::equals(const Value& other) const {
  const bool a_num = is_number() || is_bool();
  const bool b_num = other.is_number() || other.is_bool();
  if (a_num && b_num) {
    if ((is_int() || is_bool()) && (other.is_int() || other.is_bool())) {
      const int64_t a = is_bool() ? int64_t{as_bool()} : as_int();
      const int64_t b = other.is_bool() ? int64_t{other.as_bool()} : other.as_int();
      return a == b;
    }
    return to_double() == other.to_double();
  }
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone: return true;
    case ValueKind::kString: return as_string() == other.as_string();
    case ValueKind::kList: {
      const auto& a = as_list();
      const auto& b = other.as_list();
      if (&a == &b) return true;
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].equals(b[i])) return false;
      }
      return true;
    }
    case ValueKind::kDict: {
      const auto& a = as_dict();
      const auto& b = other.as_dict();
      if (&a == &b) return true;
      if (a.is_namespace || b.is_namespace) return false;
      if (a.entries.size() != b.entries.size()) return false;
      for (const auto& [k, v] : a.entries) {
        const Value* ov = b.find(k);
        if (ov == nullptr || !v.equals(*ov)) return false;
      }
      return true;
    }
    case ValueKind::kFunction: return &as_function() == &other.as_function();
    default: return false;
  }
}

std::string Value::type_name() const {
  switch (kind()) {
    case ValueKind::kUndefined: return "Undefined";
    case ValueKind::kNone: return "NoneType";
    case ValueKind::kBool: return "bool";
    case ValueKind::kInt: return "int";
    case ValueKind::kFloat: return "float";
    case ValueKind::kString: return "str";
    case ValueKind::kList: return tuple_ ? "tuple" : "list";
    case ValueKind::kDict: return is_namespace() ? "Namespace" : "dict";
    case ValueKind::kFunction: return "function";
  }
  return "?";
}

const Value* ValueDict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : entries) {
    if (k.equals(key)) return &v;
  }
  return nullptr;
}

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (k.equals(key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

bool ValueDict::erase(const Value& key) {
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (it->first.equals(key)) {
      entries.erase(it);
      return true;
    }
  }
  return false;
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  return get_keyword(name);
}

const Value* CallArgs::get_keyword(std::string_view name) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

std::string format_python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+17", "5e-01"
  bool negative = false;
  if (sci[0] == '-') {
    negative = true;
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exponent = std::atoi(sci.c_str() + e_pos + 1);
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      const size_t int_len = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_len) {
        out.append(digits).append(int_len - digits.size(), '0').append(".0");
      } else {
        out.append(digits, 0, int_len).append(1, '.').append(digits, int_len);
      }
    } else {
      out.append("0.").append(static_cast<size_t>(-exponent - 1), '0').append(digits);
    }
    return out;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) out.append(1, '.').append(digits, 1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

std::string python_string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (const uint32_t cp : text::decode(s)) {
    switch (cp) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (cp == static_cast<uint32_t>(quote)) {
          out.push_back('\\');
          out.push_back(quote);
        } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0) ||
                   (cp >= 0xDC80 && cp <= 0xDCFF)) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", cp & 0xFF);
          out += buf;
        } else {
          text::append_codepoint(cp, &out);
        }
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace vesper::tokenizer::jinja
