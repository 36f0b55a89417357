// AsyncLlmEngine: the engine behind vesper.AsyncLLM: an engine::AsyncEngine (the engine on its
// own thread, as the server runs it) whose outputs reach asyncio without the engine thread ever
// touching Python.
//
// Why an eventfd and a C++ queue: the AsyncEngine's callbacks run on the engine thread (or its
// output thread). Taking the GIL there, even briefly for loop.call_soon_threadsafe, would stall
// every step behind whatever Python code holds the GIL (and deadlock at interpreter shutdown).
// Instead a callback copies the output into a mutex-guarded queue and, when the queue was empty,
// writes the eventfd; the asyncio loop watches the fd (loop.add_reader) and drain(), called on
// the loop's thread with the GIL, takes everything queued and turns it into Python objects. One
// write per batch of outputs, one wake-up of the loop per batch.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "python/request_builder.h"

namespace vesper::python {

namespace py = pybind11;

class AsyncLlmEngine {
 public:
  AsyncLlmEngine(const std::string& model, const py::dict& engine_args);
  ~AsyncLlmEngine();

  // The eventfd that becomes readable when drain() has something.
  int fd() const { return fd_; }
  // Converts and queues a request (errors in the arguments raise here); its outputs and any
  // refusal by the engine arrive through drain().
  void add_request(const std::string& request_id, py::handle prompt, py::handle params,
                   py::handle lora, int64_t priority);
  // A conversation rendered with the chat template, then queued as add_request does.
  void add_chat_request(const std::string& request_id, const std::string& rendered,
                        py::handle params, py::handle lora, int64_t priority);
  void abort(const std::string& request_id);
  // Everything queued since the last call: (request_id, output dict) or (request_id, message)
  // for a request the engine refused. Clears the eventfd.
  py::list drain();
  // Reads the adapter at `path` (with the GIL released; call it from an executor thread) and
  // registers it under `name` on the engine thread, ahead of any request queued after this
  // returns. Registered already: nothing happens.
  void add_lora(const std::string& name, const std::string& path);
  py::dict stats() const;
  // Stops taking requests, lets those in flight finish for up to `timeout_s`, then aborts the
  // rest and stops the engine thread. Idempotent.
  void shutdown(double timeout_s);

  RequestBuilder& builder() { return *builder_; }

 private:
  struct Event {
    std::string request_id;
    engine::RequestOutput output;
    std::string error;  // non-empty: the engine refused the request
  };
  void push(Event event);
  // The request for `prompt` (parameters converted, adapter named), queued on the engine with
  // callbacks that push its outputs. `where` names the prompt in errors.
  void submit(const std::string& request_id, RequestBuilder::Prompt prompt, py::handle params,
              py::handle lora, int64_t priority, const std::string& where);

  std::unique_ptr<RequestBuilder> builder_;  // reads the engine, which the AsyncEngine owns
  std::unique_ptr<engine::AsyncEngine> engine_;
  int fd_ = -1;
  std::mutex mutex_;  // guards events_
  std::vector<Event> events_;
  bool shut_down_ = false;
};

}  // namespace vesper::python
