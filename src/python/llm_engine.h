// LlmEngine: the engine behind vesper.LLM (vLLM's offline LLM class). generate() queues a whole
// list of requests and steps the engine on the calling thread until they are all done: one
// continuous batch, as `vesper generate` runs it.
//
// Threads and the GIL: the engine steps with the GIL released, so other Python threads run
// meanwhile; no Python code runs during a step (the progress bar is the CLI's, in C++). Every
// ~50 ms the loop takes the GIL for PyErr_CheckSignals: on Ctrl-C (KeyboardInterrupt, or any
// exception a signal handler raises) the call's requests are aborted, their blocks freed, and the
// exception propagates; the engine stays usable. One call runs at a time (a mutex, taken
// without the GIL); request ids are never reused, so outputs a previous interrupted call left
// behind are told apart and dropped.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "engine/engine.h"
#include "python/request_builder.h"

namespace vesper::python {

namespace py = pybind11;

class LlmEngine {
 public:
  LlmEngine(const std::string& model, const py::dict& engine_args);

  // prompts: a list (each a str, a list of token ids or a prompt dict); params, loras and
  // priorities: lists of the same length (a SamplingParams; None or a (name, path) pair; an int).
  // Returns the final output dicts (outputs.h) in input order.
  py::list generate(const py::list& prompts, const py::list& params, const py::list& loras,
                    const py::list& priorities, bool use_tqdm);

  RequestBuilder& builder() { return *builder_; }
  const engine::Engine& engine() const { return *engine_; }
  py::dict stats() const;

 private:
  // Registers the adapters the call names that are not registered yet (read now). Runs with
  // the lock held and the GIL released. Returns an error message, or "".
  std::string register_adapters(const std::vector<std::pair<std::string, std::string>>& loras);

  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<RequestBuilder> builder_;
  mutable std::mutex mutex_;
  uint64_t next_request_ = 0;
};

// The engine's statistics as a dict (EngineStats' fields by name; vesper.LLM.stats()).
py::dict stats_dict(const engine::EngineStats& s);

// The LoRA adapter a call names: a (name, path) pair, or None (the base model). Throws
// TypeError / ValueError naming `where`.
std::optional<std::pair<std::string, std::string>> lora_pair(py::handle lora,
                                                             const std::string& where);

}  // namespace vesper::python
