// Parser: tokens -> syntax tree, with Jinja2's grammar and operator precedence (filters and
// tests bind tighter than arithmetic; `not` looser than comparisons). Unknown filters and
// tests are rejected here, like Jinja2 does at compile time. Throws TemplateError (kSyntax)
// naming the line and column of the offending token.
#pragma once

#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace vesper::tokenizer::jinja {

Program parse_tokens(const std::vector<Token>& tokens);

}  // namespace vesper::tokenizer::jinja
