#include "python/async_llm_engine.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/logging.h"
#include "lora/adapter_read.h"
#include "python/engine_args.h"
#include "python/llm_engine.h"
#include "python/outputs.h"

namespace vesper::python {

AsyncLlmEngine::AsyncLlmEngine(const std::string& model, const py::dict& engine_args) {
  std::unique_ptr<engine::Engine> created = create_engine(model, engine_args);
  builder_ = std::make_unique<RequestBuilder>(*created);
  fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw py::value_error(std::string("eventfd: ") + std::strerror(errno));
  engine_ = std::make_unique<engine::AsyncEngine>(std::move(created));
}

AsyncLlmEngine::~AsyncLlmEngine() {
  shutdown(0);
  if (fd_ >= 0) close(fd_);
}

// Runs on the engine's threads: no Python here.
void AsyncLlmEngine::push(Event event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(event));
  if (events_.size() == 1) {
    // The loop drains everything per wake-up, so one write per batch suffices. A full counter
    // (EAGAIN) already means "readable"; nothing else can fail on an open eventfd.
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(fd_, &one, sizeof one);
  }
}

void AsyncLlmEngine::submit(const std::string& request_id, RequestBuilder::Prompt prompt,
                            py::handle params, py::handle lora, int64_t priority,
                            const std::string& where) {
  if (shut_down_) throw py::value_error("AsyncLLM: the engine is shut down");
  const ConvertedParams converted = convert_sampling_params(params);
  const auto pair = lora_pair(lora, "lora_request");
  engine::EngineRequest request =
      builder_->request(request_id, std::move(prompt), converted, pair ? pair->first : "",
                        static_cast<int32_t>(priority), where);
  const std::string id = request.request_id;
  engine_->add_request(
      std::move(request),
      [this, id](const engine::RequestOutput& out) {
        push(Event{id, out, {}});
      },
      [this, id](const engine::AsyncEngine::RequestError& e) {
        push(Event{id, {}, e.message.empty() ? "the request was refused" : e.message});
      });
}

void AsyncLlmEngine::add_request(const std::string& request_id, py::handle prompt,
                                 py::handle params, py::handle lora, int64_t priority) {
  submit(request_id, builder_->prompt(prompt, "prompt"), params, lora, priority, "prompt");
}

void AsyncLlmEngine::add_chat_request(const std::string& request_id, const std::string& rendered,
                                      py::handle params, py::handle lora, int64_t priority) {
  submit(request_id, builder_->chat_prompt(rendered), params, lora, priority, "messages");
}

void AsyncLlmEngine::abort(const std::string& request_id) {
  if (!shut_down_) engine_->abort(request_id);
}

py::list AsyncLlmEngine::drain() {
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = read(fd_, &count, sizeof count);  // EAGAIN: nothing
    events.swap(events_);
  }
  py::list out(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    out[i] = e.error.empty()
                 ? py::make_tuple(e.request_id, request_output_dict(e.output, engine_->tokenizer()))
                 : py::make_tuple(e.request_id, utf8_str(e.error));
  }
  return out;
}

void AsyncLlmEngine::add_lora(const std::string& name, const std::string& path) {
  if (shut_down_) throw py::value_error("AsyncLLM: the engine is shut down");
  const lora::LoraConfig* config = engine_->lora_config();
  if (config == nullptr || !config->enable_lora)
    throw py::value_error("lora_request '" + name + "' needs the engine argument enable_lora=True");
  if (engine_->has_adapter(name)) return;
  Result<lora::HostAdapter> read = make_error("");
  {
    // The file is read here, off the engine thread, as the server's runtime loads are.
    py::gil_scoped_release nogil;
    lora::AdapterRead reading(path, engine_->model_config(), config->max_lora_rank);
    read = reading.wait_for(lora::kAdapterReadTimeoutSeconds)
               ? reading.take()
               : Result<lora::HostAdapter>(make_error(path + ": reading it took too long"));
  }
  if (!read) throw py::value_error("lora_request '" + name + "': " + read.error().message);
  auto host = std::make_shared<lora::HostAdapter>(std::move(read).value());
  engine_->post([name, host](engine::Engine& engine) {
    lora::AdapterRegistry* registry = engine.adapters();
    // Two coroutines may load the same adapter at once: the first registration stands.
    if (registry == nullptr || registry->contains(name)) return;
    if (Status added = registry->add(name, *host); !added)
      log_warning("lora_request '%s': %s", name.c_str(), added.error().message.c_str());
  });
}

py::dict AsyncLlmEngine::stats() const {
  return stats_dict(engine_->stats());
}

void AsyncLlmEngine::shutdown(double timeout_s) {
  if (shut_down_) return;
  shut_down_ = true;
  // The engine thread never takes the GIL, so waiting for it with the GIL released is only
  // courtesy to other Python threads; it cannot deadlock either way.
  py::gil_scoped_release nogil;
  engine_->shutdown(timeout_s);
}

}  // namespace vesper::python
