// The vocabulary a grammar constrains (grammar/token_vocabulary.h), from a model's tokenizer:
// each token's bytes as the output text will hold them (SentencePiece's ▁ as a space, byte
// tokens as their byte). Control, unknown and unused tokens get no bytes, so no grammar allows
// them; the end-of-generation tokens end a grammar's output where it is complete.
#pragma once

#include <memory>

#include "grammar/token_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace vesper::engine {

std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(const tokenizer::Tokenizer& tok);

}  // namespace vesper::engine
