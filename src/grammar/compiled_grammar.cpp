#include "grammar/compiled_grammar.h"

#include "core/check.h"
#include "grammar/stack_arena.h"

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

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab,
                                 MaskOptions options)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), options_(options) {
  std::lock_guard lock(mu_);
  StackSet initial;
  auto start = std::make_unique<State>();
  if (initial_stacks(grammar_, options_.max_stacks, initial)) {
    start->accepting = grammar::is_accepting(initial);
    if (!initial.empty()) state_ids_.emplace(state_key(initial), kInitial);
    start->stacks = std::move(initial);
  } else {
    start->failed = true;
  }
  states_.push_back(std::move(start));
  states_.push_back(std::make_unique<State>());  // kDead: no stacks
  auto too_ambiguous = std::make_unique<State>();
  too_ambiguous->failed = true;
  states_.push_back(std::move(too_ambiguous));
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
  if (state == kDead || state == kTooAmbiguous) return state;
  const uint64_t key = (uint64_t{state} << 32) | static_cast<uint32_t>(token);
  const State* s = nullptr;
  {
    std::lock_guard lock(mu_);
    s = states_[state].get();  // stable: states are never removed
    if (s->failed) return kTooAmbiguous;
    if (token < 0 || token >= vocab_->size() || vocab_->is_eog(token)) return kDead;
    if (auto it = transitions_.find(key); it != transitions_.end()) return it->second;
  }
  const std::string& piece = vocab_->piece(token);
  StackSet stacks = piece.empty() ? StackSet{} : s->stacks;
  StackSet after;
  bool failed = false;
  for (unsigned char b : piece) {
    if (!advance_stacks(grammar_, stacks, b, options_.max_stacks, after)) {
      failed = true;
      break;
    }
    stacks.swap(after);
    if (stacks.empty()) break;
  }
  std::lock_guard lock(mu_);
  const StateId id = failed ? kTooAmbiguous : intern(std::move(stacks));
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

bool CompiledGrammar::is_failed(StateId state) const {
  std::lock_guard lock(mu_);
  return states_[state]->failed;
}

std::optional<std::string> CompiledGrammar::failure(StateId state) const {
  if (!is_failed(state)) return std::nullopt;
  return "the grammar is too ambiguous: more than " + with_separators(options_.max_stacks) +
         " alternatives at one position";
}

std::optional<std::string> CompiledGrammar::failure(const GrammarCursor& cursor) const {
  return failure(cursor.states.empty() ? kInitial : cursor.states.back());
}

namespace {

// Depth-first over the vocabulary trie from stacks cut to their top (StackArena::intern_top): a
// node is entered while some reading takes its bytes within the top, or once a reading has
// popped into the context (kContext), below which any byte might be taken. sets[d] holds the
// stacks after the first d bytes (one reused vector per depth: nothing is allocated per node).
//
// A step past `max_stacks` at a node means next() fails every token through it: all are
// allowed (they do not leave the grammar; they lead to the failed state). That holds for stacks
// cut to their top too: the whole stacks under them explore at least the alternatives the cut
// ones do and leave at least as many stacks, so they pass the bound at that byte or before.
struct ContextIndependentWalk {
  const std::vector<TokenVocabulary::Node>& trie;
  StackArena& arena;
  TokenMask& allowed;
  std::vector<int32_t>& context_dependent;
  size_t limit;
  size_t max_stacks;
  std::vector<std::vector<uint32_t>> sets;
  bool overflow = false;

  void allow_subtree(uint32_t root) {
    std::vector<uint32_t> todo = {root};
    while (!todo.empty()) {
      const uint32_t n = todo.back();
      todo.pop_back();
      for (int32_t t : trie[n].tokens)
        allowed[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
      for (auto [byte, child] : trie[n].children) todo.push_back(child);
    }
  }

  void walk(uint32_t node, size_t depth, bool in_context) {
    if (sets.size() <= depth + 1) sets.resize(depth + 2);
    for (auto [byte, child] : trie[node].children) {
      if (overflow) return;
      std::vector<uint32_t>& next = sets[depth + 1];
      next.clear();
      if (arena.takes_byte(sets[depth], byte) &&
          !arena.advance(sets[depth], byte, next, max_stacks)) {
        allow_subtree(child);
        continue;
      }
      // Sorted: kContext, if there, is first (or second after kEmpty).
      bool popped = false, local = false;
      for (uint32_t id : next) {
        if (id == StackArena::kContext)
          popped = true;
        else
          local = true;
      }
      const bool child_in_context = in_context || popped;
      if (!local && !child_in_context) continue;
      for (int32_t t : trie[child].tokens) {
        if (local) {
          allowed[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
        } else {
          context_dependent.push_back(t);
          if (context_dependent.size() > limit) {
            overflow = true;
            return;
          }
        }
      }
      if (!trie[child].children.empty()) walk(child, depth + 1, child_in_context);
    }
  }
};

// Whether `stacks` take all of `bytes`, or fail a step past `max_stacks` on the way (the token
// then leads to the failed state, so it is allowed, as next() has it).
bool takes_all(StackArena& arena, const std::vector<uint32_t>& start, const std::string& bytes,
               size_t max_stacks, std::vector<uint32_t>& a, std::vector<uint32_t>& b) {
  a = start;
  for (unsigned char c : bytes) {
    if (!arena.takes_byte(a, c)) return false;
    if (!arena.advance(a, c, b, max_stacks)) return true;
    if (b.empty()) return false;
    std::swap(a, b);
  }
  return true;
}

}  // namespace

std::shared_ptr<const CompiledGrammar::ContextIndependentMask>
CompiledGrammar::context_independent_mask(const StackSet& stacks, size_t depth) const {
  // The key: the cut stacks, and whether each was cut (a whole stack's bottom is real).
  StackSet cut;
  std::u32string key;
  for (const Stack& s : stacks) {
    const size_t from = s.size() > depth ? s.size() - depth : 0;
    cut.emplace_back(s.begin() + static_cast<ptrdiff_t>(from), s.end());
    key.push_back(static_cast<char32_t>(from > 0 ? 1 : 0));
  }
  key += state_key(cut);
  {
    std::lock_guard lock(mu_);
    if (auto it = context_independent_.find(key); it != context_independent_.end())
      return it->second;
  }
  auto m = std::make_shared<ContextIndependentMask>();
  m->allowed.assign((static_cast<size_t>(vocab_->size()) + 63) / 64, 0);
  StackArena arena(grammar_);
  ContextIndependentWalk w{
      vocab_->trie(),      arena, m->allowed, m->context_dependent, options_.max_context_dependent,
      options_.max_stacks, {}};
  w.sets.resize(1);
  for (const Stack& s : stacks) w.sets[0].push_back(arena.intern_top(s, depth));
  std::sort(w.sets[0].begin(), w.sets[0].end());
  w.sets[0].erase(std::unique(w.sets[0].begin(), w.sets[0].end()), w.sets[0].end());
  w.walk(0, 0, false);
  m->overflow = w.overflow;
  if (m->overflow) {
    m->context_dependent.clear();
    m->context_dependent.shrink_to_fit();
    m->allowed.clear();
    m->allowed.shrink_to_fit();
  }
  std::lock_guard lock(mu_);
  if (num_masks_ + context_independent_.size() >= options_.max_cached_masks) return m;
  auto [it, added] = context_independent_.emplace(std::move(key), std::move(m));
  return it->second;
}

TokenMask CompiledGrammar::compute_mask(const State& state) const {
  size_t max_depth = 0;
  for (const Stack& s : state.stacks) max_depth = std::max(max_depth, s.size());
  // A cut whose walk leaves too many tokens to the context (a value just completed, where every
  // token that starts with a separator depends on what encloses it) gives way to the whole
  // stacks, where nothing depends on a context.
  std::shared_ptr<const ContextIndependentMask> ci =
      context_independent_mask(state.stacks, options_.cut_depth);
  if (ci->overflow) ci = context_independent_mask(state.stacks, max_depth);
  VESPER_CHECK(!ci->overflow, "a whole-stack walk cannot depend on a context");
  TokenMask mask = ci->allowed;
  bool any = std::any_of(mask.begin(), mask.end(), [](uint64_t w) { return w != 0; });
  if (!ci->context_dependent.empty()) {
    // The full stacks decide the rest.
    StackArena arena(grammar_);
    std::vector<uint32_t> start, a, b;
    for (const Stack& s : state.stacks) start.push_back(arena.intern(s));
    std::sort(start.begin(), start.end());
    for (int32_t t : ci->context_dependent)
      if (takes_all(arena, start, vocab_->piece(t), options_.max_stacks, a, b)) {
        set_bit(mask, t);
        any = true;
      }
  }
  if (state.accepting || !any)
    for (int32_t t : vocab_->eog_ids()) set_bit(mask, t);
  return mask;
}

std::shared_ptr<const TokenMask> CompiledGrammar::allowed(StateId state,
                                                          bool* computed_here) const {
  if (computed_here != nullptr) *computed_here = false;
  State* s = nullptr;
  {
    std::unique_lock lock(mu_);
    s = states_[state].get();
    // Another thread is computing this mask: wait for it rather than walk the trie twice.
    mask_ready_.wait(lock, [s] { return !s->computing; });
    if (s->mask) return s->mask;
    s->computing = true;
    ++num_mask_computations_;
  }
  if (computed_here != nullptr) *computed_here = true;
  std::shared_ptr<const TokenMask> mask;
  try {
    mask = std::make_shared<const TokenMask>(compute_mask(*s));
  } catch (...) {
    std::lock_guard lock(mu_);
    s->computing = false;
    mask_ready_.notify_all();
    throw;
  }
  std::lock_guard lock(mu_);
  s->computing = false;
  mask_ready_.notify_all();
  // A grammar whose outputs wander through ever new states (long free enumerations) stops
  // caching there: the memory stays bounded, the masks are computed again when needed.
  if (num_masks_ + context_independent_.size() >= options_.max_cached_masks) return mask;
  s->mask = std::move(mask);
  ++num_masks_;
  return s->mask;
}

bool CompiledGrammar::mask_pending(StateId state) const {
  std::lock_guard lock(mu_);
  const State& s = *states_[state];
  return !s.mask && !s.computing &&
         num_masks_ + context_independent_.size() < options_.max_cached_masks;
}

bool CompiledGrammar::allows(StateId state, int32_t token) const {
  if (token < 0 || token >= vocab_->size()) return false;
  return bit(*allowed(state), token);
}

void CompiledGrammar::apply(StateId state, std::span<float> logits) const {
  const std::shared_ptr<const TokenMask> mask = allowed(state);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(logits.size(), static_cast<size_t>(vocab_->size()));
  // A word at a time: most words of a mask are all allowed or all refused.
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = (*mask)[w];
    const size_t begin = w * 64, end = std::min(n, begin + 64);
    if (bits == ~uint64_t{0} && end - begin == 64) continue;
    if (bits == 0) {
      std::fill(logits.begin() + static_cast<ptrdiff_t>(begin),
                logits.begin() + static_cast<ptrdiff_t>(end), kMasked);
      continue;
    }
    for (size_t t = begin; t < end; ++t)
      if (!((bits >> (t - begin)) & 1)) logits[t] = kMasked;
  }
  for (size_t t = n; t < logits.size(); ++t) logits[t] = kMasked;
}

size_t CompiledGrammar::num_states() const {
  std::lock_guard lock(mu_);
  return states_.size();
}

size_t CompiledGrammar::num_masks() const {
  std::lock_guard lock(mu_);
  return num_masks_;
}

size_t CompiledGrammar::num_mask_computations() const {
  std::lock_guard lock(mu_);
  return num_mask_computations_;
}

}  // namespace vesper::grammar
