// The bound on ambiguity (limits.h kMaxStacksPerState, CompiledGrammar::MaskOptions::max_stacks):
// a state past it fails, deterministically, allows only end-of-generation tokens, stays failed,
// and says why through the compiled grammar and the cursor.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/gbnf.h"
#include "grammar/grammar_cache.h"

namespace vesper::grammar {
namespace {

constexpr int32_t kEog = 0, kA = 1, kB = 2, kC = 3, kAA = 4, kAB = 5;

std::shared_ptr<const TokenVocabulary> vocab() {
  return std::make_shared<TokenVocabulary>(std::vector<std::string>{"", "a", "b", "c", "aa", "ab"},
                                           std::vector<int32_t>{kEog});
}

Grammar parse(std::string_view text) {
  auto g = parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return g.ok() ? std::move(g).value() : Grammar{};
}

// Every "a" doubles the ways to read the input: each may close with "b" or with "c" (t makes the
// two alternatives differ in their second element, so they do not share a prefix).
constexpr std::string_view kDoubling = R"(root ::= s
s ::= "a" s "b" | "a" t "c" | ""
t ::= s
)";

CompiledGrammar::MaskOptions with_max_stacks(size_t max_stacks, size_t cut_depth = 4) {
  CompiledGrammar::MaskOptions o;
  o.cut_depth = cut_depth;
  o.max_stacks = max_stacks;
  return o;
}

// The tokens `state` allows, each checked against next(): allowed tokens do not leave the
// grammar (they may fail), refused ones do not lead anywhere useful. `disagreements` counts
// the tokens that break this.
std::vector<int32_t> allowed_checked_against_next(const CompiledGrammar& cg, StateId state,
                                                  int& disagreements) {
  std::vector<int32_t> allowed;
  for (int32_t t = 0; t < cg.vocabulary().size(); ++t) {
    const bool allows = cg.allows(state, t);
    if (allows) allowed.push_back(t);
    if (t == kEog) continue;
    const StateId next = cg.next(state, t);
    const bool agrees =
        allows ? next != CompiledGrammar::kDead
               : next == CompiledGrammar::kDead || next == CompiledGrammar::kTooAmbiguous;
    EXPECT_TRUE(agrees) << "state " << state << " token '" << cg.vocabulary().piece(t)
                        << "' allowed " << allows << " next " << next;
    disagreements += !agrees;
  }
  return allowed;
}

TEST(Ambiguity, DoublingGrammarFailsAtTheSameTokenEveryTime) {
  const CompiledGrammar cg(parse(kDoubling), vocab(), with_max_stacks(64));
  const CompiledGrammar again(parse(kDoubling), vocab(), with_max_stacks(64));
  std::vector<int32_t> output;
  std::vector<StateId> states, states_again;
  StateId s = CompiledGrammar::kInitial, s2 = CompiledGrammar::kInitial;
  while (!cg.is_failed(s) && output.size() < 20) {
    EXPECT_FALSE(cg.failure(s).has_value());
    output.push_back(kA);
    s = cg.next(s, kA);
    s2 = again.next(s2, kA);
    states.push_back(s);
    states_again.push_back(s2);
  }
  ASSERT_TRUE(cg.is_failed(s)) << "no failure after " << output.size() << " a's";
  EXPECT_EQ(s, CompiledGrammar::kTooAmbiguous);
  EXPECT_EQ(states, states_again);  // same tokens, same states, same failing token
  // 2^k ways after k a's: past 64 within a handful.
  EXPECT_GE(output.size(), 5u);
  EXPECT_LE(output.size(), 8u);
  EXPECT_EQ(cg.failure(s),
            "the grammar is too ambiguous: more than 64 alternatives at one position");
  // Its mask: end of generation only. And it stays failed, whatever comes.
  EXPECT_TRUE(cg.allows(s, kEog));
  for (int32_t t : {kA, kB, kC, kAA, kAB}) EXPECT_FALSE(cg.allows(s, t)) << t;
  for (int32_t t : {kEog, kA, kB, kC}) EXPECT_EQ(cg.next(s, t), CompiledGrammar::kTooAmbiguous);
  // Two-byte tokens fail at the same byte.
  std::vector<int32_t> pairs(output.size() / 2, kAA);
  if (output.size() % 2) pairs.push_back(kA);
  EXPECT_EQ(cg.state_after(pairs), CompiledGrammar::kTooAmbiguous);
  pairs.pop_back();
  EXPECT_FALSE(cg.is_failed(cg.state_after(pairs)));
}

TEST(Ambiguity, CursorReportsTheFailure) {
  const CompiledGrammar cg(parse(kDoubling), vocab(), with_max_stacks(64));
  GrammarCursor cursor;
  std::vector<int32_t> output = {kA, kA, kA};
  cg.state_after(cursor, output);
  EXPECT_FALSE(cg.failure(cursor).has_value());
  output.resize(12, kA);
  EXPECT_EQ(cg.state_after(cursor, output), CompiledGrammar::kTooAmbiguous);
  EXPECT_EQ(cg.failure(cursor),
            "the grammar is too ambiguous: more than 64 alternatives at one position");
  // The sampler then allows only the end, and the state after it is still the failure.
  output.push_back(kEog);
  cg.state_after(cursor, output);
  EXPECT_TRUE(cg.failure(cursor).has_value());
  // A speculative cut back before the failure clears it.
  output.resize(2);
  cg.state_after(cursor, output);
  EXPECT_FALSE(cg.failure(cursor).has_value());
}

// Masks agree with next() near and past the bound, whichever way they are computed (cut walks,
// whose steps may pass the bound with stacks cut to their top, and whole-stack walks), over
// every string of "a", "b" and "c" up to four bytes as tokens, along random walks.
TEST(Ambiguity, MasksAgreeWithNextAtTheBound) {
  std::vector<std::string> pieces = {""}, shorter = {""};
  for (int len = 1; len <= 4; ++len) {
    std::vector<std::string> longer;
    for (const std::string& p : shorter)
      for (char c : {'a', 'b', 'c'}) longer.push_back(p + c);
    pieces.insert(pieces.end(), longer.begin(), longer.end());
    shorter = std::move(longer);
  }
  auto many = std::make_shared<TokenVocabulary>(pieces, std::vector<int32_t>{kEog});
  for (size_t cut : {size_t{1}, size_t{2}, size_t{4}, size_t{1} << 30}) {
    SCOPED_TRACE("cut depth " + std::to_string(cut));
    const CompiledGrammar cg(parse(kDoubling), many, with_max_stacks(64, cut));
    int failures = 0;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      std::mt19937_64 rng(seed);
      StateId s = CompiledGrammar::kInitial;
      for (int step = 0; step < 12 && !cg.is_failed(s); ++step) {
        int disagreements = 0;
        const std::vector<int32_t> allowed = allowed_checked_against_next(cg, s, disagreements);
        ASSERT_EQ(disagreements, 0);
        ASSERT_FALSE(allowed.empty());
        // Mostly tokens of a's only, which open more ways to read the input.
        std::vector<int32_t> opening;
        for (int32_t t : allowed)
          if (t != kEog && cg.vocabulary().piece(t).find_first_not_of('a') == std::string::npos)
            opening.push_back(t);
        const std::vector<int32_t>& from = !opening.empty() && rng() % 4 ? opening : allowed;
        const int32_t t = from[rng() % from.size()];
        if (t == kEog) break;
        s = cg.next(s, t);
      }
      failures += cg.is_failed(s);
    }
    EXPECT_GT(failures, 0);
  }
}

TEST(Ambiguity, GrammarTooAmbiguousAtItsStartIsRefusedByTheCache) {
  // Twelve levels, each read two ways before any byte: 4,096 stacks at the start.
  std::string text = "root ::= r0\n";
  for (int i = 0; i < 12; ++i) {
    const std::string next = std::to_string(i + 1);
    text += "r" + std::to_string(i) + " ::= r" + next + " \"x\" | q" + next + " \"y\"\n";
    text += "q" + next + " ::= r" + next + "\n";
  }
  text += "r12 ::= \"z\"\n";
  const CompiledGrammar cg(parse(text), vocab());
  EXPECT_TRUE(cg.is_failed(CompiledGrammar::kInitial));
  EXPECT_TRUE(cg.allows(CompiledGrammar::kInitial, kEog));
  EXPECT_FALSE(cg.allows(CompiledGrammar::kInitial, kA));
  GrammarCache cache(vocab(), 4);
  auto compiled = cache.get(text);
  ASSERT_FALSE(compiled.ok());
  EXPECT_EQ(compiled.error().message,
            "the grammar is too ambiguous: more than 1,024 alternatives at one position (at its "
            "start)");
  EXPECT_EQ(cache.size(), 0u);
}

// Ambiguity that does not grow stays well within the bound, however long the input.
TEST(Ambiguity, BoundedAmbiguityNeverFails) {
  const CompiledGrammar cg(parse(R"(root ::= ("a" | "a" "a")* "b")"), vocab());
  StateId s = CompiledGrammar::kInitial;
  for (int i = 0; i < 300; ++i) s = cg.next(s, i % 3 ? kA : kAA);
  EXPECT_FALSE(cg.is_failed(s));
  s = cg.next(s, kB);
  EXPECT_TRUE(cg.is_accepting(s));
  EXPECT_LT(cg.num_states(), 10u);
}

}  // namespace
}  // namespace vesper::grammar
