// The engine's RequestOutput as the plain dict vesper/outputs.py builds vLLM's RequestOutput
// from: {"request_id", "finished", "prompt_token_ids" (final output only, else None),
// "num_cached_tokens", "metrics": {...}, "outputs": [{"index", "text", "token_ids", "logprobs",
// "finish_reason", "stop_reason", "delta_text", "delta_token_ids", "delta_logprobs"}]}.
// Logprobs are lists of (token id, logprob, decoded token, [(top id, logprob, decoded), ...]).
// Times are wall-clock seconds (time.time()), as vLLM's metrics are; the engine's are steady.
//
// Text is decoded as UTF-8 with replacement, so no byte sequence the model emits can make the
// conversion fail. Call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include "engine/request_output.h"
#include "tokenizer/tokenizer.h"

namespace vesper::python {

namespace py = pybind11;

py::str utf8_str(const std::string& s);

py::dict request_output_dict(const engine::RequestOutput& out, const tokenizer::Tokenizer& tok);

}  // namespace vesper::python
