// The OpenAI API's request formats as Vesper understands them: parsing and validation of
// /v1/completions and /v1/chat/completions bodies into engine inputs, and the response and
// stream-chunk shapes. Validation errors are ApiErrors that name the field at fault.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "engine/request_output.h"
#include "sample/sampling_params.h"
#include "server/api_error.h"

namespace vesper::server {

// A prompt as the client gave it: text, or token ids.
using PromptInput = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  std::string model;
  std::vector<PromptInput> prompts;  // one engine request each
  sample::SamplingParams params;
  bool echo = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int32_t priority = 0;
};

struct ChatRequest {
  std::string model;
  nlohmann::json messages;  // validated: array of {role, content (string or text parts)}
  sample::SamplingParams params;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
  bool add_generation_prompt = true;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  int32_t priority = 0;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
};

// Parses a /v1/completions body. `body` must be a JSON object.
std::variant<CompletionRequest, ApiError> parse_completion_request(const nlohmann::json& body);
// Parses a /v1/chat/completions body.
std::variant<ChatRequest, ApiError> parse_chat_request(const nlohmann::json& body);

// Logprobs in the completions API's shape: tokens, token_logprobs, top_logprobs, text_offset.
// `piece_of` renders a token id as text; text_offset is where the first token's text starts.
nlohmann::json completion_logprobs_json(const std::vector<engine::LogprobEntry>& entries,
                                        const std::function<std::string(int32_t)>& piece_of, size_t text_offset);
// Logprobs in the chat API's shape: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
nlohmann::json chat_logprobs_json(const std::vector<engine::LogprobEntry>& entries,
                                  const std::function<std::string(int32_t)>& piece_of);

}  // namespace vesper::server
