#include "grammar/gbnf.h"

#include <gtest/gtest.h>

#include "grammar/stack_set.h"

namespace vesper::grammar {
namespace {

Grammar parse_ok(std::string_view text) {
  auto g = parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return g.ok() ? std::move(g).value() : Grammar{};
}

std::string parse_error(std::string_view text) {
  auto g = parse_gbnf(text);
  EXPECT_FALSE(g.ok()) << text;
  return g.ok() ? "" : g.error().message;
}

TEST(Gbnf, LiteralsAlternativesAndRuleReferences) {
  const Grammar g = parse_ok(R"(root ::= greeting " " name
greeting ::= "hello" | "hi"
name ::= "bob" | "al"
)");
  EXPECT_TRUE(g.matches("hello bob"));
  EXPECT_TRUE(g.matches("hi al"));
  EXPECT_FALSE(g.matches("hi"));
  EXPECT_FALSE(g.matches("hello bobby"));
  EXPECT_FALSE(g.matches("hey bob"));
}

TEST(Gbnf, RepetitionOperators) {
  const Grammar g = parse_ok("root ::= \"a\"* \"b\"+ \"c\"? [0-9]{2} [x-z]{1,3} \"!\"{2,}\n");
  EXPECT_TRUE(g.matches("b12x!!"));
  EXPECT_TRUE(g.matches("aaabbc34xyz!!!!"));
  EXPECT_FALSE(g.matches("12x!!"));      // b+ needs one
  EXPECT_FALSE(g.matches("b1x!!"));      // {2}
  EXPECT_FALSE(g.matches("b12xyzx!!"));  // {1,3}
  EXPECT_FALSE(g.matches("b12x!"));      // {2,}
  EXPECT_FALSE(g.matches("bcc12x!!"));   // c? at most one
}

TEST(Gbnf, GroupsNestAndRepeat) {
  const Grammar g = parse_ok("root ::= (\"ab\" | \"c\" (\"d\" | \"e\")*)+\n");
  EXPECT_TRUE(g.matches("ab"));
  EXPECT_TRUE(g.matches("cdeedabc"));
  EXPECT_FALSE(g.matches(""));
  EXPECT_FALSE(g.matches("a"));
  EXPECT_FALSE(g.matches("abd"));
}

TEST(Gbnf, ClassesAreCodePointsInUtf8) {
  const Grammar g = parse_ok("root ::= [^\"\\\\a] [α-ω] . [\\u00e9\\x41]\n");
  EXPECT_TRUE(g.matches("bβxé"));
  EXPECT_TRUE(g.matches("€ω\U0001F600A"));
  EXPECT_FALSE(g.matches("aβxé"));
  EXPECT_FALSE(g.matches("\"βxé"));
  EXPECT_FALSE(g.matches("bbxé"));
  EXPECT_FALSE(g.matches("bβ\xC3xé"));  // broken UTF-8 is not a code point
  EXPECT_FALSE(g.matches("bβxe"));
}

TEST(Gbnf, RecursionCommentsAndContinuationLines) {
  const Grammar g = parse_ok(R"g(# arithmetic
root ::= expr
expr ::= term (("+" | "-") term)*   # sums
term ::= num | "(" expr ")"
num  ::= [0-9]+
  | "x"
)g");
  EXPECT_TRUE(g.matches("1+(2-x)+((3))"));
  EXPECT_FALSE(g.matches("1+(2-x"));
  EXPECT_FALSE(g.matches("1+"));
}

TEST(Gbnf, EmptyRulesAndBodiesOnTheNextLine) {
  const Grammar g = parse_ok("root ::= \"a\" opt \"b\"\nopt ::= \nother ::=\n  \"x\"\n");
  EXPECT_TRUE(g.matches("ab"));
  EXPECT_FALSE(g.matches("axb"));
}

TEST(Gbnf, ErrorsNameWhereAndWhat) {
  EXPECT_NE(parse_error("root ::= foo\n").find("undefined rule 'foo'"), std::string::npos);
  EXPECT_NE(parse_error("start ::= \"a\"\n").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(parse_error("root ::= root \"a\" | \"b\"\n").find("left-recursive"), std::string::npos);
  EXPECT_NE(
      parse_error("root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"\n").find("'x' is left-recursive"),
      std::string::npos);
  EXPECT_NE(parse_error("root ::= \"abc\n").find("unterminated"), std::string::npos);
  EXPECT_NE(parse_error("root ::= [a-").find("line 1, column 13: unterminated character class"),
            std::string::npos);
  EXPECT_NE(parse_error("root ::= [z-a]\n").find("out of order"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{3,1}\n").find("n < m"), std::string::npos);
  EXPECT_NE(parse_error("root ::= (\"a\"\n").find("expected ')'"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\nroot ::= \"b\"\n").find("defined twice"),
            std::string::npos);
  EXPECT_NE(parse_error("root ::= *\n").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{99999}\n").find("repetition count"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\n  \"b\" ::= x\n").find("line 2"), std::string::npos);
}

TEST(Gbnf, RepeatingWhatCanMatchNothingIsNamedAsSuch) {
  // Not "left recursion": the rule the text repeats in, where, and with which operator.
  EXPECT_EQ(parse_error("root ::= (\"\")* \"a\"\n"),
            "line 1, column 10: rule 'root' repeats, with '*', something that can match the "
            "empty string (it could repeat forever without reading anything)");
  EXPECT_EQ(parse_error("root ::= \"x\" item+\nitem ::= \"b\"?\n"),
            "line 1, column 14: rule 'root' repeats, with '+', something that can match the "
            "empty string (it could repeat forever without reading anything)");
  EXPECT_NE(parse_error("root ::= \"x\"\n  list\nlist ::= (\"a\"? (\"b\" | \"\")){2,}\n")
                .find("line 3, column 10: rule 'list' repeats, with '{2,}'"),
            std::string::npos);
  // Bounded repetition of the same is fine (ambiguous, not endless).
  const Grammar g = parse_ok("root ::= (\"a\"?){0,3} \"b\"\n");
  EXPECT_TRUE(g.matches("aab"));
  EXPECT_FALSE(g.matches("aaaab"));
  // Genuine left recursion is still called so.
  EXPECT_EQ(parse_error("root ::= root \"a\" | \"b\"\n"), "rule 'root' is left-recursive");
  EXPECT_EQ(parse_error("root ::= (\"\" | root) \"a\"\n"), "rule 'root' is left-recursive");
}

// Alternatives that begin alike share their beginning (a trie): the same language, and one
// stack where there would be one per alternative.
TEST(Gbnf, AlternativesSharingABeginningAreFactored) {
  const Grammar g = parse_ok(
      "root ::= \"a\" | \"ab\" | \"abc\" | \"b\" | \"a\" | x \"1\" | x \"2\"\nx ::= \"x\"\n");
  for (const char* yes : {"a", "ab", "abc", "b", "x1", "x2"}) EXPECT_TRUE(g.matches(yes)) << yes;
  for (const char* no : {"", "ac", "abcd", "bb", "x", "x3"}) EXPECT_FALSE(g.matches(no)) << no;
  EXPECT_EQ(initial_stacks(g).size(), 3u);  // "a...", "b", x
  std::string choices = "root ::= \"item-0\"";
  for (int i = 1; i < 5000; ++i) choices += " | \"item-" + std::to_string(i) + "\"";
  const Grammar many = parse_ok(choices + "\n");
  EXPECT_EQ(initial_stacks(many).size(), 1u);
  EXPECT_TRUE(many.matches("item-4999"));
  EXPECT_TRUE(many.matches("item-50"));
  EXPECT_FALSE(many.matches("item-5000"));
  EXPECT_FALSE(many.matches("item-"));
}

TEST(Gbnf, LiteralEscapesRoundTrip) {
  const std::string text = "a\"b\\c\nd\te\x01";
  const Grammar g = parse_ok("root ::= " + gbnf_literal(text) + "\n");
  EXPECT_TRUE(g.matches(text));
  EXPECT_FALSE(g.matches("a\"b\\c\nd\te"));
}

}  // namespace
}  // namespace vesper::grammar
