// Fuzz target: the input is a GGUF file. GgufFile::open either rejects it with an error naming
// the file, or (gguf.h) "a GgufFile that opened is safe to use": every metadata value has the
// type it says, keys and tensor names are unique, every tensor's shape, type, size and
// alignment are consistent, and its data lies inside the file. All of that is checked here, and
// every byte of every tensor is read. A file that opened is then written back with GgufWriter
// and re-read, which must give the same metadata and tensors. When it has tokenizer metadata,
// the tokenizer is built from it (tokenizer.h: a bad vocabulary is an error naming the file),
// and a tokenizer that builds must encode and decode within its promises.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/check.h"
#include "fuzz_util.h"
#include "gguf/gguf.h"
#include "tensor/ggml_type.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace vesper::gguf {
namespace {

// Which alternative of Value::data each type must use (gguf.h).
bool holds_its_type(const Value& v) {
  switch (v.type) {
    case ValueType::kUint8:
    case ValueType::kUint16:
    case ValueType::kUint32:
    case ValueType::kUint64:
      return std::holds_alternative<uint64_t>(v.data);
    case ValueType::kInt8:
    case ValueType::kInt16:
    case ValueType::kInt32:
    case ValueType::kInt64:
      return std::holds_alternative<int64_t>(v.data);
    case ValueType::kFloat32:
    case ValueType::kFloat64:
      return std::holds_alternative<double>(v.data);
    case ValueType::kBool:
      return std::holds_alternative<bool>(v.data);
    case ValueType::kString:
      return std::holds_alternative<std::string>(v.data);
    case ValueType::kArray:
      return std::holds_alternative<Array>(v.data);
  }
  return false;
}

void check_value(const Value& v) {
  VESPER_CHECK(holds_its_type(v), "value of type %s holds another type",
               std::string(value_type_name(v.type)).c_str());
  // The accessors must agree with the type.
  VESPER_CHECK(v.is_integer() ==
               (v.as_int().has_value() || (v.type == ValueType::kUint64 &&
                                           std::get<uint64_t>(v.data) > uint64_t{INT64_MAX})));
  VESPER_CHECK((v.as_string() != nullptr) == (v.type == ValueType::kString));
  VESPER_CHECK((v.as_array() != nullptr) == (v.type == ValueType::kArray));
  VESPER_CHECK(v.as_bool().has_value() == (v.type == ValueType::kBool));
  if (v.is_integer() || v.is_float()) VESPER_CHECK(v.as_double().has_value());
  (void)v.to_string();
  if (const Array* a = v.as_array()) {
    for (const Value& item : a->items) {
      VESPER_CHECK(item.type == a->element_type, "array of %s holds a %s",
                   std::string(value_type_name(a->element_type)).c_str(),
                   std::string(value_type_name(item.type)).c_str());
      check_value(item);
    }
  }
}

bool same_value(const Value& a, const Value& b) {
  if (a.type != b.type || a.data.index() != b.data.index()) return false;
  if (const auto* x = std::get_if<double>(&a.data)) {
    const double y = std::get<double>(b.data);
    return (std::isnan(*x) && std::isnan(y)) || std::memcmp(x, &y, sizeof y) == 0;
  }
  if (const Array* x = a.as_array()) {
    const Array& y = *b.as_array();
    if (x->element_type != y.element_type || x->items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x->items.size(); ++i)
      if (!same_value(x->items[i], y.items[i])) return false;
    return true;
  }
  if (const auto* x = std::get_if<uint64_t>(&a.data)) return *x == std::get<uint64_t>(b.data);
  if (const auto* x = std::get_if<int64_t>(&a.data)) return *x == std::get<int64_t>(b.data);
  if (const auto* x = std::get_if<bool>(&a.data)) return *x == std::get<bool>(b.data);
  return *a.as_string() == *b.as_string();
}

// Everything gguf.h promises about a file that opened.
void check_file(const GgufFile& file) {
  VESPER_CHECK(file.version() == 2 || file.version() == 3, "version %u", file.version());
  const size_t alignment = file.alignment();
  VESPER_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0, "alignment %zu", alignment);
  VESPER_CHECK(file.data_offset() % alignment == 0);

  std::unordered_set<std::string> keys;
  for (const auto& [key, value] : file.metadata()) {
    VESPER_CHECK(keys.insert(key).second, "duplicate key %s", key.c_str());
    VESPER_CHECK(file.find(key) == &value);
    check_value(value);
    // The typed getters answer (value or error) for whatever the type is.
    (void)file.get_int(key);
    (void)file.get_float(key);
    (void)file.get_bool(key);
    (void)file.get_string(key);
    (void)file.get_array(key, ValueType::kString);
  }

  const uint8_t* begin = file.mapping().data();
  const uint8_t* end = begin + file.file_size();
  std::unordered_set<std::string> names;
  uint64_t checksum = 0;
  for (const TensorInfo& t : file.tensors()) {
    VESPER_CHECK(names.insert(t.name).second, "duplicate tensor %s", t.name.c_str());
    VESPER_CHECK(file.find_tensor(t.name) == &t);
    VESPER_CHECK(!t.shape.empty() && t.shape.size() <= 4, "%zu dims", t.shape.size());
    const auto traits = tensor::type_traits(static_cast<uint32_t>(t.type));
    VESPER_CHECK(traits.has_value(), "unknown type %u", static_cast<uint32_t>(t.type));
    // The element count and byte size, computed without overflow.
    unsigned __int128 elements = 1;
    for (int64_t d : t.shape) {
      VESPER_CHECK(d > 0, "dimension %lld", static_cast<long long>(d));
      elements *= static_cast<uint64_t>(d);
      VESPER_CHECK(elements <= static_cast<unsigned __int128>(INT64_MAX),
                   "element count overflows");
    }
    VESPER_CHECK(t.shape[0] % traits->block_size == 0);
    VESPER_CHECK(static_cast<int64_t>(elements) == t.num_elements());
    const unsigned __int128 bytes = elements / static_cast<uint64_t>(traits->block_size) *
                                    static_cast<uint64_t>(traits->type_size);
    VESPER_CHECK(bytes == t.size_bytes, "tensor %s: %zu bytes for %lld elements of %s",
                 t.name.c_str(), t.size_bytes, static_cast<long long>(t.num_elements()),
                 std::string(traits->name).c_str());
    VESPER_CHECK(t.size_bytes ==
                 tensor::row_size(t.type, t.shape[0]) * static_cast<size_t>(t.rows()));
    VESPER_CHECK(t.offset % alignment == 0);
    VESPER_CHECK(t.data == begin + file.data_offset() + t.offset);
    VESPER_CHECK(
        t.data >= begin && t.data <= end && t.size_bytes <= static_cast<size_t>(end - t.data),
        "tensor %s: data outside the file", t.name.c_str());
    for (size_t i = 0; i < t.size_bytes; ++i) checksum += t.data[i];
  }
  volatile uint64_t sink = checksum;
  (void)sink;
}

// What GgufWriter makes of the file must read back as the same file.
void check_round_trip(const GgufFile& file) {
  // The writer pads to the alignment even when there is no tensor data, so a huge alignment
  // would only measure memory.
  if (file.alignment() > (size_t{1} << 20)) return;
  GgufWriter writer;
  writer.copy_metadata(file);
  for (const TensorInfo& t : file.tensors()) {
    Status added = writer.add_tensor(t.name, t.shape, t.type, {t.data, t.size_bytes});
    VESPER_CHECK(added.ok(), "writer rejects tensor %s: %s", t.name.c_str(),
                 added.error().message.c_str());
  }
  const std::vector<uint8_t> bytes = writer.serialize();
  static fuzz::MemFile copy("fuzz_gguf_copy");
  copy.write(bytes.data(), bytes.size());
  auto reread = GgufFile::open(copy.path());
  VESPER_CHECK(reread.ok(), "the writer's output does not open: %s",
               reread.error().message.c_str());
  VESPER_CHECK(reread->metadata().size() == file.metadata().size());
  for (size_t i = 0; i < file.metadata().size(); ++i) {
    VESPER_CHECK(reread->metadata()[i].first == file.metadata()[i].first);
    VESPER_CHECK(same_value(reread->metadata()[i].second, file.metadata()[i].second),
                 "key %s changed: %s -> %s", file.metadata()[i].first.c_str(),
                 file.metadata()[i].second.to_string().c_str(),
                 reread->metadata()[i].second.to_string().c_str());
  }
  VESPER_CHECK(reread->tensors().size() == file.tensors().size());
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const TensorInfo& a = file.tensors()[i];
    const TensorInfo& b = reread->tensors()[i];
    VESPER_CHECK(a.name == b.name && a.shape == b.shape && a.type == b.type &&
                 a.size_bytes == b.size_bytes);
    VESPER_CHECK(a.size_bytes == 0 || std::memcmp(a.data, b.data, a.size_bytes) == 0);
  }
}

// A vocabulary from fuzzed metadata: it builds or says why; if it builds, it works.
void check_tokenizer(const GgufFile& file) {
  using namespace tokenizer;
  auto built = Tokenizer::from_gguf(file);
  if (!built.ok()) {
    VESPER_CHECK(built.error().message.find(file.path()) != std::string::npos,
                 "tokenizer error does not name the file: %s", built.error().message.c_str());
    return;
  }
  const Tokenizer& tok = *built;
  VESPER_CHECK(tok.n_vocab() > 0);
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    (void)tok.token_to_piece(id, true);
    (void)tok.token_attr(id);
    VESPER_CHECK(tok.find_token(tok.token_text(id)) == id, "token texts are not unique");
  }
  for (const char* text : {"", " ", "Hello world", " a b ab abab", "<s></s>[CLS]<|endoftext|>",
                           "caf\xC3\xA9 \xF0\x9F\xA6\x99\n\t", "\xFF\xC3"}) {
    for (int flags = 0; flags < 4; ++flags) {
      const std::vector<int32_t> ids = tok.encode(text, flags & 1, flags & 2);
      for (int32_t id : ids) VESPER_CHECK(tok.is_valid(id), "encode gave id %d", id);
      for (bool skip : {false, true}) {
        const std::string decoded = tok.decode(ids, skip);
        VESPER_CHECK(is_valid_utf8(decoded), "decoded text is not valid UTF-8");
        IncrementalDetokenizer detok(tok, {.skip_special = skip});
        std::string streamed;
        for (int32_t id : ids) streamed += detok.feed(id);
        streamed += detok.flush();
        VESPER_CHECK(streamed == decoded, "streamed text differs from decode()");
      }
    }
  }
}

}  // namespace
}  // namespace vesper::gguf

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vesper;
  static fuzz::MemFile input("fuzz_gguf");
  input.write(data, size);
  auto file = gguf::GgufFile::open(input.path());
  if (!file.ok()) {
    VESPER_CHECK(file.error().message.rfind(input.path(), 0) == 0,
                 "error does not name the file: %s", file.error().message.c_str());
    return 0;
  }
  gguf::check_file(*file);
  gguf::check_round_trip(*file);
  if (file->find("tokenizer.ggml.model") != nullptr) gguf::check_tokenizer(*file);
  return 0;
}
