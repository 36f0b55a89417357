// OpenAiService: Vesper's HTTP API, independent of the HTTP machinery: routing, authentication,
// validation, admission control, and the OpenAI endpoints (completions and chat completions,
// streaming or not, models, tokenize / detokenize, health, metrics).
//
// handle() answers at once for bad input (an ApiError in OpenAI's shape naming the field) and
// for the cheap endpoints; generation requests go to the AsyncEngine and are answered from its
// callbacks. A client that disconnects has its requests aborted.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "engine/async_engine.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/response_sink.h"
#include "server/server_config.h"
#include "tokenizer/chat_template.h"

namespace vesper::server {

struct HttpRequest {
  std::string method;
  std::string target;  // path and query
  std::string content_type;
  std::string authorization;
  std::string body;
};

class OpenAiService {
 public:
  OpenAiService(ServerConfig config, engine::AsyncEngine& engine, Metrics& metrics, tokenizer::ChatTemplate chat_template);

  void handle(const HttpRequest& request, const std::shared_ptr<ResponseSink>& sink);

  const std::string& model_name() const { return config_.served_model_name; }

 private:
  void fail(const ApiError& error, const std::shared_ptr<ResponseSink>& sink);
  void completions(const nlohmann::json& body, const std::shared_ptr<ResponseSink>& sink);
  void chat_completions(const nlohmann::json& body, const std::shared_ptr<ResponseSink>& sink);
  void tokenize(const nlohmann::json& body, const std::shared_ptr<ResponseSink>& sink);
  void detokenize(const nlohmann::json& body, const std::shared_ptr<ResponseSink>& sink);
  nlohmann::json models_json() const;

  // Checks the model field, prompt lengths against --max-model-len and the KV capacity.
  std::optional<ApiError> check_model(const std::string& model) const;
  std::optional<ApiError> check_length(size_t prompt_tokens, int64_t max_tokens, const char* what) const;

  ServerConfig config_;
  engine::AsyncEngine& engine_;
  Metrics& metrics_;
  tokenizer::ChatTemplate chat_template_;
  std::string bos_text_, eos_text_;
  std::atomic<uint64_t> next_id_{1};
  int64_t created_ = 0;
};

}  // namespace vesper::server
