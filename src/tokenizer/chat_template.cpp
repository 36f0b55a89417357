#include "tokenizer/chat_template.h"

#include <cstdint>
#include <exception>
#include <limits>
#include <utility>

#include "gguf/gguf.h"

namespace vesper::tokenizer {

namespace {

using jinja::Value;
using jinja::ValueList;

// Recursive, so the nesting it follows is bounded: JSON from a request can nest as deep as
// its bytes allow (nlohmann's parser is iterative), and unbounded recursion here would overflow
// the stack. `level` is the nesting level of `j` (1 for the value passed in).
template <class Json>
Result<Value> to_value(const Json& j, int level = 1) {
  if (j.is_structured() && level > kMaxJsonDepth) {
    return make_error("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Value(static_cast<int64_t>(u));
      }
      return Value(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& item : j) {
        VESPER_ASSIGN_OR_RETURN(Value v, to_value(item, level + 1));
        items.push_back(std::move(v));
      }
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        VESPER_ASSIGN_OR_RETURN(Value v, to_value(it.value(), level + 1));
        d.as_dict().set(Value(it.key()), std::move(v));
      }
      return d;
    }
    default: return Value::none();
  }
}

// Whether `j` nests arrays and objects more than `max_levels` deep (`j` itself is level 1). Copying
// nlohmann JSON (and converting json to ordered_json) recurses per level, so the entry points
// that must copy check first; this recursion stops at the limit.
template <class Json>
bool nested_deeper_than(const Json& j, int max_levels) {
  if (!j.is_structured()) return false;
  if (max_levels == 0) return true;
  for (const auto& item : j) {
    if (nested_deeper_than(item, max_levels - 1)) return true;
  }
  return false;
}

std::string too_deep(const std::string& what) {
  return "chat template: " + what + " nested deeper than " + std::to_string(kMaxJsonDepth) +
         " levels";
}

// Whether `part` is {"type": "text", "text": <string>, ...}. Written with find() and type checks
// because nlohmann's value("type", "") throws when "type" holds a non-string.
bool is_text_part(const nlohmann::ordered_json& part) {
  if (!part.is_object()) return false;
  const auto type = part.find("type");
  const auto text = part.find("text");
  return type != part.end() && type->is_string() && type->get_ref<const std::string&>() == "text" &&
         text != part.end() && text->is_string();
}

// Joins the text parts of an OpenAI content list; other parts (images, audio) carry no text.
std::string join_text_parts(const nlohmann::ordered_json& parts) {
  std::string out;
  bool first = true;
  for (const auto& part : parts) {
    std::string piece;
    if (part.is_string()) {
      piece = part.get<std::string>();
    } else if (is_text_part(part)) {
      piece = part["text"].get<std::string>();
    } else {
      continue;
    }
    if (!first) out += "\n";
    first = false;
    out += piece;
  }
  return out;
}

nlohmann::ordered_json message_to_json(const ChatMessage& m) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["role"] = m.role;
  j["content"] = m.content;
  if (!m.name.empty()) j["name"] = m.name;
  if (!m.tool_calls.is_null()) j["tool_calls"] = m.tool_calls;
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  return j;
}

}  // namespace

Result<jinja::Value> json_to_value(const nlohmann::ordered_json& json) {
  auto v = to_value(json);
  if (!v.ok()) return make_error("chat template: JSON value is " + v.error().message);
  return v;
}

Result<ChatTemplate> ChatTemplate::parse(std::string source) {
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) return make_error("chat template: " + parsed.error().message);
  ChatTemplate t;
  t.source_ = std::move(source);
  t.template_ = std::move(parsed).value();
  return t;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt, const std::string& bos_token,
                                         const std::string& eos_token,
                                         const nlohmann::json& extra) const {
  // The extra object itself is one level above its values.
  if (nested_deeper_than(extra, kMaxJsonDepth + 1)) return make_error(too_deep("extra context is"));
  ChatTemplateInputs inputs;
  for (size_t i = 0; i < messages.size(); ++i) {
    // A message is level 1, its tool_calls level 2.
    if (nested_deeper_than(messages[i].tool_calls, kMaxJsonDepth - 1)) {
      return make_error(too_deep("message " + std::to_string(i) + " is"));
    }
    inputs.messages.push_back(message_to_json(messages[i]));
  }
  inputs.add_generation_prompt = add_generation_prompt;
  inputs.bos_token = bos_token;
  inputs.eos_token = eos_token;
  if (!extra.is_null()) inputs.extra = extra;
  return apply(inputs);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                         const std::string& bos_token, const std::string& eos_token,
                                         const nlohmann::json& extra) const {
  // The messages array is one level above the messages.
  if (nested_deeper_than(messages, kMaxJsonDepth + 1)) return make_error(too_deep("messages are"));
  if (nested_deeper_than(extra, kMaxJsonDepth + 1)) return make_error(too_deep("extra context is"));
  ChatTemplateInputs inputs;
  inputs.messages = messages;
  inputs.add_generation_prompt = add_generation_prompt;
  inputs.bos_token = bos_token;
  inputs.eos_token = eos_token;
  if (!extra.is_null()) inputs.extra = extra;
  return apply(inputs);
}

Result<std::string> ChatTemplate::apply(const ChatTemplateInputs& inputs) const {
  if (!inputs.messages.is_array()) return make_error("chat template: messages must be a JSON array");
  if (!inputs.extra.is_object()) return make_error("chat template: extra context must be a JSON object");
  Value messages = Value::list();
  for (size_t i = 0; i < inputs.messages.size(); ++i) {
    const auto& m = inputs.messages[i];
    if (!m.is_object()) {
      return make_error("chat template: message " + std::to_string(i) + " is not a JSON object");
    }
    auto converted = to_value(m);
    if (!converted.ok()) {
      return make_error("chat template: message " + std::to_string(i) + " is " +
                        converted.error().message);
    }
    Value msg = std::move(converted).value();
    if (inputs.flatten_content_parts && m.contains("content") && m["content"].is_array()) {
      msg.as_dict().set(Value("content"), Value(join_text_parts(m["content"])));
    }
    messages.as_list().push_back(std::move(msg));
  }

  Value vars = Value::dict();
  auto& d = vars.as_dict();
  d.set(Value("tools"), Value::none());
  d.set(Value("documents"), Value::none());
  for (auto it = inputs.extra.begin(); it != inputs.extra.end(); ++it) {
    auto value = to_value(it.value());
    if (!value.ok()) {
      return make_error("chat template: extra context \"" + it.key() + "\" is " +
                        value.error().message);
    }
    d.set(Value(it.key()), std::move(value).value());
  }
  d.set(Value("messages"), std::move(messages));
  d.set(Value("add_generation_prompt"), Value(inputs.add_generation_prompt));
  d.set(Value("bos_token"), Value(inputs.bos_token));
  d.set(Value("eos_token"), Value(inputs.eos_token));

  jinja::RenderOptions options;
  options.now = inputs.now;
  options.limits = inputs.limits;
  jinja::RenderErrorKind kind;
  auto rendered = template_.render(vars, options, &kind);
  if (!rendered.ok()) {
    if (kind == jinja::RenderErrorKind::kRaised) {
      return make_error("chat template rejected the conversation: " + rendered.error().message);
    }
    return make_error("chat template: " + rendered.error().message);
  }
  return rendered;
}

std::string default_chat_template() {
  return R"({%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] if message['content'] is string else '') + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%})";
}

Result<ModelChatTemplate> model_chat_template(const gguf::GgufFile& model) {
  VESPER_ASSIGN_OR_RETURN(std::optional<std::string> from_model,
                          model.get_string("tokenizer.chat_template"));
  if (from_model)
    return ModelChatTemplate{*from_model, model.path() + " (tokenizer.chat_template)"};
  return ModelChatTemplate{default_chat_template(),
                           "the default ChatML template (the model has none)"};
}

}  // namespace vesper::tokenizer
