// GGUF files: reading (v2 and v3, mmap'd, zero-copy tensor views) and writing.
//
// A GgufFile owns the mapping of one file, its metadata (typed key-value pairs in file order)
// and its tensor infos, each pointing into the mapping. Opening validates everything a later
// reader relies on, so a GgufFile that opened is safe to use: magic and version, every
// metadata value and nested array, unique tensor names, known tensor types, shapes whose
// element count fits the type's block size and whose byte size fits 64 bits, data offsets
// aligned to general.alignment and inside the file. Each error names the file and the fault.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/mapped_file.h"
#include "core/result.h"
#include "tensor/ggml_type.h"

namespace vesper::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr size_t kDefaultAlignment = 32;

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view value_type_name(ValueType type);

struct Value;

// An array value: every element has `element_type` (arrays may nest).
struct Array {
  ValueType element_type = ValueType::kUint8;
  std::vector<Value> items;
};

// One metadata value. `type` says which member of `data` is set: all integer types are held
// as int64_t or uint64_t (signed types as int64_t, unsigned as uint64_t), floats as double.
struct Value {
  ValueType type = ValueType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

  static Value u8(uint8_t v) { return {ValueType::kUint8, uint64_t{v}}; }
  static Value i8(int8_t v) { return {ValueType::kInt8, int64_t{v}}; }
  static Value u16(uint16_t v) { return {ValueType::kUint16, uint64_t{v}}; }
  static Value i16(int16_t v) { return {ValueType::kInt16, int64_t{v}}; }
  static Value u32(uint32_t v) { return {ValueType::kUint32, uint64_t{v}}; }
  static Value i32(int32_t v) { return {ValueType::kInt32, int64_t{v}}; }
  static Value u64(uint64_t v) { return {ValueType::kUint64, v}; }
  static Value i64(int64_t v) { return {ValueType::kInt64, v}; }
  static Value f32(float v) { return {ValueType::kFloat32, double{v}}; }
  static Value f64(double v) { return {ValueType::kFloat64, v}; }
  static Value boolean(bool v) { return {ValueType::kBool, v}; }
  static Value string(std::string v) { return {ValueType::kString, std::move(v)}; }
  static Value array(ValueType element_type, std::vector<Value> items) {
    return {ValueType::kArray, Array{element_type, std::move(items)}};
  }
  static Value string_array(const std::vector<std::string>& items);
  static Value f32_array(const std::vector<float>& items);
  static Value i32_array(const std::vector<int32_t>& items);

  bool is_integer() const;
  bool is_float() const { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }
  // Any integer type as int64 (nullopt when not an integer or out of range).
  std::optional<int64_t> as_int() const;
  // Any integer or float type as double.
  std::optional<double> as_double() const;
  std::optional<bool> as_bool() const;
  const std::string* as_string() const { return std::get_if<std::string>(&data); }
  const Array* as_array() const { return std::get_if<Array>(&data); }

  // Short human-readable form; arrays longer than `max_items` are elided.
  std::string to_string(size_t max_items = 8) const;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // ggml order: shape[0] (ne0) varies fastest
  tensor::GgmlType type = tensor::GgmlType::kF32;
  uint64_t offset = 0;  // relative to the start of the data section
  size_t size_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t num_elements() const;
  int64_t rows() const { return shape.empty() ? 1 : num_elements() / shape[0]; }
};

// Memory that keeps the tensor data of an assembled GgufFile alive (the mappings of a Hugging
// Face checkpoint's safetensors files, buffers of tensors converted at load).
class TensorStorage {
 public:
  virtual ~TensorStorage() = default;
  // As MappedFile::release_pages: pages wholly inside [p, p + n) that are file-backed may be
  // dropped from memory (their data stays readable). A no-op for memory the storage owns.
  virtual void release_pages(const void* p, size_t n) const = 0;
};

class GgufFile {
 public:
  // Maps and validates `path`.
  static Result<GgufFile> open(const std::string& path);
  // A file built in memory from another format: metadata and tensors as a GGUF of that model
  // would hold them, each tensor's data pointing into `storage`. `path` names the source in
  // errors. Tensor names must be unique, each size_bytes must match its type and shape.
  static Result<GgufFile> assemble(std::string path,
                                   std::vector<std::pair<std::string, Value>> metadata,
                                   std::vector<TensorInfo> tensors,
                                   std::shared_ptr<const TensorStorage> storage);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }
  // Bytes of the file on disk (of an assembled file: its tensors' bytes).
  size_t file_size() const;
  // The mapping of a file read from disk (empty for an assembled one, whose tensors lie in its
  // TensorStorage).
  const MappedFile& mapping() const { return file_; }
  // Whether the file was built in memory from another format (assemble), not read from a GGUF.
  bool assembled() const { return storage_ != nullptr; }
  // Tells the OS that the pages of tensor data wholly inside [p, p + n) are not needed now
  // (MappedFile::release_pages); the data stays readable. Used after a backend copied a weight.
  void release_pages(const void* p, size_t n) const;

  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;

  // Typed getters. require_* errors name the file and the key when the key is missing or has
  // the wrong type; get_* return nullopt when missing and an error for a wrong type.
  Result<int64_t> require_int(std::string_view key) const;
  Result<std::optional<int64_t>> get_int(std::string_view key) const;
  Result<std::optional<double>> get_float(std::string_view key) const;
  Result<std::optional<bool>> get_bool(std::string_view key) const;
  Result<std::string> require_string(std::string_view key) const;
  Result<std::optional<std::string>> get_string(std::string_view key) const;
  // An array key; nullptr when missing, error when not an array of `element_type`.
  Result<const Array*> get_array(std::string_view key, ValueType element_type) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Error naming the file and the tensor when it is missing.
  Result<const TensorInfo*> require_tensor(std::string_view name) const;

 private:
  friend class Parser;
  std::string path_;
  MappedFile file_;
  uint32_t version_ = 0;
  size_t alignment_ = kDefaultAlignment;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorInfo> tensors_;
  std::shared_ptr<const TensorStorage> storage_;  // set for an assembled file
};

// Builds a GGUF v3 file in memory and writes it. Tensor data is copied at add_tensor, so the
// source may go away. Used by `vesper quantize`, `vesper synth` and tests.
class GgufWriter {
 public:
  // Sets (or replaces) a metadata key, keeping first-insertion order.
  void set(std::string key, Value value);
  // Removes a metadata key if present.
  void remove(std::string_view key);
  // Copies the metadata of another file (all keys) in its order.
  void copy_metadata(const GgufFile& from);
  // Adds a tensor; `shape` in ggml order; `data` must be exactly row_size * rows bytes.
  Status add_tensor(std::string name, std::vector<int64_t> shape, tensor::GgmlType type,
                    std::span<const uint8_t> data);
  // Writes the file (alignment from general.alignment if set, else 32). Errors name `path`.
  Status write(const std::string& path) const;
  // The serialized bytes (for tests that corrupt files).
  std::vector<uint8_t> serialize() const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> shape;
    tensor::GgmlType type;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace vesper::gguf
