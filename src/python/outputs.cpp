#include "python/outputs.h"

#include <chrono>

namespace vesper::python {
namespace {

// Seconds to add to a steady-clock time (the engine's now_seconds) to make it wall-clock.
double wall_clock_offset() {
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double steady =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return wall - steady;
}

py::object wall_time(double steady, double offset) {
  if (steady == 0) return py::none();  // not reached (no token yet, not finished)
  return py::float_(steady + offset);
}

py::list id_list(const std::vector<int32_t>& ids) {
  py::list out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out[i] = py::int_(ids[i]);
  return out;
}

py::list logprob_list(const std::vector<sample::LogprobEntry>& entries,
                      const tokenizer::Tokenizer& tok) {
  auto piece = [&](int32_t id) { return utf8_str(tok.token_to_piece(id, false)); };
  py::list out(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const sample::LogprobEntry& e = entries[i];
    py::list top(e.top.size());
    for (size_t k = 0; k < e.top.size(); ++k)
      top[k] = py::make_tuple(e.top[k].token, e.top[k].logprob, piece(e.top[k].token));
    out[i] = py::make_tuple(e.token, e.logprob, piece(e.token), std::move(top));
  }
  return out;
}

py::object stop_reason(const engine::CompletionOutput& c) {
  if (c.stop_string) return utf8_str(*c.stop_string);
  if (c.stop_token) return py::int_(*c.stop_token);
  // As the HTTP API reports it: the output's constraint gave up, and why.
  if (c.constraint_error) return utf8_str(*c.constraint_error);
  return py::none();
}

}  // namespace

py::str utf8_str(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::dict request_output_dict(const engine::RequestOutput& out, const tokenizer::Tokenizer& tok) {
  const double offset = wall_clock_offset();
  py::dict d;
  d["request_id"] = out.request_id;
  d["finished"] = out.finished;
  d["prompt_token_ids"] = out.finished ? py::object(id_list(out.prompt_token_ids)) : py::none();
  d["num_cached_tokens"] = out.num_cached_tokens;
  py::dict m;
  m["arrival_time"] = wall_time(out.metrics.arrival_time, offset);
  m["first_scheduled_time"] = wall_time(out.metrics.first_scheduled_time, offset);
  m["first_token_time"] = wall_time(out.metrics.first_token_time, offset);
  m["last_token_time"] = wall_time(out.metrics.last_token_time, offset);
  m["finished_time"] = wall_time(out.metrics.finished_time, offset);
  m["num_preemptions"] = out.metrics.num_preemptions;
  d["metrics"] = std::move(m);
  py::list outputs(out.outputs.size());
  for (size_t i = 0; i < out.outputs.size(); ++i) {
    const engine::CompletionOutput& c = out.outputs[i];
    py::dict o;
    o["index"] = c.index;
    o["delta_text"] = utf8_str(c.delta_text);
    o["delta_token_ids"] = id_list(c.delta_token_ids);
    o["delta_logprobs"] = logprob_list(c.delta_logprobs, tok);
    o["finished"] = c.finished();
    if (c.finished()) {
      o["text"] = utf8_str(c.text);
      o["token_ids"] = id_list(c.token_ids);
      o["logprobs"] = logprob_list(c.logprobs, tok);
      o["finish_reason"] = utf8_str(*c.finish_reason);
      o["stop_reason"] = stop_reason(c);
    }
    outputs[i] = std::move(o);
  }
  d["outputs"] = std::move(outputs);
  return d;
}

}  // namespace vesper::python
