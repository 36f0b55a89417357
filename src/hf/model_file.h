// The one entry point for a model path given on the command line or to the engine: a GGUF file,
// or a Hugging Face checkpoint directory (hf/checkpoint.h), both as a GgufFile.
#pragma once

#include <string>

#include "core/result.h"
#include "gguf/gguf.h"

namespace vesper::hf {

// Opens `path`: a directory with config.json loads as a Hugging Face checkpoint, anything else as
// a GGUF file. Errors name the path and the fault.
Result<gguf::GgufFile> open_model_file(const std::string& path);

// The name a model path goes by (`serve`'s default --served-model-name): a GGUF file's name
// without its extension, a checkpoint directory's name ("Qwen2.5-0.5B" keeps its dot).
std::string model_name(const std::string& path);

}  // namespace vesper::hf
