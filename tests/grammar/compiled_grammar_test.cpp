#include "grammar/compiled_grammar.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "grammar/gbnf.h"
#include "grammar/grammar_cache.h"
#include "sanitized.h"

namespace vesper::grammar {
namespace {

// Token 0 ends generation; the others are pieces of JSON-ish text, some multi-byte, one a lone
// UTF-8 lead byte (as byte-fallback tokens are).
std::shared_ptr<const TokenVocabulary> test_vocab() {
  std::vector<std::string> pieces = {
      "",  "{", "}",    "\"",   "a",   "ab",  "b\"",  " ",  "\":", "1",    "12", ",", "[",
      "]", "é", "\xC3", "\xA9", "{\"", "\"}", "null", "nu", "ll",  "true", "x",  "",  ":"};
  return std::make_shared<TokenVocabulary>(std::move(pieces), std::vector<int32_t>{0});
}

CompiledGrammar compile(std::string_view gbnf, CompiledGrammar::MaskOptions options = {}) {
  auto g = parse_gbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return CompiledGrammar(std::move(g).value(), test_vocab(), options);
}

// The ways a mask can be computed: cut walks (shallow and default) with context-dependent
// tokens checked against the whole stacks; cut walks that overflow at once into whole-stack
// walks; whole-stack walks only; and with the cache full after three masks.
const std::vector<CompiledGrammar::MaskOptions> kMaskOptions = {{4, 1024, 16384},
                                                                {1, 1024, 16384},
                                                                {2, 0, 16384},
                                                                {size_t{1} << 30, 1024, 16384},
                                                                {4, 1024, 3}};

// The slow reference: a token may follow `text` when text + piece can still be extended to a
// match (some stack survives every byte).
bool viable(const Grammar& g, const std::string& text) {
  StackSet s = initial_stacks(g);
  for (unsigned char c : text) {
    s = advance_stacks(g, s, c);
    if (s.empty()) return false;
  }
  return true;
}

// The tokens `state` allows after `text`, each checked against the reference (a failure per
// token that disagrees).
std::vector<int32_t> allowed_checked_against_reference(const CompiledGrammar& cg, StateId state,
                                                       const std::string& text) {
  const TokenVocabulary& v = cg.vocabulary();
  std::vector<int32_t> allowed;
  for (int32_t t = 0; t < v.size(); ++t) {
    const bool expect = v.is_eog(t)
                            ? cg.grammar().matches(text)
                            : !v.piece(t).empty() && viable(cg.grammar(), text + v.piece(t));
    EXPECT_EQ(cg.allows(state, t), expect) << "after '" << text << "' token '" << v.piece(t) << "'";
    if (expect) allowed.push_back(t);
  }
  return allowed;
}

constexpr std::string_view kJsonish = R"g(root ::= value
value ::= object | array | string | number | "null" | "true"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ":" ws value ws
array ::= "[" ( value ( "," value ){0,2} )? "]"
string ::= "\"" [^"\\]* "\""
number ::= [1-9] [0-9]{0,3}
ws ::= " "?
)g";

TEST(CompiledGrammar, MasksEqualTheReferenceAlongRandomWalks) {
  for (const auto& options : kMaskOptions) {
    SCOPED_TRACE("cut depth " + std::to_string(options.cut_depth));
    const CompiledGrammar cg = compile(kJsonish, options);
    const TokenVocabulary& v = cg.vocabulary();
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      std::mt19937_64 rng(seed);
      std::string text;
      std::vector<int32_t> output;
      StateId state = CompiledGrammar::kInitial;
      for (int step = 0; step < 30; ++step) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        const std::vector<int32_t> allowed = allowed_checked_against_reference(cg, state, text);
        ASSERT_FALSE(::testing::Test::HasFailure());
        ASSERT_FALSE(allowed.empty()) << text;
        const int32_t t = allowed[rng() % allowed.size()];
        if (v.is_eog(t)) {
          EXPECT_TRUE(cg.grammar().matches(text));
          break;
        }
        text += v.piece(t);
        output.push_back(t);
        state = cg.next(state, t);
        ASSERT_EQ(state, cg.state_after(output));
      }
    }
    EXPECT_GT(cg.num_states(), 10u);
  }
}

// Deep nesting: stacks far deeper than the first cut (four elements), so masks come from a cut
// top plus the context-dependent tokens checked against the whole stacks, and states at
// different depths share their cut walks. Masks still equal the reference. Under a sanitizer
// (VESPER_SANITIZED), two walks per cut depth instead of six.
TEST(CompiledGrammar, DeepStacksMatchTheReference) {
  const uint64_t walks = testing_util::sanitized() ? 2 : 6;
  for (const auto& options : kMaskOptions) {
    SCOPED_TRACE("cut depth " + std::to_string(options.cut_depth));
    const CompiledGrammar cg = compile(kJsonish, options);
    const TokenVocabulary& v = cg.vocabulary();
    const std::vector<int32_t> open = {12, 17};  // "[" and "{\""
    for (uint64_t seed = 1; seed <= walks; ++seed) {
      std::mt19937_64 rng(seed);
      std::string text;
      std::vector<int32_t> output;
      StateId state = CompiledGrammar::kInitial;
      for (int step = 0; step < 45; ++step) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        const std::vector<int32_t> allowed = allowed_checked_against_reference(cg, state, text);
        ASSERT_FALSE(::testing::Test::HasFailure());
        ASSERT_FALSE(allowed.empty());
        // Open brackets while they are allowed for the first 25 steps, then anything.
        int32_t t = allowed[rng() % allowed.size()];
        for (int32_t o : open)
          if (step < 25 && rng() % 4 != 0 &&
              std::find(allowed.begin(), allowed.end(), o) != allowed.end())
            t = o;
        if (v.is_eog(t)) break;
        text += v.piece(t);
        output.push_back(t);
        state = cg.next(state, t);
      }
    }
  }
}

TEST(CompiledGrammar, CursorFollowsAppendsAndCuts) {
  const CompiledGrammar cg = compile(kJsonish);
  GrammarCursor cursor;
  std::vector<int32_t> out = {17, 4, 8, 9};  // {"a": 1
  EXPECT_EQ(cg.state_after(cursor, out), cg.state_after(out));
  out.push_back(10);  // appended
  EXPECT_EQ(cg.state_after(cursor, out), cg.state_after(out));
  out = {17, 4, 8, 19};  // a speculative cut and a different continuation
  EXPECT_EQ(cg.state_after(cursor, out), cg.state_after(out));
  EXPECT_EQ(cursor.tokens, out);
  out.push_back(2);
  const StateId done = cg.state_after(cursor, out);
  EXPECT_TRUE(cg.is_accepting(done));
  // Complete: only end of generation.
  for (int32_t t = 1; t < cg.vocabulary().size(); ++t) EXPECT_FALSE(cg.allows(done, t)) << t;
  EXPECT_TRUE(cg.allows(done, 0));
}

TEST(CompiledGrammar, SplitUtf8AndDeadStates) {
  const CompiledGrammar cg = compile("root ::= \"é\" \"x\"\n");
  EXPECT_TRUE(cg.allows(CompiledGrammar::kInitial, 14));   // é whole
  EXPECT_TRUE(cg.allows(CompiledGrammar::kInitial, 15));   // its first byte
  EXPECT_FALSE(cg.allows(CompiledGrammar::kInitial, 16));  // its second byte first
  EXPECT_FALSE(cg.allows(CompiledGrammar::kInitial, 0));   // not complete yet
  const StateId half = cg.next(CompiledGrammar::kInitial, 15);
  EXPECT_TRUE(cg.allows(half, 16));
  EXPECT_EQ(cg.next(CompiledGrammar::kInitial, 4), CompiledGrammar::kDead);
  // A dead state lets the sequence end, and nothing else.
  EXPECT_TRUE(cg.allows(CompiledGrammar::kDead, 0));
  EXPECT_FALSE(cg.allows(CompiledGrammar::kDead, 23));
  std::vector<float> logits(static_cast<size_t>(cg.vocabulary().size()), 1.0f);
  cg.apply(half, logits);
  for (size_t t = 0; t < logits.size(); ++t) EXPECT_EQ(std::isinf(logits[t]), t != 16) << t;
}

// Sequences on several threads (the engine's sampler, speculative verification, the server's
// workers) share one compiled grammar: its caches fill concurrently and give every thread what
// a grammar of its own would (the TSan build runs this).
TEST(CompiledGrammar, ConcurrentWalksShareCachesSafely) {
  const CompiledGrammar shared = compile(kJsonish);
  constexpr int kThreads = 4;
  std::vector<std::vector<int32_t>> outputs(kThreads);
  std::vector<std::vector<StateId>> states(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(static_cast<uint64_t>(i % 2));  // two pairs of threads walk alike
      GrammarCursor cursor;
      for (int step = 0; step < 40; ++step) {
        const StateId s = shared.state_after(cursor, outputs[i]);
        states[i].push_back(s);
        std::vector<int32_t> allowed;
        for (int32_t t = 1; t < shared.vocabulary().size(); ++t)
          if (shared.allows(s, t)) allowed.push_back(t);
        if (allowed.empty() || shared.is_accepting(s)) break;
        outputs[i].push_back(allowed[rng() % allowed.size()]);
      }
    });
  for (auto& t : threads) t.join();
  const CompiledGrammar alone = compile(kJsonish);
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(outputs[i], outputs[i % 2]) << i;  // same seed, same walk
    for (size_t k = 0; k < states[i].size(); ++k) {
      const std::vector<int32_t> prefix(outputs[i].begin(),
                                        outputs[i].begin() + static_cast<ptrdiff_t>(k));
      EXPECT_EQ(*shared.allowed(states[i][k]), *alone.allowed(alone.state_after(prefix)))
          << i << " " << k;
    }
  }
}

TEST(GrammarCache, SharesCompiledGrammarsByTextAndDropsLeastRecent) {
  GrammarCache cache(test_vocab(), 2);
  auto a = cache.get("root ::= \"a\"\n");
  ASSERT_TRUE(a.ok());
  auto a2 = cache.get("root ::= \"a\"\n");
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a->get(), a2->get());
  ASSERT_TRUE(cache.get("root ::= \"b\"\n").ok());
  ASSERT_TRUE(cache.get("root ::= \"a\"\n").ok());  // a is now the most recent
  ASSERT_TRUE(cache.get("root ::= \"x\"\n").ok());  // drops b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.get("root ::= \"a\"\n")->get(), a->get());
  auto bad = cache.get("root ::= nope\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("undefined rule 'nope'"), std::string::npos);
}

// get() runs on a server worker: it leaves the initial state's mask computed, so the first
// constrained step on the engine thread finds it cached; concurrent gets of one text share it.
TEST(GrammarCache, GetComputesTheInitialMask) {
  GrammarCache cache(test_vocab(), 4);
  std::vector<std::shared_ptr<const CompiledGrammar>> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      auto g = cache.get(std::string(kJsonish));
      ASSERT_TRUE(g.ok()) << g.error().message;
      got[i] = *g;
    });
  for (auto& t : threads) t.join();
  ASSERT_TRUE(got[0]);
  EXPECT_EQ(got[0]->num_masks(), 1u);
  EXPECT_EQ(cache.size(), 1u);
  const CompiledGrammar fresh = compile(kJsonish);
  EXPECT_EQ(*got[0]->allowed(CompiledGrammar::kInitial), *fresh.allowed(CompiledGrammar::kInitial));
  EXPECT_EQ(got[0]->num_masks(), 1u);  // served from the cache, not computed again
  for (const auto& g : got) EXPECT_EQ(*g->allowed(CompiledGrammar::kInitial), *fresh.allowed(0));
}

}  // namespace
}  // namespace vesper::grammar
