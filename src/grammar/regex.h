// Regular expressions to GBNF: the ECMAScript subset that JSON Schema's `pattern`, xgrammar and
// llama.cpp's json-schema-to-grammar accept, converted to one GBNF expression (inline groups and
// operators only, no rule definitions) whose language is the set of strings the regex fully
// matches.
//
// Supported: literal characters (UTF-8), escapes \d \D \w \W \s \S \n \t \r \f \v \0 \cX \xHH
// \uHHHH \u{H...} (surrogate pairs combine) and escaped metacharacters or punctuation, classes
// [...] with ranges, negation and escapes (\d etc. and \b = backspace inside them), `.` (any code
// point except \n), groups (...) (?:...) (?<name>...) (?P<name>...), alternation (empty branches
// too), quantifiers * + ? {m} {m,} {m,n} and their lazy forms (a trailing ?: same language).
// A leading ^ and a trailing $ (of the regex or of a top-level alternative) are accepted.
// Following ECMAScript's Annex B, a `{` that does not start a quantifier and a lone `]` or `}`
// are literals, and a `-` next to a class escape inside a class is a literal. As in PCRE and
// Python, a `]` right after `[` or `[^` is a literal member (ECMAScript's empty classes [] and
// [^] are not supported).
//
// Refused, with an error naming the construct and its 0-based position in code points:
// backreferences, lookahead/lookbehind, atomic groups, inline flags, \b \B outside classes,
// \p{...}, octal escapes, anchors anywhere else, possessive quantifiers, a quantifier on nothing
// or directly on another quantifier, unbalanced parentheses and brackets, ranges out of order,
// {n,m} with n > m, repetition counts above 10000, invalid UTF-8.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "grammar/utf8_ranges.h"

namespace vesper::grammar {

struct RegexOptions {
  // false: full match (a leading ^ and trailing $ change nothing). true: ECMAScript search
  // semantics, which JSON Schema's `pattern` has: a top-level alternative that does not start
  // with ^ may be preceded by any text, one that does not end with $ may be followed by any.
  bool search = false;
  // false: the expression matches the characters themselves. true: it matches them as written
  // between the quotes of a JSON string, each character in one canonical spelling
  // (json_string_char_expression): raw where JSON allows it, escaped where JSON requires it.
  bool json_string = false;
};

// The regex as one GBNF expression, full-match semantics (RegexOptions{}).
Result<std::string> regex_to_gbnf_expression(std::string_view regex);
Result<std::string> regex_to_gbnf_expression(std::string_view regex, const RegexOptions& options);

// A complete grammar: "root ::= <expression>\n".
Result<std::string> regex_to_gbnf(std::string_view regex);

// Spelling characters inside JSON strings, shared with the JSON schema converter. Every code
// point has exactly one canonical spelling, so that comparing spellings compares strings:
//  - " and \ and U+0008 U+0009 U+000A U+000C U+000D: their short escapes (\" \\ \b \t \n \f \r);
//  - other code points below U+0020, and U+007F: \u00XX with lowercase hex digits;
//  - everything else: raw UTF-8 (never \/ and never \uXXXX).

// One character of `chars` (normalized ranges) in its canonical spelling, as one GBNF item
// (parenthesized when it has alternatives); `[]` (matches nothing) when `chars` is empty.
std::string json_string_char_expression(const CodepointRanges& chars);
// Appends the canonical spelling of `cp` (the text between a JSON string's quotes) to `out`.
void append_json_string_char(uint32_t cp, std::string& out);

// The code points of UTF-8 `text`; nullopt when it is not valid UTF-8 (overlong forms,
// surrogates and truncated sequences included).
std::optional<std::vector<uint32_t>> decode_utf8(std::string_view text);

}  // namespace vesper::grammar
