// The server's request parsing without a server: JSON bodies (UTF-8, depth, literals), the typed
// field accessor, request targets and bearer tokens, and the OpenAI request validation.
#include <gtest/gtest.h>

#include <string>

#include "server/http_request.h"
#include "server/json_body.h"
#include "server/json_fields.h"
#include "server/openai_protocol.h"

namespace vesper::server {
namespace {

using nlohmann::json;

// The error of a parse, copied out of the (temporary) result.
std::optional<ApiError> error_of(const std::variant<json, ApiError>& v) {
  if (const ApiError* e = std::get_if<ApiError>(&v)) return *e;
  return std::nullopt;
}

TEST(JsonBody, NestingBeyondTheLimitIsRefusedWithItsOffset) {
  EXPECT_FALSE(
      error_of(parse_json_body("{\"a\":" + std::string(63, '[') + std::string(63, ']') + "}")));
  const std::string deep = "{\"a\":" + std::string(64, '[') + std::string(64, ']') + "}";
  std::optional<ApiError> e = error_of(parse_json_body(deep));
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("deeper than 64 levels (at byte 68)"), std::string::npos) << e->message;
  // 200,000 levels: refused by the scan, before any recursive code sees it.
  const std::string very = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_TRUE(error_of(parse_json_body(very)));
  // Brackets and escaped quotes inside strings are not nesting.
  EXPECT_FALSE(error_of(parse_json_body("{\"a\":\"" + std::string(500, '[') + "\\\"{{{\"}")));
}

TEST(JsonBody, SyntaxErrorsNameTheByteAndTheLiteral) {
  std::optional<ApiError> e = error_of(parse_json_body("{\"prompt\":\"hi\",\"max_tokens\":NaN}"));
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("at byte 28"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("invalid literal"), std::string::npos) << e->message;
  e = error_of(parse_json_body("{\"t\":1e999}"));
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("out of range"), std::string::npos) << e->message;
  EXPECT_TRUE(error_of(parse_json_body("[1]")));
  EXPECT_EQ(e->status, 400);
}

TEST(JsonBody, InvalidUtf8IsFoundAtItsOffset) {
  EXPECT_EQ(find_invalid_utf8("plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), std::string::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("a\xc0\xaf"), 1u);          // overlong '/'
  EXPECT_EQ(find_invalid_utf8("a\xed\xa0\x80"), 1u);      // a surrogate
  EXPECT_EQ(find_invalid_utf8("a\xf4\x90\x80\x80"), 1u);  // past U+10FFFF
  EXPECT_EQ(find_invalid_utf8("a\xe2\x82"), 1u);          // truncated
  std::optional<ApiError> e = error_of(parse_json_body("{\"p\":\"\xff\"}"));
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("UTF-8 (at byte 6)"), std::string::npos) << e->message;
}

TEST(JsonFields, WrongTypesAndNullsNameTheFieldByItsPath) {
  const json body = {{"n", "x"},    {"b", nullptr}, {"f", 2.5},
                     {"big", 1e30}, {"whole", 3.0}, {"neg", -1}};
  const JsonFields f(body, "messages[2]");
  int64_t i = 0;
  auto e = f.integer("n", i, 0, 10);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "'messages[2].n' must be an integer between 0 and 10, got a string");
  EXPECT_EQ(e->param, "messages[2].n");
  bool b = true;
  EXPECT_FALSE(f.boolean("b", b));  // null reads as absent by default
  EXPECT_TRUE(b);
  e = f.boolean("b", b, Null::kError);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("got null"), std::string::npos);
  EXPECT_TRUE(f.integer("f", i, 0, 10));
  e = f.integer("big", i, 0, 10);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("got a number (1e+30)"), std::string::npos) << e->message;
  EXPECT_FALSE(f.integer("whole", i, 0, 10));
  EXPECT_EQ(i, 3);
  EXPECT_TRUE(f.integer("neg", i, 0, 10));
  std::string s;
  EXPECT_TRUE(f.require_string("missing", s));
  const json* obj = nullptr;
  EXPECT_TRUE(f.object("n", obj));
  EXPECT_FALSE(f.object("absent", obj));
  EXPECT_EQ(obj, nullptr);
  // A non-object has no fields.
  const json five = 5;
  const JsonFields none(five);
  EXPECT_FALSE(none.has("x"));
  EXPECT_TRUE(none.require_string("x", s));
}

TEST(HttpRequest, PathsOfOriginAndAbsoluteFormTargets) {
  EXPECT_EQ(request_path("/v1/models?x=1"), "/v1/models");
  EXPECT_EQ(request_path("/health#frag"), "/health");
  EXPECT_EQ(request_path("http://localhost:8000/health"), "/health");
  EXPECT_EQ(request_path("HTTPS://h/v1/completions?a"), "/v1/completions");
  EXPECT_EQ(request_path("http://host"), "/");
  EXPECT_EQ(request_path(""), "");
}

TEST(HttpRequest, BearerTokensAreCaseInsensitiveInTheScheme) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("bearer abc"), "abc");
  EXPECT_EQ(bearer_token("BEARER   abc  "), "abc");
  EXPECT_EQ(bearer_token("Bearer"), std::nullopt);
  EXPECT_EQ(bearer_token("Bearerabc"), std::nullopt);
  EXPECT_EQ(bearer_token("Basic abc"), std::nullopt);
  EXPECT_EQ(bearer_token(""), std::nullopt);
}

const ProtocolLimits kLimits{512};

TEST(OpenAiProtocol, ContentPartsAreCheckedPartByPart) {
  for (const json& type : {json(5), json(nullptr), json::array()}) {
    const json body = {
        {"messages", {{{"role", "user"}, {"content", {{{"type", type}, {"text", "hi"}}}}}}}};
    auto parsed = parse_chat_request(body, kLimits);
    const ApiError* e = std::get_if<ApiError>(&parsed);
    ASSERT_NE(e, nullptr) << type;
    EXPECT_EQ(e->param, "messages[0].content[0].type");
  }
  const json two = {
      {"messages",
       {{{"role", "user"},
         {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}}};
  auto parsed = parse_chat_request(two, kLimits);
  ASSERT_TRUE(std::holds_alternative<ChatRequest>(parsed));
  EXPECT_EQ(std::get<ChatRequest>(parsed).messages[0]["content"], "a\nb");
}

TEST(OpenAiProtocol, TokenIdsOutsideTheVocabularyAreRefusedEverywhere) {
  auto stop = parse_completion_request({{"prompt", "hi"}, {"stop_token_ids", {3, 512}}}, kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(stop));
  EXPECT_EQ(std::get<ApiError>(stop).param, "stop_token_ids");
  auto prompt = parse_completion_request({{"prompt", {1, 2, 99999}}}, kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(prompt));
  EXPECT_NE(std::get<ApiError>(prompt).message.find("prompt[2]"), std::string::npos);
  auto nested =
      parse_completion_request({{"prompt", {json::array({1, 2}), json::array({-4})}}}, kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(nested));
  auto detok = parse_detokenize_request({{"tokens", {1, 4000000000u}}}, kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(detok));
  // A long prompt of ids is one prompt, not a list of more than 1024 prompts.
  auto long_ids = parse_completion_request({{"prompt", std::vector<int32_t>(2000, 5)}}, kLimits);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(long_ids));
  auto ok = parse_completion_request({{"prompt", {1, 511}}, {"stop_token_ids", {0, 511}}}, kLimits);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ok));
  EXPECT_TRUE(std::get<CompletionRequest>(ok).params.validate().ok());
}

TEST(OpenAiProtocol, NullableAndNonNullableFields) {
  // OpenAI's optional parameters take null as "not given".
  auto nulls = parse_completion_request(
      {{"prompt", "hi"}, {"temperature", nullptr}, {"stop", nullptr}, {"n", nullptr}}, kLimits);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(nulls));
  EXPECT_EQ(std::get<CompletionRequest>(nulls).params.n, 1);
  auto tok = parse_tokenize_request({{"prompt", "x"}, {"add_generation_prompt", nullptr}});
  ASSERT_TRUE(std::holds_alternative<ApiError>(tok));
  EXPECT_EQ(std::get<ApiError>(tok).param, "add_generation_prompt");
  auto rf = parse_chat_request(
      {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"response_format", {{"type", 5}}}},
      kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(rf));
  EXPECT_EQ(std::get<ApiError>(rf).param, "response_format.type");
}

}  // namespace
}  // namespace vesper::server
