// The binary form of a Grammar (a constraint travelling with a step plan): a parsed GBNF grammar
// round-trips and matches the same texts; truncated bytes, indices out of range and grammars the
// matcher cannot run (left recursion, a rule without alternatives) are errors.
#include <gtest/gtest.h>

#include "grammar/gbnf.h"
#include "grammar/grammar_codec.h"

namespace vesper::grammar {
namespace {

Result<Grammar> round_trip(const Grammar& g) {
  ByteWriter w;
  write_grammar(w, g);
  const std::vector<uint8_t> bytes = w.take();
  ByteReader r(bytes);
  return read_grammar(r);
}

TEST(GrammarCodec, AParsedGrammarRoundTripsAndMatchesTheSameTexts) {
  auto g = parse_gbnf(R"(root ::= "{" ws item ("," ws item)* "}"
item ::= [a-z]+ | "\"" [^"]* "\""
ws ::= " "?)");
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto back = round_trip(*g);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->root, g->root);
  ASSERT_EQ(back->rules.size(), g->rules.size());
  for (const char* text : {"{abc}", "{ ab, \"x y\"}", "{}", "{ab,}", "abc"})
    EXPECT_EQ(back->matches(text), g->matches(text)) << text;
  // Every prefix of the bytes is an error, never a crash.
  ByteWriter w;
  write_grammar(w, *g);
  const std::vector<uint8_t> bytes = w.take();
  for (size_t n = 0; n < bytes.size(); ++n) {
    ByteReader r(std::span<const uint8_t>(bytes.data(), n));
    EXPECT_FALSE(read_grammar(r).ok()) << "cut at " << n;
  }
}

TEST(GrammarCodec, GrammarsTheMatcherCannotRunAreRefused) {
  auto g = parse_gbnf(R"(root ::= "a" root | "b")");
  ASSERT_TRUE(g.ok());
  // root ::= root "a": left-recursive (the parser refuses it; bytes can say it all the same).
  Grammar left = *g;
  left.elements = {{Element::Kind::kRule, 0}, {Element::Kind::kBytes, 0}, {Element::Kind::kEnd, 0}};
  left.byte_sets.resize(1);
  left.rules.resize(1);
  left.rules[0].alternatives = {0};
  left.root = 0;
  auto r = round_trip(left);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("left-recursive"), std::string::npos) << r.error().message;
  Grammar empty_rule = left;
  empty_rule.rules[0].alternatives.clear();
  EXPECT_FALSE(round_trip(empty_rule).ok());
  Grammar bad_index = *g;
  bad_index.elements[0] = {Element::Kind::kRule, 99};
  auto b = round_trip(bad_index);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("rule 99"), std::string::npos) << b.error().message;
}

}  // namespace
}  // namespace vesper::grammar
