// CompiledGrammar: a Grammar bound to a model's vocabulary, answering "which tokens may come
// next" for each matcher state, and GrammarCursor, one sequence's place in it.
//
// States (stack sets, stack_set.h) are interned: equal states get one id, so what is computed
// for a state serves every sequence that reaches it. The caches fill lazily and are shared by
// all sequences using the grammar (many requests with one schema share one CompiledGrammar,
// grammar_cache.h):
//  - the allowed-token mask of a state;
//  - transitions (state, token) -> state;
//  - the context-independent part of masks (xgrammar's split): a state's mask is computed from
//    the top few elements of its stacks alone, by one walk of the vocabulary trie that drops a
//    subtree at the first byte the grammar refuses. Tokens read within those elements are
//    decided there (allowed or refused whatever lies below); the few that pop below them
//    (context-dependent: a string's closing quote and what follows) are kept in a list and
//    checked against each state's full stacks. States that differ only below the top (the same
//    field in the 1st and the 40th item of an array, a value at any nesting depth) share the
//    walk. When too many tokens depend on the context, a deeper top is tried, up to the whole
//    stacks.
// After warm-up a decoding step costs a hash lookup and a pass of the mask over the row. The
// caches are guarded by a mutex; the trie walk runs outside it. A state's mask is computed once
// however many threads ask at the same time: the later ones wait for the first (so a mask that a
// prefetching thread has begun, mask_prefetcher.h, is not computed twice on the step loop).
//
// End-of-generation tokens are allowed exactly in accepting states (the root rule complete).
// A state that allows nothing (the vocabulary cannot spell what the grammar needs, or the
// sequence left the grammar) allows only end-of-generation tokens, so it ends.
//
// An ambiguous grammar can need ever more stacks (stack_set.h); a step past
// options.max_stacks leads to kTooAmbiguous, a failed state: it allows only end-of-generation
// tokens, every token leads from it back to it, and failure() says why, so the engine can end
// the sequence and report it. Whether a step fails depends only on the state and the token's
// bytes, so the same tokens always reach the same states. A token whose reading fails is
// allowed by the mask of the state before (it is not known to leave the grammar).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/limits.h"
#include "grammar/stack_set.h"
#include "grammar/token_vocabulary.h"

namespace vesper::grammar {

using StateId = uint32_t;
// Bit t set: token t may come next.
using TokenMask = std::vector<uint64_t>;

// One sequence's place in a grammar: the state after each prefix of its output, kept so that
// the next step (or a speculative verification that extends or cuts the output) resumes from
// the longest prefix it shares with what was seen before.
struct GrammarCursor {
  std::vector<int32_t> tokens;
  std::vector<StateId> states;  // states[i]: after tokens[0, i); empty until first used
};

// How a CompiledGrammar's masks split into a context-independent part and the rest (see
// below). The masks are the same for any values; tests vary them to drive every path.
struct GrammarMaskOptions {
  size_t cut_depth = 4;  // top elements of each stack the shared walk reads
  // Context-dependent tokens beyond which a cut walk gives way to a walk of the whole stacks.
  size_t max_context_dependent = 1024;
  // Masks kept per grammar at most (both kinds; 4 KB each for a 32,000-token vocabulary).
  size_t max_cached_masks = 16384;
  // The bound on one step's stacks and explored alternatives (stack_set.h) past which a state
  // fails as too ambiguous.
  size_t max_stacks = kMaxStacksPerState;
};

class CompiledGrammar {
 public:
  using MaskOptions = GrammarMaskOptions;

  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab,
                  MaskOptions options = {});

  static constexpr StateId kInitial = 0;
  static constexpr StateId kDead = 1;  // no way forward: only end-of-generation tokens
  // Failed: the grammar is too ambiguous to follow (above). The initial state fails too when
  // the grammar's start alone is past the bound (GrammarCache refuses such grammars).
  static constexpr StateId kTooAmbiguous = 2;

  // The state after `token` in `state` (kDead when the grammar does not allow it; end-of-
  // generation tokens lead to kDead too: nothing follows them).
  StateId next(StateId state, int32_t token) const;
  // The state after `output`, resuming `cursor` from what it shares with `output`.
  StateId state_after(GrammarCursor& cursor, std::span<const int32_t> output) const;
  // The state after `output`, from the start (no cursor).
  StateId state_after(std::span<const int32_t> output) const;

  bool is_accepting(StateId state) const;
  // Whether decoding gave up in `state` (kTooAmbiguous, or a failed initial state).
  bool is_failed(StateId state) const;
  // Why `state` failed ("the grammar is too ambiguous: more than 1,024 alternatives at one
  // position"); nullopt when it did not.
  std::optional<std::string> failure(StateId state) const;
  // The same for the last state `cursor` reached (failed states are sticky, so a cursor that
  // ever failed has).
  std::optional<std::string> failure(const GrammarCursor& cursor) const;
  // The tokens allowed in `state` (computed on first use, or waited for while another thread
  // computes it). `computed_here`: set to whether this call computed the mask.
  std::shared_ptr<const TokenMask> allowed(StateId state, bool* computed_here = nullptr) const;
  // Whether allowed(state) would compute something: no mask cached, none being computed, and room
  // in the cache to keep one (a mask computed ahead of time that could not be kept is wasted).
  bool mask_pending(StateId state) const;
  bool allows(StateId state, int32_t token) const;
  // Sets every logit the state does not allow to -infinity.
  void apply(StateId state, std::span<float> logits) const;

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocab_; }
  const std::shared_ptr<const TokenVocabulary>& vocabulary_ptr() const { return vocab_; }
  // Cache sizes, for logs and tests.
  size_t num_states() const;
  size_t num_masks() const;
  // Masks computed so far (a mask computed again after the cache filled counts again).
  size_t num_mask_computations() const;

 private:
  struct State {
    StackSet stacks;
    bool accepting = false;
    bool failed = false;
    std::shared_ptr<const TokenMask> mask;  // filled on first use
    bool computing = false;                 // a thread is computing the mask (mask_ready_)
  };

  // The part of a mask decided by the top `depth` elements of each stack: the tokens allowed
  // whatever lies below, and those that pop below (to check against the full stacks). `overflow`:
  // more than options_.max_context_dependent of the latter (the walk stopped; use the whole
  // stacks). Tokens whose reading passes options_.max_stacks are allowed: next() fails them.
  struct ContextIndependentMask {
    TokenMask allowed;
    std::vector<int32_t> context_dependent;
    bool overflow = false;
  };

  // The id of `stacks`, adding it when new. Call with mu_ held.
  StateId intern(StackSet stacks) const;
  TokenMask compute_mask(const State& state) const;
  std::shared_ptr<const ContextIndependentMask> context_independent_mask(const StackSet& stacks,
                                                                         size_t depth) const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  MaskOptions options_;
  mutable std::mutex mu_;
  // Signalled when a mask computation ends (State::computing cleared).
  mutable std::condition_variable mask_ready_;
  mutable std::vector<std::unique_ptr<State>> states_;
  mutable std::unordered_map<std::u32string, StateId> state_ids_;
  mutable std::unordered_map<uint64_t, StateId> transitions_;
  // By the top elements of a state's stacks (and the depth that cut them).
  mutable std::unordered_map<std::u32string, std::shared_ptr<const ContextIndependentMask>>
      context_independent_;
  mutable size_t num_masks_ = 0;
  mutable size_t num_mask_computations_ = 0;
};

}  // namespace vesper::grammar
