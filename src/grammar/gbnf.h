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
// column 9: undefined rule 'valeu'"), and refuse left recursion ("rule 'expr' is left-recursive";
// an unbounded repetition of something that can match the empty string, which is left
// recursion too, is named as such: "line 1, column 10: rule 'root' repeats, with '*', something
// that can match the empty string ...") and grammars without a `root` rule. limits.h bounds
// the text, the nesting of groups and repetitions, and the grammar's elements, rules and
// alternatives; the latter are counted from the parsed text before the grammar is built, so a
// grammar over them costs no more than reading it ("the grammar has 260,001 elements, more than
// the limit of 250,000").
//
// Alternatives that begin with the same elements are left-factored (they share the beginning
// and branch after it, as a trie): the language is unchanged, and a choice among many literals
// (an enum, a choice list) keeps one matcher stack instead of one per literal.
Result<Grammar> parse_gbnf(std::string_view text);

// A literal as GBNF text: `"` + escaped bytes + `"` (what converters emitting GBNF use).
std::string gbnf_literal(std::string_view text);

}  // namespace vesper::grammar
