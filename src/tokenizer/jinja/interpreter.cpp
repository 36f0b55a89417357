#include "tokenizer/jinja/interpreter.h"

#include <limits>
#include <utility>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"

namespace vesper::tokenizer::jinja {

namespace {

// Restores a variable when a scope (or output capture) ends, also on errors.
template <class T>
class Restore {
 public:
  Restore(T& slot, T value) : slot_(slot), saved_(std::move(slot)) { slot_ = std::move(value); }
  ~Restore() { slot_ = std::move(saved_); }
  Restore(const Restore&) = delete;
  Restore& operator=(const Restore&) = delete;

 private:
  T& slot_;
  T saved_;
};

void add_location(TemplateError& e, int line, int column) {
  if (e.line() == 0) e.set_location(line, column);
}

}  // namespace

Interpreter::Interpreter(const RenderOptions& options) : options_(options) {
  if (options.now) {
    now_ = *options.now;
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &now_);
  }
}

std::string Interpreter::render(const Program& program, const Value& variables) {
  globals_ = std::make_shared<Scope>();
  ValueDict globals;
  install_globals(globals);
  for (auto& [k, v] : globals.entries) globals_->vars[k.as_string()] = v;
  root_ = std::make_shared<Scope>();
  root_->parent = globals_;
  if (variables.is_dict()) {
    for (const auto& [k, v] : variables.as_dict().entries) root_->vars[k.to_str()] = v;
  }
  current_ = root_;
  std::string out;
  out_ = &out;
  exec_body(program.body);
  out_ = nullptr;
  return out;
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > options_.limits.max_output_bytes) {
    fail("string of " + std::to_string(bytes) + " bytes exceeds the render limit of " +
         std::to_string(options_.limits.max_output_bytes) + " bytes");
  }
}

void Interpreter::check_items(size_t items) const {
  if (items > options_.limits.max_collection_items) {
    fail("list of " + std::to_string(items) + " items exceeds the render limit of " +
         std::to_string(options_.limits.max_collection_items) + " items");
  }
}

void Interpreter::tick(uint64_t steps) {
  steps_ += steps;
  if (steps_ > options_.limits.max_steps) {
    fail("template exceeded the limit of " + std::to_string(options_.limits.max_steps) +
         " steps (does it loop without end?)");
  }
}

void Interpreter::emit(std::string_view text) {
  out_->append(text);
  if (out_->size() > options_.limits.max_output_bytes) {
    fail("output exceeds the render limit of " + std::to_string(options_.limits.max_output_bytes) +
         " bytes");
  }
}

std::string Interpreter::capture(const Body& body) {
  std::string buffer;
  Restore<std::string*> sink(out_, &buffer);
  exec_body(body);
  return buffer;
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Scope* s = current_.get(); s != nullptr; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::call(const Value& callee, CallArgs& args, std::string_view what) {
  if (callee.is_function()) return callee.as_function().impl(*this, args);
  if (callee.is_undefined()) fail(callee.undefined_hint());
  std::string message = "'";
  message.append(what).append("' (").append(callee.type_name()).append(") is not callable");
  fail(std::move(message));
}

Interpreter::Flow Interpreter::exec_body(const Body& body) {
  for (const auto& s : body) {
    const Flow f = exec(*s);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  tick();
  try {
    switch (s.kind) {
      case Stmt::Kind::kText: emit(s.text); return Flow::kNormal;
      case Stmt::Kind::kOutput: emit(eval(*s.expr).to_str()); return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (eval(*cond).truthy()) return exec_body(body);
        }
        return exec_body(s.else_body);
      case Stmt::Kind::kFor: return exec_for(s);
      case Stmt::Kind::kSet: exec_set(s.target, eval(*s.expr)); return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        Value v = capture(s.body);
        if (s.expr) v = eval_filter(*s.expr, &v);
        exec_set(s.target, std::move(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: current_->vars[s.text] = make_macro(s); return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Value caller = make_macro(s);
        const Expr& call_expr = *s.expr;
        const Value callee = eval(*call_expr.object);
        CallArgs args;
        eval_call_args(call_expr, &args);
        args.keyword.emplace_back("caller", caller);
        emit(call(callee, args, "call block").to_str());
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        const Value body(capture(s.body));
        emit(eval_filter(*s.expr, &body).to_str());
        return Flow::kNormal;
      }
      case Stmt::Kind::kWith: {
        auto scope = std::make_shared<Scope>();
        scope->parent = current_;
        std::vector<Value> values;
        for (const auto& [target, expr] : s.assignments) values.push_back(eval(*expr));
        Restore<std::shared_ptr<Scope>> in_scope(current_, scope);
        for (size_t i = 0; i < values.size(); ++i) exec_set(s.assignments[i].first, values[i]);
        return exec_body(s.body);
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kScope: return exec_body(s.body);
    }
  } catch (TemplateError& e) {
    add_location(e, s.line, s.column);
    throw;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s) {
  const Value iterable = eval(*s.expr);
  ValueList items;
  switch (iterable.kind()) {
    case ValueKind::kList: items = iterable.as_list(); break;
    case ValueKind::kUndefined: break;
    case ValueKind::kString:
    case ValueKind::kDict: {
      CallArgs none;
      items = apply_filter(*this, "list", iterable, none).as_list();
      break;
    }
    default: fail("'" + iterable.type_name() + "' object is not iterable");
  }
  const std::shared_ptr<Scope> outer = current_;
  if (s.filter) {
    ValueList kept;
    for (auto& item : items) {
      tick();
      auto scope = std::make_shared<Scope>();
      scope->parent = outer;
      Restore<std::shared_ptr<Scope>> in_scope(current_, scope);
      exec_set(s.target, item);
      if (eval(*s.filter).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(s.else_body);
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    tick();
    auto scope = std::make_shared<Scope>();
    scope->parent = outer;
    Restore<std::shared_ptr<Scope>> in_scope(current_, scope);
    exec_set(s.target, items[static_cast<size_t>(i)]);
    Value loop = Value::dict();
    ValueDict& d = loop.as_dict();
    d.entries.reserve(12);
    d.entries.emplace_back(Value("index"), Value(i + 1));
    d.entries.emplace_back(Value("index0"), Value(i));
    d.entries.emplace_back(Value("revindex"), Value(n - i));
    d.entries.emplace_back(Value("revindex0"), Value(n - i - 1));
    d.entries.emplace_back(Value("first"), Value(i == 0));
    d.entries.emplace_back(Value("last"), Value(i == n - 1));
    d.entries.emplace_back(Value("length"), Value(n));
    d.entries.emplace_back(Value("previtem"), i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
    d.entries.emplace_back(Value("nextitem"), i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
    d.entries.emplace_back(Value("depth"), Value(1));
    d.entries.emplace_back(Value("depth0"), Value(0));
    d.entries.emplace_back(Value("cycle"), Value::function("cycle", [i](Interpreter&, CallArgs& a) {
                             if (a.positional.empty()) fail("loop.cycle() needs at least one value");
                             return a.positional[static_cast<size_t>(i) % a.positional.size()];
                           }));
    scope->vars["loop"] = std::move(loop);
    if (exec_body(s.body) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interpreter::exec_set(const Target& target, Value value) {
  if (!target.attribute.empty()) {
    const Value ns = lookup(target.names[0]);
    if (!ns.is_namespace()) {
      fail("cannot assign attribute '" + target.attribute + "' on '" + target.names[0] +
           "': only namespace() objects take attribute assignment");
    }
    if (value.is_dict() && &value.as_dict() == &ns.as_dict()) fail("cannot put a namespace inside itself");
    ns.as_dict().set(Value(target.attribute), std::move(value));
    return;
  }
  if (target.names.size() == 1) {
    current_->vars[target.names[0]] = std::move(value);
    return;
  }
  ValueList parts;
  if (value.is_list()) {
    parts = value.as_list();
  } else {
    CallArgs none;
    parts = apply_filter(*this, "list", value, none).as_list();
  }
  if (parts.size() != target.names.size()) {
    fail("cannot unpack " + std::to_string(parts.size()) + " values into " +
         std::to_string(target.names.size()) + " names");
  }
  for (size_t i = 0; i < parts.size(); ++i) current_->vars[target.names[i]] = std::move(parts[i]);
}

Value Interpreter::make_macro(const Stmt& s) {
  std::weak_ptr<Scope> defined_in = current_;
  return Value::function(s.kind == Stmt::Kind::kMacro ? s.text : "caller",
                         [&s, defined_in](Interpreter& in, CallArgs& args) {
                           return in.invoke_macro(s, defined_in, args);
                         });
}

Value Interpreter::invoke_macro(const Stmt& macro, const std::weak_ptr<Scope>& defined_in,
                                CallArgs& args) {
  if (call_depth_ >= options_.limits.max_call_depth) {
    fail("macro calls nest deeper than " + std::to_string(options_.limits.max_call_depth) +
         " (unbounded recursion?)");
  }
  Restore<int> depth(call_depth_, call_depth_ + 1);
  auto scope = std::make_shared<Scope>();
  scope->parent = defined_in.lock();
  if (!scope->parent) scope->parent = root_;
  Restore<std::shared_ptr<Scope>> in_scope(current_, scope);

  ValueList varargs;
  for (size_t i = macro.params.size(); i < args.positional.size(); ++i) varargs.push_back(args.positional[i]);
  Value kwargs = Value::dict();
  for (const auto& [name, value] : args.keyword) {
    bool is_param = name == "caller";
    for (const auto& p : macro.params) is_param = is_param || p.name == name;
    if (!is_param) kwargs.as_dict().set(Value(name), value);
  }
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const MacroParam& p = macro.params[i];
    const Value* given = i < args.positional.size() ? &args.positional[i] : args.get_keyword(p.name);
    if (given != nullptr) {
      scope->vars[p.name] = *given;
    } else if (p.default_value) {
      scope->vars[p.name] = eval(*p.default_value);
    } else {
      scope->vars[p.name] = Value::undefined("macro argument '" + p.name + "' was not given");
    }
  }
  scope->vars["varargs"] = Value::tuple(std::move(varargs));
  scope->vars["kwargs"] = std::move(kwargs);
  if (const Value* caller = args.get_keyword("caller")) scope->vars["caller"] = *caller;
  return Value(capture(macro.body));
}

void Interpreter::eval_call_args(const Expr& e, CallArgs* args) {
  args->positional.reserve(e.items.size());
  for (const auto& item : e.items) args->positional.push_back(eval(*item));
  for (const auto& [name, expr] : e.keywords) args->keyword.emplace_back(name, eval(*expr));
}

Value Interpreter::eval_filter(const Expr& e, const Value* block_input) {
  Value input;
  if (e.object) {
    input = e.object->kind == Expr::Kind::kFilter ? eval_filter(*e.object, block_input) : eval(*e.object);
  } else {
    input = *block_input;
  }
  CallArgs args;
  eval_call_args(e, &args);
  try {
    return apply_filter(*this, e.name, input, args);
  } catch (TemplateError& err) {
    add_location(err, e.line, e.column);
    throw;
  }
}

Value Interpreter::eval(const Expr& e) {
  try {
    return eval_inner(e);
  } catch (TemplateError& err) {
    add_location(err, e.line, e.column);
    throw;
  }
}

Value Interpreter::eval_inner(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: return lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList items;
      items.reserve(e.items.size());
      for (const auto& item : e.items) items.push_back(eval(*item));
      return e.kind == Expr::Kind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case Expr::Kind::kDict: {
      Value d = Value::dict();
      for (const auto& [k, v] : e.pairs) {
        Value key = eval(*k);
        d.as_dict().set(std::move(key), eval(*v));
      }
      return d;
    }
    case Expr::Kind::kGetAttr: return get_attr(eval(*e.object), e.name);
    case Expr::Kind::kGetItem: {
      const Value object = eval(*e.object);
      return get_item(object, eval(*e.right));
    }
    case Expr::Kind::kSlice: {
      const Value object = eval(*e.object);
      const Value start = e.start ? eval(*e.start) : Value();
      const Value stop = e.stop ? eval(*e.stop) : Value();
      const Value step = e.step ? eval(*e.step) : Value();
      return get_slice(object, start, stop, step);
    }
    case Expr::Kind::kCall: {
      const Value callee = eval(*e.object);
      CallArgs args;
      eval_call_args(e, &args);
      std::string what = e.object->kind == Expr::Kind::kName || e.object->kind == Expr::Kind::kGetAttr
                             ? e.object->name
                             : "expression";
      return call(callee, args, what);
    }
    case Expr::Kind::kFilter: return eval_filter(e, nullptr);
    case Expr::Kind::kTest: {
      const Value subject = eval(*e.object);
      CallArgs args;
      eval_call_args(e, &args);
      const bool r = apply_test(*this, e.name, subject, args);
      return e.negated ? !r : r;
    }
    case Expr::Kind::kUnary: {
      const Value v = eval(*e.object);
      if (e.name == "not") return !v.truthy();
      if (v.is_undefined()) fail(v.undefined_hint());
      if (e.name == "+") {
        if (v.is_number()) return v;
        if (v.is_bool()) return int64_t{v.as_bool()};
      } else {
        if (v.is_float()) return -v.as_float();
        if (v.is_int()) {
          if (v.as_int() == std::numeric_limits<int64_t>::min()) fail("integer overflow");
          return -v.as_int();
        }
        if (v.is_bool()) return -int64_t{v.as_bool()};
      }
      fail("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
    }
    case Expr::Kind::kBinary: {
      if (e.name == "and") {
        Value left = eval(*e.object);
        return left.truthy() ? eval(*e.right) : left;
      }
      if (e.name == "or") {
        Value left = eval(*e.object);
        return left.truthy() ? left : eval(*e.right);
      }
      const Value left = eval(*e.object);
      const Value right = eval(*e.right);
      return binary_op(*this, e.name, left, right);
    }
    case Expr::Kind::kCompare: {
      Value left = eval(*e.object);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.items[i]);
        if (!compare_op(e.ops[i], left, right)) return false;
        left = std::move(right);
      }
      return true;
    }
    case Expr::Kind::kCondition:
      if (eval(*e.object).truthy()) return eval(*e.items[0]);
      return e.items[1] ? eval(*e.items[1]) : Value::undefined("the condition was false and there is no else");
  }
  return Value();
}

}  // namespace vesper::tokenizer::jinja
