// Python's operators on template values (binary_op: + - * / // % ** ~, compare_op: == != < <=
// > >= in, not in) and the two protocols under them that filters, tests and methods use as
// well: iteration (what `for`, |list and |join walk over) and ordering (what <, |sort, |min,
// |max and |dictsort compare by).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja {

namespace builtins {

namespace {

[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.undefined_hint());
}

}  // namespace

// Items of anything iterable: lists, dict keys, string characters; undefined is empty.
ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kList:
      return v.as_list();
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
    case ValueKind::kUndefined:
      return {};
    default:
      fail("'" + v.type_name() + "' object is not iterable");
  }
}

// Python's ordering for sort/min/max/<: numbers with numbers, strings with strings, lists
// element-wise. Case-insensitive string comparison when !case_sensitive.
int compare_values(const Value& a, const Value& b, bool case_sensitive) {
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
    if (case_sensitive)
      return a.as_string().compare(b.as_string()) < 0 ? -1
                                                      : (a.as_string() == b.as_string() ? 0 : 1);
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
  fail("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() +
       "'");
}

}  // namespace builtins

Value binary_op(Interpreter& in, std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.to_str();
    const std::string t = b.to_str();
    in.check_size(s.size() + t.size());
    return s + t;
  }
  if (a.is_undefined()) builtins::fail_undefined(a);
  if (b.is_undefined()) builtins::fail_undefined(b);
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  auto as_i = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for " + std::string(op) + ": '" + a.type_name() + "' and '" +
         b.type_name() + "'");
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
    const Value* seq =
        (a.is_string() || a.is_list()) ? &a : ((b.is_string() || b.is_list()) ? &b : nullptr);
    const Value* times = seq == &a ? &b : &a;
    if (seq != nullptr && (times->is_int() || times->is_bool())) {
      const int64_t n = std::max<int64_t>(0, as_i(*times));
      if (seq->is_string()) {
        const size_t len = seq->as_string().size();
        if (len != 0 && static_cast<uint64_t>(n) > (uint64_t{1} << 40) / len)
          fail("string repetition is too large");
        in.check_size(len * static_cast<size_t>(n));
        std::string out;
        out.reserve(len * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out += seq->as_string();
        return out;
      }
      const size_t len = seq->as_list().size();
      if (len != 0 && static_cast<uint64_t>(n) > (uint64_t{1} << 40) / len)
        fail("list repetition is too large");
      in.check_items(len * static_cast<size_t>(n));
      ValueList out;
      for (int64_t i = 0; i < n; ++i)
        out.insert(out.end(), seq->as_list().begin(), seq->as_list().end());
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
      return builtins::printf_format(a.as_string(), b.is_list() ? b.as_list() : ValueList{b});
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
      if (!a.is_string())
        fail("'in <string>' requires string as left operand, not " + a.type_name());
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
  const int c = builtins::compare_values(a, b);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  if (op == ">=") return c >= 0;
  fail("unknown comparison '" + std::string(op) + "'");
}

}  // namespace vesper::tokenizer::jinja
