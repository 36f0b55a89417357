// Tool calls in chat completions (OpenAI's `tools` / `tool_choice`, vLLM's parsers).
//
// - `tool_choice` "none": tools are not offered; "required" or a named function: the output is
//   constrained (grammar/) to a valid call, vLLM's way: a named function's output is its
//   arguments (a JSON value of its `parameters` schema); "required" outputs a JSON array of
//   {"name": ..., "parameters": {...}} with at least one item (exactly one with OpenAI's
//   `parallel_tool_calls: false`). "auto" (the default when tools are
//   given) leaves the output free and a parser (`--tool-call-parser`, with
//   `--enable-auto-tool-choice`) finds calls in it: `hermes` (<tool_call>{"name", "arguments"}
//   </tool_call> blocks) or `llama3_json` (a JSON object {"name", "parameters"}, optionally after
//   <|python_tag|>, several separated by ";").
// - Calls are answered as OpenAI's `tool_calls` (id, type "function", name, arguments as JSON
//   text) with finish_reason "tool_calls"; streamed, a call's first delta carries its index, id,
//   type and name, later deltas pieces of its arguments (ToolCallStream).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/structured_output.h"

namespace vesper::server {

struct ToolChoice {
  enum class Kind { kNone, kAuto, kRequired, kNamed };
  Kind kind = Kind::kNone;
  std::string name;  // kNamed: the function
};

enum class ToolCallParser { kNone, kHermes, kLlama3Json };
// "hermes" or "llama3_json"; the error lists the choices.
Result<ToolCallParser> tool_call_parser_from_name(const std::string& name);

// Reads `tools` and `tool_choice` (validated: each tool {"type": "function", "function":
// {"name", "description", "parameters", "strict"}}); for "required" and named choices, sets
// `constraint` (a request that also sets another output constraint is a 400).
// `ordered`: the body with its keys in written order (parse_output_constraint), or null.
std::optional<ApiError> parse_tools(const JsonFields& f, const nlohmann::ordered_json* ordered,
                                    nlohmann::json& tools, ToolChoice& choice,
                                    std::optional<OutputConstraint>& constraint);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

// A new call id: "chatcmpl-tool-" and 32 hex digits, as vLLM's.
std::string make_tool_call_id();

// The calls in the output of a "required" or named choice (empty when the output is not a
// complete call, e.g. cut by max_tokens).
std::vector<ToolCall> parse_forced_tool_calls(const ToolChoice& choice, const std::string& text);

// What an auto-choice parser finds: the text outside calls (empty: none) and the calls.
struct ParsedToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedToolOutput parse_tool_calls(ToolCallParser parser, const std::string& text);
// While streaming under `parser`: how many bytes at the start of `text` can be sent as content
// now (the rest might turn out to be a call, so it waits).
size_t streamable_content(ToolCallParser parser, const std::string& text);

// The deltas of forced calls as their text grows: each call's header once its name is known,
// then what its arguments gained. Feed the whole text so far; returns OpenAI `tool_calls`
// delta entries (possibly none).
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolChoice choice) : choice_(std::move(choice)) {}
  nlohmann::json update(const std::string& text);
  // The calls streamed so far, with their ids (for the final answer to agree with the stream).
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  ToolChoice choice_;
  std::vector<ToolCall> calls_;  // started calls (arguments: as much as was sent)
};

}  // namespace vesper::server
