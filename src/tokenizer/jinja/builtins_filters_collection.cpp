// Filters over lists, dicts and other iterables: size and ends (length/count, first, last),
// conversion (list, items), ordering (sort, dictsort, reverse, min, max, unique), selection
// (select, reject, selectattr, rejectattr), mapping (map, join, sum) and batch. Items are
// walked with `iterate` and ordered with `compare_values` (builtins_operators.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/text.h"

namespace vesper::tokenizer::jinja::builtins {

namespace {

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

Value f_length(Interpreter&, const Value& v, CallArgs&) {
  switch (v.kind()) {
    case ValueKind::kString:
      return static_cast<int64_t>(text::length(v.as_string()));
    case ValueKind::kList:
      return static_cast<int64_t>(v.as_list().size());
    case ValueKind::kDict:
      return static_cast<int64_t>(v.as_dict().entries.size());
    case ValueKind::kUndefined:
      return 0;
    default:
      fail("object of type '" + v.type_name() + "' has no len()");
  }
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

Value f_first(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_list())
    return v.as_list().empty() ? Value::undefined("first() of an empty list") : v.as_list().front();
  ValueList items = iterate(v);
  return items.empty() ? Value::undefined("first() of an empty sequence") : items.front();
}

Value f_last(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_list())
    return v.as_list().empty() ? Value::undefined("last() of an empty list") : v.as_list().back();
  ValueList items = iterate(v);
  return items.empty() ? Value::undefined("last() of an empty sequence") : items.back();
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
  if (items.empty())
    return Value::undefined(std::string(want_max ? "max" : "min") + "() of an empty sequence");
  size_t best = 0;
  auto key = [&](const Value& item) {
    return absent(attribute) ? item : get_attr_path(item, attribute->to_str());
  };
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare_values(key(items[i]), key(items[best]), case_sensitive);
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value f_max(Interpreter&, const Value& v, CallArgs& a) {
  return min_max(v, a, true);
}
Value f_min(Interpreter&, const Value& v, CallArgs& a) {
  return min_max(v, a, false);
}

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
  rest.positional.assign(
      a.positional.begin() + static_cast<std::ptrdiff_t>(std::min(next, a.positional.size())),
      a.positional.end());
  rest.keyword = a.keyword;
  ValueList out;
  for (const auto& item : iterate(v)) {
    const Value subject = by_attribute ? get_attr_path(item, attribute) : item;
    const bool ok = test.empty() ? subject.truthy() : apply_test(in, test, subject, rest);
    if (ok != reject) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, false);
}
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, true);
}
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, false);
}
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, true);
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

Value f_sort(Interpreter&, const Value& v, CallArgs& a) {
  const bool reverse = bool_arg(a, 0, "reverse", false);
  const bool case_sensitive = bool_arg(a, 1, "case_sensitive", false);
  const Value* attribute = a.get(2, "attribute");
  ValueList items = iterate(v);
  auto key = [&](const Value& item) {
    return absent(attribute) ? item : get_attr_path(item, attribute->to_str());
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const int c = compare_values(key(x), key(y), case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* attribute = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  Value total = absent(start) ? Value(0) : *start;
  for (const auto& item : iterate(v)) {
    total = binary_op(in, "+", total,
                      absent(attribute) ? item : get_attr_path(item, attribute->to_str()));
  }
  return total;
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

}  // namespace

// Also dict.items() and dict.keys() (builtins_methods.cpp).
Value f_items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list();
  if (!v.is_dict() || v.is_namespace()) fail("items() expects a dict, got " + v.type_name());
  ValueList out;
  for (const auto& [k, val] : v.as_dict().entries) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value f_list(Interpreter&, const Value& v, CallArgs&) {
  return Value::list(iterate(v));
}

std::span<const NamedFilter> collection_filters() {
  // clang-format off
  static constexpr NamedFilter kTable[] = {
      // size, ends, conversion
      {"length", f_length}, {"count", f_length}, {"first", f_first}, {"last", f_last},
      {"list", f_list}, {"items", f_items},
      // ordering
      {"sort", f_sort}, {"dictsort", f_dictsort}, {"reverse", f_reverse}, {"unique", f_unique},
      {"min", f_min}, {"max", f_max},
      // selection
      {"select", f_select}, {"reject", f_reject},
      {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
      // mapping and grouping
      {"map", f_map}, {"join", f_join}, {"sum", f_sum}, {"batch", f_batch},
  };
  // clang-format on
  return kTable;
}

}  // namespace vesper::tokenizer::jinja::builtins
