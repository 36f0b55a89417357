#include "tokenizer/bpe.h"

#include <queue>
#include <string>

#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace vesper::tokenizer {
namespace {

struct Symbol {
  int prev = -1;
  int next = -1;
  size_t begin = 0;
  size_t size = 0;  // 0 once merged into its left neighbour
};

struct Bigram {
  int left = 0;
  int right = 0;
  int32_t rank = 0;
  size_t left_size = 0;   // sizes when queued: a bigram is stale once either side changed
  size_t right_size = 0;
};

// Lowest rank first; among equal ranks the leftmost.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

class BpeSession {
 public:
  explicit BpeSession(const Vocab& vocab) : vocab_(vocab) {}

  // Merges one (byte-level encoded) word and appends its tokens.
  void encode_word(std::string_view word, std::vector<int32_t>* out) {
    if (vocab_.ignore_merges) {
      const int32_t id = vocab_.find(word);
      if (id != kNoToken) {
        out->push_back(id);
        return;
      }
    }
    word_ = word;
    symbols_.clear();
    queue_ = {};
    for (size_t offset = 0; offset < word.size();) {
      Symbol sym;
      sym.begin = offset;
      sym.size = std::min(utf8_sequence_length(static_cast<uint8_t>(word[offset])), word.size() - offset);
      offset += sym.size;
      sym.prev = static_cast<int>(symbols_.size()) - 1;
      sym.next = offset == word.size() ? -1 : static_cast<int>(symbols_.size()) + 1;
      symbols_.push_back(sym);
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) add_bigram(i - 1, i);

    while (!queue_.empty()) {
      const Bigram bigram = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[bigram.left];
      Symbol& right = symbols_[bigram.right];
      if (left.size != bigram.left_size || right.size != bigram.right_size || left.size == 0 ||
          right.size == 0) {
        continue;
      }
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = bigram.left;
      add_bigram(left.prev, bigram.left);
      add_bigram(bigram.left, left.next);
    }

    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) {
      const std::string_view piece = word_.substr(symbols_[i].begin, symbols_[i].size);
      const int32_t id = vocab_.find(piece);
      if (id != kNoToken) {
        out->push_back(id);
        continue;
      }
      // Not a token: llama.cpp looks each byte up as a one-byte token and drops the misses.
      for (char c : piece) {
        const int32_t byte_id = vocab_.find(std::string_view(&c, 1));
        if (byte_id != kNoToken) out->push_back(byte_id);
      }
    }
  }

 private:
  void add_bigram(int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[left];
    const Symbol& r = symbols_[right];
    key_.assign(word_.substr(l.begin, l.size));
    key_.push_back(' ');
    key_.append(word_.substr(r.begin, r.size));
    auto it = vocab_.bpe_ranks.find(std::string_view(key_));
    if (it == vocab_.bpe_ranks.end()) return;
    queue_.push({left, right, it->second, l.size, r.size});
  }

  const Vocab& vocab_;
  std::string_view word_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  std::string key_;  // "left right", reused across lookups
};

}  // namespace

void bpe_encode(const Vocab& vocab, std::string_view raw_text, std::vector<int32_t>* out) {
  // The pre-tokenizer works on code points; invalid bytes become U+FFFD as in llama.cpp.
  const std::string text = to_valid_utf8_lenient(raw_text);
  const std::vector<Span> words = vocab.pre_tokenizer.split(text);
  BpeSession session(vocab);
  std::string encoded;
  for (const Span& w : words) {
    encoded.clear();
    for (size_t i = w.begin; i < w.end; ++i) encoded.append(byte_to_bpe_char(static_cast<uint8_t>(text[i])));
    session.encode_word(encoded, out);
  }
}

}  // namespace vesper::tokenizer
