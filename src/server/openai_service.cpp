#include "server/openai_service.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>

#include "core/logging.h"
#include "engine/grammar_vocabulary.h"
#include "lora/adapter_access.h"
#include "lora/adapter_read.h"
#include "server/generation_job.h"
#include "server/json_body.h"
#include "server/random_id.h"

namespace vesper::server {

using nlohmann::json;

namespace {

// Threads that parse, validate and tokenize request bodies. Two, so that one very large request
// (a prompt of tens of megabytes takes seconds to tokenize) leaves another thread for everyone
// else; the engine's compute threads are separate.
constexpr int kWorkerThreads = 2;
// Distinct constraints whose compiled grammars (and computed masks) are kept; a schema used by
// many requests is compiled once.
constexpr size_t kGrammarCacheCapacity = 256;

std::array<unsigned char, 32> sha256(std::string_view s) {
  std::array<unsigned char, 32> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), digest.data());
  return digest;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct OpenAiService::Workers {
  boost::asio::thread_pool pool{kWorkerThreads};
};

OpenAiService::OpenAiService(ServerConfig config, engine::AsyncEngine& engine, Metrics& metrics,
                             tokenizer::ChatTemplate chat_template)
    : config_(std::move(config)),
      engine_(engine),
      metrics_(metrics),
      chat_template_(std::move(chat_template)) {
  const auto& tok = engine_.tokenizer();
  if (auto bos = tok.bos_id()) bos_text_ = tok.token_to_piece(*bos, true);
  if (auto eos = tok.eos_id()) eos_text_ = tok.token_to_piece(*eos, true);
  created_ = unix_now();
  limits_.n_vocab = tok.n_vocab();
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    max_piece_bytes_ = std::max(max_piece_bytes_, tok.token_to_piece(id, true).size());
  if (!config_.api_key.empty()) api_key_digest_ = sha256(config_.api_key);
  workers_ = std::make_unique<Workers>();
  grammars_ = std::make_unique<grammar::GrammarCache>(engine::grammar_vocabulary(tok),
                                                      kGrammarCacheCapacity);
}

std::optional<ApiError> OpenAiService::compile_constraint(
    const std::optional<OutputConstraint>& constraint, sample::SamplingParams& params) {
  if (!constraint) return std::nullopt;
  auto compiled = grammars_->get(constraint->gbnf);
  if (!compiled)
    return bad_request("'" + constraint->field + "': " + compiled.error().message,
                       constraint->field);
  params.grammar = std::move(compiled).value();
  return std::nullopt;
}

OpenAiService::~OpenAiService() {
  stop();
}

void OpenAiService::stop() {
  if (workers_) workers_->pool.join();
}

void OpenAiService::guarded(const std::shared_ptr<ResponseSink>& sink,
                            const std::function<void()>& work) {
  std::string what;
  try {
    work();
    return;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  log_error("internal error while handling a request: %s", what.c_str());
  fail(ApiError{500, "Internal server error: " + what, "internal_server_error", std::nullopt,
                std::nullopt},
       sink);
}

bool OpenAiService::authorized(const std::string& authorization) const {
  const std::optional<std::string_view> token = bearer_token(authorization);
  if (!token) return false;
  // Digests of equal length compared in constant time: the time taken says nothing of how much
  // of the key a guess got right, nor of the key's length.
  const auto digest = sha256(*token);
  return CRYPTO_memcmp(digest.data(), api_key_digest_.data(), digest.size()) == 0;
}

std::optional<ApiError> OpenAiService::check_admission(size_t num_requests) const {
  if (!engine_.accepting())
    return ApiError{503, "The server is shutting down", "service_unavailable", std::nullopt,
                    std::nullopt};
  const int64_t waiting = engine_.num_waiting();
  if (waiting + static_cast<int64_t>(num_requests) > config_.max_num_waiting)
    return ApiError{503,
                    "The server is overloaded: " + std::to_string(waiting) +
                        " requests are waiting (--max-num-waiting " +
                        std::to_string(config_.max_num_waiting) + "); retry later",
                    "server_overloaded", std::nullopt, std::string("overloaded")};
  return std::nullopt;
}

void OpenAiService::fail(const ApiError& error, const std::shared_ptr<ResponseSink>& sink) {
  metrics_.on_rejected(error.status);
  sink->send_json(error.status, error.to_json());
}

std::variant<std::string, ApiError> OpenAiService::resolve_model(const std::string& model) const {
  if (model.empty() || model == config_.served_model_name) return std::string();
  if (engine_.has_adapter(model)) return model;
  std::string names = "`" + config_.served_model_name + "`";
  for (const auto& a : engine_.adapters()) names += ", `" + a.name + "`";
  return ApiError{404, "The model `" + model + "` does not exist; this server serves " + names,
                  "invalid_request_error", std::string("model"), std::string("model_not_found")};
}

std::optional<ApiError> OpenAiService::check_text_length(size_t bytes, const char* what) const {
  // No token covers more than max_piece_bytes_ bytes of text (+1: a tokenizer may add a space
  // before the text), so this many tokens at least: a text that cannot fit is refused before
  // seconds go into tokenizing it.
  const auto at_least = static_cast<int64_t>(bytes / (max_piece_bytes_ + 1));
  const int64_t limit = engine_.scheduler_config().max_model_len;
  if (at_least <= limit) return std::nullopt;
  return bad_request("This model's maximum context length is " + std::to_string(limit) +
                         " tokens (--max-model-len). However, the " + what + " is " +
                         std::to_string(bytes) + " bytes, at least " + std::to_string(at_least) +
                         " tokens. Please reduce the length of the " + what + ".",
                     std::string(what) == "messages" ? "messages" : "prompt");
}

std::optional<ApiError> OpenAiService::check_length(size_t prompt_tokens, int64_t max_tokens,
                                                    const char* what) const {
  const int64_t limit = engine_.scheduler_config().max_model_len;
  const int64_t total = static_cast<int64_t>(prompt_tokens) + max_tokens;
  const std::string param = std::string(what) == "messages" ? "messages" : "prompt";
  if (static_cast<int64_t>(prompt_tokens) > limit || total > limit) {
    return bad_request("This model's maximum context length is " + std::to_string(limit) +
                           " tokens (--max-model-len). "
                           "However, you requested " +
                           std::to_string(total) + " tokens (" + std::to_string(prompt_tokens) +
                           " in the " + what + ", " + std::to_string(max_tokens) +
                           " in the completion). Please reduce the length of the " + what +
                           " or completion.",
                       param);
  }
  const auto& plan = engine_.memory_plan();
  const int64_t blocks = (total + plan.block_size - 1) / plan.block_size;
  if (blocks > plan.num_blocks)
    return bad_request("The request needs up to " + std::to_string(total) +
                           " tokens of KV cache but the server holds " +
                           std::to_string(plan.token_capacity()) + " tokens in all (" +
                           plan.capacity_source + ")",
                       "max_tokens");
  return std::nullopt;
}

json OpenAiService::models_json() const {
  const int64_t max_model_len = engine_.scheduler_config().max_model_len;
  json data = json::array({{{"id", config_.served_model_name},
                            {"object", "model"},
                            {"created", created_},
                            {"owned_by", "vesper"},
                            {"root", config_.served_model_name},
                            {"parent", nullptr},
                            {"max_model_len", max_model_len}}});
  // Adapters as vLLM lists them: their path as root, the base model as parent.
  for (const auto& a : engine_.adapters())
    data.push_back({{"id", a.name},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "vesper"},
                    {"root", a.path},
                    {"parent", config_.served_model_name},
                    {"max_model_len", max_model_len}});
  return {{"object", "list"}, {"data", data}};
}

void OpenAiService::load_lora_adapter(const json& body, const std::shared_ptr<ResponseSink>& sink) {
  std::string name, path;
  for (const auto& [key, out] : {std::pair<const char*, std::string*>{"lora_name", &name},
                                 std::pair<const char*, std::string*>{"lora_path", &path}}) {
    if (!body.contains(key) || !body[key].is_string() || body[key].get<std::string>().empty())
      return fail(bad_request(std::string("'") + key + "' must be a non-empty string", key), sink);
    *out = body[key].get<std::string>();
  }
  if (Status ok = lora::check_adapter_name(name); !ok)
    return fail(bad_request("'lora_name': " + ok.error().message, "lora_name"), sink);
  if (name == config_.served_model_name)
    return fail(
        bad_request("'lora_name': '" + name + "' is the base model's served name", "lora_name"),
        sink);
  if (engine_.has_adapter(name))
    return fail(
        bad_request("'lora_name': an adapter named '" + name + "' is already loaded", "lora_name"),
        sink);
  const lora::LoraConfig* lora = engine_.lora_config();
  if (lora == nullptr || !lora->enable_lora)
    return fail(bad_request("adapters are not enabled (--enable-lora)", "lora_path"), sink);
  // Read here, on a request worker: the engine thread only installs the copy, so that nothing a
  // client names (a FIFO, a file on a stalled mount) can hold up the step loop.
  auto resolved = lora::resolve_allowed_path(path, lora->allowed_dirs);
  if (!resolved) {
    log_warning("load_lora_adapter '%s': %s", name.c_str(), resolved.error().message.c_str());
    return fail(bad_request("Failed to load adapter '" + name + "': " + resolved.error().message,
                            "lora_path"),
                sink);
  }
  bool recognized = false;
  lora::AdapterRead reading(*resolved, engine_.model_config(), lora->max_lora_rank);
  auto read = reading.wait_for(lora::kAdapterReadTimeoutSeconds)
                  ? reading.take(&recognized)
                  : Result<lora::HostAdapter>(make_error(
                        *resolved + ": reading it took over " +
                        std::to_string(static_cast<int>(lora::kAdapterReadTimeoutSeconds)) + " s"));
  if (!read) {
    // Until the file is known to be an adapter, its errors may quote its bytes (a wrong magic)
    // or tell what it is: the client learns only that it is not a readable adapter.
    log_warning("load_lora_adapter '%s': %s", name.c_str(), read.error().message.c_str());
    return fail(
        bad_request("Failed to load adapter '" + name + "': " +
                        (recognized ? read.error().message : lora::not_an_adapter_message(path)),
                    "lora_path"),
        sink);
  }
  auto host = std::make_shared<lora::HostAdapter>(std::move(read).value());
  engine_.post([this, name, host, sink](engine::Engine& engine) {
    lora::AdapterRegistry* registry = engine.adapters();
    Status added = registry != nullptr
                       ? registry->add(name, *host)
                       : Status(make_error("adapters are not enabled (--enable-lora)"));
    sink->post([this, name, added, sink] {
      if (!added)
        return fail(bad_request("Failed to load adapter '" + name + "': " + added.error().message,
                                "lora_name"),
                    sink);
      sink->send(200, "text/plain; charset=utf-8",
                 "Success: LoRA adapter '" + name + "' added successfully.");
    });
  });
}

void OpenAiService::unload_lora_adapter(const json& body,
                                        const std::shared_ptr<ResponseSink>& sink) {
  if (!body.contains("lora_name") || !body["lora_name"].is_string())
    return fail(bad_request("'lora_name' must be a string", "lora_name"), sink);
  const std::string name = body["lora_name"].get<std::string>();
  engine_.post([this, name, sink](engine::Engine& engine) {
    lora::AdapterRegistry* registry = engine.adapters();
    const bool removed = registry != nullptr && registry->remove(name);
    sink->post([this, name, removed, sink] {
      if (!removed)
        return fail(
            ApiError{404, "The adapter '" + name + "' is not loaded", "invalid_request_error",
                     std::string("lora_name"), std::string("model_not_found")},
            sink);
      sink->send(200, "text/plain; charset=utf-8",
                 "Success: LoRA adapter '" + name + "' removed successfully.");
    });
  });
}

void OpenAiService::handle(HttpRequest request, const std::shared_ptr<ResponseSink>& sink) {
  guarded(sink, [&] { route(request, sink); });
}

void OpenAiService::route(HttpRequest& req, const std::shared_ptr<ResponseSink>& sink) {
  const std::string path = request_path(req.target);
  struct Route {
    const char* path;
    const char* method;
    bool needs_body;
  };
  static const Route kRoutes[] = {
      {"/v1/completions", "POST", true},
      {"/v1/chat/completions", "POST", true},
      {"/tokenize", "POST", true},
      {"/detokenize", "POST", true},
      {"/v1/models", "GET", false},
      {"/health", "GET", false},
      {"/metrics", "GET", false},
      {"/version", "GET", false},
      {"/v1/load_lora_adapter", "POST", true},
      {"/v1/unload_lora_adapter", "POST", true},
  };
  const Route* route = nullptr;
  for (const Route& r : kRoutes)
    if (path == r.path) route = &r;
  if (route == nullptr)
    return fail(ApiError{404, "Not found: " + path, "not_found_error", std::nullopt, std::nullopt},
                sink);
  if (path.find("lora_adapter") != std::string::npos && !config_.enable_lora_runtime_updating)
    return fail(ApiError{404,
                         "Not found: " + path +
                             " (loading and unloading adapters while serving needs "
                             "--enable-lora-runtime-updating)",
                         "not_found_error", std::nullopt, std::nullopt},
                sink);
  if (req.method != route->method && !(req.method == "HEAD" && std::string(route->method) == "GET"))
    return fail(
        ApiError{405,
                 "Method " + req.method + " is not allowed for " + path + "; use " + route->method,
                 "invalid_request_error", std::nullopt, std::nullopt},
        sink);
  // Health and metrics stay open so that probes work without the key, as vLLM's do.
  if (!config_.api_key.empty() && path != "/health" && path != "/metrics" &&
      !authorized(req.authorization))
    return fail(ApiError{401, "Invalid or missing API key: send \"Authorization: Bearer <key>\"",
                         "authentication_error", std::nullopt, std::string("invalid_api_key")},
                sink);
  if (path == "/health") return sink->send_json(200, {{"status", "ok"}});
  if (path == "/version") return sink->send_json(200, {{"version", "0.1.0"}});
  if (path == "/metrics")
    return sink->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render());
  if (path == "/v1/models") return sink->send_json(200, models_json());

  if (req.content_type.find("application/json") == std::string::npos)
    return fail(
        ApiError{415, "Content-Type must be application/json, got \"" + req.content_type + "\"",
                 "invalid_request_error", std::nullopt, std::nullopt},
        sink);
  boost::asio::post(workers_->pool, [this, r = std::move(req), path, sink] {
    guarded(sink, [&] { handle_body(r, path, sink); });
  });
}

void OpenAiService::handle_body(const HttpRequest& req, const std::string& path,
                                const std::shared_ptr<ResponseSink>& sink) {
  auto parsed = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e, sink);
  const json& body = std::get<json>(parsed);
  // JSON schemas compile with their properties in the order the client wrote them: the body
  // again, keeping key order, when it may carry one (it parsed once, so it parses again).
  std::optional<nlohmann::ordered_json> ordered;
  for (const char* key :
       {"response_format", "guided_json", "json_schema", "structured_outputs", "tools"})
    if (body.is_object() && body.contains(key)) {
      ordered = nlohmann::ordered_json::parse(req.body, nullptr, false);
      break;
    }
  const nlohmann::ordered_json* in_order = ordered ? &*ordered : nullptr;
  if (path == "/v1/completions") return completions(body, in_order, sink);
  if (path == "/v1/chat/completions") return chat_completions(body, in_order, sink);
  if (path == "/tokenize") return tokenize(body, sink);
  if (path == "/v1/load_lora_adapter") return load_lora_adapter(body, sink);
  if (path == "/v1/unload_lora_adapter") return unload_lora_adapter(body, sink);
  return detokenize(body, sink);
}

void OpenAiService::completions(const json& body, const nlohmann::ordered_json* ordered,
                                const std::shared_ptr<ResponseSink>& sink) {
  auto parsed = parse_completion_request(body, limits_, ordered);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e, sink);
  CompletionRequest r = std::move(std::get<CompletionRequest>(parsed));
  auto resolved = resolve_model(r.model);
  if (auto* e = std::get_if<ApiError>(&resolved)) return fail(*e, sink);
  const std::string lora_name = std::get<std::string>(resolved);
  const auto& tok = engine_.tokenizer();
  std::vector<JobPrompt> prompts;
  for (auto& p : r.prompts) {
    JobPrompt jp;
    if (auto* text = std::get_if<std::string>(&p)) {
      if (auto e = check_text_length(text->size(), "prompt")) return fail(*e, sink);
      jp.ids = tok.encode(*text, /*add_special=*/true, /*parse_special=*/true);
      jp.text = *text;
    } else {
      jp.ids = std::get<std::vector<int32_t>>(p);
      jp.text = tok.decode(jp.ids, /*skip_special=*/true);
    }
    if (jp.ids.empty())
      return fail(bad_request("'prompt' is empty after tokenization", "prompt"), sink);
    if (auto e = check_length(jp.ids.size(), r.params.max_tokens, "prompt")) return fail(*e, sink);
    prompts.push_back(std::move(jp));
  }
  if (auto e = check_admission(prompts.size())) return fail(*e, sink);
  if (auto e = compile_constraint(r.constraint, r.params)) return fail(*e, sink);
  auto job = std::make_shared<GenerationJob>(
      GenerationJob::Kind::kCompletion, random_id("cmpl-"),
      lora_name.empty() ? config_.served_model_name : lora_name, unix_now(), r.stream,
      r.include_usage, r.echo, r.params, std::move(prompts), sink, engine_);
  jobs_.add(job);
  job->start(r.priority, lora_name);
}

void OpenAiService::chat_completions(const json& body, const nlohmann::ordered_json* ordered,
                                     const std::shared_ptr<ResponseSink>& sink) {
  auto parsed = parse_chat_request(body, limits_, ordered);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e, sink);
  ChatRequest r = std::move(std::get<ChatRequest>(parsed));
  auto resolved = resolve_model(r.model);
  if (auto* e = std::get_if<ApiError>(&resolved)) return fail(*e, sink);
  const std::string lora_name = std::get<std::string>(resolved);
  ToolCallParser parser = ToolCallParser::kNone;
  if (r.tool_choice.kind == ToolChoice::Kind::kAuto) {
    if (!config_.enable_auto_tool_choice)
      return fail(bad_request("\"auto\" tool choice requires --enable-auto-tool-choice and "
                              "--tool-call-parser to be set",
                              "tool_choice"),
                  sink);
    parser = tool_call_parser_from_name(config_.tool_call_parser).value();
  }
  // The template sees the tools unless the request turned them off (or passed its own).
  if (r.tool_choice.kind != ToolChoice::Kind::kNone && !r.chat_template_kwargs.contains("tools"))
    r.chat_template_kwargs["tools"] = r.tools;
  auto rendered = chat_template_.render(r.messages, r.add_generation_prompt, bos_text_, eos_text_,
                                        r.chat_template_kwargs);
  if (!rendered)
    return fail(bad_request("chat template: " + rendered.error().message, "messages"), sink);
  if (auto e = check_text_length(rendered->size(), "messages")) return fail(*e, sink);
  JobPrompt jp;
  jp.text = *rendered;
  // The template writes BOS and other special tokens itself, as text to be parsed.
  jp.ids = engine_.tokenizer().encode(jp.text, /*add_special=*/false, /*parse_special=*/true);
  if (jp.ids.empty())
    return fail(bad_request("the rendered conversation is empty", "messages"), sink);
  const int64_t limit = engine_.scheduler_config().max_model_len;
  if (!r.max_tokens_given)
    r.params.max_tokens = std::max<int64_t>(0, limit - static_cast<int64_t>(jp.ids.size()));
  if (auto e = check_length(jp.ids.size(), r.params.max_tokens, "messages")) return fail(*e, sink);
  if (r.params.min_tokens > r.params.max_tokens)
    return fail(
        bad_request("'min_tokens' must not exceed the completion's token limit", "min_tokens"),
        sink);
  if (auto e = check_admission(1)) return fail(*e, sink);
  if (auto e = compile_constraint(r.constraint, r.params)) return fail(*e, sink);
  std::vector<JobPrompt> prompts;
  prompts.push_back(std::move(jp));
  auto job = std::make_shared<GenerationJob>(
      GenerationJob::Kind::kChat, random_id("chatcmpl-"),
      lora_name.empty() ? config_.served_model_name : lora_name, unix_now(), r.stream,
      r.include_usage, false, r.params, std::move(prompts), sink, engine_);
  if (r.tool_choice.kind != ToolChoice::Kind::kNone) job->set_tools(r.tool_choice, parser);
  jobs_.add(job);
  job->start(r.priority, lora_name);
}

void OpenAiService::fail_in_flight(const ApiError& error) {
  jobs_.for_each([&error](GenerationJob& job) { job.fail(error); });
}

size_t OpenAiService::num_in_flight() {
  size_t n = 0;
  jobs_.for_each([&n](GenerationJob& job) { n += job.finished() ? 0 : 1; });
  return n;
}

void OpenAiService::tokenize(const json& body, const std::shared_ptr<ResponseSink>& sink) {
  auto parsed = parse_tokenize_request(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e, sink);
  const TokenizeRequest& r = std::get<TokenizeRequest>(parsed);
  std::string text;
  bool add_special = r.add_special_tokens;
  if (r.prompt) {
    text = *r.prompt;
  } else {
    auto rendered = chat_template_.render(r.messages, r.add_generation_prompt, bos_text_, eos_text_,
                                          r.chat_template_kwargs);
    if (!rendered)
      return fail(bad_request("chat template: " + rendered.error().message, "messages"), sink);
    text = *rendered;
    add_special = false;  // the template writes the special tokens itself
  }
  const auto ids = engine_.tokenizer().encode(text, add_special, /*parse_special=*/true);
  sink->send_json(200, {{"tokens", ids},
                        {"count", ids.size()},
                        {"max_model_len", engine_.scheduler_config().max_model_len}});
}

void OpenAiService::detokenize(const json& body, const std::shared_ptr<ResponseSink>& sink) {
  auto parsed = parse_detokenize_request(body, limits_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e, sink);
  sink->send_json(200,
                  {{"prompt", engine_.tokenizer().decode(std::get<std::vector<int32_t>>(parsed))}});
}

}  // namespace vesper::server
