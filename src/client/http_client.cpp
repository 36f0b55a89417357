#include "client/http_client.h"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <limits>

namespace vesper::client {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using boost::system::error_code;

constexpr size_t kMaxErrorBody = 64 * 1024;
constexpr size_t kReadChunk = 16 * 1024;
// After the caller stops reading (it got "data: [DONE]"), how long the rest of the body may take
// before the connection is dropped instead of kept for reuse.
constexpr auto kDrainTimeout = std::chrono::seconds(1);

std::string describe(const error_code& ec) {
  if (ec == beast::error::timeout) return "timed out";
  return ec.message();
}

// The server closed a kept-alive connection before this request got any answer.
bool is_stale_connection(const error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::connection_aborted;
}

}  // namespace

HttpClient::HttpClient(asio::any_io_executor executor, Url url, std::string api_key)
    : executor_(std::move(executor)), url_(std::move(url)), api_key_(std::move(api_key)) {}

asio::awaitable<Status> HttpClient::resolve() {
  asio::ip::tcp::resolver resolver(executor_);
  error_code ec;
  endpoints_ = co_await resolver.async_resolve(url_.host, url_.port,
                                               asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return make_error("cannot resolve host \"" + url_.host + "\": " + ec.message());
  co_return Status();
}

asio::awaitable<Result<HttpResponse>> HttpClient::get(std::string path, Clock::duration timeout) {
  co_return co_await request(false, path, {}, nullptr, timeout);
}

asio::awaitable<Result<HttpResponse>> HttpClient::post_streaming(std::string path,
                                                                 std::string json_body,
                                                                 const OnBody& on_body,
                                                                 Clock::duration timeout) {
  co_return co_await request(true, path, json_body, &on_body, timeout);
}

asio::awaitable<Result<HttpResponse>> HttpClient::request(bool post, const std::string& path,
                                                          const std::string& body,
                                                          const OnBody* on_body,
                                                          Clock::duration timeout) {
  const auto deadline = Clock::now() + timeout;
  http::request<http::string_body> req{post ? http::verb::post : http::verb::get,
                                       url_.prefix + path, 11};
  req.set(http::field::host, url_.host_header());
  req.set(http::field::user_agent, "vesper-bench");
  req.set(http::field::connection, "keep-alive");
  if (!api_key_.empty()) req.set(http::field::authorization, "Bearer " + api_key_);
  if (post) {
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream, application/json");
    req.body() = body;
  }
  req.prepare_payload();

  for (int attempt = 0;; ++attempt) {
    const bool reused = attempt == 0 && !idle_.empty();
    beast::tcp_stream stream = [&] {
      if (!reused) return beast::tcp_stream(executor_);
      beast::tcp_stream s = std::move(idle_.back());
      idle_.pop_back();
      return s;
    }();
    stream.expires_at(deadline);
    error_code ec;
    if (!reused) {
      co_await stream.async_connect(endpoints_, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return make_error(std::string("connect: ") + describe(ec));
      // Beast may write the header and the body separately: without this, Nagle's algorithm holds
      // the body until the server's delayed ACK (40 ms on Linux) on a kept-alive connection.
      stream.socket().set_option(asio::ip::tcp::no_delay(true), ec);
    }
    co_await http::async_write(stream, req, asio::redirect_error(asio::use_awaitable, ec));
    if (ec && reused && is_stale_connection(ec)) continue;
    if (ec) co_return make_error(std::string("sending the request: ") + describe(ec));

    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    // No limit on a streamed body (boost::none would trip Boost 1.74's length check).
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    co_await http::async_read_header(stream, buffer, parser,
                                     asio::redirect_error(asio::use_awaitable, ec));
    if (ec && reused && is_stale_connection(ec)) continue;
    if (ec) co_return make_error(std::string("reading the response header: ") + describe(ec));

    HttpResponse response;
    response.status = static_cast<int>(parser.get().result_int());
    const bool stream_body = on_body != nullptr && response.status / 100 == 2;
    char chunk[kReadChunk];
    bool keep_reading = true;
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof chunk;
      co_await http::async_read_some(stream, buffer, parser,
                                     asio::redirect_error(asio::use_awaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec && !keep_reading)
        break;  // draining after the caller stopped: just drop the connection
      if (ec) co_return make_error(std::string("reading the response body: ") + describe(ec));
      const size_t n = sizeof chunk - parser.get().body().size;
      if (n == 0 || !keep_reading) continue;
      const std::string_view piece(chunk, n);
      if (stream_body) {
        if (!(*on_body)(piece)) {
          keep_reading = false;
          stream.expires_at(std::min(deadline, Clock::now() + kDrainTimeout));
        }
      } else if (response.body.size() < kMaxErrorBody || on_body == nullptr) {
        response.body.append(piece);
      }
    }
    if (parser.is_done() && parser.keep_alive()) {
      stream.expires_never();
      idle_.push_back(std::move(stream));
    }
    co_return response;
  }
}

}  // namespace vesper::client
