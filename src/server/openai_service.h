// OpenAiService: Vesper's HTTP API, independent of the HTTP machinery: routing, authentication,
// validation, admission control, and the OpenAI endpoints (completions and chat completions,
// streaming or not, models, tokenize / detokenize, health, metrics).
//
// handle() answers the cheap endpoints (health, models, metrics) at once. Everything that reads a
// body (JSON parsing, validation, chat templates, tokenization: work that grows with the request)
// runs on the service's own worker threads, never on the caller's (the HTTP I/O threads), so one
// large request cannot stall other clients. Bad input gets an ApiError in OpenAI's shape naming
// the field; generation requests go to the AsyncEngine and are answered from its callbacks. A
// client that disconnects has its requests aborted. Nothing a request holds can make handle()
// throw: an unexpected exception is logged and answered with a 500, and serving goes on.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "engine/async_engine.h"
#include "grammar/grammar_cache.h"
#include "server/api_error.h"
#include "server/http_request.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/response_sink.h"
#include "server/server_config.h"
#include "server/weak_list.h"
#include "tokenizer/chat_template.h"

namespace vesper::server {

class GenerationJob;

class OpenAiService {
 public:
  OpenAiService(ServerConfig config, engine::AsyncEngine& engine, Metrics& metrics,
                tokenizer::ChatTemplate chat_template);
  ~OpenAiService();

  void handle(HttpRequest request, const std::shared_ptr<ResponseSink>& sink);
  // Waits for the work handed to the worker threads to finish; handle() must not be called
  // afterwards. The HTTP server calls it before its connections go away.
  void stop();

  const std::string& model_name() const { return config_.served_model_name; }

  // Thread-safe. Ends every completion still answering with `error` (a stream: as its last
  // event), without the engine: for when the engine cannot answer any more (a rank of a
  // parallel job is gone, or the launcher is about to end the process).
  void fail_in_flight(const ApiError& error);
  // Thread-safe. Completions whose response has not ended.
  size_t num_in_flight();

 private:
  struct Workers;
  void route(HttpRequest& request, const std::shared_ptr<ResponseSink>& sink);
  void handle_body(const HttpRequest& request, const std::string& path,
                   const std::shared_ptr<ResponseSink>& sink);
  // Runs `work`; an exception escaping it is logged and answered with a 500.
  void guarded(const std::shared_ptr<ResponseSink>& sink, const std::function<void()>& work);
  bool authorized(const std::string& authorization) const;
  void fail(const ApiError& error, const std::shared_ptr<ResponseSink>& sink);
  std::optional<ApiError> check_admission(size_t num_requests) const;
  // `ordered`: the body with its keys in written order when it may hold a JSON schema, else null.
  void completions(const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                   const std::shared_ptr<ResponseSink>& sink);
  void chat_completions(const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                        const std::shared_ptr<ResponseSink>& sink);
  void tokenize(const nlohmann::json& body, const std::shared_ptr<ResponseSink>& sink);
  void detokenize(const nlohmann::json& body, const std::shared_ptr<ResponseSink>& sink);
  nlohmann::json models_json() const;

  // Checks the model field, prompt lengths against --max-model-len and the KV capacity.
  // The adapter a request's "model" names ("" for the base model), or a 404 model_not_found.
  std::variant<std::string, ApiError> resolve_model(const std::string& model) const;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (--enable-lora-runtime-updating).
  void load_lora_adapter(const nlohmann::json& body, const std::shared_ptr<ResponseSink>& sink);
  void unload_lora_adapter(const nlohmann::json& body, const std::shared_ptr<ResponseSink>& sink);
  // A text of `bytes` bytes that is sure to exceed --max-model-len, refused untokenized.
  std::optional<ApiError> check_text_length(size_t bytes, const char* what) const;
  std::optional<ApiError> check_length(size_t prompt_tokens, int64_t max_tokens,
                                       const char* what) const;
  // Structured output: the request's grammar from the cache into `params` (a grammar that does
  // not compile is a 400 naming its field).
  std::optional<ApiError> compile_constraint(const std::optional<OutputConstraint>& constraint,
                                             sample::SamplingParams& params);

  ServerConfig config_;
  engine::AsyncEngine& engine_;
  Metrics& metrics_;
  tokenizer::ChatTemplate chat_template_;
  std::string bos_text_, eos_text_;
  ProtocolLimits limits_;
  std::array<unsigned char, 32> api_key_digest_{};  // SHA-256 of the key, compared in constant time
  size_t max_piece_bytes_ = 1;                      // the most text bytes one token stands for
  int64_t created_ = 0;
  std::unique_ptr<Workers> workers_;
  std::unique_ptr<grammar::GrammarCache> grammars_;  // compiled by constraint text, shared
  // The completions started, for fail_in_flight() (weakly: a finished job is freed as before).
  WeakList<GenerationJob> jobs_;
};

}  // namespace vesper::server
