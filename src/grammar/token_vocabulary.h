// TokenVocabulary: what a grammar needs to know of a tokenizer: the bytes each token adds to
// the text, arranged as a byte trie so that a grammar state's allowed tokens are found by one
// walk that drops whole subtrees at the first byte the grammar refuses.
//
// Built once per model from the tokenizer's pieces. Tokens with no bytes (control tokens and
// other specials, empty pieces) are never allowed by a grammar, except the end-of-generation
// tokens, which a grammar allows exactly where its root rule is complete.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace vesper::grammar {

class TokenVocabulary {
 public:
  // pieces[id]: the bytes token id adds to the output text ("" for tokens a grammar never
  // allows); eog_ids: the end-of-generation tokens.
  TokenVocabulary(std::vector<std::string> pieces, std::vector<int32_t> eog_ids);

  int32_t size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  std::span<const int32_t> eog_ids() const { return eog_ids_; }
  bool is_eog(int32_t id) const;

  // The trie: node 0 is the root (the empty prefix).
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // (byte, node), ascending by byte
    std::vector<int32_t> tokens;                         // tokens whose bytes end here
  };
  const std::vector<Node>& trie() const { return trie_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_ids_;
  std::vector<Node> trie_;
};

}  // namespace vesper::grammar
