// IncrementalDetokenizer: streaming detokenization for one sequence. Feed token ids one at a
// time as they are generated and get back the text they add.
//
// Promises:
//  - A delta never ends inside a UTF-8 sequence: bytes of a character split over several
//    tokens (byte-fallback <0xE2><0x80><0x99>, or byte-level BPE pieces) are held back until
//    the character is complete. Invalid sequences become U+FFFD as soon as they are known to
//    be invalid; flush() turns a trailing incomplete one into U+FFFD.
//  - Over a whole sequence, the concatenated deltas (feed() results, then flush()) equal
//    Tokenizer::decode(ids, skip_special) exactly, including llama.cpp's first-token
//    leading-space rule and, for vocabularies with clean_spaces(), the HF space clean-up (for
//    which a few bytes after a space are held back until the next token shows whether the
//    space stays).
//  - With `continuation`, the sequence is treated as continuing earlier text (generated tokens
//    after a prompt): the first token keeps its leading space, as llama.cpp's
//    token_to_piece-based streaming does. Then the deltas equal decode() of the same ids
//    without the first-token space rule.
//
// Cost per token is O(piece length); the internal buffers are reused, so after warm-up nothing
// is allocated per token. Not thread-safe (one instance per sequence); holds a copy of the
// Tokenizer, so it stays valid however the original is moved.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace vesper::tokenizer {

struct DetokenizeOptions {
  bool skip_special = false;  // as Tokenizer::decode's skip_special
  bool continuation = false;  // keep the first token's leading space
};

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(Tokenizer tokenizer, DetokenizeOptions options = {});

  // Adds one token; returns the text that is now final (possibly empty). The view stays valid
  // until the next call on this object.
  std::string_view feed(int32_t id);
  // Ends the sequence: returns everything still held back. The detokenizer is then reset.
  std::string_view flush();
  // Starts a new sequence (same tokenizer and options).
  void reset();

  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  void add_piece(std::string_view piece);
  void drain(bool final);

  Tokenizer tokenizer_;
  DetokenizeOptions options_;
  bool first_token_ = true;  // nothing fed yet
  bool strip_space_ = false; // the next piece loses one leading space
  bool holding_eos_ = false; // an EOS that is dropped if it turns out to be the last token
  std::string raw_;          // bytes not yet cleaned (clean_spaces) or not yet UTF-8-complete
  std::string out_;          // the delta returned by the last call
};

}  // namespace vesper::tokenizer
