// GGUF parsing and validation. Every read is bounds-checked against the mapping, so a
// truncated or corrupted file produces an error naming the file and the fault.
#include <cstring>
#include <limits>
#include <unordered_set>

#include "gguf/gguf.h"

namespace vesper::gguf {
namespace {

// Upper bounds that reject absurd counts before any allocation is attempted.
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxDims = 4;
// The smallest tensor info: name length, dimension count, one dimension, type, offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// The fewest bytes one value of `type` takes in a file (a string: its length; an array: its
// element type and length). Counts are checked against these before anything is reserved, so
// a corrupt count cannot make the reader allocate more than a genuine file of that size would.
uint64_t min_value_bytes(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
    case ValueType::kString:
      return 8;
    case ValueType::kArray:
      return 4 + 8;
  }
  return 1;
}

}  // namespace

// Cursor over the mapped bytes; reads fail (return false) rather than overrun.
class Parser {
 public:
  Parser(const std::string& path, std::span<const uint8_t> bytes) : path_(path), bytes_(bytes) {}

  Status parse(GgufFile& out);

 private:
  template <class T>
  bool read(T& v) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  Error fail(const std::string& what) const { return make_error(path_ + ": " + what); }
  Error truncated(const std::string& what) const {
    return fail("truncated file: ends inside " + what + " (at byte " + std::to_string(pos_) +
                " of " + std::to_string(bytes_.size()) + ")");
  }
  Result<std::string> read_string(const std::string& what);
  Result<Value> read_value(ValueType type, const std::string& key, int depth);

  const std::string& path_;
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

Result<std::string> Parser::read_string(const std::string& what) {
  uint64_t len = 0;
  if (!read(len)) return truncated(what + " length");
  if (len > kMaxStringBytes)
    return fail(what + ": string length " + std::to_string(len) + " is too large");
  if (bytes_.size() - pos_ < len) return truncated(what);
  std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
  pos_ += len;
  return s;
}

Result<Value> Parser::read_value(ValueType type, const std::string& key, int depth) {
  const std::string what = "metadata value of key \"" + key + "\"";
  switch (type) {
    case ValueType::kUint8: {
      uint8_t v;
      if (!read(v)) return truncated(what);
      return Value::u8(v);
    }
    case ValueType::kInt8: {
      int8_t v;
      if (!read(v)) return truncated(what);
      return Value::i8(v);
    }
    case ValueType::kUint16: {
      uint16_t v;
      if (!read(v)) return truncated(what);
      return Value::u16(v);
    }
    case ValueType::kInt16: {
      int16_t v;
      if (!read(v)) return truncated(what);
      return Value::i16(v);
    }
    case ValueType::kUint32: {
      uint32_t v;
      if (!read(v)) return truncated(what);
      return Value::u32(v);
    }
    case ValueType::kInt32: {
      int32_t v;
      if (!read(v)) return truncated(what);
      return Value::i32(v);
    }
    case ValueType::kUint64: {
      uint64_t v;
      if (!read(v)) return truncated(what);
      return Value::u64(v);
    }
    case ValueType::kInt64: {
      int64_t v;
      if (!read(v)) return truncated(what);
      return Value::i64(v);
    }
    case ValueType::kFloat32: {
      float v;
      if (!read(v)) return truncated(what);
      return Value::f32(v);
    }
    case ValueType::kFloat64: {
      double v;
      if (!read(v)) return truncated(what);
      return Value::f64(v);
    }
    case ValueType::kBool: {
      uint8_t v;
      if (!read(v)) return truncated(what);
      if (v > 1) return fail(what + ": bool value " + std::to_string(v) + " is not 0 or 1");
      return Value::boolean(v != 0);
    }
    case ValueType::kString: {
      VESPER_ASSIGN_OR_RETURN(std::string s, read_string(what));
      return Value::string(std::move(s));
    }
    case ValueType::kArray: {
      if (depth >= kMaxArrayDepth) return fail(what + ": arrays nested too deeply");
      uint32_t raw_elem = 0;
      uint64_t count = 0;
      if (!read(raw_elem)) return truncated(what + " (array element type)");
      if (raw_elem > static_cast<uint32_t>(ValueType::kFloat64))
        return fail(what + ": unknown array element type " + std::to_string(raw_elem));
      if (!read(count)) return truncated(what + " (array length)");
      auto elem = static_cast<ValueType>(raw_elem);
      if (count > (bytes_.size() - pos_) / min_value_bytes(elem))
        return fail(what + ": array length " + std::to_string(count) + " exceeds what the " +
                    std::to_string(bytes_.size() - pos_) +
                    " bytes left in the file can hold (truncated or corrupt)");
      std::vector<Value> items;
      items.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        VESPER_ASSIGN_OR_RETURN(Value v, read_value(elem, key, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::array(elem, std::move(items));
    }
  }
  return fail(what + ": unknown value type " + std::to_string(static_cast<uint32_t>(type)));
}

Status Parser::parse(GgufFile& out) {
  uint32_t magic = 0;
  if (!read(magic)) return truncated("the header (magic)");
  if (magic != kMagic) {
    char shown[5] = {};
    std::memcpy(shown, &magic, 4);
    for (char& c : shown)
      if (c != 0 && (c < 32 || c > 126)) c = '?';
    return fail("not a GGUF file: wrong magic \"" + std::string(shown) + "\" (expected \"GGUF\")");
  }
  if (!read(out.version_)) return truncated("the header (version)");
  if (out.version_ == 1)
    return fail(
        "GGUF version 1 is not supported (it is obsolete; re-convert the model); supported: 2, 3");
  if (out.version_ != 2 && out.version_ != 3)
    return fail("unsupported GGUF version " + std::to_string(out.version_) + "; supported: 2, 3");
  uint64_t n_tensors = 0, n_kv = 0;
  if (!read(n_tensors)) return truncated("the header (tensor count)");
  if (!read(n_kv)) return truncated("the header (metadata count)");
  if (n_tensors > bytes_.size() || n_kv > bytes_.size())
    return fail("tensor count " + std::to_string(n_tensors) + " / metadata count " +
                std::to_string(n_kv) + " exceed the file size (truncated or corrupt)");

  std::unordered_set<std::string> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    VESPER_ASSIGN_OR_RETURN(std::string key, read_string("metadata key #" + std::to_string(i)));
    if (!keys.insert(key).second) return fail("duplicate metadata key \"" + key + "\"");
    uint32_t raw_type = 0;
    if (!read(raw_type)) return truncated("type of metadata key \"" + key + "\"");
    if (raw_type > static_cast<uint32_t>(ValueType::kFloat64))
      return fail("metadata key \"" + key + "\": unknown value type " + std::to_string(raw_type));
    VESPER_ASSIGN_OR_RETURN(Value value, read_value(static_cast<ValueType>(raw_type), key, 0));
    out.metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const Value* a = out.find("general.alignment")) {
    auto v = a->as_int();
    if (a->type != ValueType::kUint32 || !v || *v == 0 || (*v & (*v - 1)) != 0)
      return fail("general.alignment must be a power-of-two uint32, got " + a->to_string());
    out.alignment_ = static_cast<size_t>(*v);
  }

  if (n_tensors > (bytes_.size() - pos_) / kMinTensorInfoBytes)
    return fail("tensor count " + std::to_string(n_tensors) + " exceeds what the " +
                std::to_string(bytes_.size() - pos_) +
                " bytes left for tensor infos can hold (truncated or corrupt)");
  std::unordered_set<std::string> names;
  out.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    VESPER_ASSIGN_OR_RETURN(t.name, read_string("tensor info #" + std::to_string(i) + " name"));
    const std::string what = "tensor " + t.name;
    if (!names.insert(t.name).second) return fail("duplicate tensor name \"" + t.name + "\"");
    uint32_t n_dims = 0;
    if (!read(n_dims)) return truncated(what + " dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      return fail(what + ": " + std::to_string(n_dims) + " dimensions (supported: 1 to 4)");
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      int64_t ne = 0;
      if (!read(ne)) return truncated(what + " shape");
      if (ne <= 0)
        return fail(what + ": dimension " + std::to_string(d) + " is " + std::to_string(ne));
      if (elements > std::numeric_limits<int64_t>::max() / ne)
        return fail(what + ": shape overflows");
      elements *= ne;
      t.shape.push_back(ne);
    }
    uint32_t raw_type = 0;
    if (!read(raw_type)) return truncated(what + " type");
    auto traits = tensor::type_traits(raw_type);
    if (!traits) return fail(what + ": unknown tensor type " + std::to_string(raw_type));
    t.type = static_cast<tensor::GgmlType>(raw_type);
    if (t.shape[0] % traits->block_size != 0)
      return fail(what + ": row length " + std::to_string(t.shape[0]) + " is not a multiple of " +
                  std::string(traits->name) + "'s block size " +
                  std::to_string(traits->block_size));
    if (!read(t.offset)) return truncated(what + " data offset");
    if (t.offset % out.alignment_ != 0)
      return fail(what + ": data offset " + std::to_string(t.offset) + " is not aligned to " +
                  std::to_string(out.alignment_) + " bytes");
    // elements fits int64, but its byte size may not fit 64 bits (2^62 f32 would wrap to 0).
    const auto blocks = static_cast<uint64_t>(elements / traits->block_size);
    if (blocks > std::numeric_limits<size_t>::max() / traits->type_size)
      return fail(what + ": " + std::to_string(elements) + " elements of " +
                  std::string(traits->name) + " are more bytes than 64 bits can count");
    t.size_bytes = static_cast<size_t>(blocks) * traits->type_size;
    out.tensors_.push_back(std::move(t));
  }

  size_t data_offset = (pos_ + out.alignment_ - 1) / out.alignment_ * out.alignment_;
  if (!out.tensors_.empty() && data_offset > bytes_.size())
    return truncated("the padding before tensor data");
  out.data_offset_ = data_offset;
  for (TensorInfo& t : out.tensors_) {
    const std::string what = "tensor " + t.name;
    uint64_t begin = data_offset + t.offset;
    if (t.offset > bytes_.size() || begin > bytes_.size() || t.size_bytes > bytes_.size() - begin)
      return fail(what + ": data [" + std::to_string(begin) + ", " +
                  std::to_string(begin + t.size_bytes) + ") ends past end of file (" +
                  std::to_string(bytes_.size()) + " bytes); the file is truncated or corrupt");
    t.data = bytes_.data() + begin;
  }
  return {};
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  VESPER_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  GgufFile file;
  file.path_ = path;
  file.file_ = std::move(mapped);
  Parser parser(file.path_, file.file_.bytes());
  VESPER_TRY(parser.parse(file));
  return file;
}

Result<GgufFile> GgufFile::assemble(std::string path,
                                    std::vector<std::pair<std::string, Value>> metadata,
                                    std::vector<TensorInfo> tensors,
                                    std::shared_ptr<const TensorStorage> storage) {
  std::unordered_set<std::string_view> names;
  for (const TensorInfo& t : tensors) {
    if (!names.insert(t.name).second) return make_error(path + ": duplicate tensor " + t.name);
    if (t.shape.empty() || t.shape[0] % tensor::traits(t.type).block_size != 0 ||
        t.size_bytes != tensor::row_size(t.type, t.shape[0]) * static_cast<size_t>(t.rows()))
      return make_error(path + ": tensor " + t.name + " has a size that does not match its shape");
  }
  GgufFile file;
  file.path_ = std::move(path);
  file.version_ = 3;
  file.metadata_ = std::move(metadata);
  file.tensors_ = std::move(tensors);
  file.storage_ = std::move(storage);
  return file;
}

size_t GgufFile::file_size() const {
  if (!storage_) return file_.size();
  size_t bytes = 0;
  for (const TensorInfo& t : tensors_) bytes += t.size_bytes;
  return bytes;
}

void GgufFile::release_pages(const void* p, size_t n) const {
  if (storage_)
    storage_->release_pages(p, n);
  else
    file_.release_pages(p, n);
}

const Value* GgufFile::find(std::string_view key) const {
  for (const auto& [k, v] : metadata_)
    if (k == key) return &v;
  return nullptr;
}

namespace {
std::string wrong_type(const std::string& path, std::string_view key, const Value& v,
                       std::string_view expected) {
  return path + ": metadata key \"" + std::string(key) + "\" has type " +
         std::string(value_type_name(v.type)) + ", expected " + std::string(expected);
}
}  // namespace

Result<std::optional<int64_t>> GgufFile::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<int64_t>{};
  auto i = v->as_int();
  if (!i) return make_error(wrong_type(path_, key, *v, "an integer"));
  return std::optional<int64_t>{*i};
}

Result<int64_t> GgufFile::require_int(std::string_view key) const {
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> v, get_int(key));
  if (!v) return make_error(path_ + ": missing required metadata key \"" + std::string(key) + "\"");
  return *v;
}

Result<std::optional<double>> GgufFile::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<double>{};
  auto d = v->as_double();
  if (!d) return make_error(wrong_type(path_, key, *v, "a number"));
  return std::optional<double>{*d};
}

Result<std::optional<bool>> GgufFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<bool>{};
  auto b = v->as_bool();
  if (!b) return make_error(wrong_type(path_, key, *v, "bool"));
  return std::optional<bool>{*b};
}

Result<std::optional<std::string>> GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<std::string>{};
  const std::string* s = v->as_string();
  if (s == nullptr) return make_error(wrong_type(path_, key, *v, "string"));
  return std::optional<std::string>{*s};
}

Result<std::string> GgufFile::require_string(std::string_view key) const {
  VESPER_ASSIGN_OR_RETURN(std::optional<std::string> v, get_string(key));
  if (!v) return make_error(path_ + ": missing required metadata key \"" + std::string(key) + "\"");
  return *v;
}

Result<const Array*> GgufFile::get_array(std::string_view key, ValueType element_type) const {
  const Value* v = find(key);
  if (v == nullptr) return static_cast<const Array*>(nullptr);
  const Array* a = v->as_array();
  if (a == nullptr) return make_error(wrong_type(path_, key, *v, "array"));
  if (a->element_type != element_type)
    return make_error(path_ + ": metadata key \"" + std::string(key) + "\" is an array of " +
                      std::string(value_type_name(a->element_type)) + ", expected an array of " +
                      std::string(value_type_name(element_type)));
  return a;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

Result<const TensorInfo*> GgufFile::require_tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr)
    return make_error(path_ + ": missing required tensor \"" + std::string(name) + "\"");
  return t;
}

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace vesper::gguf
