// The grammar logits processor: every sampled token keeps the output inside the grammar, for
// every decoding method; end of generation comes exactly when the grammar is complete; the
// batched sampler with a cursor draws what the reference sampler (no cursor) draws.
#include <gtest/gtest.h>

#include <random>

#include "grammar/gbnf.h"
#include "sample/sampler.h"

namespace vesper::sample {
namespace {

constexpr int32_t kEos = 0;

std::shared_ptr<const grammar::CompiledGrammar> digits_grammar() {
  // Token 0 ends generation; the others spell digits, signs and commas, some several at once.
  std::vector<std::string> pieces = {"",  "1",  "2", "3",   "12", "-",
                                     ",", "9,", "x", "123", "  ", ","};
  auto vocab = std::make_shared<grammar::TokenVocabulary>(pieces, std::vector<int32_t>{kEos});
  auto g = grammar::parse_gbnf("root ::= num (\",\" num){0,3}\nnum ::= \"-\"? [1-9] [0-9]?\n");
  EXPECT_TRUE(g.ok());
  return std::make_shared<grammar::CompiledGrammar>(std::move(g).value(), vocab);
}

struct Method {
  const char* name;
  SamplingParams params;
};

std::vector<Method> methods() {
  std::vector<Method> m(6);
  m[0] = {"greedy", {}};
  m[0].params.temperature = 0;
  m[1] = {"temperature", {}};
  m[2] = {"top_k", {}};
  m[2].params.top_k = 3;
  m[3] = {"top_p", {}};
  m[3].params.top_p = 0.5f;
  m[4] = {"min_p", {}};
  m[4].params.min_p = 0.2f;
  m[5] = {"penalties", {}};
  m[5].params.repetition_penalty = 1.3f;
  m[5].params.frequency_penalty = 0.5f;
  return m;
}

TEST(GrammarProcessor, EveryMethodStaysInTheGrammarAndEndsWhereItIsComplete) {
  auto grammar = digits_grammar();
  const std::vector<int32_t> eog = {kEos};
  for (Method m : methods()) {
    m.params.grammar = grammar;
    for (uint64_t seed = 1; seed <= 25; ++seed) {
      m.params.seed = seed;
      BatchSampler batched(12);
      std::mt19937_64 rng = make_rng(m.params);
      Sampler reference(m.params);
      std::mt19937_64 logits_rng(seed * 7919);
      grammar::GrammarCursor cursor;
      std::vector<int32_t> out;
      std::string text;
      for (int step = 0; step < 40; ++step) {
        std::vector<float> logits(12);
        for (float& x : logits) x = std::normal_distribution<float>(0, 2)(logits_rng);
        std::vector<float> copy = logits;
        BatchSampler::Row row{&m.params, &rng, {{}, out, &cursor}, logits};
        const int32_t t = batched.sample_one(row, eog);
        ASSERT_EQ(t, reference.sample(copy, {}, out)) << m.name << " seed " << seed;
        if (t == kEos) break;
        text += grammar->vocabulary().piece(t);
        out.push_back(t);
        ASSERT_NE(grammar->state_after(out), grammar::CompiledGrammar::kDead)
            << m.name << " seed " << seed << " left the grammar at '" << text << "'";
      }
      EXPECT_TRUE(grammar->grammar().matches(text)) << m.name << " seed " << seed << ": " << text;
      ASSERT_FALSE(out.empty());
    }
  }
}

}  // namespace
}  // namespace vesper::sample
