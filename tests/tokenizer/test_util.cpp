#include "tokenizer/test_util.h"

#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "core/check.h"

namespace vesper::tokenizer::tok_test {

Result<Tokenizer> load_tokenizer(const std::string& path) {
  VESPER_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(path));
  return Tokenizer::from_gguf(file);
}

const Tokenizer& vocab(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const std::string path = name == "stories260K" ? std::string(kModelsDir) + "/stories260K.gguf"
                             : name.find('/') == std::string::npos
                                 ? std::string(kVectorsDir) + "/ggml-vocab-" + name + ".gguf"
                                 : name;
    Result<Tokenizer> tok = load_tokenizer(path);
    VESPER_CHECK(tok.ok(), "%s", tok.ok() ? "" : tok.error().message.c_str());
    it = cache.emplace(name, std::make_unique<Tokenizer>(std::move(tok).value())).first;
  }
  return *it->second;
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (u >= 0x20 && u < 0x7F) {
      out.push_back(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> read_cases(const std::string& path) {
  const std::string text = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> cases;
  for (size_t pos = 0, hit; (hit = text.find(sep, pos)) != std::string::npos;
       pos = hit + sep.size())
    cases.push_back(text.substr(pos, hit - pos));
  return cases;
}

std::vector<std::vector<int32_t>> read_expected(const std::string& path) {
  std::vector<std::vector<int32_t>> lines;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    std::vector<int32_t> ids;
    std::istringstream words(line);
    long long id = 0;
    while (words >> id) ids.push_back(static_cast<int32_t>(id));
    lines.push_back(std::move(ids));
  }
  return lines;
}

}  // namespace vesper::tokenizer::tok_test
