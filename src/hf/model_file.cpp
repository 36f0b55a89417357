#include "hf/model_file.h"

#include <filesystem>

#include "hf/checkpoint.h"

namespace vesper::hf {

Result<gguf::GgufFile> open_model_file(const std::string& path) {
  if (is_checkpoint_dir(path)) return load_checkpoint(path);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return make_error(
        path +
        ": a directory without config.json: neither a GGUF file nor a Hugging Face checkpoint");
  return gguf::GgufFile::open(path);
}

std::string model_name(const std::string& path) {
  std::filesystem::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // "dir/"
  std::error_code ec;
  return std::filesystem::is_directory(p, ec) ? p.filename().string() : p.stem().string();
}

}  // namespace vesper::hf
