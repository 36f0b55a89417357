// GGUF v3 serialization. The layout mirrors what the reader validates: header, metadata,
// tensor infos, padding to the alignment, then each tensor's data padded to the alignment.
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "gguf/gguf.h"

namespace vesper::gguf {
namespace {

class ByteSink {
 public:
  template <class T>
  void put(T v) {
    // resize + memcpy rather than insert: g++ 12 warns falsely (-Wstringop-overflow) on
    // insert into an empty vector.
    size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    size_t at = bytes.size();
    bytes.resize(at + s.size());
    if (!s.empty()) std::memcpy(bytes.data() + at, s.data(), s.size());
  }
  void pad_to(size_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
  }
  void put_value(const Value& v) {
    switch (v.type) {
      case ValueType::kUint8: put<uint8_t>(static_cast<uint8_t>(std::get<uint64_t>(v.data))); break;
      case ValueType::kInt8: put<int8_t>(static_cast<int8_t>(std::get<int64_t>(v.data))); break;
      case ValueType::kUint16: put<uint16_t>(static_cast<uint16_t>(std::get<uint64_t>(v.data))); break;
      case ValueType::kInt16: put<int16_t>(static_cast<int16_t>(std::get<int64_t>(v.data))); break;
      case ValueType::kUint32: put<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.data))); break;
      case ValueType::kInt32: put<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.data))); break;
      case ValueType::kUint64: put<uint64_t>(std::get<uint64_t>(v.data)); break;
      case ValueType::kInt64: put<int64_t>(std::get<int64_t>(v.data)); break;
      case ValueType::kFloat32: put<float>(static_cast<float>(std::get<double>(v.data))); break;
      case ValueType::kFloat64: put<double>(std::get<double>(v.data)); break;
      case ValueType::kBool: put<uint8_t>(std::get<bool>(v.data) ? 1 : 0); break;
      case ValueType::kString: put_string(std::get<std::string>(v.data)); break;
      case ValueType::kArray: {
        const Array& a = std::get<Array>(v.data);
        put<uint32_t>(static_cast<uint32_t>(a.element_type));
        put<uint64_t>(a.items.size());
        for (const Value& item : a.items) {
          VESPER_CHECK(item.type == a.element_type, "array element of wrong type");
          put_value(item);
        }
        break;
      }
    }
  }
  std::vector<uint8_t> bytes;
};

}  // namespace

void GgufWriter::set(std::string key, Value value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::remove(std::string_view key) {
  std::erase_if(metadata_, [&](const auto& kv) { return kv.first == key; });
}

void GgufWriter::copy_metadata(const GgufFile& from) {
  for (const auto& [k, v] : from.metadata()) set(k, v);
}

Status GgufWriter::add_tensor(std::string name, std::vector<int64_t> shape, tensor::GgmlType type,
                              std::span<const uint8_t> data) {
  if (shape.empty() || shape.size() > 4) return make_error("tensor " + name + ": 1 to 4 dimensions required");
  const tensor::TypeTraits& t = tensor::traits(type);
  if (shape[0] % t.block_size != 0)
    return make_error("tensor " + name + ": row length " + std::to_string(shape[0]) +
                      " is not a multiple of the block size of " + std::string(t.name));
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  size_t expected = static_cast<size_t>(elements / t.block_size) * t.type_size;
  if (data.size() != expected)
    return make_error("tensor " + name + ": " + std::to_string(data.size()) + " bytes given, " +
                      std::to_string(expected) + " expected");
  for (const auto& p : tensors_)
    if (p.name == name) return make_error("duplicate tensor name \"" + name + "\"");
  tensors_.push_back({std::move(name), std::move(shape), type, {data.begin(), data.end()}});
  return {};
}

std::vector<uint8_t> GgufWriter::serialize() const {
  size_t alignment = kDefaultAlignment;
  for (const auto& [k, v] : metadata_)
    if (k == "general.alignment" && v.as_int()) alignment = static_cast<size_t>(*v.as_int());
  ByteSink out;
  out.put<uint32_t>(kMagic);
  out.put<uint32_t>(3);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(metadata_.size());
  for (const auto& [k, v] : metadata_) {
    out.put_string(k);
    out.put<uint32_t>(static_cast<uint32_t>(v.type));
    out.put_value(v);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.put_string(t.name);
    out.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) out.put<int64_t>(d);
    out.put<uint32_t>(static_cast<uint32_t>(t.type));
    out.put<uint64_t>(offset);
    offset += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  out.pad_to(alignment);
  for (const auto& t : tensors_) {
    out.bytes.insert(out.bytes.end(), t.data.begin(), t.data.end());
    out.pad_to(alignment);
  }
  return std::move(out.bytes);
}

Status GgufWriter::write(const std::string& path) const {
  std::vector<uint8_t> bytes = serialize();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return make_error(path + ": cannot open for writing: " + std::strerror(errno));
  size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  bool ok = written == bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return make_error(path + ": write failed: " + std::strerror(errno));
  return {};
}

}  // namespace vesper::gguf
