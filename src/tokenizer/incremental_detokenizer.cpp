#include "tokenizer/incremental_detokenizer.h"

#include "core/check.h"
#include "tokenizer/detokenize.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace vesper::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(Tokenizer tokenizer, DetokenizeOptions options)
    : tokenizer_(std::move(tokenizer)), options_(options) {
  reset();
}

void IncrementalDetokenizer::reset() {
  first_token_ = true;
  strip_space_ = !options_.continuation && tokenizer_.vocab().add_space_prefix;
  holding_eos_ = false;
  raw_.clear();
}

void IncrementalDetokenizer::add_piece(std::string_view piece) {
  if (strip_space_ && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
  strip_space_ = false;
  raw_.append(piece);
}

// Moves what is final from raw_ to out_: with clean_spaces, only up to a cut that no later
// text can affect; then only complete UTF-8 sequences (invalid ones as U+FFFD).
void IncrementalDetokenizer::drain(bool final) {
  const Vocab& v = tokenizer_.vocab();
  size_t ready = raw_.size();
  if (v.clean_spaces) {
    if (!final) ready = clean_up_safe_cut(raw_);
    if (ready == 0) return;
    // Cleaning only removes spaces, and a safe cut has none right before it, so the cleaned
    // chunk still ends where raw_[0, ready) ends and UTF-8 completeness carries over.
    const std::string cleaned = clean_up_spaces(std::string_view(raw_).substr(0, ready));
    const size_t used = repair_utf8(cleaned, final, &out_);
    // Bytes of an unfinished character go back in front of the uncleaned rest.
    raw_.replace(0, ready, cleaned, used, std::string::npos);
    return;
  }
  const size_t used = repair_utf8(raw_, final, &out_);
  raw_.erase(0, used);
}

std::string_view IncrementalDetokenizer::feed(int32_t id) {
  VESPER_CHECK(tokenizer_.is_valid(id), "token id %d out of range [0, %d)", id, tokenizer_.n_vocab());
  const Vocab& v = tokenizer_.vocab();
  out_.clear();
  const bool first = first_token_;
  first_token_ = false;
  if (options_.skip_special) {
    if (first && v.add_bos && id == v.bos) {
      strip_space_ = false;  // as decode(): the space after a dropped BOS stays
      return out_;
    }
    if (holding_eos_) {  // the held EOS was not the last token after all
      holding_eos_ = false;
      add_piece(v.piece(v.eos, false));
    }
    if (v.add_eos && id == v.eos) {
      holding_eos_ = true;
      drain(false);
      return out_;
    }
  }
  add_piece(v.piece(id, !options_.skip_special));
  drain(false);
  return out_;
}

std::string_view IncrementalDetokenizer::flush() {
  out_.clear();
  drain(true);  // a held EOS is the last token: dropped, as decode() drops it
  reset();
  return out_;
}

}  // namespace vesper::tokenizer
