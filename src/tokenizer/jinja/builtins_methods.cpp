// The methods templates call on values, as Python has them: str (strip, split, startswith,
// find, format, join, is*, ...), list (append, extend, insert, pop, index, count) and dict
// (items, keys, values, get). get_method binds one to its object; get_attr and get_item
// (builtins_access.cpp) find methods through it. Where a method is also a filter or test,
// it calls that one.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja::builtins {

namespace {

bool starts_or_ends(const std::string& s, const Value& affix, bool ends) {
  auto one = [&](const Value& x) {
    const std::string& a =
        require_string(x, ends ? "endswith() argument" : "startswith() argument");
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
  if (name == "count")
    return text::count(s, require_string(require_arg(a, 0, "sub", name), "count() argument"));
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
  if (name == "isalnum")
    return all_codepoints(s, [](uint32_t c) { return text::is_alpha(c) || text::is_digit(c); });
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
      "strip",    "lstrip",  "rstrip",  "split",   "rsplit",     "splitlines", "startswith",
      "endswith", "upper",   "lower",   "title",   "capitalize", "replace",    "find",
      "rfind",    "index",   "rindex",  "count",   "format",     "join",       "isdigit",
      "isalpha",  "isalnum", "isspace", "islower", "isupper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool is_list_method(std::string_view name) {
  return name == "append" || name == "extend" || name == "insert" || name == "pop" ||
         name == "index" || name == "count";
}

bool is_dict_method(std::string_view name) {
  return name == "items" || name == "keys" || name == "values" || name == "get";
}

}  // namespace

Value get_method(const Value& object, std::string_view name) {
  const std::string n(name);
  if (object.is_string() && is_string_method(name)) {
    return Value::function(n, [s = object.as_string(), n](Interpreter& in, CallArgs& a) {
      return string_method(in, s, n, a);
    });
  }
  if (object.is_list() && is_list_method(name)) {
    return Value::function(
        n, [object, n](Interpreter& in, CallArgs& a) { return list_method(in, object, n, a); });
  }
  if (object.is_dict() && !object.is_namespace() && is_dict_method(name)) {
    return Value::function(
        n, [object, n](Interpreter& in, CallArgs& a) { return dict_method(in, object, n, a); });
  }
  return Value();
}

}  // namespace vesper::tokenizer::jinja::builtins
