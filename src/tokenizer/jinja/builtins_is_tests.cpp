// Jinja's tests, what `value is name(args)` and select/reject apply: type checks (defined,
// none, string, number, mapping, iterable, ...), comparisons (eq, lt, ge, in, sameas, ...),
// arithmetic (odd, even, divisibleby), case (lower, upper) and name checks (filter, test).
#include <cstdint>
#include <span>
#include <string>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja::builtins {

namespace {

const Value& test_arg(const CallArgs& a, std::string_view test) {
  if (a.positional.empty()) fail("test '" + std::string(test) + "' needs an argument");
  return a.positional[0];
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) {
  return !v.is_undefined();
}
bool t_undefined(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined();
}
bool t_none(Interpreter&, const Value& v, CallArgs&) {
  return v.is_none();
}
bool t_boolean(Interpreter&, const Value& v, CallArgs&) {
  return v.is_bool();
}
bool t_true(Interpreter&, const Value& v, CallArgs&) {
  return v.is_bool() && v.as_bool();
}
bool t_false(Interpreter&, const Value& v, CallArgs&) {
  return v.is_bool() && !v.as_bool();
}
bool t_string(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string();
}
bool t_number(Interpreter&, const Value& v, CallArgs&) {
  return v.is_number() || v.is_bool();
}
bool t_integer(Interpreter&, const Value& v, CallArgs&) {
  return v.is_int();
}
bool t_float(Interpreter&, const Value& v, CallArgs&) {
  return v.is_float();
}
bool t_mapping(Interpreter&, const Value& v, CallArgs&) {
  return v.is_dict() && !v.is_namespace();
}
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_string() || v.is_undefined() || (v.is_dict() && !v.is_namespace());
}
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_string() || (v.is_dict() && !v.is_namespace());
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_function();
}
bool t_escaped(Interpreter&, const Value&, CallArgs&) {
  return false;
}
bool t_odd(Interpreter&, const Value& v, CallArgs&) {
  return to_int64(v, "odd test") % 2 != 0;
}
bool t_even(Interpreter&, const Value& v, CallArgs&) {
  return to_int64(v, "even test") % 2 == 0;
}
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  const int64_t d = to_int64(test_arg(a, "divisibleby"), "divisibleby argument");
  if (d == 0) fail("integer division or modulo by zero");
  return to_int64(v, "divisibleby test") % d == 0;
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) {
  return v.equals(test_arg(a, "eq"));
}
bool t_ne(Interpreter&, const Value& v, CallArgs& a) {
  return !v.equals(test_arg(a, "ne"));
}
bool t_lt(Interpreter&, const Value& v, CallArgs& a) {
  return compare_values(v, test_arg(a, "lt")) < 0;
}
bool t_le(Interpreter&, const Value& v, CallArgs& a) {
  return compare_values(v, test_arg(a, "le")) <= 0;
}
bool t_gt(Interpreter&, const Value& v, CallArgs& a) {
  return compare_values(v, test_arg(a, "gt")) > 0;
}
bool t_ge(Interpreter&, const Value& v, CallArgs& a) {
  return compare_values(v, test_arg(a, "ge")) >= 0;
}
bool t_in(Interpreter&, const Value& v, CallArgs& a) {
  return compare_op("in", v, test_arg(a, "in"));
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& other = test_arg(a, "sameas");
  if (v.kind() != other.kind()) return false;
  if (v.is_list()) return &v.as_list() == &other.as_list();
  if (v.is_dict()) return &v.as_dict() == &other.as_dict();
  return v.equals(other);
}

bool t_filter(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && has_filter(v.as_string());
}
bool t_test(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && has_test(v.as_string());
}

}  // namespace

// Jinja tests str(value).islower() / .isupper(), whatever the value is.
// Also the methods str.islower() and str.isupper() (builtins_methods.cpp).
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

std::span<const NamedTest> is_tests() {
  // clang-format off
  static constexpr NamedTest kTable[] = {
      // types
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none},
      {"boolean", t_boolean}, {"true", t_true}, {"false", t_false},
      {"string", t_string}, {"number", t_number}, {"integer", t_integer}, {"float", t_float},
      {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence},
      {"callable", t_callable}, {"escaped", t_escaped},
      // comparisons
      {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne},
      {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le},
      {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge},
      {"in", t_in}, {"sameas", t_sameas},
      // numbers
      {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby},
      // case of str(value)
      {"lower", t_lower}, {"upper", t_upper},
      // names of filters and tests
      {"filter", t_filter}, {"test", t_test},
  };
  // clang-format on
  return kTable;
}

}  // namespace vesper::tokenizer::jinja::builtins
