// Pieces of decoding shared by Tokenizer::decode and IncrementalDetokenizer. Internal.
#pragma once

#include <string>
#include <string_view>

namespace vesper::tokenizer {

// Hugging Face's clean_up_tokenization_spaces as llama.cpp's llama_detokenize applies it, in
// three passes: drop the space before ? ! . , ; turn " ' " into "'"; drop the space before
// 's 'm 're 've. Only ever removes spaces.
std::string clean_up_spaces(std::string_view text);

// Where `text` can be cut so that clean_up_spaces(text) equals
// clean_up_spaces(text[0, cut)) + clean_up_spaces(text[cut, ...)) whatever follows: the
// largest cut with no space among the three bytes before it. Every pattern the passes look at
// starts with a space and spans at most four bytes, so none can straddle such a cut.
size_t clean_up_safe_cut(std::string_view text);

}  // namespace vesper::tokenizer
