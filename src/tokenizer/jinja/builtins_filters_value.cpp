// Filters on one value as a whole rather than on its text or items: numbers and conversions
// to them (abs, int, float, round, with Python's parsing and rounding), the fallback for
// undefined values (default/d) and attribute lookup by name (attr).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja::builtins {

namespace {

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return std::fabs(v.as_float());
  const int64_t n = to_int64(v, "abs()");
  if (n == std::numeric_limits<int64_t>::min()) fail("integer overflow");
  return n < 0 ? -n : n;
}

Value f_attr(Interpreter&, const Value& v, CallArgs& a) {
  return get_attr(v, require_string(require_arg(a, 0, "name", "attr"), "attr name"));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  const Value* def = a.get(0, "default_value");
  const bool boolean = bool_arg(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return def != nullptr ? *def : Value("");
  return v;
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
      if (parse_python_float(s, &d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
        return static_cast<int64_t>(d);
    }
  }
  return fallback;
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
  } else if (method == "common")
    r = std::nearbyint(x * scale) / scale;
  else if (method == "ceil")
    r = std::ceil(x * scale) / scale;
  else if (method == "floor")
    r = std::floor(x * scale) / scale;
  else
    fail("round(): method must be 'common', 'ceil' or 'floor'");
  return r;
}

}  // namespace

std::span<const NamedFilter> value_filters() {
  // clang-format off
  static constexpr NamedFilter kTable[] = {
      // numbers
      {"abs", f_abs}, {"int", f_int}, {"float", f_float}, {"round", f_round},
      // fallback and lookup
      {"default", f_default}, {"d", f_default}, {"attr", f_attr},
  };
  // clang-format on
  return kTable;
}

}  // namespace vesper::tokenizer::jinja::builtins
