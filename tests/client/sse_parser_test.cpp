// SseParser: events split at any byte, CRLF/CR/LF line ends, multi-line data, comments, finish().
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "client/sse_parser.h"

namespace vesper::client {
namespace {

std::vector<std::string> parse_in_pieces(const std::string& body, const std::vector<size_t>& cuts,
                                         bool finish) {
  SseParser p;
  std::vector<std::string> events;
  auto on_event = [&](std::string_view data) { events.emplace_back(data); };
  size_t from = 0;
  for (size_t cut : cuts) {
    p.feed(std::string_view(body).substr(from, cut - from), on_event);
    from = cut;
  }
  p.feed(std::string_view(body).substr(from), on_event);
  if (finish) p.finish(on_event);
  return events;
}

std::vector<std::string> parse_whole(const std::string& body, bool finish = false) {
  return parse_in_pieces(body, {}, finish);
}

const std::string kStream =
    "data: {\"choices\":[{\"text\":\"Once\"}]}\r\n\r\n"
    ": keep-alive comment\n\n"
    "event: message\nid: 7\ndata: {\"choices\":[{\"text\":\" upon\"}]}\n\n"
    "data: line one\ndata: line two\r\rdata:no-space\n\n"
    "data: [DONE]\n\n";
const std::vector<std::string> kEvents = {"{\"choices\":[{\"text\":\"Once\"}]}",
                                          "{\"choices\":[{\"text\":\" upon\"}]}",
                                          "line one\nline two", "no-space", "[DONE]"};

TEST(SseParser, ParsesWholeStream) {
  EXPECT_EQ(parse_whole(kStream), kEvents);
}

TEST(SseParser, SameEventsWhereverTheBytesAreSplit) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut)
    EXPECT_EQ(parse_in_pieces(kStream, {cut}, false), kEvents) << cut;
  for (size_t a = 0; a <= kStream.size(); a += 3)
    for (size_t b = a; b <= kStream.size(); b += 5)
      EXPECT_EQ(parse_in_pieces(kStream, {a, b}, false), kEvents);
}

TEST(SseParser, ByteByByte) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < kStream.size(); ++i) cuts.push_back(i);
  EXPECT_EQ(parse_in_pieces(kStream, cuts, false), kEvents);
}

TEST(SseParser, CrLfSplitBetweenFeedsIsOneLineEnd) {
  // "\r" at the end of one piece and "\n" at the start of the next must not make a blank line.
  const std::string body = "data: a\r\ndata: b\r\n\r\n";
  EXPECT_EQ(parse_in_pieces(body, {8}, false), std::vector<std::string>{"a\nb"});
  EXPECT_EQ(parse_in_pieces(body, {17}, false), std::vector<std::string>{"a\nb"});
}

TEST(SseParser, CarriageReturnAloneEndsLines) {
  EXPECT_EQ(parse_whole("data: x\r\rdata: y\r\r"), (std::vector<std::string>{"x", "y"}));
}

TEST(SseParser, DropsOnlyOneSpaceAfterColon) {
  EXPECT_EQ(parse_whole("data:  two spaces\n\ndata:none\n\n"),
            (std::vector<std::string>{" two spaces", "none"}));
}

TEST(SseParser, EventWithoutDataIsNotDispatched) {
  EXPECT_TRUE(parse_whole("event: ping\nid: 3\n\n: comment\n\nretry: 10\n\n").empty());
  // An empty data line is data: an empty event.
  EXPECT_EQ(parse_whole("data:\n\n"), std::vector<std::string>{""});
  EXPECT_EQ(parse_whole("data\n\n"), std::vector<std::string>{""});
}

TEST(SseParser, EventCompletesOnlyAtBlankLine) {
  EXPECT_TRUE(parse_whole("data: [DONE]\n").empty());
  EXPECT_TRUE(parse_whole("data: [DONE]").empty());
}

TEST(SseParser, FinishDispatchesUnterminatedEvent) {
  EXPECT_EQ(parse_whole("data: a\n\ndata: [DONE]\n", true),
            (std::vector<std::string>{"a", "[DONE]"}));
  EXPECT_EQ(parse_whole("data: a\n\ndata: [DONE]", true),
            (std::vector<std::string>{"a", "[DONE]"}));
  EXPECT_EQ(parse_whole("data: a\n\n", true), std::vector<std::string>{"a"});
}

TEST(SseParser, SkipsByteOrderMarkAtStart) {
  EXPECT_EQ(parse_whole("\xEF\xBB\xBF"
                        "data: a\n\n"),
            std::vector<std::string>{"a"});
}

TEST(SseParser, KeepsUtf8SplitAcrossFeeds) {
  const std::string body = "data: caf\xC3\xA9\n\n";
  for (size_t cut = 0; cut <= body.size(); ++cut)
    EXPECT_EQ(parse_in_pieces(body, {cut}, false), std::vector<std::string>{"caf\xC3\xA9"});
}

}  // namespace
}  // namespace vesper::client
