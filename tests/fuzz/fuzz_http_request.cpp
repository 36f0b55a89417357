// Fuzz target: bytes from a client connection. They go through the same HTTP parser the server
// reads requests with (Boost.Beast's request_parser, with the server's header limit and a body
// limit), request after request as on a keep-alive connection. Each complete request is taken
// apart as the service does: the target's path (origin- or absolute-form), the bearer token, and
// for the POST endpoints the body through validation (openai_checks.h). A malformed stream must
// end in a parser error, never a crash; what the service derives must keep its promises.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "openai_checks.h"
#include "server/http_request.h"

namespace http = boost::beast::http;

namespace {

void check_request(const vesper::server::HttpRequest& r) {
  const std::string path = vesper::server::request_path(r.target);
  VESPER_CHECK(path.find_first_of("?#") == std::string::npos, "a path kept its query");
  VESPER_CHECK(path.size() <= r.target.size() || path == "/", "a path longer than its target");
  if (auto token = vesper::server::bearer_token(r.authorization)) {
    VESPER_CHECK(token->empty() || (token->front() != ' ' && token->back() != ' '),
                 "a token with spaces around");
  }
  static const char* kPosts[] = {"/v1/completions", "/v1/chat/completions", "/tokenize",
                                 "/detokenize"};
  for (int i = 0; i < 4; ++i)
    if (path == kPosts[i] && r.method == "POST") vesper::fuzz::check_body(r.body, i);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  // Requests one after another, as a keep-alive connection sends them.
  while (!rest.empty()) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(vesper::server::kMaxHeaderBytes);
    parser.body_limit(1 << 20);
    parser.eager(true);
    boost::beast::error_code ec;
    const size_t used = parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    if (ec == http::error::need_more) {
      // All the bytes are in: a request cut short, unless the message ends at end of stream.
      parser.put_eof(ec);
      if (ec) return 0;
    } else if (ec) {
      return 0;  // malformed: the server answers 400 / 413 / 431 and closes
    }
    if (!parser.is_done()) return 0;
    VESPER_CHECK(used > 0 || parser.is_done(), "the parser made no progress");
    const auto& req = parser.get();
    vesper::server::HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.content_type = std::string(req[http::field::content_type]);
    r.authorization = std::string(req[http::field::authorization]);
    r.body = req.body();
    check_request(r);
    if (used == 0) return 0;
    rest.remove_prefix(used);
  }
  return 0;
}
