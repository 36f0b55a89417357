// GBNF: llama.cpp's grammar text format, parsed into a byte-level Grammar.
//
// The dialect (llama.cpp's grammars/README.md):
//   root ::= item ("," item)*        # rules: name ::= alternatives; `root` is the start
//   item ::= "lit\n" | [a-z0-9_] | [^"\\] | . | other-rule | ( group ) | x* | x+ | x? | x{m} |
//            x{m,} | x{m,n}
// Literals and classes take escapes \n \r \t \\ \" \] \- \[ \xHH \uHHHH \UHHHHHHHH; `.` is any
// Unicode code point; classes are sets of code points (UTF-8 encoded by the compiler, so a
// grammar matches bytes); `#` starts a comment to the end of the line; rule names are
// [A-Za-z0-9-_]+ and may be used before their definition. Newlines end a rule only where the
// next line starts a new `name ::=` (an alternative may continue on the next line after `|`
// or inside parentheses, as llama.cpp allows).
#pragma once

#include <string>
#include <string_view>

#include "core/result.h"
#include "grammar/grammar.h"

namespace vesper::grammar {

// Parses and compiles `text`. Errors name the line and column and what is wrong ("line 3,
// column 9: undefined rule 'valeu'"), and refuse left recursion ("rule 'expr' is left-recursive")
// and grammars without a `root` rule.
Result<Grammar> parse_gbnf(std::string_view text);

// A literal as GBNF text: `"` + escaped bytes + `"` (what converters emitting GBNF use).
std::string gbnf_literal(std::string_view text);

}  // namespace vesper::grammar
