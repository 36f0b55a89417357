// What `obj.name`, `obj[key]` and `obj[a:b:c]` evaluate to (get_attr, get_item, get_slice),
// and the dotted paths ("a.b.0") that map, sort, join, ... take as attribute= (get_attr_path).
// Methods are found here too, through get_method (builtins_methods.cpp).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja {

Value get_attr(const Value& object, std::string_view name) {
  if (object.is_undefined()) return object;
  Value method = builtins::get_method(object, name);
  if (!method.is_undefined()) return method;
  if (object.is_dict()) {
    const Value* v = object.as_dict().find(name);
    if (v != nullptr) return *v;
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute '" +
                          std::string(name) + "'");
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
    Value method = builtins::get_method(object, key.as_string());
    if (!method.is_undefined()) return method;
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute " + key.repr());
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) return object;
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    return builtins::to_int64(v, what);
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
    const std::string_view part =
        path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(),
                                                      [](char c) { return c >= '0' && c <= '9'; });
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

}  // namespace vesper::tokenizer::jinja
