#include "grammar/mask_prefetcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "grammar/gbnf.h"

namespace vesper::grammar {
namespace {

// Token 0 ends generation; JSON-ish pieces otherwise.
std::shared_ptr<const TokenVocabulary> json_vocab() {
  std::vector<std::string> pieces = {"",    "{", "}",  "\"", "a", "ab", "b\"",  " ",
                                     "\":", "1", "12", ",",  "[", "]",  "null", "x"};
  return std::make_shared<TokenVocabulary>(std::move(pieces), std::vector<int32_t>{0});
}

std::shared_ptr<const CompiledGrammar> compile(CompiledGrammar::MaskOptions options = {}) {
  auto g = parse_gbnf(R"g(root ::= value
value ::= object | array | string | "null"
object ::= "{" ( string ":" " "? value ( "," string ":" value )* )? "}"
array ::= "[" ( value ( "," value )* )? "]"
string ::= "\"" [^"\\]* "\""
)g");
  EXPECT_TRUE(g.ok()) << g.error().message;
  return std::make_shared<const CompiledGrammar>(std::move(g).value(), json_vocab(), options);
}

// The states along {"": [[null]]}, each one new and live (a walk that revisits a state would
// find its mask computed by an earlier request, and only on a host fast enough to finish it).
std::vector<StateId> walk(const CompiledGrammar& g) {
  std::vector<StateId> states;
  StateId s = CompiledGrammar::kInitial;
  for (int32_t t : {1, 3, 8, 7, 12, 12, 14, 13, 13, 2}) {
    s = g.next(s, t);
    EXPECT_NE(s, CompiledGrammar::kDead) << "token " << t << " after " << states.size();
    EXPECT_EQ(std::count(states.begin(), states.end(), s), 0) << "state " << states.size();
    states.push_back(s);
  }
  return states;
}

// The runner hands each next state over after sampling; by the next step its mask is cached and
// equals the one the step would compute itself, and the step computes nothing.
TEST(MaskPrefetcher, ComputesMasksAheadThatTheStepThenFinds) {
  const auto g = compile();
  const auto fresh = compile();
  const std::vector<StateId> states = walk(*g);
  MaskPrefetcher prefetcher;
  for (StateId s : states) {
    EXPECT_TRUE(g->mask_pending(s));
    prefetcher.request(g, s);
  }
  prefetcher.wait_idle();
  const auto computed = g->num_mask_computations();
  EXPECT_GT(prefetcher.num_computed(), 0);
  EXPECT_EQ(static_cast<size_t>(prefetcher.num_computed()), computed);
  const std::vector<StateId> fresh_states = walk(*fresh);
  for (size_t i = 0; i < states.size(); ++i) {
    EXPECT_FALSE(g->mask_pending(states[i]));
    bool computed_here = true;
    EXPECT_EQ(*g->allowed(states[i], &computed_here), *fresh->allowed(fresh_states[i]));
    EXPECT_FALSE(computed_here) << "state " << i;
  }
  EXPECT_EQ(g->num_mask_computations(), computed);
  // Cached states are not computed again.
  for (StateId s : states) prefetcher.request(g, s);
  prefetcher.wait_idle();
  EXPECT_EQ(g->num_mask_computations(), computed);
}

// Many threads asking for one state's mask at once (the step and the prefetcher) compute it once
// and share it.
TEST(MaskPrefetcher, ConcurrentAskersComputeAMaskOnce) {
  for (int round = 0; round < 20; ++round) {
    const auto g = compile();
    const StateId s = walk(*g)[2];
    std::vector<std::shared_ptr<const TokenMask>> got(6);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < got.size(); ++i)
      threads.emplace_back([&, i] { got[i] = g->allowed(s); });
    for (auto& t : threads) t.join();
    EXPECT_EQ(g->num_mask_computations(), 1u);
    for (const auto& m : got) EXPECT_EQ(m.get(), got[0].get());
  }
}

// With the cache full, nothing is prefetched (it could not be kept); the step computes the masks.
TEST(MaskPrefetcher, SkipsStatesWhoseMaskCouldNotBeKept) {
  CompiledGrammar::MaskOptions options;
  options.max_cached_masks = 0;
  const auto g = compile(options);
  MaskPrefetcher prefetcher;
  for (StateId s : walk(*g)) {
    EXPECT_FALSE(g->mask_pending(s));
    prefetcher.request(g, s);
  }
  prefetcher.wait_idle();
  EXPECT_EQ(prefetcher.num_computed(), 0);
  EXPECT_EQ(g->num_mask_computations(), 0u);
}

// Destroying the prefetcher with requests queued returns (the queue is dropped) and leaves the
// grammars usable.
TEST(MaskPrefetcher, StopsWithRequestsQueued) {
  const auto g = compile();
  const std::vector<StateId> states = walk(*g);
  {
    MaskPrefetcher prefetcher;
    for (int i = 0; i < 100; ++i)
      for (StateId s : states) prefetcher.request(g, s);
  }
  const auto fresh = compile();
  EXPECT_EQ(*g->allowed(states.back()), *fresh->allowed(walk(*fresh).back()));
}

}  // namespace
}  // namespace vesper::grammar
