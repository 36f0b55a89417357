#include "tokenizer/synthetic_vocab.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace vesper::tokenizer::tok_test {

using gguf::Value;
using gguf::ValueType;

Metadata spm_metadata() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};  // unknown, control, control
  static const char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    scores.push_back(0);
    types.push_back(6);  // byte
  }
  const std::pair<const char*, float> normal[] = {
      {"\xE2\x96\x81", -1},
      {"a", -2},
      {"b", -3},
      {"\xE2\x96\x81"
       "a",
       -5},
      {"ab", -4},
      {"\xE2\x96\x81"
       "ab",
       -6},
  };
  for (const auto& [text, score] : normal) {
    tokens.push_back(text);
    scores.push_back(score);
    types.push_back(1);
  }
  return {
      {"general.architecture", Value::string("llama")},
      {"tokenizer.ggml.model", Value::string("llama")},
      {"tokenizer.ggml.tokens", Value::string_array(tokens)},
      {"tokenizer.ggml.scores", Value::f32_array(scores)},
      {"tokenizer.ggml.token_type", Value::i32_array(types)},
      {"tokenizer.ggml.bos_token_id", Value::u32(1)},
      {"tokenizer.ggml.eos_token_id", Value::u32(2)},
      {"tokenizer.ggml.unknown_token_id", Value::u32(0)},
  };
}

Metadata bpe_metadata() {
  // GPT-2's byte alphabet: printable Latin-1 maps to itself, the rest to U+0100 upward.
  std::vector<std::string> tokens;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cpt = printable ? b : next++;
    std::string s;
    if (cpt < 0x80) {
      s.push_back(static_cast<char>(cpt));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
      s.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
    }
    tokens.push_back(s);
  }
  for (const char* t : {"\xC4\xA0"
                        "a",
                        "ab",
                        "\xC4\xA0"
                        "ab",
                        "<|endoftext|>"})
    tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  const int32_t eot = static_cast<int32_t>(tokens.size()) - 1;
  return {
      {"general.architecture", Value::string("gpt2")},
      {"tokenizer.ggml.model", Value::string("gpt2")},
      {"tokenizer.ggml.pre", Value::string("gpt-2")},
      {"tokenizer.ggml.tokens", Value::string_array(tokens)},
      {"tokenizer.ggml.token_type", Value::i32_array(types)},
      {"tokenizer.ggml.merges", Value::string_array({"\xC4\xA0 a", "a b",
                                                     "\xC4\xA0"
                                                     "a b"})},
      {"tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(eot))},
      {"tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(eot))},
  };
}

void set_key(Metadata* md, const std::string& key, gguf::Value value) {
  for (auto& [k, v] : *md) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  md->emplace_back(key, std::move(value));
}

void remove_key(Metadata* md, const std::string& key) {
  md->erase(std::remove_if(md->begin(), md->end(), [&](const auto& kv) { return kv.first == key; }),
            md->end());
}

std::string write_gguf(const std::string& name, const Metadata& md) {
  gguf::GgufWriter writer;
  for (const auto& [k, v] : md) writer.set(k, v);
  const std::string path = ::testing::TempDir() + "/vesper_tokenizer_" + name + ".gguf";
  const Status status = writer.write(path);
  EXPECT_TRUE(status.ok()) << status.error().message;
  return path;
}

}  // namespace vesper::tokenizer::tok_test
