#include "grammar/regex.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar/gbnf.h"

namespace vesper::grammar {
namespace {

// Converts `regex` with `options` into "root ::= <expression>" and checks the language: every
// string of `yes` matches, none of `no` does.
void expect_language(std::string_view regex, const std::vector<std::string>& yes,
                     const std::vector<std::string>& no, const RegexOptions& options = {}) {
  SCOPED_TRACE("regex: " + std::string(regex));
  auto expr = regex_to_gbnf_expression(regex, options);
  ASSERT_TRUE(expr.ok()) << expr.error().message;
  const std::string text = "root ::= " + *expr + "\n";
  SCOPED_TRACE("grammar: " + text);
  auto g = parse_gbnf(text);
  ASSERT_TRUE(g.ok()) << g.error().message;
  for (const std::string& s : yes) EXPECT_TRUE(g->matches(s)) << "should match: " << s;
  for (const std::string& s : no) EXPECT_FALSE(g->matches(s)) << "should not match: " << s;
}

std::string regex_error(std::string_view regex) {
  auto expr = regex_to_gbnf_expression(regex);
  EXPECT_FALSE(expr.ok()) << regex << " converted to " << (expr.ok() ? *expr : "");
  return expr.ok() ? "" : expr.error().message;
}

TEST(Regex, LiteralsMatchTheWholeText) {
  expect_language("abc", {"abc"}, {"", "ab", "abcd", "xabc"});
  expect_language("^abc$", {"abc"}, {"ab", "abcd", "xabc"});
  expect_language("", {""}, {"a"});
}

TEST(Regex, CompleteGrammarHasARootRule) {
  auto text = regex_to_gbnf("a|b");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->rfind("root ::= ", 0), 0u);
  EXPECT_EQ(text->back(), '\n');
  auto g = parse_gbnf(*text);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(g->matches("b"));
  EXPECT_FALSE(g->matches("ab"));
}

TEST(Regex, AlternationIncludingEmptyBranches) {
  expect_language("cat|dog", {"cat", "dog"}, {"catdog", "ca", ""});
  expect_language("a|b|", {"", "a", "b"}, {"ab"});
  expect_language("(|x)y", {"y", "xy"}, {"x", "xxy"});
  expect_language("^a$|^b$", {"a", "b"}, {"ab"});
  expect_language("x(a|)(|b)", {"x", "xa", "xb", "xab"}, {"xba"});
}

TEST(Regex, Quantifiers) {
  expect_language("ab*c", {"ac", "abc", "abbbbc"}, {"abbb", "bc"});
  expect_language("ab+c", {"abc", "abbc"}, {"ac"});
  expect_language("ab?c", {"ac", "abc"}, {"abbc"});
  expect_language("x{3}", {"xxx"}, {"xx", "xxxx"});
  expect_language("x{2,}", {"xx", "xxxxxxx"}, {"x"});
  expect_language("x{1,3}", {"x", "xxx"}, {"", "xxxx"});
  expect_language("ax{0}b", {"ab"}, {"axb"});
  expect_language("(ab){2}", {"abab"}, {"ab", "ababab"});
}

TEST(Regex, LazyQuantifiersMatchTheSameStrings) {
  expect_language("a*?b", {"b", "aab"}, {"a"});
  expect_language("a+?", {"a", "aa"}, {""});
  expect_language("a??b", {"b", "ab"}, {"aab"});
  expect_language("a{1,2}?", {"a", "aa"}, {"aaa"});
}

TEST(Regex, NestedQuantifiersOverEmptyMatches) {
  // x* with x able to match nothing would be a left-recursive GBNF rule.
  expect_language("(a*)*", {"", "a", "aaaa"}, {"b"});
  expect_language("(a?b?)+", {"", "a", "b", "ab", "abba", "bbaa"}, {"c"});
  expect_language("(a|b*)*c", {"c", "ac", "bbc", "abababc"}, {"", "ca"});
  expect_language("((ab)*c?)*", {"", "ab", "c", "abcab", "cc"}, {"a", "ba"});
  expect_language("(x{0,2}){3}", {"", "x", "xxxxxx"}, {"xxxxxxx"});
  expect_language("(a*){2,3}b", {"b", "aaab"}, {"a"});
  expect_language("((a+)+)+", {"a", "aaa"}, {""});
}

TEST(Regex, CharacterClasses) {
  expect_language("[a-c]+", {"abc", "cab"}, {"abd", ""});
  expect_language("[^a-c]", {"d", "\n", "é"}, {"a", "c", "dd"});
  expect_language("[a-c-]", {"a", "-"}, {"d"});
  expect_language("[-a]", {"a", "-"}, {"b"});
  expect_language("[a-z-0]", {"q", "-", "0"}, {"1"});
  expect_language("[]a]", {"]", "a"}, {"b", "[]a]"});
  expect_language("[^]a]", {"b"}, {"]", "a"});
  expect_language("[\\]\\-\\[]", {"]", "-", "["}, {"\\"});
  expect_language("[\\d.]+", {"1.5", "..."}, {"a"});
  expect_language("[^\\d]", {"a", " "}, {"5"});
  expect_language("[\\w-]+", {"snake_case-name9"}, {"a b"});
  expect_language("[a-\\d]", {"a", "-", "7"}, {"b"});  // Annex B: '-' beside \d is literal
  expect_language("[\\s]", {" ", "\t", "\xE3\x80\x80"}, {"a"});
  expect_language("[\\b]", {"\b"}, {"b"});
  expect_language("[.*+?()|{}^$]+", {".*+?()|{}^$"}, {"a"});
}

TEST(Regex, ShorthandEscapes) {
  expect_language("\\d\\D", {"1a", "9 "}, {"12", "a1"});
  expect_language("\\w\\W", {"a-", "_ "}, {"ab", "-a"});
  expect_language("\\s\\S", {" x", "\nx", "\xC2\xA0x"}, {"x ", "  "});
}

TEST(Regex, EscapedCharacters) {
  expect_language("a\\.b", {"a.b"}, {"axb"});
  expect_language("\\\\\\/\\-\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$", {"\\/-*+?()[]{}|^$"}, {});
  expect_language("\\n\\t\\r\\f\\v\\0", {std::string("\n\t\r\f\v\0", 6)}, {"ntrfv0"});
  expect_language("\\x41\\u00e9\\u{1F600}", {"Aé😀"}, {"A"});
  expect_language("\\uD83D\\uDE00", {"😀"}, {"\xED\xA0\xBD\xED\xB8\x80"});
  expect_language("\\cJ", {"\n"}, {"J"});
  expect_language("\"quoted\"", {"\"quoted\""}, {"quoted"});
  expect_language("a#b", {"a#b"}, {"a"});
}

TEST(Regex, DotIsAnyCodePointButNewline) {
  expect_language("a.c", {"abc", "a c", "a€c", "a😀c"}, {"a\nc", "ac", "abbc"});
}

TEST(Regex, UnicodePassesThrough) {
  expect_language("héllo wörld", {"héllo wörld"}, {"hello world"});
  expect_language("[α-ω]+", {"λογος"}, {"logos", "ΛΟΓΟΣ"});
  expect_language("😀+|日本", {"😀😀", "日本"}, {"日", "😀日本"});
  expect_language("[^😀]", {"a", "😁"}, {"😀"});
}

TEST(Regex, Groups) {
  expect_language("(?:ab)+", {"ab", "abab"}, {"a"});
  expect_language("(?<year>\\d{4})-(?<month>\\d{2})", {"2024-01"}, {"24-01"});
  expect_language("(?P<x>a|b)c", {"ac", "bc"}, {"c"});
  expect_language("((a)(b(c)))", {"abc"}, {"ab"});
}

TEST(Regex, BracesThatAreNotQuantifiersAreLiterals) {
  expect_language("a{,2}", {"a{,2}"}, {"a", "aa"});
  expect_language("x{", {"x{"}, {"x"});
  expect_language("{}", {"{}"}, {""});
  expect_language("a{2, 3}", {"a{2, 3}"}, {"aa"});
  expect_language("a]b}", {"a]b}"}, {"ab"});
}

TEST(Regex, SearchSemanticsLeaveUnanchoredEndsOpen) {
  RegexOptions search;
  search.search = true;
  expect_language("b+", {"b", "abc", "xbbby"}, {"", "ac"}, search);
  expect_language("^b", {"b", "bc"}, {"ab"}, search);
  expect_language("b$", {"b", "ab"}, {"bc"}, search);
  expect_language("^b$", {"b"}, {"ab", "bc"}, search);
  expect_language("^a|b$", {"a", "ax", "b", "xb"}, {"xa", "bx"}, search);
}

TEST(Regex, JsonStringSpellingEscapesWhatJsonMustEscape) {
  RegexOptions json;
  json.json_string = true;
  // The matched characters are written as inside a JSON string.
  expect_language("[^,]+", {"a", "a\\\"b", "a\\\\b", "a\\nb", "a\\u0001", "a\\u007f", "é"},
                  {"a,b", "a\"b", "a\\qb", "a\\", "a\nb", "a\\/b", "a\\u0041", "a\\u001F"}, json);
  expect_language("\"x\"", {"\\\"x\\\""}, {"\"x\""}, json);
  expect_language("a.b", {"a\\tb", "a\\\"b"}, {"a\\nb", "a\nb"}, json);
}

TEST(Regex, JsonStringCharExpression) {
  const std::string text =
      "root ::= " + json_string_char_expression(normalize({{0, 0x10FFFF}})) + "*\n";
  auto g = parse_gbnf(text);
  ASSERT_TRUE(g.ok()) << g.error().message << "\n" << text;
  EXPECT_TRUE(g->matches("plain é 😀 \\\" \\\\ \\b \\f \\n \\r \\t \\u0000 \\u001f \\u007f /"));
  EXPECT_FALSE(g->matches("\""));
  EXPECT_FALSE(g->matches("\\"));
  EXPECT_FALSE(g->matches("\\/"));      // '/' is written raw
  EXPECT_FALSE(g->matches("\\u0041"));  // 'A' is written raw
  EXPECT_FALSE(g->matches("\\u000a"));  // newline is written \n
  EXPECT_FALSE(g->matches("\\u001F"));  // lowercase hex only
  EXPECT_FALSE(g->matches("\x7F"));
  EXPECT_FALSE(g->matches("\n"));

  std::string spelled;
  append_json_string_char('"', spelled);
  append_json_string_char('\n', spelled);
  append_json_string_char(0x1F, spelled);
  append_json_string_char(0x7F, spelled);
  append_json_string_char(0xE9, spelled);
  EXPECT_EQ(spelled, "\\\"\\n\\u001f\\u007f\xC3\xA9");
  EXPECT_EQ(json_string_char_expression({}), "[]");
}

TEST(Regex, DecodeUtf8RejectsInvalidText) {
  EXPECT_EQ(decode_utf8("aé😀").value(), (std::vector<uint32_t>{'a', 0xE9, 0x1F600}));
  EXPECT_FALSE(decode_utf8("\xC0\x80").has_value());      // overlong
  EXPECT_FALSE(decode_utf8("\xED\xA0\x80").has_value());  // surrogate
  EXPECT_FALSE(decode_utf8("\xE2\x82").has_value());      // truncated
  EXPECT_FALSE(regex_to_gbnf_expression("a\xFF").ok());
}

TEST(Regex, UnsupportedConstructsNameThemselvesAndTheirPosition) {
  EXPECT_EQ(regex_error("(a)b\\1"), "regex: backreference \\1 at position 4 is not supported");
  EXPECT_EQ(regex_error("(?<n>a)\\k<n>"),
            "regex: named backreference \\k<...> at position 7 is not supported");
  EXPECT_EQ(regex_error("a(?=b)"), "regex: lookahead (?= at position 1 is not supported");
  EXPECT_EQ(regex_error("a(?!b)"), "regex: negative lookahead (?! at position 1 is not supported");
  EXPECT_EQ(regex_error("(?<=a)b"), "regex: lookbehind (?<= at position 0 is not supported");
  EXPECT_EQ(regex_error("(?<!a)b"),
            "regex: negative lookbehind (?<! at position 0 is not supported");
  EXPECT_EQ(regex_error("\\bfoo"), "regex: word boundary \\b at position 0 is not supported");
  EXPECT_EQ(regex_error("foo\\B"), "regex: non-word-boundary \\B at position 3 is not supported");
  EXPECT_EQ(regex_error("a^b"),
            "regex: anchor ^ (allowed only at the start of the regex) at position 1 is not "
            "supported");
  EXPECT_EQ(regex_error("a$b"),
            "regex: anchor $ (allowed only at the end of the regex) at position 1 is not "
            "supported");
  EXPECT_EQ(regex_error("(^a)"),
            "regex: anchor ^ (allowed only at the start of the regex) at position 1 is not "
            "supported");
  EXPECT_EQ(regex_error("a*+"), "regex: possessive quantifier *+ at position 1 is not supported");
  EXPECT_EQ(regex_error("a{2,3}+"),
            "regex: possessive quantifier {2,3}+ at position 1 is not supported");
  EXPECT_NE(regex_error("(?>a)").find("atomic group (?> at position 0"), std::string::npos);
  EXPECT_NE(regex_error("(?i)a").find("at position 0 is not supported"), std::string::npos);
  EXPECT_NE(regex_error("\\p{L}").find("unicode property escape \\p at position 0"),
            std::string::npos);
  EXPECT_NE(regex_error("\\012").find("octal escape"), std::string::npos);
}

TEST(Regex, MalformedRegexesAreErrorsWithPositions) {
  EXPECT_EQ(regex_error("x(ab"), "regex: unbalanced '(' (no matching ')') at position 1");
  EXPECT_EQ(regex_error("ab)"), "regex: unbalanced ')' at position 2");
  EXPECT_EQ(regex_error("a[bc"), "regex: unterminated character class '[' at position 1");
  EXPECT_EQ(regex_error("[]"), "regex: unterminated character class '[' at position 0");
  EXPECT_EQ(regex_error("[az-a]"), "regex: bad range z-a in a character class at position 2");
  EXPECT_EQ(regex_error("a{3,2}"), "regex: quantifier {3,2} with min > max at position 1");
  EXPECT_EQ(regex_error("a{10001}"),
            "regex: repetition count in {10001} above 10000 at position 1");
  EXPECT_EQ(regex_error("a{1,99999999999}"),
            "regex: repetition count in {1,99999999999} above 10000 at position 1");
  EXPECT_EQ(regex_error("*a"), "regex: quantifier '*' with nothing to repeat at position 0");
  EXPECT_EQ(regex_error("a|+"), "regex: quantifier '+' with nothing to repeat at position 2");
  EXPECT_EQ(regex_error("^*"), "regex: quantifier '*' with nothing to repeat at position 1");
  EXPECT_EQ(regex_error("(){2}{3}").find("directly after quantifier '{2}'") != std::string::npos,
            true);
  EXPECT_EQ(regex_error("a**"),
            "regex: quantifier '*' directly after quantifier '*' (put the first in a group) at "
            "position 2");
  EXPECT_EQ(regex_error("a\\"), "regex: trailing backslash at position 1");
  EXPECT_EQ(regex_error("\\xZ1"), "regex: escape \\xZ needs 2 hex digits at position 0");
  EXPECT_EQ(regex_error("\\q"), "regex: unknown escape \\q at position 0");
  EXPECT_NE(regex_error("\\uD800").find("lone surrogate"), std::string::npos);
}

TEST(Regex, DeepNestingIsRefusedNotACrash) {
  const std::string deep = std::string(1000, '(') + "a" + std::string(1000, ')');
  EXPECT_NE(regex_error(deep).find("nested deeper than"), std::string::npos);
  const std::string ok = std::string(100, '(') + "a" + std::string(100, ')');
  expect_language(ok, {"a"}, {"aa"});
}

TEST(Regex, RepeatingLongOptionalRunsIsBoundedNotAnOutOfMemory) {
  std::string optional_run;
  for (int i = 0; i < 100; ++i) optional_run += "a?";
  expect_language("(" + optional_run + "b?)*", {"", "ab", "aaab", "bba"}, {"c", "abc"});
  std::string long_run;
  for (int i = 0; i < 3000; ++i) long_run += "a?";
  const std::string error = regex_error("(" + long_run + ")*");
  EXPECT_NE(error.find("too large once expanded) at position 6002 is not supported"),
            std::string::npos)
      << error;
}

TEST(Regex, ExpressionEmbedsInALargerGrammar) {
  auto expr = regex_to_gbnf_expression("a|b+");
  ASSERT_TRUE(expr.ok());
  auto g = parse_gbnf("root ::= \"<\" (" + *expr + ") \">\"\n");
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(g->matches("<a>"));
  EXPECT_TRUE(g->matches("<bbb>"));
  EXPECT_FALSE(g->matches("<ab>"));
}

}  // namespace
}  // namespace vesper::grammar
