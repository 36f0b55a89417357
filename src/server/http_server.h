// HttpServer: HTTP/1.1 over Boost.Asio/Beast, asynchronous throughout: a few I/O threads serve
// any number of connections (no thread per connection). Each connection reads one request at a
// time (keep-alive), hands it to the OpenAiService, and writes the answer: a whole response, or
// a Server-Sent Events stream in chunked transfer encoding. While an answer is pending the
// connection watches its socket, so a client that goes away has its request aborted at once.
// SIGINT / SIGTERM: stop accepting, let in-flight requests finish (up to the shutdown timeout),
// then return from run().
#pragma once

#include <memory>

#include "core/result.h"
#include "engine/async_engine.h"
#include "server/openai_service.h"
#include "server/server_config.h"

namespace vesper::server {

class HttpServer {
 public:
  HttpServer(const ServerConfig& config, OpenAiService& service, engine::AsyncEngine& engine);
  ~HttpServer();

  // Binds and listens. Errors name the address.
  Status listen();
  // The bound port (useful with --port 0).
  int port() const;
  // Serves until SIGINT or SIGTERM, then shuts down gracefully.
  void run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vesper::server
