// HttpServer: HTTP/1.1 over Boost.Asio/Beast, asynchronous throughout: a few I/O threads serve
// any number of connections (no thread per connection). Each connection reads one request at a
// time (keep-alive), hands it to the OpenAiService, and writes the answer: a whole response, or
// a Server-Sent Events stream in chunked transfer encoding. While an answer is pending the
// connection watches its socket, so a client that goes away has its request aborted at once.
// SIGINT / SIGTERM: stop accepting, let in-flight requests finish (up to the shutdown timeout),
// then return from run(). Under a launcher that kills the process on its own schedule (mpirun),
// what has not finished just before that kill is answered with a 503 (set_kill_clock).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/result.h"
#include "engine/async_engine.h"
#include "server/api_error.h"
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

  // Thread-safe. Answers every completion still in flight with `error`, without the engine
  // (OpenAiService::fail_in_flight), stops accepting and keeping connections alive, and waits up
  // to `wait_s` seconds for the answers to go out. For when the engine cannot answer any more: a
  // parallel job's rank is gone and the job is about to end.
  void fail_in_flight(const ApiError& error, double wait_s);
  // Before run(): where a launcher kills the process on its own schedule once it began to end
  // the job (mpirun's kill sequence, dist/job_end.h), the seconds left until then, else nullopt.
  // A drain then answers what is left with a 503 carrying `message` shortly before the kill.
  void set_kill_clock(std::function<std::optional<double>()> seconds_until_kill,
                      std::string message);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vesper::server
