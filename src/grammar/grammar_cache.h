// GrammarCache: compiled grammars by their GBNF text, so that requests sending the same schema
// share one CompiledGrammar (and the masks it has already computed). Least recently used
// grammars beyond the capacity are dropped (sequences still using one keep it alive).
//
// get() runs where requests are admitted (the server's workers), not on the engine's step loop,
// so it does there all a new grammar costs before its first token: parsing (within limits.h's
// bounds) and the initial state's mask, so that the first constrained step finds it cached.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/result.h"
#include "grammar/compiled_grammar.h"

namespace vesper::grammar {

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const TokenVocabulary> vocab, size_t capacity);

  // The compiled form of `gbnf`, its initial mask computed (parse errors as parse_gbnf gives
  // them; a grammar whose start alone is too ambiguous to follow, CompiledGrammar::failure,
  // is an error too).
  Result<std::shared_ptr<const CompiledGrammar>> get(const std::string& gbnf);

  size_t size() const;
  const std::shared_ptr<const TokenVocabulary>& vocabulary() const { return vocab_; }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledGrammar>>;
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace vesper::grammar
