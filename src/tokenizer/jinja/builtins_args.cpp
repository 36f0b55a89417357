// How filters, methods and globals read their arguments: by position or keyword, with a
// default when absent, converted the way Python would (or a TemplateError naming the argument).
// Declared in builtins_internal.h, shared by every builtins_*.cpp that takes arguments.
#include <cmath>
#include <string>

#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"

namespace vesper::tokenizer::jinja::builtins {

bool absent(const Value* v) {
  return v == nullptr || v->is_undefined() || v->is_none();
}

int64_t to_int64(const Value& v, std::string_view what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool() ? 1 : 0;
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18)
      fail(std::string(what) + ": number out of range");
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
  if (v == nullptr)
    fail(std::string(fn) + "() missing required argument '" + std::string(name) + "'");
  return *v;
}

const std::string& require_string(const Value& v, std::string_view what) {
  if (!v.is_string()) fail(std::string(what) + " must be a string, not " + v.type_name());
  return v.as_string();
}

}  // namespace vesper::tokenizer::jinja::builtins
