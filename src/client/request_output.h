// RequestOutput: what one benchmark request measured, as vLLM's benchmark_serving records it
// (RequestFuncOutput): success or the error, time to first token, the inter-token gaps, the
// end-to-end latency and the token counts. Times are in seconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vesper::client {

struct RequestOutput {
  bool success = false;
  std::string error;          // why it failed; empty on success
  double ttft_s = 0;          // first content chunk - send time
  std::vector<double> itl_s;  // gaps between successive content chunks
  double latency_s = 0;       // end of the stream ([DONE] or end of body) - send time
  int64_t prompt_len = 0;     // usage.prompt_tokens if the server reported it, else the estimate
  int64_t output_tokens =
      0;  // usage.completion_tokens if reported, else the number of content chunks
  int64_t num_content_chunks = 0;
  bool usage_reported = false;       // the server sent usage.completion_tokens
  bool prompt_len_reported = false;  // the server sent usage.prompt_tokens
  std::string generated_text;
};

}  // namespace vesper::client
