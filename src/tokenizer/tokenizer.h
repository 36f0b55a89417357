// Tokenizer: text <-> token ids for a model, built from GGUF metadata alone
// (tokenizer.ggml.*), with the semantics of llama.cpp's llama-vocab.cpp.
//
// Supported vocabularies (tokenizer.ggml.model):
//   "llama" SPM:  SentencePiece BPE by piece scores (or, with tokenizer.ggml.merges from a Hugging
//                 Face tokenizer.json, by merge rank), spaces as U+2581, byte fallback <0xXX>.
//   "gpt2"  BPE:  byte-level BPE by merge rank, after a pre-tokenizer chosen by
//                 tokenizer.ggml.pre (PCRE2 regexes, see bpe_presets.h).
//   "bert"  WPM:  BERT WordPiece (lowercase, strip accents, greedy longest match).
//
// Invariants: a Tokenizer that was built is immutable; copies share the same vocabulary and
// are cheap; every method is const and safe to call from many threads at once. Token ids are
// int32 in [0, n_vocab()); passing any other id where an id is expected is a bug (checked).
// Decoded text is always valid UTF-8: invalid byte sequences (which byte tokens can spell)
// come out as U+FFFD.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "gguf/gguf.h"

namespace vesper::tokenizer {

enum class VocabType { kSpm, kBpe, kWpm };

// "SPM", "BPE", "WPM".
std::string_view vocab_type_name(VocabType type);

// Token attributes, bit flags with llama.cpp's values (llama_token_attr). They come from
// tokenizer.ggml.token_type and a few llama.cpp rules keyed on token texts and model names.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,      // special tokens: BOS, EOS, <|im_start|>, ...
  kAttrUserDefined = 1u << 4,  // added tokens, always matched whole in text
  kAttrByte = 1u << 5,         // <0xXX> byte-fallback tokens
  kAttrNormalized = 1u << 6,
  kAttrLstrip = 1u << 7,  // when matched in text, eats the whitespace before it
  kAttrRstrip = 1u << 8,  // when matched in text, eats the whitespace after it
  kAttrSingleWord = 1u << 9,
};

struct Vocab;  // the loaded vocabulary (vocab.h, internal)

class Tokenizer {
 public:
  // Reads the tokenizer.ggml.* keys of `file`. Errors name the file and the key at fault
  // (missing tokens, arrays of the wrong type or length, unknown model or pre-tokenizer, ...).
  static Result<Tokenizer> from_gguf(const gguf::GgufFile& file);

  // Text to ids.
  //   add_special:   add BOS / EOS (and for WPM, [CLS] ... [SEP]) as the vocabulary asks
  //                  (tokenizer.ggml.add_bos_token / add_eos_token, llama.cpp's defaults).
  //   parse_special: recognise the texts of control tokens ("<s>", "<|im_start|>") in `text`
  //                  and emit them as those tokens. User-defined tokens are always recognised,
  //                  as in llama.cpp and Hugging Face tokenizers.
  // Invalid UTF-8 in `text` is tolerated (SPM keeps the bytes via byte tokens; BPE and WPM
  // see U+FFFD there, as llama.cpp does).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Ids to text, as llama.cpp's llama_detokenize(remove_special = skip_special,
  // unparse_special = !skip_special):
  //   skip_special = false: control tokens render as their text ("<s>"); nothing is removed.
  //   skip_special = true:  control and unknown tokens render as nothing, and a leading BOS
  //                         and trailing EOS that the vocabulary adds are dropped.
  // When the vocabulary adds a space prefix (SPM), the first token's leading space is removed,
  // except after a dropped BOS (llama.cpp's rule). Vocabularies with clean_spaces() then drop
  // the spaces HF's clean_up_tokenization_spaces drops (" ." -> ".", " 's" -> "'s", ...).
  // Invalid UTF-8 becomes U+FFFD (llama.cpp would return the raw bytes).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The bytes one token contributes, as llama.cpp's llama_token_to_piece with lstrip = 0:
  // byte tokens give their byte, U+2581 becomes ' ' (SPM, WPM), byte-level BPE text is mapped
  // back to bytes, user-defined tokens give their text, and control/unknown tokens give their
  // text when `render_special` and nothing otherwise. Not necessarily valid UTF-8 on its own.
  std::string token_to_piece(int32_t id, bool render_special) const;
  // The same bytes, as a view into the tokenizer's cache (valid while any copy of this
  // Tokenizer lives).
  std::string_view piece_view(int32_t id, bool render_special) const;

  VocabType type() const;
  const std::string& model() const;  // tokenizer.ggml.model
  const std::string& pre() const;    // tokenizer.ggml.pre; empty when absent
  const std::string& path() const;   // the GGUF file it came from
  int32_t n_vocab() const;
  bool is_valid(int32_t id) const { return id >= 0 && id < n_vocab(); }

  // Special tokens; nullopt when the vocabulary has none.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> eot_id() const;  // end of turn (<|eot_id|>, <|im_end|>, <end_of_turn>)
  std::optional<int32_t> eom_id() const;  // end of message (<|eom_id|>)
  std::optional<int32_t> unk_id() const;
  std::optional<int32_t> sep_id() const;
  std::optional<int32_t> pad_id() const;
  std::optional<int32_t> mask_id() const;
  std::optional<int32_t> nl_id() const;  // the token of "\n"
  std::optional<int32_t> fim_pre_id() const;
  std::optional<int32_t> fim_suf_id() const;
  std::optional<int32_t> fim_mid_id() const;
  std::optional<int32_t> fim_pad_id() const;
  std::optional<int32_t> fim_rep_id() const;
  std::optional<int32_t> fim_sep_id() const;

  bool add_bos() const;  // encode(add_special) prepends BOS
  bool add_eos() const;  // encode(add_special) appends EOS
  bool add_sep() const;
  bool add_space_prefix() const;  // SPM: a space is put before the text (and after specials)
  bool clean_spaces() const;      // decode applies HF's clean_up_tokenization_spaces

  // End-of-generation tokens: EOS, EOT, EOM and the texts llama.cpp treats as such
  // (<|im_end|>, <|endoftext|>, <end_of_turn>, ...), sorted.
  const std::vector<int32_t>& eog_ids() const;
  bool is_eog(int32_t id) const;

  uint32_t token_attr(int32_t id) const;  // TokenAttr bits
  bool is_normal(int32_t id) const { return (token_attr(id) & kAttrNormal) != 0; }
  bool is_unknown(int32_t id) const { return (token_attr(id) & kAttrUnknown) != 0; }
  bool is_control(int32_t id) const { return (token_attr(id) & kAttrControl) != 0; }
  bool is_byte(int32_t id) const { return (token_attr(id) & kAttrByte) != 0; }
  bool is_user_defined(int32_t id) const { return (token_attr(id) & kAttrUserDefined) != 0; }
  bool is_unused(int32_t id) const { return (token_attr(id) & kAttrUnused) != 0; }

  // The token's text as stored in the vocabulary (with U+2581 or byte-level characters).
  std::string_view token_text(int32_t id) const;
  float token_score(int32_t id) const;
  // The id whose vocabulary text is exactly `text`.
  std::optional<int32_t> find_token(std::string_view text) const;

  // Internal: the loaded vocabulary, for the module's own components.
  const Vocab& vocab() const { return *vocab_; }

 private:
  explicit Tokenizer(std::shared_ptr<const Vocab> vocab) : vocab_(std::move(vocab)) {}
  std::shared_ptr<const Vocab> vocab_;
};

}  // namespace vesper::tokenizer
