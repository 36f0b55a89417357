// What templates can call and apply: filters, tests, global functions, the methods of
// strings, lists and dicts, attribute and item access, and the operators, each with the
// semantics Python and Jinja2 give it (see README.md for the list and the gaps).
// All of these throw TemplateError (kRuntime) on misuse; the interpreter adds the location.
#pragma once

#include <string_view>

#include "tokenizer/jinja/value.h"

namespace vesper::tokenizer::jinja {

bool has_filter(std::string_view name);
bool has_test(std::string_view name);

Value apply_filter(Interpreter& in, std::string_view name, const Value& input, CallArgs& args);
bool apply_test(Interpreter& in, std::string_view name, const Value& input, CallArgs& args);

// range, dict, namespace, raise_exception, strftime_now.
void install_globals(ValueDict& globals);

// obj.name: methods first (as Python's getattr finds them), then dict keys; undefined when
// neither exists (and for any attribute of undefined).
Value get_attr(const Value& object, std::string_view name);
// obj[key]: dict keys, list and string indices (negative from the end), then methods.
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] on lists and strings; each bound may be none/undefined.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);
// A dotted attribute path as map(attribute=...) and sort(attribute=...) take it ("a.b.0").
Value get_attr_path(const Value& object, std::string_view path);

// Arithmetic and string operators: + - * / // % ** ~
Value binary_op(Interpreter& in, std::string_view op, const Value& a, const Value& b);
// == != < <= > >= in notin
bool compare_op(std::string_view op, const Value& a, const Value& b);

// Python json.dumps with HF's tojson defaults (ensure_ascii=False, keys in insertion order).
// indent < 0 means no indentation.
std::string to_json(const Value& value, int indent, bool sort_keys, bool ensure_ascii,
                    std::string_view item_separator, std::string_view key_separator);

}  // namespace vesper::tokenizer::jinja
