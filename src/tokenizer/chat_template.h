// Chat templates: conversations (OpenAI-style messages) -> the prompt text a model was trained
// on, by rendering the model's Jinja chat template (GGUF tokenizer.chat_template, HF
// tokenizer_config.json chat_template) the way HF transformers' apply_chat_template does.
//
// The template sees: messages (a list of dicts: role, content, and name / tool_calls /
// tool_call_id when present), add_generation_prompt, bos_token, eos_token, tools and
// documents (none unless given), every key of the `extra` object (e.g. tools,
// enable_thinking, date_string), raise_exception(msg) and strftime_now(fmt).
//
// A ChatTemplate is immutable after parse; render() is const and thread-safe. Errors are
// Result values: parse errors name line and column, render errors name the line, and a
// template's own raise_exception() ("Conversation roles must alternate ...") reads
// "chat template rejected the conversation: <msg>". Messages and extra context nested deeper
// than kMaxJsonDepth are rejected before rendering.
//
// JSON key order: Python dicts keep insertion order and templates that print tools with
// tojson show it, so the nlohmann::ordered_json overloads keep the caller's order;
// nlohmann::json sorts object keys, which then differs from HF's output for such templates.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "tokenizer/jinja/template.h"

namespace vesper::gguf {
class GgufFile;
}  // namespace vesper::gguf

namespace vesper::tokenizer {

struct ChatMessage {
  std::string role;
  std::string content;
  std::string name;          // optional; passed only when non-empty
  std::string tool_call_id;  // optional; passed only when non-empty
  nlohmann::ordered_json tool_calls;  // optional; passed only when not null
};

// Everything one render takes. `messages` is a JSON array of message objects whose content
// is a string, null, or a list of parts ({"type": "text", "text": ...}).
struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // Content given as a list of parts is joined into one string (text parts joined with "\n",
  // as vLLM does for templates that expect strings); false passes the list through as is.
  bool flatten_content_parts = true;
  // What strftime_now() formats (a fixed date makes renders reproducible); now when unset.
  std::optional<std::tm> now;
  jinja::RenderLimits limits;
};

class ChatTemplate {
 public:
  // Parses with HF's settings (trim_blocks, lstrip_blocks). Errors: "chat template: line L,
  // column C: <what>".
  static Result<ChatTemplate> parse(std::string source);

  const std::string& source() const { return source_; }

  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                             const std::string& bos_token, const std::string& eos_token,
                             const nlohmann::json& extra = nlohmann::json::object()) const;

  // OpenAI-style messages as JSON (the server passes request messages through).
  Result<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                             const std::string& bos_token, const std::string& eos_token,
                             const nlohmann::json& extra = nlohmann::json::object()) const;

  Result<std::string> apply(const ChatTemplateInputs& inputs) const;

 private:
  std::string source_;
  jinja::Template template_;
};

// The template used when a model has no tokenizer.chat_template: ChatML, as llama.cpp and
// vLLM fall back to. Each message renders as "<|im_start|>{role}\n{content}<|im_end|>\n"
// and the generation prompt is "<|im_start|>assistant\n".
std::string default_chat_template();

// The template a model ships (GGUF tokenizer.chat_template), or default_chat_template() when it
// has none; `origin` says which, for logs and errors. Shared by `vesper serve` and the Python
// package, so that both chat with the same template.
struct ModelChatTemplate {
  std::string source;
  std::string origin;
};
Result<ModelChatTemplate> model_chat_template(const gguf::GgufFile& model);

// How deeply messages and extra-context values may nest (arrays and objects, counting the value
// itself as level 1). Deeper JSON is an error: "chat template: message 2 is nested deeper than
// 256 levels", "chat template: extra context \"tools\" is nested deeper than 256 levels".
inline constexpr int kMaxJsonDepth = 256;

// Converts JSON (objects keep the order of `json`) to engine values; an error when it is nested
// deeper than kMaxJsonDepth.
Result<jinja::Value> json_to_value(const nlohmann::ordered_json& json);

}  // namespace vesper::tokenizer
