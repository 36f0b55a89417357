// ResponseSink: how request handlers answer, independent of the HTTP machinery. The HTTP
// session implements it; every method is thread-safe (the session posts the work to its own
// executor), so handlers may call it from the engine thread.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace vesper::server {

class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // A complete response.
  virtual void send(int status, std::string content_type, std::string body) = 0;
  void send_json(int status, const nlohmann::json& body) {
    send(status, "application/json",
         body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  // Server-Sent Events: start_stream() sends the headers, send_event() one "data: ...\n\n"
  // event, end_stream() the final "data: [DONE]" and the end of the response.
  virtual void start_stream() = 0;
  virtual void send_event(std::string data) = 0;
  virtual void end_stream() = 0;
  // `callback` runs (once, on an I/O thread) if the client goes away before the response ends.
  virtual void on_disconnect(std::function<void()> callback) = 0;
  // Runs `work` on the connection's own executor, after what was posted before it and never at
  // the same time as the connection's other work (its writes, its disconnect callback): the
  // place to turn engine outputs into response bytes, off the engine thread.
  virtual void post(std::function<void()> work) = 0;
};

}  // namespace vesper::server
