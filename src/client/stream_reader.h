// StreamReader: turns the body of one streaming OpenAI response (completions or chat
// completions) into a RequestOutput, given the time at which each piece of the body arrived.
//
// A content chunk is an SSE event whose first choice carries generated text (completions:
// choices[0].text; chat: choices[0].delta.content or .reasoning_content) or token ids
// (choices[0].token_ids / .tokens). Chunks with no content (a final chunk with only
// finish_reason, a usage-only chunk) are not tokens: they take no part in TTFT or ITL.
//   TTFT = arrival of the first content chunk - send time
//   ITL  = arrival gaps between successive content chunks
//   E2E  = arrival of "data: [DONE]" (or of the end of the body) - send time
// Output tokens come from the usage object (stream_options.include_usage) when the server sends
// one, else from the number of content chunks. Pieces that arrive together share one arrival
// time, so chunks that were batched by the network count as gaps of zero, as they did for the
// client. Pure logic: no I/O and no clock, so tests feed it bytes and times.
#pragma once

#include <string>
#include <string_view>

#include "client/request_output.h"
#include "client/sse_parser.h"

namespace vesper::client {

enum class ApiKind { kCompletions, kChatCompletions };

class StreamReader {
 public:
  // `send_time_s`: when the request was sent, on the same clock as the arrival times.
  StreamReader(ApiKind kind, double send_time_s) : kind_(kind), send_time_s_(send_time_s) {}

  // A piece of the body arrived at `now_s`.
  void on_body(std::string_view bytes, double now_s);
  // The body ended at `now_s` (the server closed the stream or the last chunk came).
  void on_end(double now_s);
  // The request failed (HTTP status, connection, timeout): the output is a failure with `error`.
  void on_error(std::string error);

  // "data: [DONE]" arrived, or an error event did: nothing more needs to be read.
  bool done() const { return done_ || !error_.empty(); }
  // The measurement, once on_end() or on_error() was called.
  RequestOutput take_output();

 private:
  void on_event(std::string_view data, double now_s);

  ApiKind kind_;
  double send_time_s_;
  SseParser sse_;
  RequestOutput out_;
  double last_content_s_ = 0;
  double end_s_ = -1;
  bool done_ = false;
  std::string error_;
};

}  // namespace vesper::client
