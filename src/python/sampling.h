// A Python SamplingParams (vesper.SamplingParams: vLLM's field names and defaults) into the
// engine's sample::SamplingParams and the output constraint it asks for. Every field is read
// through PyFields (TypeError naming "SamplingParams.<field>" for a wrong type); ranges are
// checked by sample::SamplingParams::validate() (ValueError with its message, which names the
// field); structured outputs go through the server's parse_output_constraint, so a JSON schema,
// regex, choice list or GBNF grammar is accepted or refused exactly as the HTTP API does.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "sample/sampling_params.h"
#include "server/structured_output.h"

namespace vesper::python {

namespace py = pybind11;

struct ConvertedParams {
  sample::SamplingParams params;  // its grammar is not compiled yet (that needs the vocabulary)
  // max_tokens None: the rest of the context, which depends on the prompt.
  bool max_tokens_given = true;
  std::optional<server::OutputConstraint> constraint;
};

// Throws TypeError or ValueError naming the field. Call with the GIL held.
ConvertedParams convert_sampling_params(py::handle params);

}  // namespace vesper::python
