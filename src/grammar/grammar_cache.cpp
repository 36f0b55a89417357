#include "grammar/grammar_cache.h"

#include "grammar/gbnf.h"

namespace vesper::grammar {

GrammarCache::GrammarCache(std::shared_ptr<const TokenVocabulary> vocab, size_t capacity)
    : vocab_(std::move(vocab)), capacity_(capacity == 0 ? 1 : capacity) {}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::get(const std::string& gbnf) {
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(gbnf); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Parsed outside the lock: a large grammar must not hold up requests using cached ones.
  VESPER_ASSIGN_OR_RETURN(Grammar g, parse_gbnf(gbnf));
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(g), vocab_);
  if (auto failure = compiled->failure(CompiledGrammar::kInitial))
    return make_error(*failure + " (at its start)");
  // Cached in the grammar under its mutex, as any mask is; no other thread has it yet.
  compiled->allowed(CompiledGrammar::kInitial);
  std::lock_guard lock(mu_);
  if (auto it = index_.find(gbnf); it != index_.end()) return it->second->second;
  lru_.emplace_front(gbnf, compiled);
  index_[gbnf] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return std::shared_ptr<const CompiledGrammar>(compiled);
}

size_t GrammarCache::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

}  // namespace vesper::grammar
