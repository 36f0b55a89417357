// StreamReader: TTFT, ITL, E2E and output tokens from a streamed OpenAI response with given times.
#include <gtest/gtest.h>

#include "client/stream_reader.h"

namespace vesper::client {
namespace {

std::string text_chunk(const std::string& text, const char* finish = nullptr) {
  return std::string("data: {\"choices\":[{\"index\":0,\"text\":\"") + text +
         "\",\"finish_reason\":" + (finish ? std::string("\"") + finish + "\"" : "null") +
         "}]}\n\n";
}

TEST(StreamReader, MeasuresTtftItlLatencyAndUsage) {
  StreamReader r(ApiKind::kCompletions, 10.0);
  r.on_body(": ping\n\n", 10.05);  // not content
  r.on_body(text_chunk("Once"), 10.25);
  r.on_body(text_chunk(" upon") + text_chunk(" a"), 10.30);  // arrived together: a gap of zero
  r.on_body(text_chunk(" ti"), 10.40);
  r.on_body(text_chunk("me"), 10.55);
  r.on_body(text_chunk("", "length"), 10.56);  // finish chunk without text: not a token
  r.on_body("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5}}\n\n",
            10.56);
  EXPECT_FALSE(r.done());
  r.on_body("data: [DONE]\n\n", 10.60);
  EXPECT_TRUE(r.done());
  r.on_end(10.70);
  const RequestOutput out = r.take_output();
  ASSERT_TRUE(out.success) << out.error;
  EXPECT_NEAR(out.ttft_s, 0.25, 1e-9);
  ASSERT_EQ(out.itl_s.size(), 4u);
  EXPECT_NEAR(out.itl_s[0], 0.05, 1e-9);
  EXPECT_NEAR(out.itl_s[1], 0.0, 1e-9);
  EXPECT_NEAR(out.itl_s[2], 0.10, 1e-9);
  EXPECT_NEAR(out.itl_s[3], 0.15, 1e-9);
  EXPECT_NEAR(out.latency_s, 0.60, 1e-9);  // at [DONE], not at the end of the body
  EXPECT_EQ(out.num_content_chunks, 5);
  EXPECT_EQ(out.output_tokens, 5);
  EXPECT_TRUE(out.usage_reported);
  EXPECT_EQ(out.prompt_len, 9);
  EXPECT_TRUE(out.prompt_len_reported);
  EXPECT_EQ(out.generated_text, "Once upon a time");
}

TEST(StreamReader, UsageOverridesChunkCount) {
  StreamReader r(ApiKind::kCompletions, 0.0);
  r.on_body(text_chunk("ab"), 1.0);  // one chunk carrying two tokens
  r.on_body("data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\ndata: [DONE]\n\n", 2.0);
  r.on_end(2.0);
  const RequestOutput out = r.take_output();
  ASSERT_TRUE(out.success);
  EXPECT_EQ(out.output_tokens, 2);
  EXPECT_EQ(out.num_content_chunks, 1);
}

TEST(StreamReader, WithoutUsageCountsContentChunks) {
  StreamReader r(ApiKind::kCompletions, 0.0);
  r.on_body(text_chunk("a") + text_chunk("b") + text_chunk("c"), 1.0);
  r.on_end(1.5);  // no [DONE]: the end of the body ends the request
  const RequestOutput out = r.take_output();
  ASSERT_TRUE(out.success);
  EXPECT_EQ(out.output_tokens, 3);
  EXPECT_FALSE(out.usage_reported);
  EXPECT_FALSE(out.prompt_len_reported);
  EXPECT_NEAR(out.latency_s, 1.5, 1e-12);
}

TEST(StreamReader, UnterminatedLastEventCountsAtEnd) {
  StreamReader r(ApiKind::kCompletions, 0.0);
  r.on_body(text_chunk("a") + "data: [DONE]", 1.0);
  r.on_end(1.25);
  const RequestOutput out = r.take_output();
  ASSERT_TRUE(out.success);
  EXPECT_NEAR(out.latency_s, 1.25, 1e-12);
}

TEST(StreamReader, ChatDeltasAreContent) {
  StreamReader r(ApiKind::kChatCompletions, 0.0);
  r.on_body("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            0.5);  // role only: no token
  r.on_body("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n", 1.0);
  r.on_body("data: {\"choices\":[{\"delta\":{\"content\":\"!\"}}]}\n\ndata: [DONE]\n\n", 1.5);
  r.on_end(1.5);
  const RequestOutput out = r.take_output();
  ASSERT_TRUE(out.success);
  EXPECT_NEAR(out.ttft_s, 1.0, 1e-12);
  EXPECT_EQ(out.generated_text, "Hi!");
  EXPECT_EQ(out.output_tokens, 2);
}

TEST(StreamReader, ErrorEventFailsTheRequest) {
  StreamReader r(ApiKind::kCompletions, 0.0);
  r.on_body(text_chunk("a"), 1.0);
  r.on_body("data: {\"error\":{\"message\":\"context full\",\"code\":500}}\n\n", 1.2);
  EXPECT_TRUE(r.done());
  r.on_end(1.3);
  const RequestOutput out = r.take_output();
  EXPECT_FALSE(out.success);
  EXPECT_NE(out.error.find("context full"), std::string::npos) << out.error;
}

TEST(StreamReader, InvalidJsonFailsTheRequest) {
  StreamReader r(ApiKind::kCompletions, 0.0);
  r.on_body("data: {not json\n\n", 1.0);
  r.on_end(1.0);
  const RequestOutput out = r.take_output();
  EXPECT_FALSE(out.success);
  EXPECT_NE(out.error.find("not a JSON object"), std::string::npos) << out.error;
}

TEST(StreamReader, NoContentIsAFailure) {
  StreamReader r(ApiKind::kCompletions, 0.0);
  r.on_body(text_chunk("", "stop") + "data: [DONE]\n\n", 1.0);
  r.on_end(1.0);
  const RequestOutput out = r.take_output();
  EXPECT_FALSE(out.success);
  EXPECT_NE(out.error.find("without a content chunk"), std::string::npos);
}

TEST(StreamReader, TransportErrorFailsEvenAfterContent) {
  StreamReader r(ApiKind::kCompletions, 0.0);
  r.on_body(text_chunk("a"), 1.0);
  r.on_error("reading the response body: timed out");
  const RequestOutput out = r.take_output();
  EXPECT_FALSE(out.success);
  EXPECT_EQ(out.error, "reading the response body: timed out");
}

}  // namespace
}  // namespace vesper::client
