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

// A tokenizer loaded once per test binary and kept: `name` is one of llama.cpp's test vocabularies
// ("llama-spm" for ggml-vocab-llama-spm.gguf), "stories260K", or a path. Aborts when it fails to
// load, as no test of it can run.
const Tokenizer& vocab(const std::string& name);

std::string ids_to_string(const std::vector<int32_t>& ids);

// The bytes of a file ("" when it cannot be read).
std::string read_file(const std::string& path);
// llama.cpp's vector files: .inp holds the cases joined by "\n__ggml_vocab_test__\n" (which also
// ends the file); .out one line of space-separated ids per case.
std::vector<std::string> read_cases(const std::string& path);
std::vector<std::vector<int32_t>> read_expected(const std::string& path);

// C-style escapes for control and non-ASCII bytes, so failures show exact bytes.
std::string escape(std::string_view s);

}  // namespace vesper::tokenizer::tok_test
