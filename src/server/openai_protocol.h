// The OpenAI API's request formats as Vesper understands them: parsing and validation of
// /v1/completions and /v1/chat/completions bodies into engine inputs, and the response and
// stream-chunk shapes. Validation errors are ApiErrors that name the field at fault.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sample/logprobs.h"
#include "sample/sampling_params.h"
#include "server/api_error.h"
#include "server/structured_output.h"
#include "server/tool_calls.h"

namespace vesper::server {

// A prompt as the client gave it: text, or token ids.
using PromptInput = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  std::string model;
  std::vector<PromptInput> prompts;  // one engine request each
  sample::SamplingParams params;
  std::optional<OutputConstraint> constraint;  // structured output (compiled by the service)
  bool echo = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int32_t priority = 0;
};

struct ChatRequest {
  std::string model;
  nlohmann::json messages;  // validated: array of {role, content (string or text parts)}
  sample::SamplingParams params;
  std::optional<OutputConstraint> constraint;      // structured output (compiled by the service)
  nlohmann::json tools = nlohmann::json::array();  // validated `tools`, for the chat template
  ToolChoice tool_choice;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
  bool add_generation_prompt = true;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  int32_t priority = 0;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
};

// What validation needs to know of the model: token ids outside [0, n_vocab) are refused.
struct ProtocolLimits {
  int32_t n_vocab = 0;
};

// A /tokenize body: a prompt, or messages rendered with the chat template.
struct TokenizeRequest {
  std::optional<std::string> prompt;
  nlohmann::json messages;  // validated as in ChatRequest when prompt is absent
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
};

// Parse and validate request bodies (JSON objects from parse_json_body). Every field is read
// through JsonFields, so a wrong type, a null where none is allowed, or a value out of range is
// an ApiError naming the field; nothing throws. A parsed request passes
// SamplingParams::validate() and holds only token ids inside the vocabulary.
// `ordered` (optional): the same body parsed with its keys in written order, for JSON schemas
// (structured_output.h).
std::variant<CompletionRequest, ApiError> parse_completion_request(
    const nlohmann::json& body, const ProtocolLimits& limits,
    const nlohmann::ordered_json* ordered = nullptr);
std::variant<ChatRequest, ApiError> parse_chat_request(
    const nlohmann::json& body, const ProtocolLimits& limits,
    const nlohmann::ordered_json* ordered = nullptr);
std::variant<TokenizeRequest, ApiError> parse_tokenize_request(const nlohmann::json& body);
// A /detokenize body: {"tokens": [ids]}.
std::variant<std::vector<int32_t>, ApiError> parse_detokenize_request(const nlohmann::json& body,
                                                                      const ProtocolLimits& limits);

// Logprobs in the completions API's shape: tokens, token_logprobs, top_logprobs, text_offset.
// `piece_of` renders a token id as text; text_offset is where the first token's text starts.
nlohmann::json completion_logprobs_json(const std::vector<sample::LogprobEntry>& entries,
                                        const std::function<std::string(int32_t)>& piece_of,
                                        size_t text_offset);
// Logprobs in the chat API's shape: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
nlohmann::json chat_logprobs_json(const std::vector<sample::LogprobEntry>& entries,
                                  const std::function<std::string(int32_t)>& piece_of);

}  // namespace vesper::server
