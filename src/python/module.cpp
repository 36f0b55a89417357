// _vesper: the CPython extension behind the `vesper` package (python/vesper/). It exposes two
// engine front ends and the argument checks; the vLLM-shaped classes (LLM, AsyncLLM,
// SamplingParams, RequestOutput, ...) are pure Python around them. See src/python/README.md.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/async_llm_engine.h"
#include "python/engine_args.h"
#include "python/llm_engine.h"
#include "python/outputs.h"
#include "python/sampling.h"

namespace py = pybind11;
using vesper::python::AsyncLlmEngine;
using vesper::python::LlmEngine;

namespace {

// render_chat(messages, tools, add_generation_prompt, chat_template, chat_template_kwargs), the
// same on both engines: their RequestBuilder renders the conversation.
template <class Engine>
void def_render_chat(py::class_<Engine>& cls) {
  cls.def(
      "render_chat",
      [](Engine& e, py::handle messages, py::handle tools, bool add_generation_prompt,
         py::handle chat_template, py::handle kwargs) {
        return e.builder().render_chat(messages, tools, add_generation_prompt, chat_template,
                                       kwargs);
      },
      py::arg("messages"), py::arg("tools"), py::arg("add_generation_prompt"),
      py::arg("chat_template"), py::arg("chat_template_kwargs"));
}

}  // namespace

PYBIND11_MODULE(_vesper, m) {
  m.doc() = "Vesper's engine for Python (use the vesper package, not this module)";

  m.def("engine_arg_names", &vesper::python::engine_arg_names,
        "The engine arguments LLM() and AsyncLLM() take (the engine flags' names)");
  m.def(
      "check_sampling_params",
      [](py::handle params) { (void)vesper::python::convert_sampling_params(params); },
      "Raises TypeError or ValueError, naming the field, when the SamplingParams are invalid");

  py::class_<LlmEngine> llm(m, "LlmEngine");
  def_render_chat(llm);
  llm.def(py::init<const std::string&, const py::dict&>(), py::arg("model"), py::arg("engine_args"))
      .def("generate", &LlmEngine::generate, py::arg("prompts"), py::arg("params"),
           py::arg("loras"), py::arg("priorities"), py::arg("use_tqdm"))
      .def(
          "chat_prompt_ids",
          [](LlmEngine& e, const std::string& rendered) {
            return e.builder().chat_prompt(rendered).ids;
          },
          py::arg("rendered"))
      .def(
          "encode",
          [](const LlmEngine& e, const std::string& text, bool add_special) {
            return e.engine().tokenizer().encode(text, add_special, /*parse_special=*/false);
          },
          py::arg("text"), py::arg("add_special_tokens") = true)
      .def(
          "decode",
          [](const LlmEngine& e, const std::vector<int32_t>& ids, bool skip_special) -> py::str {
            for (int32_t id : ids)
              if (!e.engine().tokenizer().is_valid(id))
                throw py::value_error("token id " + std::to_string(id) +
                                      " is outside the vocabulary");
            return vesper::python::utf8_str(e.engine().tokenizer().decode(ids, skip_special));
          },
          py::arg("ids"), py::arg("skip_special_tokens") = true)
      .def_property_readonly(
          "max_model_len",
          [](const LlmEngine& e) { return e.engine().scheduler_config().max_model_len; })
      .def_property_readonly("vocab_size",
                             [](const LlmEngine& e) { return e.engine().tokenizer().n_vocab(); })
      .def("stats", &LlmEngine::stats);

  py::class_<AsyncLlmEngine> async_llm(m, "AsyncLlmEngine");
  def_render_chat(async_llm);
  async_llm
      .def(py::init<const std::string&, const py::dict&>(), py::arg("model"),
           py::arg("engine_args"))
      .def_property_readonly("fd", &AsyncLlmEngine::fd)
      .def("add_request", &AsyncLlmEngine::add_request, py::arg("request_id"), py::arg("prompt"),
           py::arg("params"), py::arg("lora"), py::arg("priority"))
      .def("add_chat_request", &AsyncLlmEngine::add_chat_request, py::arg("request_id"),
           py::arg("rendered"), py::arg("params"), py::arg("lora"), py::arg("priority"))
      .def("abort", &AsyncLlmEngine::abort, py::arg("request_id"))
      .def("drain", &AsyncLlmEngine::drain)
      .def("add_lora", &AsyncLlmEngine::add_lora, py::arg("name"), py::arg("path"))
      .def("stats", &AsyncLlmEngine::stats)
      .def("shutdown", &AsyncLlmEngine::shutdown, py::arg("timeout_s") = 0.0);
}
