#include "tokenizer/jinja/template.h"

#include <exception>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"

namespace vesper::tokenizer::jinja {

Result<Template> Template::parse(std::string_view source, const TemplateOptions& options) {
  try {
    LexerOptions lex;
    lex.trim_blocks = options.trim_blocks;
    lex.lstrip_blocks = options.lstrip_blocks;
    lex.keep_trailing_newline = options.keep_trailing_newline;
    auto program = std::make_shared<Program>(parse_tokens(tokenize(source, lex)));
    Template t;
    t.program_ = std::move(program);
    return t;
  } catch (const TemplateError& e) {
    return make_error("line " + std::to_string(e.line()) + ", column " + std::to_string(e.column()) +
                      ": " + e.message());
  } catch (const std::exception& e) {
    return make_error(std::string("template parse failed: ") + e.what());
  }
}

Result<std::string> Template::render(const Value& variables, const RenderOptions& options,
                                     RenderErrorKind* error_kind) const {
  if (error_kind != nullptr) *error_kind = RenderErrorKind::kRuntime;
  if (!program_) return make_error("render of a template that was never parsed");
  if (!variables.is_dict()) return make_error("template variables must be a dict");
  try {
    Interpreter interpreter(options);
    return interpreter.render(*program_, variables);
  } catch (const TemplateError& e) {
    if (error_kind != nullptr && e.kind() == TemplateError::Kind::kRaised) {
      *error_kind = RenderErrorKind::kRaised;
    }
    return make_error("line " + std::to_string(e.line()) + ": " + e.message());
  } catch (const std::bad_alloc&) {
    return make_error("template render ran out of memory");
  } catch (const std::exception& e) {
    return make_error(std::string("template render failed: ") + e.what());
  }
}

}  // namespace vesper::tokenizer::jinja
