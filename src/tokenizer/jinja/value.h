// Values of the Jinja engine: what expressions evaluate to and what templates print.
//
// Semantics follow Python as Jinja2 runs it: None/True/False, int64 ints, doubles printed as
// Python's repr, strings (UTF-8, indexed by code point), lists and dicts with reference
// semantics (two variables may share one list; `append` is seen through both), dicts keep
// insertion order like Python's. Undefined is a value of its own: it prints as nothing, is
// false, iterates as empty, and remembers why it is undefined for error messages.
// Functions (builtins, macros, bound methods) are values too.
//
// Internal to the engine; the public surface is template.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace vesper::tokenizer::jinja {

class Value;
class Interpreter;
struct CallArgs;

using ValueList = std::vector<Value>;

struct ValueDict;
struct Function;

enum class ValueKind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

class Value {
 public:
  Value() = default;  // undefined
  Value(bool b) : v_(b) {}                      // NOLINT: implicit by design
  Value(int i) : v_(int64_t{i}) {}              // NOLINT
  Value(int64_t i) : v_(i) {}                   // NOLINT
  Value(double d) : v_(d) {}                    // NOLINT
  Value(std::string s) : v_(std::move(s)) {}    // NOLINT
  Value(std::string_view s) : v_(std::string(s)) {}  // NOLINT
  Value(const char* s) : v_(std::string(s)) {}  // NOLINT

  // `hint` says why the value is undefined ("'foo' is undefined"), for error messages.
  static Value undefined(std::string hint = {});
  static Value none();
  static Value list(ValueList items = {});
  // A Python tuple: a list that prints as (a, b); what (a, b), dict.items() and varargs make.
  static Value tuple(ValueList items);
  // A markupsafe.Markup string (what |safe and |escape make): `+` HTML-escapes the plain
  // string on its other side, as Python does.
  static Value markup(std::string s);
  static Value dict();
  static Value namespace_object();
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> impl);

  ValueKind kind() const { return static_cast<ValueKind>(v_.index()); }
  bool is_undefined() const { return kind() == ValueKind::kUndefined; }
  bool is_none() const { return kind() == ValueKind::kNone; }
  bool is_bool() const { return kind() == ValueKind::kBool; }
  bool is_int() const { return kind() == ValueKind::kInt; }
  bool is_float() const { return kind() == ValueKind::kFloat; }
  bool is_number() const { return is_int() || is_float(); }  // bools excluded
  bool is_string() const { return kind() == ValueKind::kString; }
  bool is_list() const { return kind() == ValueKind::kList; }
  bool is_dict() const { return kind() == ValueKind::kDict; }
  bool is_function() const { return kind() == ValueKind::kFunction; }
  bool is_namespace() const;
  bool is_tuple() const { return tuple_; }
  bool is_markup() const { return markup_; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Numeric value of an int, float or bool.
  double to_double() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  ValueList& as_list() const { return *std::get<std::shared_ptr<ValueList>>(v_); }
  ValueDict& as_dict() const { return *std::get<std::shared_ptr<ValueDict>>(v_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<Function>>(v_); }
  // Why an undefined value is undefined ("'foo' is undefined"); a generic text when unknown.
  std::string undefined_hint() const;

  // Python truthiness.
  bool truthy() const;
  // Python str(): what {{ value }} prints (undefined prints as "").
  std::string to_str() const;
  // Python repr(): how values print inside lists and dicts.
  std::string repr() const;
  // Python ==, deep for lists and dicts (1 == 1.0 == True).
  bool equals(const Value& other) const;
  // Type name for messages, as Python spells it ("str", "int", "list", "NoneType", ...).
  std::string type_name() const;

 private:
  struct Undefined {
    std::string hint;
  };
  struct None {};
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<ValueList>,
               std::shared_ptr<ValueDict>, std::shared_ptr<Function>>
      v_;
  bool tuple_ = false;
  bool markup_ = false;
};

// An insertion-ordered dict. Dicts in templates are small (message objects, tool schemas), so
// lookups scan; keys are compared with Python ==.
struct ValueDict {
  std::vector<std::pair<Value, Value>> entries;
  bool is_namespace = false;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
  bool erase(const Value& key);
};

// Positional and keyword arguments of one call.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at position `index` or named `name`, whichever was given; nullptr if neither.
  const Value* get(size_t index, std::string_view name) const;
  const Value* get_keyword(std::string_view name) const;
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> impl;
};

// Python's float repr: "1.0", "0.1", "1e+20", "1.2345678901234568e+17", "nan", "inf".
std::string format_python_float(double value);

// Python's repr of a string: 'text' (or "text" when it holds ' and no "), with escapes.
std::string python_string_repr(std::string_view text);

}  // namespace vesper::tokenizer::jinja
