// What the files behind builtins.h share with each other, and nothing else: the argument
// readers, Python's iteration and ordering, the string formatting that |format, `%` and
// str.format have in common, the few filters and tests that methods reuse, and the tables
// each filter and test file hands to the registry (builtins_registry.cpp).
// Internal to the builtins: include it only from builtins_*.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tokenizer/jinja/value.h"

namespace vesper::tokenizer::jinja::builtins {

// ---------------------------------------------------------------------------------------------
// Arguments (builtins_args.cpp). An argument is looked up at position `i` or as keyword
// `name`; errors are TemplateError (kRuntime) naming it.

// Not given, undefined or none.
bool absent(const Value* v);
// An int, a bool (0/1) or a finite float (truncated); `what` names the value in errors.
int64_t to_int64(const Value& v, std::string_view what);
// `def` when absent (int_arg) or not given / undefined (bool_arg: truthiness, str_arg: str()).
int64_t int_arg(const CallArgs& a, size_t i, std::string_view name, int64_t def);
bool bool_arg(const CallArgs& a, size_t i, std::string_view name, bool def);
std::string str_arg(const CallArgs& a, size_t i, std::string_view name, std::string_view def);
// An argument the function `fn` cannot do without.
const Value& require_arg(const CallArgs& a, size_t i, std::string_view name, std::string_view fn);
const std::string& require_string(const Value& v, std::string_view what);

// ---------------------------------------------------------------------------------------------
// Iteration and ordering (builtins_operators.cpp)

// Items of anything iterable: lists, dict keys, string characters; undefined is empty.
ValueList iterate(const Value& v);
// Python's ordering for sort/min/max/<: -1, 0 or 1. Numbers with numbers, strings with
// strings (case-insensitively when !case_sensitive), lists element-wise; else an error.
int compare_values(const Value& a, const Value& b, bool case_sensitive = true);

// ---------------------------------------------------------------------------------------------
// String formatting (builtins_format.cpp)

// Python's `format % args`.
std::string printf_format(const std::string& format, const ValueList& args);
// Python's str.format(*args, **kwargs) for {}, {0}, {name} fields with optional specs.
std::string python_format(const std::string& format, const CallArgs& a);

// ---------------------------------------------------------------------------------------------
// Filters and tests that methods reuse (str.replace, dict.items/keys, str.islower/isupper)

Value f_replace(Interpreter& in, const Value& v, CallArgs& a);  // builtins_filters_text.cpp
Value f_items(Interpreter& in, const Value& v, CallArgs& a);    // builtins_filters_collection.cpp
Value f_list(Interpreter& in, const Value& v, CallArgs& a);     // builtins_filters_collection.cpp
bool t_lower(Interpreter& in, const Value& v, CallArgs& a);     // builtins_is_tests.cpp
bool t_upper(Interpreter& in, const Value& v, CallArgs& a);     // builtins_is_tests.cpp

// ---------------------------------------------------------------------------------------------
// Methods (builtins_methods.cpp)

// `object.name` as a bound str, list or dict method; undefined when it has no such method.
Value get_method(const Value& object, std::string_view name);

// ---------------------------------------------------------------------------------------------
// The registry's tables: each file lists what it defines under the names templates use.

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

struct NamedFilter {
  std::string_view name;
  FilterFn fn;
};

struct NamedTest {
  std::string_view name;
  TestFn fn;
};

std::span<const NamedFilter> text_filters();        // builtins_filters_text.cpp
std::span<const NamedFilter> collection_filters();  // builtins_filters_collection.cpp
std::span<const NamedFilter> value_filters();       // builtins_filters_value.cpp
std::span<const NamedTest> is_tests();              // builtins_is_tests.cpp

}  // namespace vesper::tokenizer::jinja::builtins
