#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/check.h"
#include "tokenizer/detokenize.h"
#include "tokenizer/encode.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace vesper::tokenizer {
namespace {

std::optional<int32_t> as_optional(int32_t id) {
  return id == kNoToken ? std::nullopt : std::optional<int32_t>(id);
}

}  // namespace

std::string_view vocab_type_name(VocabType type) {
  switch (type) {
    case VocabType::kSpm: return "SPM";
    case VocabType::kBpe: return "BPE";
    case VocabType::kWpm: return "WPM";
  }
  return "?";
}

Result<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  VESPER_ASSIGN_OR_RETURN(std::shared_ptr<const Vocab> vocab, load_vocab(file));
  return Tokenizer(std::move(vocab));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  return encode_text(*vocab_, text, add_special, parse_special);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Vocab& v = *vocab_;
  size_t first = 0;
  size_t last = ids.size();
  bool strip_space = v.add_space_prefix;
  if (skip_special && v.add_bos && last > first && ids[first] == v.bos) {
    strip_space = false;  // llama.cpp keeps the space after a removed BOS
    ++first;
  }
  if (skip_special && v.add_eos && last > first && ids[last - 1] == v.eos) --last;
  std::string raw;
  for (size_t i = first; i < last; ++i) {
    const int32_t id = ids[i];
    VESPER_CHECK(is_valid(id), "token id %d out of range [0, %d)", id, n_vocab());
    std::string_view piece = v.piece(id, !skip_special);
    if (strip_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    strip_space = false;
    raw.append(piece);
  }
  if (v.clean_spaces) raw = clean_up_spaces(raw);
  if (is_valid_utf8(raw)) return raw;
  return sanitize_utf8(raw);
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  return std::string(piece_view(id, render_special));
}

std::string_view Tokenizer::piece_view(int32_t id, bool render_special) const {
  VESPER_CHECK(is_valid(id), "token id %d out of range [0, %d)", id, n_vocab());
  return vocab_->piece(id, render_special);
}

VocabType Tokenizer::type() const { return vocab_->type; }
const std::string& Tokenizer::model() const { return vocab_->model; }
const std::string& Tokenizer::pre() const { return vocab_->pre; }
const std::string& Tokenizer::path() const { return vocab_->path; }
int32_t Tokenizer::n_vocab() const { return vocab_->n_vocab(); }

std::optional<int32_t> Tokenizer::bos_id() const { return as_optional(vocab_->bos); }
std::optional<int32_t> Tokenizer::eos_id() const { return as_optional(vocab_->eos); }
std::optional<int32_t> Tokenizer::eot_id() const { return as_optional(vocab_->eot); }
std::optional<int32_t> Tokenizer::eom_id() const { return as_optional(vocab_->eom); }
std::optional<int32_t> Tokenizer::unk_id() const { return as_optional(vocab_->unk); }
std::optional<int32_t> Tokenizer::sep_id() const { return as_optional(vocab_->sep); }
std::optional<int32_t> Tokenizer::pad_id() const { return as_optional(vocab_->pad); }
std::optional<int32_t> Tokenizer::mask_id() const { return as_optional(vocab_->mask); }
std::optional<int32_t> Tokenizer::nl_id() const { return as_optional(vocab_->nl); }
std::optional<int32_t> Tokenizer::fim_pre_id() const { return as_optional(vocab_->fim_pre); }
std::optional<int32_t> Tokenizer::fim_suf_id() const { return as_optional(vocab_->fim_suf); }
std::optional<int32_t> Tokenizer::fim_mid_id() const { return as_optional(vocab_->fim_mid); }
std::optional<int32_t> Tokenizer::fim_pad_id() const { return as_optional(vocab_->fim_pad); }
std::optional<int32_t> Tokenizer::fim_rep_id() const { return as_optional(vocab_->fim_rep); }
std::optional<int32_t> Tokenizer::fim_sep_id() const { return as_optional(vocab_->fim_sep); }

bool Tokenizer::add_bos() const { return vocab_->add_bos; }
bool Tokenizer::add_eos() const { return vocab_->add_eos; }
bool Tokenizer::add_sep() const { return vocab_->add_sep; }
bool Tokenizer::add_space_prefix() const { return vocab_->add_space_prefix; }
bool Tokenizer::clean_spaces() const { return vocab_->clean_spaces; }

const std::vector<int32_t>& Tokenizer::eog_ids() const { return vocab_->eog_ids; }

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(vocab_->eog_ids.begin(), vocab_->eog_ids.end(), id);
}

uint32_t Tokenizer::token_attr(int32_t id) const {
  VESPER_CHECK(is_valid(id), "token id %d out of range [0, %d)", id, n_vocab());
  return vocab_->tokens[id].attr;
}

std::string_view Tokenizer::token_text(int32_t id) const {
  VESPER_CHECK(is_valid(id), "token id %d out of range [0, %d)", id, n_vocab());
  return vocab_->tokens[id].text;
}

float Tokenizer::token_score(int32_t id) const {
  VESPER_CHECK(is_valid(id), "token id %d out of range [0, %d)", id, n_vocab());
  return vocab_->tokens[id].score;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  return as_optional(vocab_->find(text));
}

}  // namespace vesper::tokenizer
