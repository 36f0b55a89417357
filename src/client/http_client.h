// HttpClient: an asynchronous HTTP/1.1 client (Boost.Beast over Boost.Asio, C++20 coroutines)
// for one server, made for many concurrent streaming requests from one thread.
//
// Owns the resolved addresses of the server and a pool of idle keep-alive connections: a request
// takes an idle connection or opens a new one, and gives it back when the server leaves it open.
// A request on a reused connection that the server had closed meanwhile (nothing of the response
// read yet) is retried once on a new connection. Each request has one deadline for all of it
// (connect, send, the whole streamed body). Errors are values with a message that says which step
// failed ("connect: Connection refused"); nothing throws out of it. Not thread-safe: use it from
// the executor's one thread.
#pragma once

#include <utility>  // before Boost 1.74's awaitable.hpp, which uses std::exchange without it

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "client/url.h"
#include "core/result.h"

namespace vesper::client {

struct HttpResponse {
  int status = 0;
  std::string body;  // the whole body; for a streamed 2xx response, empty
};

class HttpClient {
 public:
  using Clock = std::chrono::steady_clock;
  // Gets each piece of a 2xx response body as it arrives; returns false to stop reading.
  using OnBody = std::function<bool(std::string_view)>;

  HttpClient(boost::asio::any_io_executor executor, Url url, std::string api_key);

  // Resolves the host; required once before any request.
  boost::asio::awaitable<Status> resolve();

  // GET url.prefix + path; the whole response.
  boost::asio::awaitable<Result<HttpResponse>> get(std::string path, Clock::duration timeout);

  // POST url.prefix + path with a JSON body. A 2xx body goes to on_body piece by piece as it
  // arrives (returned body empty); any other status returns its body (at most 64 KiB).
  boost::asio::awaitable<Result<HttpResponse>> post_streaming(std::string path,
                                                              std::string json_body,
                                                              const OnBody& on_body,
                                                              Clock::duration timeout);

  const Url& url() const { return url_; }

 private:
  boost::asio::awaitable<Result<HttpResponse>> request(bool post, const std::string& path,
                                                       const std::string& body,
                                                       const OnBody* on_body,
                                                       Clock::duration timeout);

  boost::asio::any_io_executor executor_;
  Url url_;
  std::string api_key_;
  boost::asio::ip::tcp::resolver::results_type endpoints_;
  std::vector<boost::beast::tcp_stream> idle_;
};

}  // namespace vesper::client
