#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"

namespace vesper::tokenizer::jinja {

namespace {

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : toks_(tokens) {}

  Program run() {
    Program program;
    std::string end;
    program.body = parse_body({}, &end);
    return program;
  }

 private:
  // RAII guard against stack exhaustion on pathological nesting.
  struct Nest {
    explicit Nest(Parser* p) : parser(p) {
      if (++parser->nesting_ > kMaxNesting) parser->fail("template nests too deeply");
    }
    ~Nest() { --parser->nesting_; }
    Parser* parser;
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t ahead = 1) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  const Token& advance() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }

  bool is_op(std::string_view op) const {
    return cur().type == TokenType::kOperator && cur().value == op;
  }
  bool is_name(std::string_view name) const {
    return cur().type == TokenType::kName && cur().value == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kText: return "text";
      case TokenType::kVariableBegin: return "'{{'";
      case TokenType::kVariableEnd: return "'}}'";
      case TokenType::kBlockBegin: return "'{%'";
      case TokenType::kBlockEnd: return "'%}'";
      case TokenType::kName: return "'" + t.value + "'";
      case TokenType::kInteger: return "integer " + t.value;
      case TokenType::kFloat: return "number " + t.value;
      case TokenType::kString: return "string literal";
      case TokenType::kOperator: return "'" + t.value + "'";
      case TokenType::kEof: return "end of template";
    }
    return "token";
  }

  [[noreturn]] void fail(const std::string& message) const { fail_at(cur(), message); }
  [[noreturn]] static void fail_at(const Token& t, const std::string& message) {
    throw TemplateError(TemplateError::Kind::kSyntax, message, t.line, t.column);
  }

  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail("expected '" + std::string(op) + "', got " + describe(cur()));
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) fail("expected '%}', got " + describe(cur()));
    advance();
  }
  std::string expect_identifier() {
    if (cur().type != TokenType::kName) fail("expected a name, got " + describe(cur()));
    return advance().value;
  }

  template <class T>
  std::unique_ptr<T> make(const Token& at) {
    auto node = std::make_unique<T>();
    node->line = at.line;
    node->column = at.column;
    return node;
  }

  ExprPtr make_expr(Expr::Kind kind, const Token& at) {
    auto e = make<Expr>(at);
    e->kind = kind;
    return e;
  }

  // Statements until a block tag named in `ends` (its name is left as the current token and
  // stored in *end) or, with no `ends`, until the end of the template.
  Body parse_body(std::initializer_list<std::string_view> ends, std::string* end) {
    Nest nest(this);
    Body body;
    while (true) {
      const Token& t = cur();
      switch (t.type) {
        case TokenType::kEof:
          if (ends.size() != 0) {
            std::string expected;
            for (const auto e : ends) expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
            fail("unexpected end of template, expected " + expected);
          }
          return body;
        case TokenType::kText: {
          auto s = make<Stmt>(t);
          s->kind = Stmt::Kind::kText;
          s->text = t.value;
          advance();
          body.push_back(std::move(s));
          break;
        }
        case TokenType::kVariableBegin: {
          auto s = make<Stmt>(t);
          s->kind = Stmt::Kind::kOutput;
          advance();
          s->expr = parse_tuple(true, false);
          if (cur().type != TokenType::kVariableEnd) fail("expected '}}', got " + describe(cur()));
          advance();
          body.push_back(std::move(s));
          break;
        }
        case TokenType::kBlockBegin: {
          const Token& name = peek();
          if (name.type != TokenType::kName) fail_at(name, "expected a tag name, got " + describe(name));
          if (std::find(ends.begin(), ends.end(), name.value) != ends.end()) {
            advance();
            *end = name.value;
            return body;
          }
          advance();
          body.push_back(parse_statement());
          break;
        }
        default: fail("unexpected " + describe(t));
      }
    }
  }

  // Consumes the end tag name left by parse_body and the '%}' after it.
  void finish_end_tag() {
    advance();
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    const std::string tag = t.value;
    advance();
    auto s = make<Stmt>(t);
    std::string end;
    if (tag == "if") {
      s->kind = Stmt::Kind::kIf;
      ExprPtr cond = parse_expression();
      expect_block_end();
      Body body = parse_body({"elif", "else", "endif"}, &end);
      s->branches.emplace_back(std::move(cond), std::move(body));
      while (end == "elif") {
        advance();
        cond = parse_expression();
        expect_block_end();
        body = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(body));
      }
      if (end == "else") {
        advance();
        expect_block_end();
        s->else_body = parse_body({"endif"}, &end);
      }
      finish_end_tag();
    } else if (tag == "for") {
      s->kind = Stmt::Kind::kFor;
      s->target = parse_target(false);
      if (!skip_name("in")) fail("expected 'in' in for loop, got " + describe(cur()));
      s->expr = parse_tuple(false, false);
      if (skip_name("if")) s->filter = parse_expression();
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"endfor", "else"}, &end);
      --loop_depth_;
      if (end == "else") {
        advance();
        expect_block_end();
        s->else_body = parse_body({"endfor"}, &end);
      }
      finish_end_tag();
    } else if (tag == "set") {
      s->target = parse_target(true);
      if (skip_op("=")) {
        s->kind = Stmt::Kind::kSet;
        s->expr = parse_tuple(true, false);
        expect_block_end();
      } else {
        s->kind = Stmt::Kind::kSetBlock;
        if (!s->target.attribute.empty() || s->target.names.size() != 1) {
          fail("a block {% set %} assigns exactly one plain name");
        }
        if (is_op("|")) s->expr = parse_filter_chain(nullptr);
        expect_block_end();
        s->body = parse_body({"endset"}, &end);
        finish_end_tag();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->text = expect_identifier();
      s->params = parse_params();
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_body({"endmacro"}, &end);
      loop_depth_ = saved;
      finish_end_tag();
    } else if (tag == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (is_op("(")) s->params = parse_params();
      const Token& at = cur();
      s->expr = parse_expression();
      if (s->expr->kind != Expr::Kind::kCall) fail_at(at, "{% call %} expects a macro call");
      expect_block_end();
      s->body = parse_body({"endcall"}, &end);
      finish_end_tag();
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->expr = parse_filter_chain(nullptr, /*leading_pipe=*/false);
      expect_block_end();
      s->body = parse_body({"endfilter"}, &end);
      finish_end_tag();
    } else if (tag == "with") {
      s->kind = Stmt::Kind::kWith;
      while (cur().type != TokenType::kBlockEnd) {
        if (!s->assignments.empty()) expect_op(",");
        Target target = parse_target(false);
        expect_op("=");
        s->assignments.emplace_back(std::move(target), parse_expression());
      }
      expect_block_end();
      s->body = parse_body({"endwith"}, &end);
      finish_end_tag();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail_at(t, "'" + tag + "' outside of a loop");
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_block_end();
    } else if (tag == "generation") {
      s->kind = Stmt::Kind::kScope;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, &end);
      finish_end_tag();
    } else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
               tag == "block" || tag == "autoescape" || tag == "do") {
      fail_at(t, "the '" + tag + "' tag is not supported");
    } else {
      fail_at(t, "unknown tag '" + tag + "'");
    }
    return s;
  }

  Target parse_target(bool allow_attribute) {
    Target target;
    const bool parens = skip_op("(");
    target.names.push_back(expect_identifier());
    if (allow_attribute && !parens && skip_op(".")) {
      target.attribute = expect_identifier();
      return target;
    }
    while (skip_op(",")) {
      if (cur().type != TokenType::kName) break;
      target.names.push_back(expect_identifier());
    }
    if (parens) expect_op(")");
    return target;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_identifier();
      if (skip_op("=")) p.default_value = parse_expression();
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  // Comma-separated expressions; a comma makes a tuple.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens) {
    const Token& at = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        is_tuple = true;
      }
      if (!can_start_expression()) {
        if (items.empty() && !explicit_parens) fail("expected an expression, got " + describe(cur()));
        break;
      }
      items.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    if (!is_tuple && items.size() == 1) return std::move(items[0]);
    auto e = make_expr(Expr::Kind::kTuple, at);
    e->items = std::move(items);
    return e;
  }

  bool can_start_expression() const {
    const Token& t = cur();
    switch (t.type) {
      case TokenType::kName:
      case TokenType::kString:
      case TokenType::kInteger:
      case TokenType::kFloat: return true;
      case TokenType::kOperator:
        return t.value == "(" || t.value == "[" || t.value == "{" || t.value == "-" || t.value == "+";
      default: return false;
    }
  }

  ExprPtr parse_expression() {
    Nest nest(this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Token& at = advance();
      auto cond = make_expr(Expr::Kind::kCondition, at);
      cond->object = parse_or();
      cond->items.push_back(std::move(e));
      cond->items.push_back(skip_name("else") ? parse_expression() : nullptr);
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr binary(const Token& at, std::string op, ExprPtr left, ExprPtr right) {
    auto e = make_expr(Expr::Kind::kBinary, at);
    e->name = std::move(op);
    e->object = std::move(left);
    e->right = std::move(right);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Token& at = advance();
      left = binary(at, "or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Token& at = advance();
      left = binary(at, "and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    Nest nest(this);
    if (is_name("not")) {
      const Token& at = advance();
      auto e = make_expr(Expr::Kind::kUnary, at);
      e->name = "not";
      e->object = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr left = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOperator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
           cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        op = advance().value;
      } else if (is_name("in")) {
        advance();
        op = "in";
      } else if (is_name("not") && peek().type == TokenType::kName && peek().value == "in") {
        advance();
        advance();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(Expr::Kind::kCompare, at);
        cmp->object = std::move(left);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(left);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = advance();
      left = binary(at, at.value, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token& at = advance();
      left = binary(at, "~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = advance();
      left = binary(at, at.value, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& at = advance();
      left = binary(at, "**", std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& at = advance();
      node = make_expr(Expr::Kind::kUnary, at);
      node->name = at.value;
      node->object = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    Nest nest(this);
    const Token& t = cur();
    switch (t.type) {
      case TokenType::kName: {
        advance();
        auto e = make_expr(Expr::Kind::kLiteral, t);
        if (t.value == "true" || t.value == "True") {
          e->literal = Value(true);
        } else if (t.value == "false" || t.value == "False") {
          e->literal = Value(false);
        } else if (t.value == "none" || t.value == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.value;
        }
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (cur().type == TokenType::kString) s += advance().value;
        auto e = make_expr(Expr::Kind::kLiteral, t);
        e->literal = Value(std::move(s));
        return e;
      }
      case TokenType::kInteger: {
        advance();
        auto e = make_expr(Expr::Kind::kLiteral, t);
        e->literal = Value(t.int_value);
        return e;
      }
      case TokenType::kFloat: {
        advance();
        auto e = make_expr(Expr::Kind::kLiteral, t);
        e->literal = Value(t.float_value);
        return e;
      }
      case TokenType::kOperator:
        if (t.value == "(") {
          advance();
          ExprPtr e = parse_tuple(true, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          advance();
          auto e = make_expr(Expr::Kind::kList, t);
          while (!is_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("]")) break;
            e->items.push_back(parse_expression());
          }
          expect_op("]");
          return e;
        }
        if (t.value == "{") {
          advance();
          auto e = make_expr(Expr::Kind::kDict, t);
          while (!is_op("}")) {
            if (!e->pairs.empty()) expect_op(",");
            if (is_op("}")) break;
            ExprPtr key = parse_expression();
            expect_op(":");
            e->pairs.emplace_back(std::move(key), parse_expression());
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const Token& at = advance();
        if (cur().type == TokenType::kName) {
          auto e = make_expr(Expr::Kind::kGetAttr, at);
          e->object = std::move(node);
          e->name = advance().value;
          node = std::move(e);
        } else if (cur().type == TokenType::kInteger) {
          auto e = make_expr(Expr::Kind::kGetItem, at);
          e->object = std::move(node);
          auto index = make_expr(Expr::Kind::kLiteral, cur());
          index->literal = Value(advance().int_value);
          e->right = std::move(index);
          node = std::move(e);
        } else {
          fail("expected an attribute name after '.', got " + describe(cur()));
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& at = advance();  // '['
    ExprPtr start;
    if (!is_op(":")) start = parse_expression();
    if (!is_op(":")) {
      expect_op("]");
      auto e = make_expr(Expr::Kind::kGetItem, at);
      e->object = std::move(node);
      e->right = std::move(start);
      return e;
    }
    advance();  // ':'
    auto e = make_expr(Expr::Kind::kSlice, at);
    e->object = std::move(node);
    e->start = std::move(start);
    if (!is_op(":") && !is_op("]")) e->stop = parse_expression();
    if (skip_op(":")) {
      if (!is_op("]")) e->step = parse_expression();
    }
    expect_op("]");
    return e;
  }

  void parse_call_args(Expr* e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e->items.empty() || !e->keywords.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator && peek().value == "=") {
        std::string name = advance().value;
        advance();
        e->keywords.emplace_back(std::move(name), parse_expression());
      } else {
        if (!e->keywords.empty()) fail("positional argument follows keyword argument");
        e->items.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make_expr(Expr::Kind::kCall, cur());
    e->object = std::move(node);
    parse_call_args(e.get());
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node), true, /*single=*/true);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // One filter (`single`) or a chain of them; `node` may be null inside {% filter %}.
  ExprPtr parse_filter_chain(ExprPtr node, bool leading_pipe = true, bool single = false) {
    bool first = true;
    while (true) {
      if (!first || leading_pipe) {
        if (!skip_op("|")) break;
      }
      first = false;
      const Token& at = cur();
      std::string name = expect_identifier();
      while (is_op(".")) {
        advance();
        name.push_back('.');
        name += expect_identifier();
      }
      if (!has_filter(name)) fail_at(at, "no filter named '" + name + "'");
      auto e = make_expr(Expr::Kind::kFilter, at);
      e->name = std::move(name);
      e->object = std::move(node);
      if (is_op("(")) parse_call_args(e.get());
      node = std::move(e);
      if (single) break;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    advance();  // 'is'
    auto e = make_expr(Expr::Kind::kTest, cur());
    e->negated = skip_name("not");
    const Token& at = cur();
    e->name = expect_identifier();
    if (!has_test(e->name)) fail_at(at, "no test named '" + e->name + "'");
    e->object = std::move(node);
    if (is_op("(")) {
      parse_call_args(e.get());
    } else {
      const Token& t = cur();
      const bool starts_arg =
          t.type == TokenType::kString || t.type == TokenType::kInteger || t.type == TokenType::kFloat ||
          (t.type == TokenType::kOperator && (t.value == "[" || t.value == "{")) ||
          (t.type == TokenType::kName && t.value != "else" && t.value != "or" && t.value != "and" &&
           t.value != "if" && t.value != "is" && t.value != "in" && t.value != "not");
      if (starts_arg) e->items.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Program parse_tokens(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace vesper::tokenizer::jinja
