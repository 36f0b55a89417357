#include "python/llm_engine.h"

#include <pybind11/stl.h>

#include <chrono>
#include <unordered_map>

#include "cli/progress_bar.h"
#include "lora/adapter_access.h"
#include "python/engine_args.h"
#include "python/outputs.h"
#include "python/py_fields.h"

namespace vesper::python {
namespace {

// How often a generate() loop takes the GIL to look for signals (Ctrl-C): often enough that an
// interrupt feels immediate, rarely enough that a loop of sub-millisecond steps does not spend
// its time on the GIL.
constexpr auto kSignalCheckInterval = std::chrono::milliseconds(50);

}  // namespace

std::optional<std::pair<std::string, std::string>> lora_pair(py::handle lora,
                                                             const std::string& where) {
  if (lora.is_none()) return std::nullopt;
  if (!py::isinstance<py::tuple>(lora) || py::len(lora) != 2)
    throw py::type_error(where + " must be a LoRARequest or None, got " + type_name(lora));
  const py::tuple t = py::reinterpret_borrow<py::tuple>(lora);
  std::pair<std::string, std::string> out{to_str(t[0], where + ".lora_name"),
                                          to_str(t[1], where + ".lora_path")};
  if (auto st = lora::check_adapter_name(out.first); !st)
    throw py::value_error(where + ".lora_name: " + st.error().message);
  if (out.second.empty()) throw py::value_error(where + ".lora_path must not be empty");
  return out;
}

LlmEngine::LlmEngine(const std::string& model, const py::dict& engine_args)
    : engine_(create_engine(model, engine_args)),
      builder_(std::make_unique<RequestBuilder>(*engine_)) {}

std::string LlmEngine::register_adapters(
    const std::vector<std::pair<std::string, std::string>>& loras) {
  lora::AdapterRegistry* registry = engine_->adapters();
  for (const auto& [name, path] : loras) {
    if (registry == nullptr || !registry->config().enable_lora)
      return "lora_request '" + name + "' needs the engine argument enable_lora=True";
    if (registry->contains(name)) {
      for (const lora::AdapterRegistry::Info& info : registry->list())
        if (info.name == name && info.path != path)
          return "lora_request '" + name + "': the name is registered for " + info.path + ", not " +
                 path;
      continue;
    }
    if (auto st = registry->add(name, path); !st)
      return "lora_request '" + name + "': " + st.error().message;
  }
  return {};
}

py::list LlmEngine::generate(const py::list& prompts, const py::list& params, const py::list& loras,
                             const py::list& priorities, bool use_tqdm) {
  const size_t n = prompts.size();
  if (params.size() != n || loras.size() != n || priorities.size() != n)
    throw py::value_error(
        "generate: sampling_params, lora_request and priority must match the prompts in number");
  // Everything that can be wrong with the arguments is found here, before anything is queued.
  std::vector<engine::EngineRequest> requests;
  requests.reserve(n);
  std::vector<std::pair<std::string, std::string>> adapters;
  std::unordered_map<PyObject*, ConvertedParams> converted;  // one conversion per object
  const uint64_t first_id = next_request_;
  next_request_ += n;
  for (size_t i = 0; i < n; ++i) {
    const std::string where = "prompts[" + std::to_string(i) + "]";
    RequestBuilder::Prompt prompt = builder_->prompt(prompts[i], where);
    auto it = converted.find(params[i].ptr());
    if (it == converted.end())
      it = converted.emplace(params[i].ptr(), convert_sampling_params(params[i])).first;
    std::string lora_name;
    if (auto pair = lora_pair(loras[i], "lora_request")) {
      lora_name = pair->first;
      adapters.push_back(std::move(*pair));
    }
    const int64_t priority = to_int(priorities[i], "priority[" + std::to_string(i) + "]");
    requests.push_back(builder_->request(std::to_string(first_id + i), std::move(prompt),
                                         it->second, std::move(lora_name),
                                         static_cast<int32_t>(priority), where));
  }

  std::vector<std::optional<engine::RequestOutput>> done(n);
  std::string error;
  bool interrupted = false;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mutex_);
    engine::Engine& e = *engine_;
    error = register_adapters(adapters);
    size_t added = 0;
    if (error.empty())
      for (; added < n; ++added)
        if (auto st = e.add_request(requests[added]); !st) {
          error = "prompts[" + std::to_string(added) + "]: " + st.error().message;
          break;
        }
    if (!error.empty()) {
      for (size_t i = 0; i < added; ++i) e.abort(requests[i].request_id);
    } else {
      cli::ProgressBar progress("Processed prompts", static_cast<int64_t>(n));
      size_t finished = 0;
      int64_t tokens = 0;
      auto last_check = std::chrono::steady_clock::now();
      while (finished < n) {
        if (!e.has_unfinished()) {
          error = "generate: the engine stopped with requests unfinished";  // a bug, not a crash
          break;
        }
        for (engine::RequestOutput& out : e.step()) {
          char* end = nullptr;
          const unsigned long long id = std::strtoull(out.request_id.c_str(), &end, 10);
          if (id < first_id || id >= first_id + n) continue;  // an interrupted call's leftovers
          for (const auto& c : out.outputs)
            tokens += static_cast<int64_t>(c.delta_token_ids.size());
          if (out.finished) {
            done[id - first_id] = std::move(out);
            ++finished;
          }
        }
        if (use_tqdm) progress.update(static_cast<int64_t>(finished), tokens);
        const auto now = std::chrono::steady_clock::now();
        if (now - last_check >= kSignalCheckInterval) {
          last_check = now;
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) {
            interrupted = true;  // the exception stays set for error_already_set below
            break;
          }
        }
      }
      if (interrupted || !error.empty())
        for (size_t i = 0; i < n; ++i)
          if (!done[i]) e.abort(requests[i].request_id);
    }
  }
  if (interrupted) throw py::error_already_set();
  if (!error.empty()) throw py::value_error(error);
  py::list out(n);
  for (size_t i = 0; i < n; ++i) out[i] = request_output_dict(*done[i], engine_->tokenizer());
  return out;
}

py::dict LlmEngine::stats() const {
  engine::EngineStats s;
  {
    py::gil_scoped_release nogil;  // a generate() on another thread holds the lock for its run
    std::lock_guard<std::mutex> lock(mutex_);
    s = engine_->stats();
  }
  return stats_dict(s);
}

py::dict stats_dict(const engine::EngineStats& s) {
  py::dict d;
  d["num_running"] = s.num_running;
  d["num_waiting"] = s.num_waiting;
  d["num_swapped"] = s.num_swapped;
  d["num_requests"] = s.num_requests;
  d["kv_blocks_total"] = s.kv_blocks_total;
  d["kv_blocks_used"] = s.kv_blocks_used;
  d["kv_blocks_cached"] = s.kv_blocks_cached;
  d["kv_blocks_evictable"] = s.kv_blocks_evictable;
  d["num_preemptions"] = s.num_preemptions;
  d["prompt_tokens"] = s.prompt_tokens;
  d["generation_tokens"] = s.generation_tokens;
  d["num_steps"] = s.num_steps;
  d["prefix_cache_queries"] = s.prefix_cache_queries;
  d["prefix_cache_hits"] = s.prefix_cache_hits;
  d["spec_num_drafts"] = s.spec_num_drafts;
  d["spec_num_draft_tokens"] = s.spec_num_draft_tokens;
  d["spec_num_accepted_tokens"] = s.spec_num_accepted_tokens;
  d["adapter_loads"] = s.adapter_loads;
  d["running_adapters"] = s.running_adapters;
  return d;
}

}  // namespace vesper::python
