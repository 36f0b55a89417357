#include "tokenizer/spm.h"

#include <queue>
#include <string>

#include "tokenizer/utf8.h"

namespace vesper::tokenizer {
namespace {

// A piece of the text during merging; pieces form a doubly linked list in text order.
struct Symbol {
  int prev = -1;
  int next = -1;
  size_t begin = 0;
  size_t size = 0;  // 0 once merged into its left neighbour
};

struct Bigram {
  int left = 0;
  int right = 0;
  // The score of the merged token, or minus the merge's rank when merging by rank (exact in a
  // double either way).
  double priority = 0.0;
  size_t size = 0;  // bytes of the merged piece, to spot bigrams made stale by other merges
};

// Highest priority first; among equal priorities the leftmost.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
  }
};

class SpmSession {
 public:
  SpmSession(const Vocab& vocab, std::string_view text) : vocab_(vocab), text_(text) {}

  void run(std::vector<int32_t>* out) {
    for (size_t offset = 0; offset < text_.size();) {
      Symbol sym;
      sym.begin = offset;
      sym.size = std::min(utf8_sequence_length(static_cast<uint8_t>(text_[offset])),
                          text_.size() - offset);
      offset += sym.size;
      sym.prev = static_cast<int>(symbols_.size()) - 1;
      sym.next = offset == text_.size() ? -1 : static_cast<int>(symbols_.size()) + 1;
      symbols_.push_back(sym);
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add_bigram(i - 1, i);

    while (!queue_.empty()) {
      const Bigram bigram = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[bigram.left];
      Symbol& right = symbols_[bigram.right];
      if (left.size == 0 || right.size == 0 || left.size + right.size != bigram.size) continue;
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = bigram.left;
      try_add_bigram(left.prev, bigram.left);
      try_add_bigram(bigram.left, left.next);
    }

    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) emit(symbols_[i], out);
  }

 private:
  std::string_view text_of(const Symbol& s) const { return text_.substr(s.begin, s.size); }

  void try_add_bigram(int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[left];
    const Symbol& r = symbols_[right];
    if (vocab_.spm_merges_by_rank) {
      // Hugging Face's BPE: only listed pairs merge, lowest rank first.
      key_.assign(text_of(l));
      key_.push_back(' ');
      key_.append(text_of(r));
      const auto it = vocab_.bpe_ranks.find(std::string_view(key_));
      if (it == vocab_.bpe_ranks.end()) return;
      queue_.push({left, right, -static_cast<double>(it->second), l.size + r.size});
      return;
    }
    const int32_t id = vocab_.find(text_.substr(l.begin, l.size + r.size));
    if (id == kNoToken) return;
    queue_.push({left, right, vocab_.tokens[id].score, l.size + r.size});
  }

  // A final piece is a token, or (only for unmerged characters, since merges always form
  // tokens) spelled with byte tokens.
  void emit(const Symbol& s, std::vector<int32_t>* out) const {
    const std::string_view piece = text_of(s);
    const int32_t id = vocab_.find(piece);
    if (id != kNoToken) {
      out->push_back(id);
      return;
    }
    for (char c : piece) {
      const int32_t byte_id = vocab_.byte_tokens[static_cast<uint8_t>(c)];
      if (byte_id != kNoToken) {
        out->push_back(byte_id);
      } else if (vocab_.unk != kNoToken) {
        out->push_back(vocab_.unk);  // a vocabulary without byte fallback
      }
    }
  }

  const Vocab& vocab_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  std::string key_;  // "left right" for rank lookups, reused
};

}  // namespace

void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out) {
  SpmSession(vocab, text).run(out);
}

}  // namespace vesper::tokenizer
