// GenerationJob: one completions or chat-completions HTTP request in flight: its engine requests
// (one per prompt; each with n samples), the stream of chunks or the final response body, usage
// accounting, and abort on disconnect. The engine thread only hands each output over to the
// connection's executor (ResponseSink::post); the job turns it into JSON and SSE there, so the
// engine thread never encodes responses. Everything the job does runs on that one executor, so
// its state needs no lock.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "server/api_error.h"
#include "server/response_sink.h"
#include "server/tool_calls.h"

namespace vesper::server {

struct JobPrompt {
  std::vector<int32_t> ids;
  std::string text;  // the prompt text (for echo)
};

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  enum class Kind { kCompletion, kChat };

  GenerationJob(Kind kind, std::string id, std::string model, int64_t created, bool stream,
                bool include_usage, bool echo, const sample::SamplingParams& params,
                std::vector<JobPrompt> prompts, std::shared_ptr<ResponseSink> sink,
                engine::AsyncEngine& engine);

  // Chat with tools: how calls are read from each choice's output (before start()).
  void set_tools(const ToolChoice& choice, ToolCallParser parser);

  // Submits every prompt, with the adapter `lora_name` (empty: the base model). A stream's
  // headers (and the chat role chunks) go out once the engine took the first prompt, so that a
  // request the engine refuses (an adapter unloaded meanwhile) gets its HTTP status.
  void start(int32_t priority, const std::string& lora_name = {});

  // Thread-safe. Ends the response with `error` (a stream: as its last event) unless it ended
  // already, and aborts the job's requests: for when the engine cannot answer any more (a rank of
  // a parallel job is gone), so the server answers without it.
  void fail(const ApiError& error);
  // Thread-safe. Whether the response has ended (answered whole, or with an error).
  bool finished() const;

 private:
  void begin_stream();
  void on_output(size_t prompt_index, const engine::RequestOutput& out);
  void on_error(const engine::AsyncEngine::RequestError& error);
  void respond_error(const ApiError& error);
  void abort_all();
  std::string piece(int32_t token) const;
  nlohmann::json chunk(nlohmann::json choices) const;
  nlohmann::json usage_json() const;
  void finish();
  // Chat with tools: a streamed choice's delta (null: nothing to send yet) and its finish
  // reason, and a final message.
  bool forced_tool_calls() const;
  nlohmann::json tool_delta(size_t index, const engine::CompletionOutput& c, std::string& finish);
  nlohmann::json chat_message(const engine::CompletionOutput& c, std::string& finish) const;

  Kind kind_;
  std::string id_;
  std::string model_;
  int64_t created_;
  bool stream_;
  bool include_usage_;
  bool echo_;
  sample::SamplingParams params_;
  std::vector<JobPrompt> prompts_;
  std::shared_ptr<ResponseSink> sink_;
  engine::AsyncEngine& engine_;

  std::vector<engine::RequestOutput> finals_;  // per prompt, once finished
  std::vector<size_t> text_offsets_;           // per choice: bytes of text streamed so far
  std::vector<bool> finish_sent_;              // per choice: its finish_reason chunk is out
  std::vector<int64_t> cached_tokens_;  // per prompt: prompt tokens served from the prefix cache
  size_t remaining_ = 0;
  int64_t completion_tokens_ = 0;
  // The response has ended. Written on the connection's strand only; atomic for finished().
  std::atomic<bool> finished_{false};
  bool stream_started_ = false;
  ToolChoice tool_choice_;
  ToolCallParser tool_parser_ = ToolCallParser::kNone;
  // Set by set_tools (chat with tools); kNone otherwise.
  std::vector<std::string> texts_;            // per choice, tools only: the text so far
  std::vector<size_t> content_sent_;          // per choice, auto tools: bytes sent as content
  std::vector<ToolCallStream> tool_streams_;  // per choice, forced calls
};

}  // namespace vesper::server
