// RequestBuilder: what both Python front ends (LLM, AsyncLLM) do to a call's arguments before the
// engine sees them, with the GIL held: prompts (text, token ids, vLLM's TextPrompt and
// TokensPrompt dicts) into token ids, SamplingParams into the engine's (structured outputs
// compiled once per constraint through a GrammarCache, as the server does), and chat
// conversations rendered with the model's chat template (or one given) after the server's own
// validation of messages and tools. Errors are TypeError / ValueError naming the argument.
//
// Holds the engine's tokenizer by reference: it lives as long as the engine that owns it.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_request.h"
#include "grammar/grammar_cache.h"
#include "python/sampling.h"
#include "tokenizer/chat_template.h"

namespace vesper::python {

namespace py = pybind11;

class RequestBuilder {
 public:
  // Reads the model's chat template from the engine's model file (the template is parsed when
  // first used: a model whose template does not parse can still generate).
  explicit RequestBuilder(const engine::Engine& engine);

  struct Prompt {
    std::vector<int32_t> ids;
    std::optional<std::string> text;  // absent for token-id prompts
  };
  // `where` names the argument in errors ("prompts[2]").
  Prompt prompt(py::handle prompt, const std::string& where) const;

  // The engine request for `prompt` with `params` (converted by convert_sampling_params):
  // the constraint compiled, max_tokens None made the rest of the context, token ids checked
  // against the vocabulary.
  engine::EngineRequest request(std::string request_id, Prompt prompt,
                                const ConvertedParams& params, std::string lora_name,
                                int32_t priority, const std::string& where);

  // messages (one conversation: a list of {"role", "content", ...} dicts) rendered to the
  // prompt text, with `tools` (OpenAI's list of function tools, or None) offered to the template
  // and `chat_template` (None: the model's) and `chat_template_kwargs` (a dict or None).
  std::string render_chat(py::handle messages, py::handle tools, bool add_generation_prompt,
                          py::handle chat_template, py::handle chat_template_kwargs);
  // The rendered text's ids: the template writes BOS and other special tokens as text.
  Prompt chat_prompt(const std::string& rendered) const;

  int64_t max_model_len() const { return max_model_len_; }

 private:
  const tokenizer::ChatTemplate& chat_template(py::handle source);

  const tokenizer::Tokenizer& tokenizer_;
  int64_t max_model_len_;
  grammar::GrammarCache grammars_;
  std::string bos_text_, eos_text_;
  tokenizer::ModelChatTemplate model_template_;
  std::string model_template_error_;  // the model file's template could not be read
  // Parsed templates by source (the model's, and any a call passed), kept for later calls.
  std::map<std::string, std::unique_ptr<tokenizer::ChatTemplate>> templates_;
};

}  // namespace vesper::python
