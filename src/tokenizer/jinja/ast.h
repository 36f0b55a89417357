// The syntax tree the parser builds and the interpreter walks. Immutable once parsed, so one
// tree serves any number of concurrent renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace vesper::tokenizer::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // items
    kTuple,     // items
    kDict,      // pairs
    kGetAttr,   // object . name
    kGetItem,   // object [ index ]
    kSlice,     // object [ start : stop : step ] (each may be null)
    kCall,      // object ( items, keywords )
    kFilter,    // object | name ( items, keywords ); object is null inside {% filter %}
    kTest,      // object is [not] name ( items, keywords )
    kUnary,     // op object  (op: "-", "+", "not")
    kBinary,    // object op right  (op: + - * / // % ** ~ and or)
    kCompare,   // object (ops[i] items[i])...  (ops: == != < <= > >= in notin)
    kCondition, // items[0] if object else items[1]  (items[1] may be null)
  };

  Kind kind = Kind::kLiteral;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;  // variable, attribute, filter, test or operator
  ExprPtr object;
  ExprPtr right;
  ExprPtr start, stop, step;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;
  std::vector<std::string> ops;
  bool negated = false;  // `is not`
};

// Where {% for %} and {% set %} bind: one name, several names (unpacking), or ns.attr.
struct Target {
  std::vector<std::string> names;
  std::string attribute;  // non-empty for `set ns.attr = ...` (names holds "ns")
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (cond, body)..., else_body
    kFor,          // target in expr [if filter] body [else else_body]
    kSet,          // target = expr
    kSetBlock,     // {% set target [| filter] %} body {% endset %}; expr is the filter or null
    kMacro,        // name(params) body
    kCallBlock,    // {% call(params) expr %} body
    kFilterBlock,  // {% filter expr %} body
    kWith,         // {% with assignments %} body
    kBreak,
    kContinue,
    kScope,        // a body rendered as is ({% generation %})
  };

  Kind kind = Kind::kText;
  int line = 0;
  int column = 0;
  std::string text;  // text, or macro name
  ExprPtr expr;
  ExprPtr filter;  // for loops: the `if` condition
  Target target;
  Body body;
  Body else_body;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<MacroParam> params;
  std::vector<std::pair<Target, ExprPtr>> assignments;
};

struct Program {
  Body body;
};

}  // namespace vesper::tokenizer::jinja
