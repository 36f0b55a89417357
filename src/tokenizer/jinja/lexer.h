// Lexer: template source -> tokens, with Jinja2's whitespace control already applied.
//
// Text between tags becomes kText tokens; {{ ... }} and {% ... %} become a begin token, the
// expression tokens inside, and an end token; {# ... #} comments vanish; {% raw %} bodies
// become text. Whitespace control follows Jinja2's lexer exactly: '-' on a tag strips all
// whitespace on that side, trim_blocks removes the first newline after a block or comment
// tag, lstrip_blocks removes spaces and tabs between a line start and a block or comment tag,
// '+' turns both off for that tag, and a single trailing newline of the source is dropped
// unless keep_trailing_newline. Newlines (\r\n, \r) are normalized to \n first.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vesper::tokenizer::jinja {

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

enum class TokenType {
  kText,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kInteger,
  kFloat,
  kString,
  kOperator,
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string value;  // text, name, decoded string, or operator spelling
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

// Throws TemplateError (kSyntax) on unterminated tags, strings or comments and on characters
// that start no token.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options);

}  // namespace vesper::tokenizer::jinja
