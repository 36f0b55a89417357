// Tool calls without a server: tools / tool_choice validation and the constraint they set,
// reading calls out of outputs (forced, hermes, llama3_json) and the streamed deltas.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include "grammar/gbnf.h"
#include "server/openai_protocol.h"

namespace vesper::server {
namespace {

using nlohmann::json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                  "unit": {"enum": ["c", "f"]}}, "required": ["city"],
                  "additionalProperties": false}}},
  {"type": "function", "function": {"name": "noop"}}
])");

ChatRequest parse_chat(json body) {
  body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto r = parse_chat_request(body, ProtocolLimits{512});
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::get<ChatRequest>(r);
}

ApiError chat_error(json body) {
  if (!body.contains("messages"))
    body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto r = parse_chat_request(body, ProtocolLimits{512});
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body.dump();
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(ToolCalls, ChoiceDefaultsAndConstraints) {
  ChatRequest r = parse_chat({{"tools", kTools}});
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::kAuto);
  EXPECT_FALSE(r.constraint);
  r = parse_chat({{"tools", kTools}, {"tool_choice", "none"}});
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::kNone);
  r = parse_chat({{"tools", kTools}, {"tool_choice", "required"}});
  ASSERT_TRUE(r.constraint);
  auto g = grammar::parse_gbnf(r.constraint->gbnf);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(g->matches(
      R"([{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "noop", "parameters": {}}])"));
  EXPECT_FALSE(g->matches(R"([])"));
  EXPECT_FALSE(g->matches(R"([{"name": "get_weather", "parameters": {"unit": "c"}}])"));
  EXPECT_FALSE(g->matches(R"([{"name": "other", "parameters": {}}])"));
  r = parse_chat(
      {{"tools", kTools},
       {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::kNamed);
  ASSERT_TRUE(r.constraint);
  g = grammar::parse_gbnf(r.constraint->gbnf);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->matches(R"({"city": "Oslo", "unit": "f"})"));
  EXPECT_FALSE(g->matches(R"({"unit": "f"})"));
}

TEST(ToolCalls, BadToolsAndChoicesNameTheField) {
  EXPECT_EQ(chat_error({{"tool_choice", "required"}}).param, "tool_choice");
  EXPECT_EQ(chat_error({{"tools", kTools}, {"tool_choice", "sometimes"}}).param, "tool_choice");
  EXPECT_EQ(chat_error({{"tools", kTools},
                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}})
                .param,
            "tool_choice.function.name");
  EXPECT_EQ(chat_error({{"tools", json::array({{{"type", "retrieval"}}})}}).param, "tools[0].type");
  EXPECT_EQ(
      chat_error(
          {{"tools", json::array({{{"type", "function"}, {"function", {{"name", "bad name"}}}}})}})
          .param,
      "tools[0].function.name");
  json dup = kTools;
  dup[1]["function"]["name"] = "get_weather";
  EXPECT_EQ(chat_error({{"tools", dup}}).param, "tools[1].function.name");
  json bad_schema = kTools;
  bad_schema[0]["function"]["parameters"]["properties"]["city"]["multipleOf"] = 2;
  const ApiError e = chat_error(
      {{"tools", bad_schema},
       {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  EXPECT_EQ(e.param, "tools[0].function.parameters");
  EXPECT_NE(e.message.find("multipleOf"), std::string::npos) << e.message;
  EXPECT_EQ(
      chat_error({{"tools", kTools}, {"tool_choice", "required"}, {"guided_regex", "a+"}}).param,
      "guided_regex");
}

TEST(ToolCalls, ForcedOutputsParse) {
  const ToolChoice named{ToolChoice::Kind::kNamed, "get_weather"};
  auto calls = parse_forced_tool_calls(named, R"({"city": "Oslo"})");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_TRUE(calls[0].id.starts_with("chatcmpl-tool-"));
  EXPECT_TRUE(parse_forced_tool_calls(named, R"({"city": "Os)").empty());
  const ToolChoice required{ToolChoice::Kind::kRequired, ""};
  calls = parse_forced_tool_calls(required,
                                  R"([{"name": "get_weather", "parameters": {"city": "A, \"B\" }"}},
 {"name": "noop", "parameters": {}}])");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].arguments, R"({"city": "A, \"B\" }"})");
  EXPECT_EQ(calls[1].name, "noop");
  EXPECT_EQ(calls[1].arguments, "{}");
  EXPECT_NE(calls[0].id, calls[1].id);
}

// Feeding a forced output a byte at a time, the deltas reassemble into the final calls.
TEST(ToolCalls, StreamedDeltasReassemble) {
  const std::string text =
      R"([{"name": "get_weather", "parameters": {"city": "Rome [x] {y}", "unit": "c"}}, {"name": "noop", "parameters": {}}])";
  ToolCallStream stream(ToolChoice{ToolChoice::Kind::kRequired, ""});
  std::vector<std::string> names, args, ids;
  for (size_t n = 1; n <= text.size(); ++n) {
    for (const json& d : stream.update(text.substr(0, n))) {
      const size_t i = d["index"];
      if (d.contains("id")) {
        ASSERT_EQ(i, names.size());
        names.push_back(d["function"]["name"]);
        ids.push_back(d["id"]);
        args.emplace_back();
      }
      args[i] += d["function"]["arguments"].get<std::string>();
    }
  }
  const auto final_calls =
      parse_forced_tool_calls(ToolChoice{ToolChoice::Kind::kRequired, ""}, text);
  ASSERT_EQ(names.size(), final_calls.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(names[i], final_calls[i].name);
    EXPECT_EQ(args[i], final_calls[i].arguments);
    EXPECT_EQ(ids[i], stream.calls()[i].id);
  }
}

TEST(ToolCalls, HermesAndLlama3JsonParsers) {
  auto parsed = parse_tool_calls(ToolCallParser::kHermes,
                                 "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", "
                                 "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(parsed.content, "Let me look.");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(parsed.calls[0].arguments), json({{"city", "Oslo"}}));
  parsed = parse_tool_calls(ToolCallParser::kHermes, "just text <tool_call>{not json</tool_call>");
  EXPECT_TRUE(parsed.calls.empty());
  EXPECT_EQ(parsed.content, "just text <tool_call>{not json</tool_call>");
  parsed = parse_tool_calls(ToolCallParser::kLlama3Json,
                            "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; "
                            "{\"name\": \"b\", \"parameters\": {}}");
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[1].name, "b");
  EXPECT_EQ(parse_tool_calls(ToolCallParser::kLlama3Json, "Hello {\"name\": \"a\"}").calls.size(),
            0u);
  EXPECT_EQ(streamable_content(ToolCallParser::kHermes, "abc <tool_"), 4u);
  EXPECT_EQ(streamable_content(ToolCallParser::kHermes, "abc <tool_call>{"), 4u);
  EXPECT_EQ(streamable_content(ToolCallParser::kHermes, "a < b"), 5u);
  EXPECT_EQ(streamable_content(ToolCallParser::kLlama3Json, "  {\"na"), 0u);
  EXPECT_EQ(streamable_content(ToolCallParser::kLlama3Json, "<|pyth"), 0u);
  EXPECT_EQ(streamable_content(ToolCallParser::kLlama3Json, "Sure"), 4u);
}

}  // namespace
}  // namespace vesper::server
