// The tree-walking interpreter behind Template::render. One Interpreter per render call: it
// owns the scopes, the output buffers and the step and depth budgets. Scoping follows
// Jinja2: a for-loop iteration, a macro call and a {% with %} each open a scope, so a
// {% set %} inside them is not seen outside (namespace() objects are how templates carry
// state out); `if` opens none.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/template.h"

namespace vesper::tokenizer::jinja {

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);

  // Renders `program` with `variables` (a dict). Throws TemplateError.
  std::string render(const Program& program, const Value& variables);

  Value call(const Value& callee, CallArgs& args, std::string_view what);
  const std::tm& now() const { return now_; }
  // Throw when a string of `bytes` or a list of `items` would pass the render limits.
  void check_size(size_t bytes) const;
  void check_items(size_t items) const;
  void tick(uint64_t steps = 1);

 private:
  struct Scope {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Scope> parent;
  };
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Target& target, Value value);
  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  Value eval_filter(const Expr& e, const Value* block_input);
  void eval_call_args(const Expr& e, CallArgs* args);
  Value lookup(const std::string& name) const;
  // A macro (or the caller() of a {% call %} block) as a function value.
  Value make_macro(const Stmt& s);
  Value invoke_macro(const Stmt& macro, const std::weak_ptr<Scope>& defined_in, CallArgs& args);
  std::string capture(const Body& body);
  void emit(std::string_view text);

  RenderOptions options_;
  std::tm now_{};
  std::shared_ptr<Scope> globals_;
  std::shared_ptr<Scope> root_;
  std::shared_ptr<Scope> current_;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace vesper::tokenizer::jinja
