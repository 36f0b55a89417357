// A Jinja2-compatible template engine for LLM chat templates (the templates of HF
// tokenizer_config.json and GGUF tokenizer.chat_template), rendering the way HF transformers'
// apply_chat_template does: trim_blocks and lstrip_blocks on, loop controls enabled,
// raise_exception() and strftime_now() available, tojson as json.dumps(ensure_ascii=False).
//
// A Template is parsed once and immutable; copies share the parsed tree; render() is const
// and safe to call from many threads at once. Nothing throws across this interface: syntax
// errors (with line and column), runtime errors (with line) and raise_exception() calls come
// back as Result errors. Rendering is bounded (output size, steps, call depth; RenderLimits)
// so no template can loop forever or exhaust memory.
//
// What is supported and what is not: src/tokenizer/jinja/README.md.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"
#include "tokenizer/jinja/value.h"

namespace vesper::tokenizer::jinja {

struct Program;

struct TemplateOptions {
  bool trim_blocks = true;    // HF's setting
  bool lstrip_blocks = true;  // HF's setting
  bool keep_trailing_newline = false;
};

struct RenderLimits {
  size_t max_output_bytes = size_t{32} << 20;  // also bounds every intermediate string
  size_t max_collection_items = size_t{1} << 20;  // bounds every list (range(), appends, ...)
  uint64_t max_steps = 50'000'000;             // statements executed plus loop iterations
  int max_call_depth = 200;                    // nested macro calls
};

struct RenderOptions {
  // What strftime_now() formats; the current local time when unset.
  std::optional<std::tm> now;
  RenderLimits limits;
};

// Why a render failed, for callers that treat a template's own raise_exception() (a rejected
// conversation) differently from a broken template.
enum class RenderErrorKind { kRuntime, kRaised };

class Template {
 public:
  // Errors read "line L, column C: <what>".
  static Result<Template> parse(std::string_view source, const TemplateOptions& options = {});

  // `variables` must be a dict (Value::dict()); its entries become the template's variables.
  // Errors read "line L: <what>"; raise_exception(msg) gives "line L: <msg>" and sets
  // *error_kind to kRaised when error_kind is non-null.
  Result<std::string> render(const Value& variables, const RenderOptions& options = {},
                             RenderErrorKind* error_kind = nullptr) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace vesper::tokenizer::jinja
