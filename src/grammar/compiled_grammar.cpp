#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <limits>

namespace vesper::grammar {
namespace {

std::u32string state_key(const StackSet& stacks) {
  std::u32string key;
  for (const Stack& s : stacks) {
    key.push_back(static_cast<char32_t>(s.size()));
    for (uint32_t p : s) key.push_back(static_cast<char32_t>(p));
  }
  return key;
}

bool bit(const TokenMask& m, int32_t t) {
  return (m[static_cast<size_t>(t) >> 6] >> (t & 63)) & 1;
}
void set_bit(TokenMask& m, int32_t t) {
  m[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
}

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  std::lock_guard lock(mu_);
  StackSet initial = initial_stacks(grammar_);
  auto start = std::make_unique<State>();
  start->accepting = grammar::is_accepting(initial);
  if (!initial.empty()) state_ids_.emplace(state_key(initial), kInitial);
  start->stacks = std::move(initial);
  states_.push_back(std::move(start));
  states_.push_back(std::make_unique<State>());  // kDead: no stacks
}

StateId CompiledGrammar::intern(StackSet stacks) const {
  if (stacks.empty()) return kDead;
  std::u32string key = state_key(stacks);
  if (auto it = state_ids_.find(key); it != state_ids_.end()) return it->second;
  const auto id = static_cast<StateId>(states_.size());
  auto state = std::make_unique<State>();
  state->accepting = grammar::is_accepting(stacks);
  state->stacks = std::move(stacks);
  states_.push_back(std::move(state));
  state_ids_.emplace(std::move(key), id);
  return id;
}

StateId CompiledGrammar::next(StateId state, int32_t token) const {
  if (state == kDead || token < 0 || token >= vocab_->size() || vocab_->is_eog(token)) return kDead;
  const uint64_t key = (uint64_t{state} << 32) | static_cast<uint32_t>(token);
  const State* s = nullptr;
  {
    std::lock_guard lock(mu_);
    if (auto it = transitions_.find(key); it != transitions_.end()) return it->second;
    s = states_[state].get();  // stable: states are never removed
  }
  const std::string& piece = vocab_->piece(token);
  StackSet stacks = piece.empty() ? StackSet{} : s->stacks;
  for (unsigned char b : piece) {
    stacks = advance_stacks(grammar_, stacks, b);
    if (stacks.empty()) break;
  }
  std::lock_guard lock(mu_);
  const StateId id = intern(std::move(stacks));
  transitions_.emplace(key, id);
  return id;
}

StateId CompiledGrammar::state_after(GrammarCursor& cursor, std::span<const int32_t> output) const {
  if (cursor.states.empty()) cursor.states.push_back(kInitial);
  size_t common = 0;
  const size_t known = std::min(cursor.tokens.size(), output.size());
  while (common < known && cursor.tokens[common] == output[common]) ++common;
  cursor.tokens.resize(common);
  cursor.states.resize(common + 1);
  for (size_t i = common; i < output.size(); ++i) {
    cursor.states.push_back(next(cursor.states.back(), output[i]));
    cursor.tokens.push_back(output[i]);
  }
  return cursor.states.back();
}

StateId CompiledGrammar::state_after(std::span<const int32_t> output) const {
  StateId s = kInitial;
  for (int32_t t : output) s = next(s, t);
  return s;
}

bool CompiledGrammar::is_accepting(StateId state) const {
  std::lock_guard lock(mu_);
  return states_[state]->accepting;
}

TokenMask CompiledGrammar::compute_mask(const State& state) const {
  TokenMask mask((static_cast<size_t>(vocab_->size()) + 63) / 64, 0);
  const auto& trie = vocab_->trie();
  // Depth-first over the trie; a node is entered only while some reading of the grammar takes
  // its bytes.
  struct Frame {
    uint32_t node;
    StackSet stacks;
  };
  std::vector<Frame> todo;
  todo.push_back({0, state.stacks});
  bool any = false;
  while (!todo.empty()) {
    Frame f = std::move(todo.back());
    todo.pop_back();
    for (auto [byte, child] : trie[f.node].children) {
      if (!takes_byte(grammar_, f.stacks, byte)) continue;
      StackSet next = advance_stacks(grammar_, f.stacks, byte);
      if (next.empty()) continue;
      for (int32_t t : trie[child].tokens) {
        set_bit(mask, t);
        any = true;
      }
      if (!trie[child].children.empty()) todo.push_back({child, std::move(next)});
    }
  }
  if (state.accepting || !any)
    for (int32_t t : vocab_->eog_ids()) set_bit(mask, t);
  return mask;
}

std::shared_ptr<const TokenMask> CompiledGrammar::allowed(StateId state) const {
  const State* s = nullptr;
  {
    std::lock_guard lock(mu_);
    s = states_[state].get();
    if (s->mask) return s->mask;
  }
  auto mask = std::make_shared<const TokenMask>(compute_mask(*s));
  std::lock_guard lock(mu_);
  State& mutable_state = *states_[state];
  if (!mutable_state.mask) {
    mutable_state.mask = std::move(mask);
    ++num_masks_;
  }
  return mutable_state.mask;
}

bool CompiledGrammar::allows(StateId state, int32_t token) const {
  if (token < 0 || token >= vocab_->size()) return false;
  return bit(*allowed(state), token);
}

void CompiledGrammar::apply(StateId state, std::span<float> logits) const {
  const std::shared_ptr<const TokenMask> mask = allowed(state);
  const size_t n = std::min(logits.size(), static_cast<size_t>(vocab_->size()));
  for (size_t t = 0; t < n; ++t)
    if (!bit(*mask, static_cast<int32_t>(t))) logits[t] = -std::numeric_limits<float>::infinity();
  for (size_t t = n; t < logits.size(); ++t) logits[t] = -std::numeric_limits<float>::infinity();
}

size_t CompiledGrammar::num_states() const {
  std::lock_guard lock(mu_);
  return states_.size();
}

size_t CompiledGrammar::num_masks() const {
  std::lock_guard lock(mu_);
  return num_masks_;
}

}  // namespace vesper::grammar
