// Vocab: everything a Tokenizer knows, as loaded from GGUF metadata (vocab_loader.cpp), plus
// the lookup structures the encoders need. Immutable once built; shared by Tokenizer copies.
// Internal to the tokenizer module.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/regex_splitter.h"
#include "tokenizer/tokenizer.h"

namespace vesper::tokenizer {

inline constexpr int32_t kNoToken = -1;

// The values of tokenizer.ggml.token_type (llama_token_type).
enum GgufTokenType : int32_t {
  kTypeUndefined = 0,
  kTypeNormal = 1,
  kTypeUnknown = 2,
  kTypeControl = 3,
  kTypeUserDefined = 4,
  kTypeUnused = 5,
  kTypeByte = 6,
};

// Hash and equality that let unordered maps keyed by std::string be probed with string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StringEqual {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
using StringToId = std::unordered_map<std::string, int32_t, StringHash, StringEqual>;

struct TokenData {
  std::string text;
  float score = 0.0f;
  uint32_t attr = kAttrNormal;
};

// A byte trie over the texts of the special tokens, used to find which of them occur in a
// text in one pass.
class SpecialTrie {
 public:
  void insert(std::string_view text, int32_t value);
  // Calls `found(value)` for every inserted text that occurs in `text` (possibly repeatedly).
  template <class F>
  void for_each_occurring(std::string_view text, F&& found) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t value = -1;
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_{Node{}};
};

struct Vocab {
  std::string path;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre
  VocabType type = VocabType::kSpm;

  std::vector<TokenData> tokens;
  StringToId token_to_id;
  size_t max_token_len = 0;

  int32_t bos = kNoToken;
  int32_t eos = kNoToken;
  int32_t eot = kNoToken;
  int32_t eom = kNoToken;
  int32_t unk = kNoToken;
  int32_t sep = kNoToken;
  int32_t pad = kNoToken;
  int32_t mask = kNoToken;
  int32_t nl = kNoToken;
  int32_t fim_pre = kNoToken;
  int32_t fim_suf = kNoToken;
  int32_t fim_mid = kNoToken;
  int32_t fim_pad = kNoToken;
  int32_t fim_rep = kNoToken;
  int32_t fim_sep = kNoToken;
  std::vector<int32_t> eog_ids;  // sorted

  bool add_bos = false;
  bool add_eos = false;
  bool add_sep = false;
  bool add_space_prefix = false;
  bool clean_spaces = false;
  bool ignore_merges = false;
  bool remove_extra_whitespaces = false;
  // WPM normalizer (BertNormalizer options).
  bool lowercase = true;
  bool strip_accents = true;

  // Tokens matched whole in text before the model's own algorithm runs: control, unknown and
  // user-defined tokens, longest text first (ties by id), and a trie of their texts mapping to
  // positions in this list.
  std::vector<int32_t> special_tokens;
  SpecialTrie special_trie;

  // The token for each byte value: SPM <0xXX> (or the one-byte text), BPE the byte-level
  // character. kNoToken when the vocabulary lacks it.
  std::array<int32_t, 256> byte_tokens{};

  // Merge ranks keyed by "left right" (the tokenizer.ggml.merges strings): BPE always; SPM only
  // when the file carries merges (a Hugging Face tokenizer.json's, see hf_tokenizer.h), which
  // makes SPM merge listed pairs by rank as Hugging Face's BPE does, instead of any pair whose
  // concatenation is a token by score as llama.cpp does. And the BPE pre-tokenizer.
  bool spm_merges_by_rank = false;
  StringToId bpe_ranks;
  RegexSplitter pre_tokenizer;

  // token_to_piece(id, render_special = true) of every token, back to back.
  std::string pieces;
  std::vector<uint32_t> piece_offsets;  // n_vocab + 1 entries

  int32_t n_vocab() const { return static_cast<int32_t>(tokens.size()); }
  int32_t find(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? kNoToken : it->second;
  }
  std::string_view piece(int32_t id, bool render_special) const;
};

// Builds a Vocab from the tokenizer.ggml.* metadata of `file` (vocab_loader.cpp).
Result<std::shared_ptr<const Vocab>> load_vocab(const gguf::GgufFile& file);

// Replaces every occurrence of `from` (non-empty) in `*s` by `to`, in one pass.
void replace_all(std::string* s, std::string_view from, std::string_view to);

// True for the token texts llama.cpp (and load_vocab) take as end of generation wherever they
// are in a vocabulary: <|eot_id|>, <|im_end|>, <end_of_turn>, <|endoftext|>, ...
bool is_eog_text(std::string_view text);

template <class F>
void SpecialTrie::for_each_occurring(std::string_view text, F&& found) const {
  for (size_t start = 0; start < text.size(); ++start) {
    int32_t node = 0;
    for (size_t i = start; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      if (nodes_[node].value >= 0) found(nodes_[node].value);
    }
  }
}

}  // namespace vesper::tokenizer
