// The global functions every template sees: range, dict, namespace, raise_exception and
// strftime_now (see install_globals in builtins.h).
#include <cstdint>
#include <ctime>
#include <string>
#include <utility>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"

namespace vesper::tokenizer::jinja {

namespace builtins {

namespace {

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
        if (!item.is_list() || item.as_list().size() != 2)
          fail(std::string(fn) + "(): sequence items must be pairs");
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
  throw TemplateError(TemplateError::Kind::kRaised,
                      msg != nullptr ? msg->to_str() : "raise_exception() called");
}

Value g_strftime_now(Interpreter& in, CallArgs& a) {
  const std::string format =
      require_string(require_arg(a, 0, "format", "strftime_now"), "strftime_now() format");
  if (format.empty()) return std::string();
  std::string buf(format.size() * 8 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &in.now());
  if (n == 0) fail("strftime_now(): could not format '" + format + "'");
  buf.resize(n);
  return buf;
}

}  // namespace

}  // namespace builtins

void install_globals(ValueDict& globals) {
  globals.set(Value("range"), Value::function("range", builtins::g_range));
  globals.set(Value("dict"), Value::function("dict", builtins::g_dict));
  globals.set(Value("namespace"), Value::function("namespace", builtins::g_namespace));
  globals.set(Value("raise_exception"),
              Value::function("raise_exception", builtins::g_raise_exception));
  globals.set(Value("strftime_now"), Value::function("strftime_now", builtins::g_strftime_now));
}

}  // namespace vesper::tokenizer::jinja
