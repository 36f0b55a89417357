// Engine arguments with vLLM's names (`LLM(model, max_model_len=256, enable_prefix_caching=False)`)
// into an EngineConfig, through the command line's own flag definitions: each keyword becomes the
// flag of the same name (max_model_len -> --max-model-len) and is parsed by cli::add_engine_flags
// and checked by cli::to_engine_config. So Python takes exactly what `vesper generate` and
// `vesper serve` take, with the same defaults, ranges and messages, and an engine flag added
// later is an engine argument at once. Messages name the keyword, not the flag.
//
// Values: a bool for a flag (False turns off a flag that is on by default); an int, a float or a
// str for a value, as the flag's type asks; a dict or a list for a JSON-valued flag
// (speculative_config, a lora_modules item); a list for a repeatable flag (lora_modules, lora,
// and lora_scaled as (path, scale) pairs); None: the default.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_config.h"

namespace vesper::python {

namespace py = pybind11;

// Throws TypeError for an unknown keyword or a value of the wrong type, ValueError for a value
// the flag refuses (both naming the keyword). Call with the GIL held.
engine::EngineConfig engine_config_from_kwargs(const std::string& model, const py::dict& kwargs);

// The engine for `model` and `kwargs` (loaded with the GIL released: it maps the model and plans
// memory, which can take seconds). Errors as engine_config_from_kwargs, and ValueError naming
// the file or flag when the engine cannot be made.
std::unique_ptr<engine::Engine> create_engine(const std::string& model, const py::dict& kwargs);

// Every keyword accepted, sorted (for help and for the error on an unknown one).
std::vector<std::string> engine_arg_names();

}  // namespace vesper::python
