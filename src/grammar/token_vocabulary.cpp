#include "grammar/token_vocabulary.h"

#include <algorithm>

namespace vesper::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> pieces, std::vector<int32_t> eog_ids)
    : pieces_(std::move(pieces)), eog_ids_(std::move(eog_ids)) {
  trie_.emplace_back();
  for (size_t id = 0; id < pieces_.size(); ++id) {
    if (pieces_[id].empty() || is_eog(static_cast<int32_t>(id))) continue;
    uint32_t node = 0;
    for (unsigned char b : pieces_[id]) {
      auto& children = trie_[node].children;
      auto it =
          std::lower_bound(children.begin(), children.end(), std::pair<uint8_t, uint32_t>{b, 0},
                           [](const auto& x, const auto& y) { return x.first < y.first; });
      if (it != children.end() && it->first == b) {
        node = it->second;
        continue;
      }
      const auto child = static_cast<uint32_t>(trie_.size());
      children.insert(it, {b, child});
      trie_.emplace_back();  // may move `children`: not used after this
      node = child;
    }
    trie_[node].tokens.push_back(static_cast<int32_t>(id));
  }
}

bool TokenVocabulary::is_eog(int32_t id) const {
  return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
}

}  // namespace vesper::grammar
