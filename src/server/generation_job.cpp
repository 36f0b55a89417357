#include "server/generation_job.h"

#include "server/openai_protocol.h"

namespace vesper::server {

using nlohmann::json;

namespace {
// vLLM's stop_reason: the stop string or stop token id that ended the choice, else null; or, when
// the output's constraint gave up (a grammar too ambiguous to follow), why.
void set_stop_reason(json& choice, const engine::CompletionOutput& c) {
  if (c.constraint_error) {
    choice["stop_reason"] = *c.constraint_error;
    return;
  }
  if (c.stop_string)
    choice["stop_reason"] = *c.stop_string;
  else if (c.stop_token)
    choice["stop_reason"] = *c.stop_token;
  else
    choice["stop_reason"] = nullptr;
}
}  // namespace

GenerationJob::GenerationJob(Kind kind, std::string id, std::string model, int64_t created,
                             bool stream, bool include_usage, bool echo,
                             const sample::SamplingParams& params, std::vector<JobPrompt> prompts,
                             std::shared_ptr<ResponseSink> sink, engine::AsyncEngine& engine)
    : kind_(kind),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      stream_(stream),
      include_usage_(include_usage),
      echo_(echo),
      params_(params),
      prompts_(std::move(prompts)),
      sink_(std::move(sink)),
      engine_(engine) {
  finals_.resize(prompts_.size());
  text_offsets_.assign(prompts_.size() * params_.n, 0);
  finish_sent_.assign(prompts_.size() * params_.n, false);
  cached_tokens_.assign(prompts_.size(), 0);
  remaining_ = prompts_.size();
}

void GenerationJob::set_tools(const ToolChoice& choice, ToolCallParser parser) {
  tool_choice_ = choice;
  tool_parser_ = choice.kind == ToolChoice::Kind::kAuto ? parser : ToolCallParser::kNone;
  const size_t choices = prompts_.size() * params_.n;
  texts_.assign(choices, "");
  content_sent_.assign(choices, 0);
  tool_streams_.assign(choices, ToolCallStream(choice));
}

bool GenerationJob::forced_tool_calls() const {
  return tool_choice_.kind == ToolChoice::Kind::kRequired ||
         tool_choice_.kind == ToolChoice::Kind::kNamed;
}

namespace {
json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& call : calls)
    out.push_back({{"id", call.id},
                   {"type", "function"},
                   {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  return out;
}
}  // namespace

json GenerationJob::tool_delta(size_t index, const engine::CompletionOutput& c,
                               std::string& finish) {
  std::string& text = texts_[index];
  text += c.delta_text;
  if (forced_tool_calls()) {
    json deltas = tool_streams_[index].update(text);
    if (c.finished() && finish == "stop" && !parse_forced_tool_calls(tool_choice_, text).empty())
      finish = "tool_calls";
    if (deltas.empty()) return c.finished() ? json::object() : json();
    return {{"tool_calls", std::move(deltas)}};
  }
  // Auto: content as far as it cannot be the start of a call; at the end, the calls found.
  size_t& sent = content_sent_[index];
  json delta = json::object();
  const size_t ready = c.finished() ? text.size() : streamable_content(tool_parser_, text);
  if (c.finished()) {
    ParsedToolOutput parsed = parse_tool_calls(tool_parser_, text);
    if (!parsed.calls.empty()) {
      json deltas = json::array();
      for (size_t k = 0; k < parsed.calls.size(); ++k) {
        json header = tool_calls_json({parsed.calls[k]})[0];
        header["index"] = k;
        deltas.push_back(std::move(header));
      }
      if (finish == "stop") finish = "tool_calls";
      return {{"tool_calls", std::move(deltas)}};
    }
  }
  if (ready > sent) {
    delta["content"] = text.substr(sent, ready - sent);
    sent = ready;
  }
  if (delta.empty() && !c.finished()) return json();
  return delta;
}

json GenerationJob::chat_message(const engine::CompletionOutput& c, std::string& finish) const {
  json message = {{"role", "assistant"}, {"content", c.text}};
  std::vector<ToolCall> calls;
  std::string content;
  if (forced_tool_calls()) {
    calls = parse_forced_tool_calls(tool_choice_, c.text);
  } else if (tool_parser_ != ToolCallParser::kNone) {
    ParsedToolOutput parsed = parse_tool_calls(tool_parser_, c.text);
    calls = std::move(parsed.calls);
    content = std::move(parsed.content);
  }
  if (calls.empty()) return message;
  message["content"] = content.empty() ? json() : json(content);
  message["tool_calls"] = tool_calls_json(calls);
  if (finish == "stop") finish = "tool_calls";
  return message;
}

std::string GenerationJob::piece(int32_t token) const {
  if (params_.return_tokens_as_token_ids) return "token_id:" + std::to_string(token);
  return engine_.tokenizer().token_to_piece(token, false);
}

json GenerationJob::chunk(json choices) const {
  return {{"id", id_},
          {"object", kind_ == Kind::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", std::move(choices)}};
}

json GenerationJob::usage_json() const {
  int64_t prompt_tokens = 0, cached_tokens = 0;
  for (const auto& p : prompts_) prompt_tokens += static_cast<int64_t>(p.ids.size());
  for (int64_t c : cached_tokens_) cached_tokens += c;
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

void GenerationJob::begin_stream() {
  if (stream_started_ || finished()) return;
  stream_started_ = true;
  sink_->start_stream();
  const int32_t n = params_.n;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    for (int32_t i = 0; i < n; ++i) {
      const size_t index = p * n + i;
      if (kind_ == Kind::kChat) {
        sink_->send_event(chunk(json::array({{{"index", index},
                                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                                              {"logprobs", nullptr},
                                              {"finish_reason", nullptr}}}))
                              .dump(-1, ' ', false, json::error_handler_t::replace));
      } else if (echo_) {
        sink_->send_event(chunk(json::array({{{"index", index},
                                              {"text", prompts_[p].text},
                                              {"logprobs", nullptr},
                                              {"finish_reason", nullptr}}}))
                              .dump(-1, ' ', false, json::error_handler_t::replace));
        text_offsets_[index] = prompts_[p].text.size();
      }
    }
  }
}

void GenerationJob::start(int32_t priority, const std::string& lora_name) {
  auto self = shared_from_this();
  sink_->on_disconnect([self] { self->abort_all(); });
  for (size_t p = 0; p < prompts_.size(); ++p) {
    engine::EngineRequest request{id_ + "-" + std::to_string(p), prompts_[p].ids, params_, priority,
                                  lora_name};
    engine_.add_request(
        std::move(request),
        // On the engine thread: hand the output over to the connection, nothing more.
        [self, p](const engine::RequestOutput& out) {
          self->sink_->post([self, p, out] { self->on_output(p, out); });
        },
        [self](const engine::AsyncEngine::RequestError& error) {
          self->sink_->post([self, error] { self->on_error(error); });
        },
        // Posted before any of its outputs, so the stream starts first.
        [self] {
          if (self->stream_) self->sink_->post([self] { self->begin_stream(); });
        });
  }
}

void GenerationJob::on_output(size_t prompt_index, const engine::RequestOutput& out) {
  if (finished()) return;
  const int32_t n = params_.n;
  cached_tokens_[prompt_index] = out.num_cached_tokens;
  for (const auto& c : out.outputs)
    completion_tokens_ += static_cast<int64_t>(c.delta_token_ids.size());
  if (stream_) {
    json choices = json::array();
    for (const auto& c : out.outputs) {
      const size_t index = prompt_index * n + c.index;
      // A choice that finished before its siblings is in every later output of the request;
      // its finish was streamed once.
      if (finish_sent_[index]) continue;
      if (c.delta_text.empty() && c.delta_token_ids.empty() && !c.finished()) continue;
      json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
      std::string finish = c.finish_reason.value_or("stop");
      if (kind_ == Kind::kChat && tool_choice_.kind != ToolChoice::Kind::kNone) {
        json delta = tool_delta(index, c, finish);
        if (delta.is_null()) continue;
        choice["delta"] = std::move(delta);
      } else if (kind_ == Kind::kChat) {
        choice["delta"] =
            c.delta_text.empty() && c.finished() ? json::object() : json{{"content", c.delta_text}};
        if (params_.logprobs >= 0 && !c.delta_logprobs.empty())
          choice["logprobs"] =
              chat_logprobs_json(c.delta_logprobs, [this](int32_t t) { return piece(t); });
      } else {
        choice["text"] = c.delta_text;
        if (params_.logprobs >= 0 && !c.delta_logprobs.empty())
          choice["logprobs"] = completion_logprobs_json(
              c.delta_logprobs, [this](int32_t t) { return piece(t); }, text_offsets_[index]);
      }
      text_offsets_[index] += c.delta_text.size();
      if (c.finished()) {
        finish_sent_[index] = true;
        choice["finish_reason"] = finish;
        set_stop_reason(choice, c);
      }
      choices.push_back(std::move(choice));
    }
    if (!choices.empty())
      sink_->send_event(
          chunk(std::move(choices)).dump(-1, ' ', false, json::error_handler_t::replace));
  }
  if (out.finished) {
    finals_[prompt_index] = out;
    if (--remaining_ == 0) finish();
  }
}

void GenerationJob::finish() {
  finished_.store(true, std::memory_order_release);
  if (stream_) {
    if (include_usage_) {
      json last = chunk(json::array());
      last["usage"] = usage_json();
      sink_->send_event(last.dump());
    }
    sink_->end_stream();
    return;
  }
  const int32_t n = params_.n;
  json choices = json::array();
  for (size_t p = 0; p < finals_.size(); ++p) {
    for (const auto& c : finals_[p].outputs) {
      const size_t index = p * n + c.index;
      std::string finish = c.finish_reason.value_or("stop");
      json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
      set_stop_reason(choice, c);
      if (kind_ == Kind::kChat) {
        choice["message"] = chat_message(c, finish);
        if (params_.logprobs >= 0)
          choice["logprobs"] =
              chat_logprobs_json(c.logprobs, [this](int32_t t) { return piece(t); });
      } else {
        const std::string prefix = echo_ ? prompts_[p].text : std::string();
        choice["text"] = prefix + c.text;
        if (params_.logprobs >= 0)
          choice["logprobs"] = completion_logprobs_json(
              c.logprobs, [this](int32_t t) { return piece(t); }, prefix.size());
      }
      choice["finish_reason"] = finish;
      choices.push_back(std::move(choice));
    }
  }
  json body = {{"id", id_},
               {"object", kind_ == Kind::kChat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"choices", std::move(choices)},
               {"usage", usage_json()}};
  sink_->send_json(200, body);
}

void GenerationJob::on_error(const engine::AsyncEngine::RequestError& error) {
  using Kind = engine::AsyncEngine::RequestError::Kind;
  respond_error(
      error.kind == Kind::kShuttingDown
          ? ApiError{503, error.message, "service_unavailable", std::nullopt, std::nullopt}
      : error.kind == Kind::kModelNotFound
          ? ApiError{404, error.message, "invalid_request_error", std::string("model"),
                     std::string("model_not_found")}
          : bad_request(error.message));
}

void GenerationJob::fail(const ApiError& error) {
  auto self = shared_from_this();
  sink_->post([self, error] { self->respond_error(error); });
}

bool GenerationJob::finished() const {
  return finished_.load(std::memory_order_acquire);
}

void GenerationJob::respond_error(const ApiError& error) {
  if (finished()) return;
  finished_.store(true, std::memory_order_release);
  abort_all();
  if (stream_started_) {
    // The status line went out with the stream's start: the error is its last event.
    sink_->send_event(error.to_json().dump(-1, ' ', false, json::error_handler_t::replace));
    sink_->end_stream();
  } else {
    sink_->send_json(error.status, error.to_json());
  }
}

void GenerationJob::abort_all() {
  for (size_t p = 0; p < prompts_.size(); ++p) engine_.abort(id_ + "-" + std::to_string(p));
}

}  // namespace vesper::server
