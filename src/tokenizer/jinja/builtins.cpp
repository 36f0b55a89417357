#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <map>
#include <string>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja {

namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

// ---------------------------------------------------------------------------------------------
// Argument helpers

bool absent(const Value* v) { return v == nullptr || v->is_undefined() || v->is_none(); }

int64_t to_int64(const Value& v, std::string_view what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool() ? 1 : 0;
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) fail(std::string(what) + ": number out of range");
    return static_cast<int64_t>(d);
  }
  fail(std::string(what) + " must be an integer, not " + v.type_name());
}

int64_t int_arg(const CallArgs& a, size_t i, std::string_view name, int64_t def) {
  const Value* v = a.get(i, name);
  return absent(v) ? def : to_int64(*v, "argument '" + std::string(name) + "'");
}

bool bool_arg(const CallArgs& a, size_t i, std::string_view name, bool def) {
  const Value* v = a.get(i, name);
  return (v == nullptr || v->is_undefined()) ? def : v->truthy();
}

std::string str_arg(const CallArgs& a, size_t i, std::string_view name, std::string_view def) {
  const Value* v = a.get(i, name);
  return (v == nullptr || v->is_undefined()) ? std::string(def) : v->to_str();
}

const Value& require_arg(const CallArgs& a, size_t i, std::string_view name, std::string_view fn) {
  const Value* v = a.get(i, name);
  if (v == nullptr) fail(std::string(fn) + "() missing required argument '" + std::string(name) + "'");
  return *v;
}

const std::string& require_string(const Value& v, std::string_view what) {
  if (!v.is_string()) fail(std::string(what) + " must be a string, not " + v.type_name());
  return v.as_string();
}

[[noreturn]] void fail_undefined(const Value& v) { fail(v.undefined_hint()); }

// Items of anything iterable: lists, dict keys, string characters; undefined is empty.
ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kList: return v.as_list();
    case ValueKind::kDict: {
      if (v.is_namespace()) fail("'Namespace' object is not iterable");
      ValueList keys;
      for (const auto& [k, val] : v.as_dict().entries) keys.push_back(k);
      return keys;
    }
    case ValueKind::kString: {
      ValueList chars;
      for (const uint32_t cp : text::decode(v.as_string())) {
        std::string c;
        text::append_codepoint(cp, &c);
        chars.emplace_back(std::move(c));
      }
      return chars;
    }
    case ValueKind::kUndefined: return {};
    default: fail("'" + v.type_name() + "' object is not iterable");
  }
}

// Python's ordering for sort/min/max/<: numbers with numbers, strings with strings, lists
// element-wise. Case-insensitive string comparison when !case_sensitive.
int compare_values(const Value& a, const Value& b, bool case_sensitive = true) {
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) {
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
      const int64_t x = a.is_bool() ? int64_t{a.as_bool()} : a.as_int();
      const int64_t y = b.is_bool() ? int64_t{b.as_bool()} : b.as_int();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const double x = a.to_double();
    const double y = b.to_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    if (case_sensitive) return a.as_string().compare(b.as_string()) < 0 ? -1 : (a.as_string() == b.as_string() ? 0 : 1);
    const std::string x = text::lower(a.as_string());
    const std::string y = text::lower(b.as_string());
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i].equals(y[i])) continue;
      return compare_values(x[i], y[i], case_sensitive);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  fail("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

// ---------------------------------------------------------------------------------------------
// printf-style and str.format formatting

std::string pad(std::string s, size_t width, char align, const std::string& fill) {
  const size_t len = text::length(s);
  if (len >= width) return s;
  const size_t total = width - len;
  size_t left = 0;
  if (align == '>') left = total;
  if (align == '^') left = total / 2;
  std::string out;
  for (size_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (size_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

std::string format_number_c(const char* spec, const Value& v, char conv) {
  char buf[512];
  if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o' || conv == 'c') {
    const long long n = static_cast<long long>(to_int64(v, "%d format"));
    std::string f = std::string(spec) + (conv == 'i' ? 'd' : conv);
    if (conv == 'c') {
      std::string out;
      text::append_codepoint(static_cast<uint32_t>(n), &out);
      return out;
    }
    std::string fl = f;
    fl.insert(fl.size() - 1, "ll");
    std::snprintf(buf, sizeof(buf), fl.c_str(), n);
    return buf;
  }
  if (!v.is_number() && !v.is_bool()) fail("a number is required, not " + v.type_name());
  std::string f = std::string(spec) + conv;
  std::snprintf(buf, sizeof(buf), f.c_str(), v.to_double());
  return buf;
}

// Python's `format % args`.
std::string printf_format(const std::string& format, const ValueList& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '%') {
      out.push_back('%');
      ++i;
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < format.size() && std::string_view("-+ 0#").find(format[j]) != std::string_view::npos) spec += format[j++];
    while (j < format.size() && std::isdigit(static_cast<unsigned char>(format[j]))) spec += format[j++];
    if (j < format.size() && format[j] == '.') {
      spec += format[j++];
      while (j < format.size() && std::isdigit(static_cast<unsigned char>(format[j]))) spec += format[j++];
    }
    if (j >= format.size()) fail("incomplete format");
    const char conv = format[j];
    if (next >= args.size()) fail("not enough arguments for format string");
    const Value& arg = args[next++];
    if (conv == 's' || conv == 'r' || conv == 'a') {
      std::string s = conv == 's' ? arg.to_str() : arg.repr();
      // width and precision for strings, by code point
      std::string width_s;
      std::string prec_s;
      bool left = false;
      size_t k = 1;
      while (k < spec.size() && std::string_view("-+ 0#").find(spec[k]) != std::string_view::npos) left |= spec[k++] == '-';
      while (k < spec.size() && std::isdigit(static_cast<unsigned char>(spec[k]))) width_s += spec[k++];
      if (k < spec.size() && spec[k] == '.') {
        ++k;
        while (k < spec.size()) prec_s += spec[k++];
        const auto cps = text::decode(s);
        const size_t prec = static_cast<size_t>(std::atoi(prec_s.c_str()));
        if (prec < cps.size()) s = text::encode(cps.data(), cps.data() + prec);
      }
      if (!width_s.empty()) s = pad(s, static_cast<size_t>(std::atoi(width_s.c_str())), left ? '<' : '>', " ");
      out += s;
    } else if (std::string_view("diouxXeEfFgGc").find(conv) != std::string_view::npos) {
      out += format_number_c(spec.c_str(), arg, conv);
    } else {
      fail(std::string("unsupported format character '") + conv + "'");
    }
    i = j;
  }
  if (next < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

// One replacement field of str.format with its spec ("<10", ".2f", "d", ...).
std::string apply_format_spec(const Value& v, std::string_view spec) {
  if (spec.empty()) return v.to_str();
  size_t i = 0;
  std::string fill = " ";
  char align = '\0';
  if (spec.size() >= 2 && std::string_view("<>^").find(spec[1]) != std::string_view::npos) {
    fill = std::string(1, spec[0]);
    align = spec[1];
    i = 2;
  } else if (std::string_view("<>^").find(spec[0]) != std::string_view::npos) {
    align = spec[0];
    i = 1;
  }
  std::string flags;
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) flags += spec[i++];
  if (i < spec.size() && spec[i] == '0') {
    flags += '0';
    ++i;
  }
  size_t width = 0;
  while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) width = width * 10 + static_cast<size_t>(spec[i++] - '0');
  int precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    precision = 0;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) precision = precision * 10 + (spec[i++] - '0');
  }
  char type = i < spec.size() ? spec[i++] : '\0';
  if (i != spec.size()) fail("invalid format specifier '" + std::string(spec) + "'");
  std::string body;
  const bool numeric = v.is_number() || v.is_bool();
  if (type == '\0' && numeric && precision >= 0) type = 'g';
  if (type == '\0' || type == 's') {
    body = v.to_str();
    if (precision >= 0) {
      const auto cps = text::decode(body);
      if (static_cast<size_t>(precision) < cps.size()) body = text::encode(cps.data(), cps.data() + precision);
    }
  } else if (type == '%') {
    Value scaled(v.to_double() * 100.0);
    body = format_number_c(("%" + flags.substr(0, flags.find('0')) + "." + std::to_string(precision < 0 ? 6 : precision)).c_str(), scaled, 'f') + "%";
  } else {
    std::string c = "%" + flags.substr(0, flags.find('0'));
    if (precision >= 0 && std::string_view("eEfFgG").find(type) != std::string_view::npos) c += "." + std::to_string(precision);
    body = format_number_c(c.c_str(), v, type == 'n' ? 'd' : type);
  }
  if (align == '\0') {
    align = numeric && type != 's' ? '>' : '<';
    if (flags.find('0') != std::string::npos && numeric) fill = "0";
  }
  return pad(body, width, align, fill);
}

// Python's str.format(*args, **kwargs) for {}, {0}, {name} fields with optional specs.
std::string python_format(const std::string& format, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) fail("single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    std::string spec;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (!field.empty() && field.back() == 'r' && field.size() >= 2 && field[field.size() - 2] == '!') field.resize(field.size() - 2);
    const Value* v;
    if (field.empty()) {
      v = auto_index < a.positional.size() ? &a.positional[auto_index] : nullptr;
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      const size_t idx = static_cast<size_t>(std::atoi(field.c_str()));
      v = idx < a.positional.size() ? &a.positional[idx] : nullptr;
    } else {
      v = a.get_keyword(field);
    }
    if (v == nullptr) fail("format(): no argument for field '{" + field + "}'");
    out += apply_format_spec(*v, spec);
    i = close;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// JSON

void json_string(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (const uint32_t cp : text::decode(s)) {
    switch (cp) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default: {
        char buf[16];
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            const uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
          }
          *out += buf;
        } else {
          text::append_codepoint(cp, out);
        }
      }
    }
  }
  out->push_back('"');
}

struct JsonWriter {
  int indent;
  bool sort_keys;
  bool ensure_ascii;
  std::string_view item_sep;
  std::string_view key_sep;
  std::string out;

  void newline(int level) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
  }

  std::string key_string(const Value& k) {
    switch (k.kind()) {
      case ValueKind::kString: return k.as_string();
      case ValueKind::kInt: return std::to_string(k.as_int());
      case ValueKind::kFloat: return format_python_float(k.as_float());
      case ValueKind::kBool: return k.as_bool() ? "true" : "false";
      case ValueKind::kNone: return "null";
      default: fail("keys must be str, int, float, bool or None, not " + k.type_name());
    }
  }

  void write(const Value& v, int level) {
    if (level > 256) fail("tojson: value nests too deeply (circular reference?)");
    switch (v.kind()) {
      case ValueKind::kNone: out += "null"; return;
      case ValueKind::kBool: out += v.as_bool() ? "true" : "false"; return;
      case ValueKind::kInt: out += std::to_string(v.as_int()); return;
      case ValueKind::kFloat: {
        const double d = v.as_float();
        if (std::isnan(d)) out += "NaN";
        else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
        else out += format_python_float(d);
        return;
      }
      case ValueKind::kString: json_string(v.as_string(), ensure_ascii, &out); return;
      case ValueKind::kList: {
        const auto& items = v.as_list();
        if (items.empty()) {
          out += "[]";
          return;
        }
        out.push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_sep;
          newline(level + 1);
          write(items[i], level + 1);
        }
        newline(level);
        out.push_back(']');
        return;
      }
      case ValueKind::kDict: {
        if (v.is_namespace()) fail("Object of type Namespace is not JSON serializable");
        std::vector<std::pair<std::string, const Value*>> entries;
        for (const auto& [k, val] : v.as_dict().entries) entries.emplace_back(key_string(k), &val);
        if (sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto& x, const auto& y) { return x.first < y.first; });
        }
        if (entries.empty()) {
          out += "{}";
          return;
        }
        out.push_back('{');
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i > 0) out += item_sep;
          newline(level + 1);
          json_string(entries[i].first, ensure_ascii, &out);
          out += key_sep;
          write(*entries[i].second, level + 1);
        }
        newline(level);
        out.push_back('}');
        return;
      }
      case ValueKind::kUndefined: fail("Object of type Undefined is not JSON serializable");
      case ValueKind::kFunction: fail("Object of type function is not JSON serializable");
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Filters

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return std::fabs(v.as_float());
  const int64_t n = to_int64(v, "abs()");
  if (n == std::numeric_limits<int64_t>::min()) fail("integer overflow");
  return n < 0 ? -n : n;
}

Value f_attr(Interpreter&, const Value& v, CallArgs& a) {
  return get_attr(v, require_string(require_arg(a, 0, "name", "attr"), "attr name"));
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  const int64_t n = int_arg(a, 0, "linecount", 0);
  if (n <= 0) fail("batch(): linecount must be positive");
  const Value* fill = a.get(1, "fill_with");
  ValueList out;
  ValueList cur;
  for (auto& item : iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (!absent(fill)) {
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
    }
    out.push_back(Value::list(std::move(cur)));
  }
  in.check_items(out.size());
  return Value::list(std::move(out));
}

Value f_capitalize(Interpreter&, const Value& v, CallArgs&) { return text::capitalize(v.to_str()); }

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  const std::string s = v.to_str();
  const int64_t width = int_arg(a, 0, "width", 80);
  const int64_t len = static_cast<int64_t>(text::length(s));
  if (width <= len) return s;
  in.check_size(static_cast<size_t>(width));
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);
  return std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(marg - left), ' ');
}

Value f_length(Interpreter&, const Value& v, CallArgs&) {
  switch (v.kind()) {
    case ValueKind::kString: return static_cast<int64_t>(text::length(v.as_string()));
    case ValueKind::kList: return static_cast<int64_t>(v.as_list().size());
    case ValueKind::kDict: return static_cast<int64_t>(v.as_dict().entries.size());
    case ValueKind::kUndefined: return 0;
    default: fail("object of type '" + v.type_name() + "' has no len()");
  }
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  const Value* def = a.get(0, "default_value");
  const bool boolean = bool_arg(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return def != nullptr ? *def : Value("");
  return v;
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& a) {
  if (!v.is_dict()) fail("dictsort expects a dict, got " + v.type_name());
  const bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  const std::string by = str_arg(a, 1, "by", "key");
  const bool reverse = bool_arg(a, 2, "reverse", false);
  if (by != "key" && by != "value") fail("dictsort: 'by' must be 'key' or 'value'");
  const size_t pos = by == "key" ? 0 : 1;
  ValueList pairs;
  for (const auto& [k, val] : v.as_dict().entries) pairs.push_back(Value::tuple({k, val}));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const int c = compare_values(x.as_list()[pos], y.as_list()[pos], case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(pairs));
}

Value f_escape(Interpreter&, const Value& v, CallArgs&) {
  return v.is_markup() ? v : Value::markup(text::html_escape(v.to_str()));
}

Value f_first(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_list()) return v.as_list().empty() ? Value::undefined("first() of an empty list") : v.as_list().front();
  ValueList items = iterate(v);
  return items.empty() ? Value::undefined("first() of an empty sequence") : items.front();
}

Value f_last(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_list()) return v.as_list().empty() ? Value::undefined("last() of an empty list") : v.as_list().back();
  ValueList items = iterate(v);
  return items.empty() ? Value::undefined("last() of an empty sequence") : items.back();
}

bool parse_python_float(std::string s, double* out) {
  s = text::strip(s, nullptr, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return false;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  *out = d;
  return true;
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  const Value* def = a.get(0, "default");
  const Value fallback = def != nullptr ? *def : Value(0.0);
  if (v.is_float()) return v;
  if (v.is_int() || v.is_bool()) return v.to_double();
  if (v.is_string()) {
    double d;
    if (parse_python_float(v.as_string(), &d)) return d;
  }
  return fallback;
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  std::string s = printf_format(v.to_str(), a.positional);
  in.check_size(s.size());
  return s;
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* w = a.get(0, "width");
  std::string indentation = "    ";
  if (w != nullptr && w->is_string()) indentation = w->as_string();
  else if (!absent(w)) indentation = std::string(static_cast<size_t>(std::max<int64_t>(0, to_int64(*w, "indent width"))), ' ');
  const bool first = bool_arg(a, 1, "first", false);
  const bool blank = bool_arg(a, 2, "blank", false);
  const std::string s = v.to_str() + "\n";
  const auto lines = text::splitlines(s);
  in.check_size(s.size() + lines.size() * indentation.size());
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += indentation;
    }
    out += lines[i];
  }
  if (first) out = indentation + out;
  return out;
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  const Value* def = a.get(0, "default");
  const Value fallback = def != nullptr ? *def : Value(0);
  const int64_t base = int_arg(a, 1, "base", 10);
  if (v.is_int()) return v;
  if (v.is_bool()) return int64_t{v.as_bool()};
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return fallback;
    return static_cast<int64_t>(d);
  }
  if (v.is_string()) {
    std::string s = text::strip(v.as_string(), nullptr, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty()) {
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(s.c_str(), &end, static_cast<int>(base));
      if (end == s.c_str() + s.size() && errno == 0) return static_cast<int64_t>(n);
      double d;
      if (parse_python_float(s, &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
    }
  }
  return fallback;
}

Value f_items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list();
  if (!v.is_dict() || v.is_namespace()) fail("items() expects a dict, got " + v.type_name());
  ValueList out;
  for (const auto& [k, val] : v.as_dict().entries) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  const std::string sep = str_arg(a, 0, "d", "");
  const Value* attribute = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += absent(attribute) ? item.to_str() : get_attr_path(item, attribute->to_str()).to_str();
    in.check_size(out.size());
  }
  return out;
}

Value f_list(Interpreter&, const Value& v, CallArgs&) { return Value::list(iterate(v)); }

Value f_lower(Interpreter&, const Value& v, CallArgs&) { return text::lower(v.to_str()); }
Value f_upper(Interpreter&, const Value& v, CallArgs&) { return text::upper(v.to_str()); }

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  ValueList out;
  if (!v.truthy()) return Value::list();  // Jinja yields nothing for none, "" and []
  const Value* attribute = a.get_keyword("attribute");
  if (attribute != nullptr) {
    const Value* def = a.get_keyword("default");
    for (const auto& item : iterate(v)) {
      Value r = get_attr_path(item, attribute->to_str());
      out.push_back((r.is_undefined() && def != nullptr) ? *def : r);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty()) fail("map() needs a filter name or attribute=");
  const std::string name = require_string(a.positional[0], "map() filter name");
  if (!has_filter(name)) fail("no filter named '" + name + "'");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const auto& item : iterate(v)) out.push_back(apply_filter(in, name, item, rest));
  return Value::list(std::move(out));
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  const bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  const Value* attribute = a.get(1, "attribute");
  const ValueList items = iterate(v);
  if (items.empty()) return Value::undefined(std::string(want_max ? "max" : "min") + "() of an empty sequence");
  size_t best = 0;
  auto key = [&](const Value& item) { return absent(attribute) ? item : get_attr_path(item, attribute->to_str()); };
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare_values(key(items[i]), key(items[best]), case_sensitive);
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value f_max(Interpreter&, const Value& v, CallArgs& a) { return min_max(v, a, true); }
Value f_min(Interpreter&, const Value& v, CallArgs& a) { return min_max(v, a, false); }

Value f_pprint(Interpreter&, const Value& v, CallArgs&) { return v.repr(); }

Value select_impl(Interpreter& in, const Value& v, CallArgs& a, bool by_attribute, bool reject) {
  if (!v.truthy()) return Value::list();  // Jinja yields nothing for none, "" and []
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (a.positional.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = a.positional[next++].to_str();
  }
  std::string test;
  if (next < a.positional.size()) test = require_string(a.positional[next++], "test name");
  if (!test.empty() && !has_test(test)) fail("no test named '" + test + "'");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(std::min(next, a.positional.size())), a.positional.end());
  rest.keyword = a.keyword;
  ValueList out;
  for (const auto& item : iterate(v)) {
    const Value subject = by_attribute ? get_attr_path(item, attribute) : item;
    const bool ok = test.empty() ? subject.truthy() : apply_test(in, test, subject, rest);
    if (ok != reject) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  const std::string s = v.to_str();
  const std::string from = require_arg(a, 0, "old", "replace").to_str();
  const std::string to = require_arg(a, 1, "new", "replace").to_str();
  const int64_t count = int_arg(a, 2, "count", -1);
  const int64_t n = from.empty() ? static_cast<int64_t>(text::length(s)) + 1 : text::count(s, from);
  const int64_t done = count < 0 ? n : std::min(n, count);
  if (to.size() > from.size()) in.check_size(s.size() + static_cast<size_t>(done) * (to.size() - from.size()));
  return text::replace(s, from, to, count);
}

Value f_reverse(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = text::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return text::encode(cps);
  }
  ValueList items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  const int64_t precision = int_arg(a, 0, "precision", 0);
  const std::string method = str_arg(a, 1, "method", "common");
  if (!v.is_number() && !v.is_bool()) fail("round() expects a number, got " + v.type_name());
  if (method == "common" && (v.is_int() || v.is_bool()) && precision >= 0) {
    return v.is_bool() ? int64_t{v.as_bool()} : v.as_int();  // Python's round(int) stays an int
  }
  const double x = v.to_double();
  const double scale = std::pow(10.0, static_cast<double>(precision));
  double r;
  if (method == "common" && precision >= 0 && precision <= 300 && std::isfinite(x)) {
    // Python rounds the exact binary value, ties to even; so does printf.
    char buf[1024];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
    r = std::strtod(buf, nullptr);
  } else if (method == "common") r = std::nearbyint(x * scale) / scale;
  else if (method == "ceil") r = std::ceil(x * scale) / scale;
  else if (method == "floor") r = std::floor(x * scale) / scale;
  else fail("round(): method must be 'common', 'ceil' or 'floor'");
  return r;
}

Value f_safe(Interpreter&, const Value& v, CallArgs&) { return Value::markup(v.to_str()); }

Value f_sort(Interpreter&, const Value& v, CallArgs& a) {
  const bool reverse = bool_arg(a, 0, "reverse", false);
  const bool case_sensitive = bool_arg(a, 1, "case_sensitive", false);
  const Value* attribute = a.get(2, "attribute");
  ValueList items = iterate(v);
  auto key = [&](const Value& item) { return absent(attribute) ? item : get_attr_path(item, attribute->to_str()); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const int c = compare_values(key(x), key(y), case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value f_string(Interpreter&, const Value& v, CallArgs&) { return v.is_markup() ? v : Value(v.to_str()); }

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* attribute = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  Value total = absent(start) ? Value(0) : *start;
  for (const auto& item : iterate(v)) {
    total = binary_op(in, "+", total, absent(attribute) ? item : get_attr_path(item, attribute->to_str()));
  }
  return total;
}

Value f_title(Interpreter&, const Value& v, CallArgs&) { return text::jinja_title(v.to_str()); }

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* indent_v = a.get(0, "indent");
  const int indent = absent(indent_v) ? -1 : static_cast<int>(std::clamp<int64_t>(to_int64(*indent_v, "indent"), 0, 64));
  const bool ensure_ascii = bool_arg(a, 1, "ensure_ascii", false);
  const bool sort_keys = bool_arg(a, 3, "sort_keys", false);
  std::string item_sep = indent < 0 ? ", " : ",";
  std::string key_sep = ": ";
  const Value* seps = a.get(2, "separators");
  if (!absent(seps)) {
    if (!seps->is_list() || seps->as_list().size() != 2) fail("tojson(): separators must be a pair");
    item_sep = seps->as_list()[0].to_str();
    key_sep = seps->as_list()[1].to_str();
  }
  std::string out = to_json(v, indent, sort_keys, ensure_ascii, item_sep, key_sep);
  in.check_size(out.size());
  return out;
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  const Value* chars = a.get(0, "chars");
  if (absent(chars)) return text::strip(v.to_str(), nullptr, true, true);
  const std::string c = chars->to_str();
  return text::strip(v.to_str(), &c, true, true);
}

Value f_truncate(Interpreter&, const Value& v, CallArgs& a) {
  const std::string s = v.to_str();
  const int64_t length = int_arg(a, 0, "length", 255);
  const bool killwords = bool_arg(a, 1, "killwords", false);
  const std::string end = str_arg(a, 2, "end", "...");
  const int64_t leeway = int_arg(a, 3, "leeway", 5);
  const auto cps = text::decode(s);
  const int64_t n = static_cast<int64_t>(cps.size());
  if (n <= length + leeway) return s;
  const int64_t keep = std::max<int64_t>(0, length - static_cast<int64_t>(text::length(end)));
  std::string head = text::encode(cps.data(), cps.data() + keep);
  if (killwords) return head + end;
  const size_t space = head.rfind(' ');
  if (space != std::string::npos) head.resize(space);
  return head + end;
}

Value f_unique(Interpreter&, const Value& v, CallArgs& a) {
  const bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  const Value* attribute = a.get(1, "attribute");
  ValueList out;
  ValueList seen;
  for (const auto& item : iterate(v)) {
    Value key = absent(attribute) ? item : get_attr_path(item, attribute->to_str());
    if (!case_sensitive && key.is_string()) key = Value(text::lower(key.as_string()));
    bool dup = false;
    for (const auto& s : seen) dup = dup || s.equals(key);
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (const uint32_t cp : text::decode(v.to_str())) {
    const bool w = text::is_alpha(cp) || text::is_digit(cp) || cp == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = {
      {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},
      {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default},         {"default", f_default},   {"dictsort", f_dictsort},
      {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
      {"float", f_float},       {"forceescape", f_escape}, {"format", f_format},
      {"indent", f_indent},     {"int", f_int},           {"items", f_items},
      {"join", f_join},         {"last", f_last},         {"length", f_length},
      {"list", f_list},         {"lower", f_lower},       {"map", f_map},
      {"max", f_max},           {"min", f_min},           {"pprint", f_pprint},
      {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse},   {"round", f_round},       {"safe", f_safe},
      {"select", f_select},     {"selectattr", f_selectattr}, {"sort", f_sort},
      {"string", f_string},     {"sum", f_sum},           {"title", f_title},
      {"tojson", f_tojson},     {"trim", f_trim},         {"truncate", f_truncate},
      {"unique", f_unique},     {"upper", f_upper},       {"wordcount", f_wordcount},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------
// Tests

const Value& test_arg(const CallArgs& a, std::string_view test) {
  if (a.positional.empty()) fail("test '" + std::string(test) + "' needs an argument");
  return a.positional[0];
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number() || v.is_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict() && !v.is_namespace(); }
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_string() || v.is_undefined() || (v.is_dict() && !v.is_namespace());
}
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_string() || (v.is_dict() && !v.is_namespace());
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) { return v.is_function(); }
bool t_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool t_odd(Interpreter&, const Value& v, CallArgs&) { return to_int64(v, "odd test") % 2 != 0; }
bool t_even(Interpreter&, const Value& v, CallArgs&) { return to_int64(v, "even test") % 2 == 0; }
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  const int64_t d = to_int64(test_arg(a, "divisibleby"), "divisibleby argument");
  if (d == 0) fail("integer division or modulo by zero");
  return to_int64(v, "divisibleby test") % d == 0;
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return v.equals(test_arg(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !v.equals(test_arg(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, test_arg(a, "lt")) < 0; }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, test_arg(a, "le")) <= 0; }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, test_arg(a, "gt")) > 0; }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, test_arg(a, "ge")) >= 0; }
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return compare_op("in", v, test_arg(a, "in")); }
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& other = test_arg(a, "sameas");
  if (v.kind() != other.kind()) return false;
  if (v.is_list()) return &v.as_list() == &other.as_list();
  if (v.is_dict()) return &v.as_dict() == &other.as_dict();
  return v.equals(other);
}
// Jinja tests str(value).islower() / .isupper(), whatever the value is.
bool t_lower(Interpreter&, const Value& v, CallArgs&) {
  bool cased = false;
  for (const uint32_t cp : text::decode(v.to_str())) {
    if (text::to_lower(cp) != cp) return false;
    cased = cased || text::to_upper(cp) != cp;
  }
  return cased;
}
bool t_upper(Interpreter&, const Value& v, CallArgs&) {
  bool cased = false;
  for (const uint32_t cp : text::decode(v.to_str())) {
    if (text::to_upper(cp) != cp) return false;
    cased = cased || text::to_lower(cp) != cp;
  }
  return cased;
}
bool t_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && has_filter(v.as_string()); }
bool t_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && has_test(v.as_string()); }

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = {
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},
      {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq},
      {"escaped", t_escaped}, {"even", t_even}, {"false", t_false}, {"filter", t_filter},
      {"float", t_float}, {"ge", t_ge}, {">=", t_ge}, {"gt", t_gt}, {"greaterthan", t_gt},
      {">", t_gt}, {"in", t_in}, {"integer", t_integer}, {"iterable", t_iterable},
      {"le", t_le}, {"<=", t_le}, {"lower", t_lower}, {"lt", t_lt}, {"lessthan", t_lt},
      {"<", t_lt}, {"mapping", t_mapping}, {"ne", t_ne}, {"!=", t_ne}, {"none", t_none},
      {"number", t_number}, {"odd", t_odd}, {"sameas", t_sameas}, {"sequence", t_sequence},
      {"string", t_string}, {"test", t_test}, {"true", t_true}, {"undefined", t_undefined},
      {"upper", t_upper},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------
// Methods of strings, dicts and lists

bool starts_or_ends(const std::string& s, const Value& affix, bool ends) {
  auto one = [&](const Value& x) {
    const std::string& a = require_string(x, ends ? "endswith() argument" : "startswith() argument");
    if (a.size() > s.size()) return false;
    return ends ? s.compare(s.size() - a.size(), a.size(), a) == 0 : s.compare(0, a.size(), a) == 0;
  };
  if (affix.is_list()) {
    for (const auto& x : affix.as_list()) {
      if (one(x)) return true;
    }
    return false;
  }
  return one(affix);
}

bool all_codepoints(const std::string& s, bool (*pred)(uint32_t)) {
  if (s.empty()) return false;
  for (const uint32_t cp : text::decode(s)) {
    if (!pred(cp)) return false;
  }
  return true;
}

Value string_method(Interpreter& in, const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = a.get(0, "chars");
    const std::string c = absent(chars) ? "" : chars->to_str();
    return text::strip(s, absent(chars) ? nullptr : &c, name != "rstrip", name != "lstrip");
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = a.get(0, "sep");
    const int64_t maxsplit = int_arg(a, 1, "maxsplit", -1);
    std::string sep_s;
    if (!absent(sep)) {
      sep_s = require_string(*sep, "separator");
      if (sep_s.empty()) fail("empty separator");
    }
    const auto parts = name == "split" ? text::split(s, absent(sep) ? nullptr : &sep_s, maxsplit)
                                       : text::rsplit(s, absent(sep) ? nullptr : &sep_s, maxsplit);
    in.check_items(parts.size());
    ValueList out(parts.begin(), parts.end());
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    const auto parts = text::splitlines(s);
    return Value::list(ValueList(parts.begin(), parts.end()));
  }
  if (name == "startswith" || name == "endswith") {
    return starts_or_ends(s, require_arg(a, 0, "prefix", name), name == "endswith");
  }
  if (name == "upper") return text::upper(s);
  if (name == "lower") return text::lower(s);
  if (name == "title") return text::python_title(s);
  if (name == "capitalize") return text::capitalize(s);
  if (name == "replace") {
    CallArgs args;
    args.positional = a.positional;
    args.keyword = a.keyword;
    return f_replace(in, Value(s), args);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::string& sub = require_string(require_arg(a, 0, "sub", name), name + "() argument");
    const int64_t pos = text::find(s, sub, name[0] == 'r');
    if (pos < 0 && (name == "index" || name == "rindex")) fail("substring not found");
    return pos;
  }
  if (name == "count") return text::count(s, require_string(require_arg(a, 0, "sub", name), "count() argument"));
  if (name == "format") {
    std::string out = python_format(s, a);
    in.check_size(out.size());
    return out;
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const auto& item : iterate(require_arg(a, 0, "iterable", "join"))) {
      if (!first) out += s;
      first = false;
      out += require_string(item, "join() item");
      in.check_size(out.size());
    }
    return out;
  }
  if (name == "isdigit") return all_codepoints(s, text::is_digit);
  if (name == "isalpha") return all_codepoints(s, text::is_alpha);
  if (name == "isalnum") return all_codepoints(s, [](uint32_t c) { return text::is_alpha(c) || text::is_digit(c); });
  if (name == "isspace") return all_codepoints(s, text::is_space);
  if (name == "islower") {
    CallArgs none;
    return t_lower(in, Value(s), none);
  }
  if (name == "isupper") {
    CallArgs none;
    return t_upper(in, Value(s), none);
  }
  fail("str has no method '" + name + "'");
}

// A list must not end up inside itself (printing or comparing it would never end).
bool contains_container(const Value& haystack, const void* needle, int depth) {
  if (depth > 256) return true;
  if (haystack.is_list()) {
    if (&haystack.as_list() == needle) return true;
    for (const auto& v : haystack.as_list()) {
      if (contains_container(v, needle, depth + 1)) return true;
    }
  } else if (haystack.is_dict()) {
    if (&haystack.as_dict() == needle) return true;
    for (const auto& [k, v] : haystack.as_dict().entries) {
      if (contains_container(v, needle, depth + 1)) return true;
    }
  }
  return false;
}

Value list_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
  ValueList& list = self.as_list();
  auto checked = [&](const Value& v) -> const Value& {
    if (contains_container(v, &list, 0)) fail("cannot put a list inside itself");
    return v;
  };
  if (name == "append") {
    in.check_items(list.size() + 1);
    list.push_back(checked(require_arg(a, 0, "object", "append")));
    return Value::none();
  }
  if (name == "extend") {
    const ValueList items = iterate(require_arg(a, 0, "iterable", "extend"));
    in.check_items(list.size() + items.size());
    for (const auto& item : items) list.push_back(checked(item));
    return Value::none();
  }
  if (name == "insert") {
    in.check_items(list.size() + 1);
    int64_t i = to_int64(require_arg(a, 0, "index", "insert"), "insert index");
    const int64_t n = static_cast<int64_t>(list.size());
    if (i < 0) i = std::max<int64_t>(0, i + n);
    i = std::min(i, n);
    list.insert(list.begin() + i, checked(require_arg(a, 1, "object", "insert")));
    return Value::none();
  }
  if (name == "pop") {
    if (list.empty()) fail("pop from empty list");
    int64_t i = int_arg(a, 0, "index", -1);
    const int64_t n = static_cast<int64_t>(list.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) fail("pop index out of range");
    Value v = list[static_cast<size_t>(i)];
    list.erase(list.begin() + i);
    return v;
  }
  if (name == "index") {
    const Value& x = require_arg(a, 0, "value", "index");
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].equals(x)) return static_cast<int64_t>(i);
    }
    fail(x.repr() + " is not in list");
  }
  if (name == "count") {
    const Value& x = require_arg(a, 0, "value", "count");
    int64_t n = 0;
    for (const auto& item : list) n += item.equals(x) ? 1 : 0;
    return n;
  }
  fail("list has no method '" + name + "'");
}

Value dict_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
  const ValueDict& dict = self.as_dict();
  if (name == "items") return f_items(in, self, a);
  if (name == "keys") return f_list(in, self, a);
  if (name == "values") {
    ValueList out;
    for (const auto& [k, v] : dict.entries) out.push_back(v);
    return Value::list(std::move(out));
  }
  if (name == "get") {
    const Value* v = dict.find(require_arg(a, 0, "key", "get"));
    if (v != nullptr) return *v;
    const Value* def = a.get(1, "default");
    return def != nullptr ? *def : Value::none();
  }
  fail("dict has no method '" + name + "'");
}

bool is_string_method(std::string_view name) {
  static const std::string_view kNames[] = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith",
      "upper", "lower", "title", "capitalize", "replace", "find", "rfind", "index", "rindex",
      "count", "format", "join", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool is_list_method(std::string_view name) {
  return name == "append" || name == "extend" || name == "insert" || name == "pop" ||
         name == "index" || name == "count";
}

bool is_dict_method(std::string_view name) {
  return name == "items" || name == "keys" || name == "values" || name == "get";
}

Value get_method(const Value& object, std::string_view name) {
  const std::string n(name);
  if (object.is_string() && is_string_method(name)) {
    return Value::function(n, [s = object.as_string(), n](Interpreter& in, CallArgs& a) {
      return string_method(in, s, n, a);
    });
  }
  if (object.is_list() && is_list_method(name)) {
    return Value::function(n, [object, n](Interpreter& in, CallArgs& a) { return list_method(in, object, n, a); });
  }
  if (object.is_dict() && !object.is_namespace() && is_dict_method(name)) {
    return Value::function(n, [object, n](Interpreter& in, CallArgs& a) { return dict_method(in, object, n, a); });
  }
  return Value();
}

// ---------------------------------------------------------------------------------------------
// Globals

Value g_range(Interpreter& in, CallArgs& a) {
  int64_t start = 0;
  int64_t stop;
  int64_t step = 1;
  if (a.positional.size() == 1) {
    stop = to_int64(a.positional[0], "range() argument");
  } else if (a.positional.size() == 2 || a.positional.size() == 3) {
    start = to_int64(a.positional[0], "range() argument");
    stop = to_int64(a.positional[1], "range() argument");
    if (a.positional.size() == 3) step = to_int64(a.positional[2], "range() argument");
  } else {
    fail("range() expects 1 to 3 arguments");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  int64_t count = 0;
  if (step > 0 && stop > start) count = (stop - start + step - 1) / step;
  if (step < 0 && stop < start) count = (start - stop - step - 1) / (-step);
  in.check_items(static_cast<size_t>(count));
  ValueList out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out.emplace_back(start + i * step);
  return Value::list(std::move(out));
}

void merge_into(Value& target, CallArgs& a, std::string_view fn) {
  for (const auto& p : a.positional) {
    if (p.is_dict()) {
      for (const auto& [k, v] : p.as_dict().entries) target.as_dict().set(k, v);
    } else if (p.is_list()) {
      for (const auto& item : p.as_list()) {
        if (!item.is_list() || item.as_list().size() != 2) fail(std::string(fn) + "(): sequence items must be pairs");
        target.as_dict().set(item.as_list()[0], item.as_list()[1]);
      }
    } else if (!p.is_undefined()) {
      fail(std::string(fn) + "() expects a dict or keyword arguments");
    }
  }
  for (const auto& [k, v] : a.keyword) target.as_dict().set(Value(k), v);
}

Value g_dict(Interpreter&, CallArgs& a) {
  Value d = Value::dict();
  merge_into(d, a, "dict");
  return d;
}

Value g_namespace(Interpreter&, CallArgs& a) {
  Value ns = Value::namespace_object();
  merge_into(ns, a, "namespace");
  return ns;
}

Value g_raise_exception(Interpreter&, CallArgs& a) {
  const Value* msg = a.get(0, "message");
  throw TemplateError(TemplateError::Kind::kRaised, msg != nullptr ? msg->to_str() : "raise_exception() called");
}

Value g_strftime_now(Interpreter& in, CallArgs& a) {
  const std::string format = require_string(require_arg(a, 0, "format", "strftime_now"), "strftime_now() format");
  if (format.empty()) return std::string();
  std::string buf(format.size() * 8 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &in.now());
  if (n == 0) fail("strftime_now(): could not format '" + format + "'");
  buf.resize(n);
  return buf;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) != 0; }
bool has_test(std::string_view name) { return tests().count(name) != 0; }

Value apply_filter(Interpreter& in, std::string_view name, const Value& input, CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) fail("no filter named '" + std::string(name) + "'");
  return it->second(in, input, args);
}

bool apply_test(Interpreter& in, std::string_view name, const Value& input, CallArgs& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail("no test named '" + std::string(name) + "'");
  return it->second(in, input, args);
}

void install_globals(ValueDict& globals) {
  globals.set(Value("range"), Value::function("range", g_range));
  globals.set(Value("dict"), Value::function("dict", g_dict));
  globals.set(Value("namespace"), Value::function("namespace", g_namespace));
  globals.set(Value("raise_exception"), Value::function("raise_exception", g_raise_exception));
  globals.set(Value("strftime_now"), Value::function("strftime_now", g_strftime_now));
}

Value get_attr(const Value& object, std::string_view name) {
  if (object.is_undefined()) return object;
  Value method = get_method(object, name);
  if (!method.is_undefined()) return method;
  if (object.is_dict()) {
    const Value* v = object.as_dict().find(name);
    if (v != nullptr) return *v;
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute '" + std::string(name) + "'");
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) return object;
  if (object.is_dict()) {
    const Value* v = object.as_dict().find(key);
    if (v != nullptr) return *v;
  } else if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_bool() ? int64_t{key.as_bool()} : key.as_int();
    if (object.is_list()) {
      const auto& list = object.as_list();
      const int64_t n = static_cast<int64_t>(list.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return list[static_cast<size_t>(i)];
    } else {
      const auto cps = text::decode(object.as_string());
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        std::string c;
        text::append_codepoint(cps[static_cast<size_t>(i)], &c);
        return c;
      }
    }
    return Value::undefined(object.type_name() + " index " + key.repr() + " out of range");
  }
  if (key.is_string()) {
    Value method = get_method(object, key.as_string());
    if (!method.is_undefined()) return method;
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute " + key.repr());
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) return object;
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    return to_int64(v, what);
  };
  const int64_t st = bound(step, "slice step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n;
  if (object.is_list()) {
    n = static_cast<int64_t>(object.as_list().size());
  } else if (object.is_string()) {
    cps = text::decode(object.as_string());
    n = static_cast<int64_t>(cps.size());
  } else {
    fail("'" + object.type_name() + "' object is not subscriptable");
  }
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(bound(start, "slice start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(bound(stop, "slice stop"), st > 0 ? n : -1);
  std::vector<size_t> indices;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) indices.push_back(static_cast<size_t>(i));
  if (object.is_list()) {
    ValueList out;
    out.reserve(indices.size());
    for (const size_t i : indices) out.push_back(object.as_list()[i]);
    return object.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  std::string out;
  for (const size_t i : indices) text::append_codepoint(cps[i], &out);
  return out;
}

Value get_attr_path(const Value& object, std::string_view path) {
  Value cur = object;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string_view part = path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (numeric) {
      cur = get_item(cur, Value(static_cast<int64_t>(std::atoll(std::string(part).c_str()))));
    } else {
      Value next = cur.is_dict() ? get_item(cur, Value(part)) : get_attr(cur, part);
      cur = std::move(next);
    }
    if (dot == std::string_view::npos) return cur;
    start = dot + 1;
  }
}

Value binary_op(Interpreter& in, std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.to_str();
    const std::string t = b.to_str();
    in.check_size(s.size() + t.size());
    return s + t;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  auto as_i = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for " + std::string(op) + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(as_i(a), as_i(b), &r)) fail("integer overflow");
      return r;
    }
    if (a_num && b_num) return a.to_double() + b.to_double();
    if (a.is_string() && b.is_string()) {
      in.check_size(a.as_string().size() + b.as_string().size());
      if (a.is_markup() || b.is_markup()) {
        const std::string left = a.is_markup() ? a.as_string() : text::html_escape(a.as_string());
        const std::string right = b.is_markup() ? b.as_string() : text::html_escape(b.as_string());
        return Value::markup(left + right);
      }
      return a.as_string() + b.as_string();
    }
    if (a.is_list() && b.is_list()) {
      in.check_items(a.as_list().size() + b.as_list().size());
      ValueList out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return a.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(as_i(a), as_i(b), &r)) fail("integer overflow");
      return r;
    }
    if (a_num && b_num) return a.to_double() - b.to_double();
    return unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(as_i(a), as_i(b), &r)) fail("integer overflow");
      return r;
    }
    if (a_num && b_num) return a.to_double() * b.to_double();
    const Value* seq = (a.is_string() || a.is_list()) ? &a : ((b.is_string() || b.is_list()) ? &b : nullptr);
    const Value* times = seq == &a ? &b : &a;
    if (seq != nullptr && (times->is_int() || times->is_bool())) {
      const int64_t n = std::max<int64_t>(0, as_i(*times));
      if (seq->is_string()) {
        const size_t len = seq->as_string().size();
        if (len != 0 && static_cast<uint64_t>(n) > (uint64_t{1} << 40) / len) fail("string repetition is too large");
        in.check_size(len * static_cast<size_t>(n));
        std::string out;
        out.reserve(len * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out += seq->as_string();
        return out;
      }
      const size_t len = seq->as_list().size();
      if (len != 0 && static_cast<uint64_t>(n) > (uint64_t{1} << 40) / len) fail("list repetition is too large");
      in.check_items(len * static_cast<size_t>(n));
      ValueList out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
      return seq->is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
    return unsupported();
  }
  if (op == "/") {
    if (!a_num || !b_num) return unsupported();
    if (b.to_double() == 0.0) fail("division by zero");
    return a.to_double() / b.to_double();
  }
  if (op == "//") {
    if (!a_num || !b_num) return unsupported();
    if (b.to_double() == 0.0) fail("integer division or modulo by zero");
    if (ints) {
      const int64_t x = as_i(a);
      const int64_t y = as_i(b);
      if (x == std::numeric_limits<int64_t>::min() && y == -1) fail("integer overflow");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return q;
    }
    return std::floor(a.to_double() / b.to_double());
  }
  if (op == "%") {
    if (a.is_string()) {
      return printf_format(a.as_string(), b.is_list() ? b.as_list() : ValueList{b});
    }
    if (!a_num || !b_num) return unsupported();
    if (b.to_double() == 0.0) fail("integer division or modulo by zero");
    if (ints) {
      const int64_t x = as_i(a);
      const int64_t y = as_i(b);
      if (y == -1) return 0;
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return r;
    }
    const double x = a.to_double();
    const double y = b.to_double();
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return r;
  }
  if (op == "**") {
    if (!a_num || !b_num) return unsupported();
    if (ints && as_i(b) >= 0) {
      int64_t base = as_i(a);
      int64_t exp = as_i(b);
      int64_t r = 1;
      while (exp > 0) {
        if ((exp & 1) && __builtin_mul_overflow(r, base, &r)) fail("integer overflow");
        exp >>= 1;
        if (exp > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
      }
      return r;
    }
    return std::pow(a.to_double(), b.to_double());
  }
  fail("unknown operator '" + std::string(op) + "'");
}

bool compare_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return a.equals(b);
  if (op == "!=") return !a.equals(b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) fail("'in <string>' requires string as left operand, not " + a.type_name());
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_list()) {
      for (const auto& item : b.as_list()) found = found || item.equals(a);
    } else if (b.is_dict()) {
      found = b.as_dict().find(a) != nullptr;
    } else if (!b.is_undefined()) {
      fail("argument of type '" + b.type_name() + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  const int c = compare_values(a, b);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  if (op == ">=") return c >= 0;
  fail("unknown comparison '" + std::string(op) + "'");
}

std::string to_json(const Value& value, int indent, bool sort_keys, bool ensure_ascii,
                    std::string_view item_separator, std::string_view key_separator) {
  JsonWriter w{indent, sort_keys, ensure_ascii, item_separator, key_separator, {}};
  w.write(value, 0);
  return std::move(w.out);
}

}  // namespace vesper::tokenizer::jinja
