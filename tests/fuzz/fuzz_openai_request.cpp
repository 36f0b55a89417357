// Fuzz target: an OpenAI request body. The last byte picks the endpoint (completions, chat
// completions, tokenize, detokenize); the rest is the body. Validation (server/json_body.h,
// server/openai_protocol.h) either answers a 4xx ApiError naming the fault or gives a request
// that keeps every promise the engine relies on: sampling parameters that pass validate(), token
// ids inside the vocabulary, messages of text. Never a crash, an exception or a stack overflow,
// whatever the nesting (the body scan bounds it before parsing).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "openai_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int endpoint = data[size - 1];
  vesper::fuzz::check_body(std::string_view(reinterpret_cast<const char*>(data), size - 1),
                           endpoint);
  return 0;
}
