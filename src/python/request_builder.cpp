#include "python/request_builder.h"

#include "engine/grammar_vocabulary.h"
#include "python/py_fields.h"
#include "server/openai_protocol.h"

namespace vesper::python {
namespace {

// Distinct constraints whose compiled grammars are kept (the server keeps as many).
constexpr size_t kGrammarCacheCapacity = 256;

}  // namespace

RequestBuilder::RequestBuilder(const engine::Engine& engine)
    : tokenizer_(engine.tokenizer()),
      max_model_len_(engine.scheduler_config().max_model_len),
      grammars_(engine::grammar_vocabulary(engine.tokenizer()), kGrammarCacheCapacity) {
  if (auto bos = tokenizer_.bos_id()) bos_text_ = tokenizer_.token_to_piece(*bos, true);
  if (auto eos = tokenizer_.eos_id()) eos_text_ = tokenizer_.token_to_piece(*eos, true);
  auto shipped = tokenizer::model_chat_template(engine.model().file());
  if (shipped)
    model_template_ = std::move(shipped).value();
  else
    model_template_error_ = shipped.error().message;
}

RequestBuilder::Prompt RequestBuilder::prompt(py::handle prompt, const std::string& where) const {
  Prompt out;
  py::handle value = prompt;
  std::string name = where;
  // vLLM's TextPrompt {"prompt": str} and TokensPrompt {"prompt_token_ids": [int]}.
  if (py::isinstance<py::dict>(prompt)) {
    const py::dict d = py::reinterpret_borrow<py::dict>(prompt);
    for (auto [k, v] : d) {
      const std::string key = to_str(k, where + " key");
      if (key != "prompt" && key != "prompt_token_ids")
        throw py::value_error(where + "[\"" + key +
                              "\"] is not supported (a prompt dict holds \"prompt\" or "
                              "\"prompt_token_ids\")");
    }
    if (d.contains("prompt") == d.contains("prompt_token_ids"))
      throw py::value_error(where + " must hold one of \"prompt\" and \"prompt_token_ids\"");
    const char* key = d.contains("prompt") ? "prompt" : "prompt_token_ids";
    value = d[key];
    name = where + "[\"" + key + "\"]";
  }
  if (PyUnicode_Check(value.ptr())) {
    out.text = to_str(value, name);
    out.ids = tokenizer_.encode(*out.text, /*add_special=*/true, /*parse_special=*/false);
  } else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    out.ids = to_int_list(value, name, tokenizer_.n_vocab());
  } else {
    throw py::type_error(name + " must be a str, a list of token ids or a prompt dict, got " +
                         type_name(value));
  }
  if (out.ids.empty()) throw py::value_error(name + " is empty");
  return out;
}

engine::EngineRequest RequestBuilder::request(std::string request_id, Prompt prompt,
                                              const ConvertedParams& params, std::string lora_name,
                                              int32_t priority, const std::string& where) {
  engine::EngineRequest r;
  r.request_id = std::move(request_id);
  r.params = params.params;
  r.priority = priority;
  r.lora_name = std::move(lora_name);
  const auto prompt_len = static_cast<int64_t>(prompt.ids.size());
  if (prompt_len > max_model_len_)
    throw py::value_error(where + " has " + std::to_string(prompt_len) +
                          " tokens, more than max_model_len " + std::to_string(max_model_len_));
  if (!params.max_tokens_given) {
    // vLLM's max_tokens=None: as many as the context leaves.
    r.params.max_tokens = max_model_len_ - prompt_len;
    if (r.params.min_tokens > r.params.max_tokens)
      throw py::value_error("SamplingParams.min_tokens (" + std::to_string(r.params.min_tokens) +
                            ") exceeds what " + where + " leaves of max_model_len (" +
                            std::to_string(r.params.max_tokens) + " tokens)");
  }
  if (auto st = r.params.validate_token_ids(tokenizer_.n_vocab()); !st)
    throw py::value_error("SamplingParams: " + st.error().message);
  if (params.constraint) {
    auto compiled = grammars_.get(params.constraint->gbnf);
    if (!compiled)
      throw py::value_error(params.constraint->field + ": " + compiled.error().message);
    r.params.grammar = std::move(compiled).value();
  }
  r.prompt_token_ids = std::move(prompt.ids);
  return r;
}

const tokenizer::ChatTemplate& RequestBuilder::chat_template(py::handle source) {
  std::string text;
  std::string origin = "chat_template";
  if (source.is_none()) {
    if (!model_template_error_.empty()) throw py::value_error(model_template_error_);
    text = model_template_.source;
    origin = model_template_.origin;
  } else {
    text = to_str(source, "chat_template");
  }
  auto it = templates_.find(text);
  if (it == templates_.end()) {
    auto parsed = tokenizer::ChatTemplate::parse(text);
    if (!parsed) throw py::value_error(origin + ": " + parsed.error().message);
    it = templates_
             .emplace(text, std::make_unique<tokenizer::ChatTemplate>(std::move(parsed).value()))
             .first;
  }
  return *it->second;
}

std::string RequestBuilder::render_chat(py::handle messages, py::handle tools,
                                        bool add_generation_prompt, py::handle chat_template_src,
                                        py::handle chat_template_kwargs) {
  // The request the HTTP API would get, validated by its own parser: messages' roles and
  // content, tools' shapes, every error naming the field.
  nlohmann::ordered_json ordered = nlohmann::ordered_json::object();
  ordered["messages"] = to_json(messages, "messages");
  if (!tools.is_none()) ordered["tools"] = to_json(tools, "tools");
  if (!chat_template_kwargs.is_none())
    ordered["chat_template_kwargs"] = to_json(chat_template_kwargs, "chat_template_kwargs");
  const nlohmann::json body = nlohmann::json::parse(ordered.dump());
  const server::ProtocolLimits limits{tokenizer_.n_vocab()};
  auto parsed = server::parse_chat_request(body, limits, &ordered);
  if (auto* e = std::get_if<server::ApiError>(&parsed)) throw py::value_error(e->message);
  server::ChatRequest& r = std::get<server::ChatRequest>(parsed);
  // As the server: the template sees the tools unless the kwargs pass their own.
  if (!tools.is_none() && !r.chat_template_kwargs.contains("tools"))
    r.chat_template_kwargs["tools"] = r.tools;
  const tokenizer::ChatTemplate& tmpl = chat_template(chat_template_src);
  auto rendered =
      tmpl.render(r.messages, add_generation_prompt, bos_text_, eos_text_, r.chat_template_kwargs);
  if (!rendered) throw py::value_error("chat template: " + rendered.error().message);
  return std::move(rendered).value();
}

RequestBuilder::Prompt RequestBuilder::chat_prompt(const std::string& rendered) const {
  Prompt out;
  out.text = rendered;
  out.ids = tokenizer_.encode(rendered, /*add_special=*/false, /*parse_special=*/true);
  if (out.ids.empty()) throw py::value_error("messages: the rendered conversation is empty");
  return out;
}

}  // namespace vesper::python
