#include "server/openai_service.h"

#include <chrono>

#include "server/generation_job.h"

namespace vesper::server {

using nlohmann::json;

namespace {

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

std::string path_of(const std::string& target) {
  const size_t q = target.find('?');
  return q == std::string::npos ? target : target.substr(0, q);
}

}  // namespace

OpenAiService::OpenAiService(ServerConfig config, engine::AsyncEngine& engine, Metrics& metrics,
                             tokenizer::ChatTemplate chat_template)
    : config_(std::move(config)), engine_(engine), metrics_(metrics), chat_template_(std::move(chat_template)) {
  const auto& tok = engine_.tokenizer();
  if (auto bos = tok.bos_id()) bos_text_ = tok.token_to_piece(*bos, true);
  if (auto eos = tok.eos_id()) eos_text_ = tok.token_to_piece(*eos, true);
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void OpenAiService::fail(const ApiError& error, const std::shared_ptr<ResponseSink>& sink) {
  metrics_.on_rejected(error.status);
  sink->send_json(error.status, error.to_json());
}

std::optional<ApiError> OpenAiService::check_model(const std::string& model) const {
  if (model.empty() || model == config_.served_model_name) return std::nullopt;
  ApiError e{404, "The model `" + model + "` does not exist; this server serves `" + config_.served_model_name + "`",
             "invalid_request_error", std::string("model"), std::string("model_not_found")};
  return e;
}

std::optional<ApiError> OpenAiService::check_length(size_t prompt_tokens, int64_t max_tokens, const char* what) const {
  const int64_t limit = engine_.scheduler_config().max_model_len;
  const int64_t total = static_cast<int64_t>(prompt_tokens) + max_tokens;
  if (static_cast<int64_t>(prompt_tokens) > limit || total > limit) {
    return bad_request("This model's maximum context length is " + std::to_string(limit) + " tokens (--max-model-len). "
                       "However, you requested " + std::to_string(total) + " tokens (" + std::to_string(prompt_tokens) +
                       " in the " + what + ", " + std::to_string(max_tokens) +
                       " in the completion). Please reduce the length of the " + what + " or completion.",
                       std::string(what) == "messages" ? "messages" : "prompt");
  }
  const auto& plan = engine_.memory_plan();
  const int64_t blocks = (total + plan.block_size - 1) / plan.block_size;
  if (blocks > plan.num_blocks)
    return bad_request("The request needs up to " + std::to_string(total) + " tokens of KV cache but the server holds " +
                       std::to_string(plan.token_capacity()) + " tokens in all (--kv-cache-memory)", "max_tokens");
  return std::nullopt;
}

json OpenAiService::models_json() const {
  return {{"object", "list"},
          {"data", json::array({{{"id", config_.served_model_name},
                                 {"object", "model"},
                                 {"created", created_},
                                 {"owned_by", "vesper"},
                                 {"root", config_.served_model_name},
                                 {"max_model_len", engine_.scheduler_config().max_model_len}}})}};
}

void OpenAiService::handle(const HttpRequest& req, const std::shared_ptr<ResponseSink>& sink) {
  const std::string path = path_of(req.target);
  struct Route {
    const char* path;
    const char* method;
    bool needs_body;
  };
  static const Route kRoutes[] = {
      {"/v1/completions", "POST", true}, {"/v1/chat/completions", "POST", true}, {"/tokenize", "POST", true},
      {"/detokenize", "POST", true},      {"/v1/models", "GET", false},          {"/health", "GET", false},
      {"/metrics", "GET", false},         {"/version", "GET", false},
  };
  const Route* route = nullptr;
  for (const Route& r : kRoutes)
    if (path == r.path) route = &r;
  if (route == nullptr) return fail(ApiError{404, "Not found: " + path, "not_found_error", std::nullopt, std::nullopt}, sink);
  if (req.method != route->method && !(req.method == "HEAD" && std::string(route->method) == "GET"))
    return fail(ApiError{405, "Method " + req.method + " is not allowed for " + path + "; use " + route->method,
                         "invalid_request_error", std::nullopt, std::nullopt},
                sink);
  // Health and metrics stay open so that probes work without the key, as vLLM's do.
  if (!config_.api_key.empty() && path != "/health" && path != "/metrics" &&
      req.authorization != "Bearer " + config_.api_key)
    return fail(ApiError{401, "Invalid or missing API key: send \"Authorization: Bearer <key>\"", "authentication_error",
                         std::nullopt, std::string("invalid_api_key")},
                sink);
  if (path == "/health") return sink->send_json(200, {{"status", "ok"}});
  if (path == "/version") return sink->send_json(200, {{"version", "0.1.0"}});
  if (path == "/metrics") return sink->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render());
  if (path == "/v1/models") return sink->send_json(200, models_json());

  if (req.content_type.find("application/json") == std::string::npos)
    return fail(ApiError{415, "Content-Type must be application/json, got \"" + req.content_type + "\"",
                         "invalid_request_error", std::nullopt, std::nullopt},
                sink);
  if (!valid_utf8(req.body)) return fail(bad_request("The request body is not valid UTF-8"), sink);
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return fail(bad_request("The request body is not valid JSON"), sink);
  if (!body.is_object()) return fail(bad_request("The request body must be a JSON object"), sink);
  if (path == "/v1/completions") return completions(body, sink);
  if (path == "/v1/chat/completions") return chat_completions(body, sink);
  if (path == "/tokenize") return tokenize(body, sink);
  return detokenize(body, sink);
}

void OpenAiService::completions(const json& body, const std::shared_ptr<ResponseSink>& sink) {
  auto parsed = parse_completion_request(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e, sink);
  CompletionRequest r = std::move(std::get<CompletionRequest>(parsed));
  if (auto e = check_model(r.model)) return fail(*e, sink);
  const auto& tok = engine_.tokenizer();
  std::vector<JobPrompt> prompts;
  for (auto& p : r.prompts) {
    JobPrompt jp;
    if (auto* text = std::get_if<std::string>(&p)) {
      jp.ids = tok.encode(*text, /*add_special=*/true, /*parse_special=*/true);
      jp.text = *text;
    } else {
      jp.ids = std::get<std::vector<int32_t>>(p);
      for (int32_t id : jp.ids)
        if (!tok.is_valid(id))
          return fail(bad_request("'prompt' token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                      std::to_string(tok.n_vocab() - 1) + ")", "prompt"),
                      sink);
      jp.text = tok.decode(jp.ids, /*skip_special=*/true);
    }
    if (jp.ids.empty()) return fail(bad_request("'prompt' is empty after tokenization", "prompt"), sink);
    if (auto e = check_length(jp.ids.size(), r.params.max_tokens, "prompt")) return fail(*e, sink);
    prompts.push_back(std::move(jp));
  }
  if (engine_.num_waiting() + static_cast<int64_t>(prompts.size()) > config_.max_num_waiting)
    return fail(ApiError{503, "The server is overloaded: " + std::to_string(engine_.num_waiting()) +
                                  " requests are waiting (--max-num-waiting " + std::to_string(config_.max_num_waiting) +
                                  "); retry later",
                         "server_overloaded", std::nullopt, std::string("overloaded")},
                sink);
  auto job = std::make_shared<GenerationJob>(GenerationJob::Kind::kCompletion,
                                             "cmpl-" + std::to_string(next_id_.fetch_add(1)), config_.served_model_name,
                                             std::chrono::duration_cast<std::chrono::seconds>(
                                                 std::chrono::system_clock::now().time_since_epoch()).count(),
                                             r.stream, r.include_usage, r.echo, r.params, std::move(prompts), sink, engine_);
  job->start(r.priority);
}

void OpenAiService::chat_completions(const json& body, const std::shared_ptr<ResponseSink>& sink) {
  auto parsed = parse_chat_request(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e, sink);
  ChatRequest r = std::move(std::get<ChatRequest>(parsed));
  if (auto e = check_model(r.model)) return fail(*e, sink);
  auto rendered = chat_template_.render(r.messages, r.add_generation_prompt, bos_text_, eos_text_, r.chat_template_kwargs);
  if (!rendered) return fail(bad_request("chat template: " + rendered.error().message, "messages"), sink);
  JobPrompt jp;
  jp.text = *rendered;
  // The template writes BOS and other special tokens itself, as text to be parsed.
  jp.ids = engine_.tokenizer().encode(jp.text, /*add_special=*/false, /*parse_special=*/true);
  if (jp.ids.empty()) return fail(bad_request("the rendered conversation is empty", "messages"), sink);
  const int64_t limit = engine_.scheduler_config().max_model_len;
  if (!r.max_tokens_given) r.params.max_tokens = std::max<int64_t>(0, limit - static_cast<int64_t>(jp.ids.size()));
  if (auto e = check_length(jp.ids.size(), r.params.max_tokens, "messages")) return fail(*e, sink);
  if (r.params.min_tokens > r.params.max_tokens)
    return fail(bad_request("'min_tokens' must not exceed the completion's token limit", "min_tokens"), sink);
  if (engine_.num_waiting() + 1 > config_.max_num_waiting)
    return fail(ApiError{503, "The server is overloaded: " + std::to_string(engine_.num_waiting()) +
                                  " requests are waiting (--max-num-waiting " + std::to_string(config_.max_num_waiting) +
                                  "); retry later",
                         "server_overloaded", std::nullopt, std::string("overloaded")},
                sink);
  std::vector<JobPrompt> prompts;
  prompts.push_back(std::move(jp));
  auto job = std::make_shared<GenerationJob>(GenerationJob::Kind::kChat,
                                             "chatcmpl-" + std::to_string(next_id_.fetch_add(1)), config_.served_model_name,
                                             std::chrono::duration_cast<std::chrono::seconds>(
                                                 std::chrono::system_clock::now().time_since_epoch()).count(),
                                             r.stream, r.include_usage, false, r.params, std::move(prompts), sink, engine_);
  job->start(r.priority);
}

void OpenAiService::tokenize(const json& body, const std::shared_ptr<ResponseSink>& sink) {
  bool add_special = true;
  if (body.contains("add_special_tokens")) {
    if (!body["add_special_tokens"].is_boolean())
      return fail(bad_request("'add_special_tokens' must be a boolean", "add_special_tokens"), sink);
    add_special = body["add_special_tokens"].get<bool>();
  }
  std::string text;
  if (body.contains("prompt")) {
    if (!body["prompt"].is_string()) return fail(bad_request("'prompt' must be a string", "prompt"), sink);
    text = body["prompt"].get<std::string>();
  } else if (body.contains("messages")) {
    json chat = body;
    auto parsed = parse_chat_request(chat);
    if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e, sink);
    auto rendered = chat_template_.render(std::get<ChatRequest>(parsed).messages,
                                          body.value("add_generation_prompt", true), bos_text_, eos_text_);
    if (!rendered) return fail(bad_request("chat template: " + rendered.error().message, "messages"), sink);
    text = *rendered;
    add_special = false;
  } else {
    return fail(bad_request("'prompt' (a string) or 'messages' is required", "prompt"), sink);
  }
  const auto ids = engine_.tokenizer().encode(text, add_special, /*parse_special=*/true);
  sink->send_json(200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine_.scheduler_config().max_model_len}});
}

void OpenAiService::detokenize(const json& body, const std::shared_ptr<ResponseSink>& sink) {
  if (!body.contains("tokens") || !body["tokens"].is_array())
    return fail(bad_request("'tokens' (an array of token ids) is required", "tokens"), sink);
  std::vector<int32_t> ids;
  const auto& tok = engine_.tokenizer();
  for (const auto& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
      return fail(bad_request("'tokens' must hold token ids between 0 and " + std::to_string(tok.n_vocab() - 1), "tokens"),
                  sink);
    ids.push_back(t.get<int32_t>());
  }
  sink->send_json(200, {{"prompt", tok.decode(ids)}});
}

}  // namespace vesper::server
