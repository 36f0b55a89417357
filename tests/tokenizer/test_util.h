// Shared helpers for the tokenizer tests: paths of the shared test data, loading a tokenizer
// from a GGUF file, and printing ids and strings in failure messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace vesper::tokenizer::tok_test {

// Tests run from the repository root; the data lives next to it.
inline constexpr const char* kVectorsDir = "../shared/tokenizer-vectors";
inline constexpr const char* kModelsDir = "../shared/models";

// Opens `path` and builds its tokenizer.
Result<Tokenizer> load_tokenizer(const std::string& path);

std::string ids_to_string(const std::vector<int32_t>& ids);

// C-style escapes for control and non-ASCII bytes, so failures show exact bytes.
std::string escape(std::string_view s);

}  // namespace vesper::tokenizer::tok_test
