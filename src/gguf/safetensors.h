// Safetensors files (Hugging Face's format for checkpoints and adapters): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and byte range in
// the data that follows, then the data. Read zero-copy from a memory mapping, like GGUF.
//
// SafetensorsFile::open validates everything later readers rely on: the header length against
// the file, the header's JSON, each tensor's dtype (F32, F16, BF16, and the integer dtypes I32 and
// I16 that quantized checkpoints such as EXL2 store), a shape whose element count matches its byte
// range, ranges inside the data and not overlapping. Errors name the file and the tensor at fault.
// A file may so hold integer tensors: a reader that expects floats checks each tensor's type
// (safetensors_dtype_name() spells a type the way the file does, for its errors).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "core/result.h"
#include "tensor/ggml_type.h"

namespace vesper::gguf {

struct SafetensorsTensor {
  std::string name;
  tensor::GgmlType type = tensor::GgmlType::kF32;  // kF32, kF16, kBF16, kI32 or kI16
  std::vector<int64_t> shape;     // as stored (torch order: [out, in] for a weight)
  const uint8_t* data = nullptr;  // into the mapping
  size_t size_bytes = 0;

  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const MappedFile& mapping() const { return file_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // The tensor, or an error naming the file and the missing tensor.
  Result<const SafetensorsTensor*> require(std::string_view name) const;

 private:
  MappedFile file_;
  std::vector<SafetensorsTensor> tensors_;
};

// The safetensors dtype of a type ("F32", "F16", "BF16", "I32", "I16"); empty for a type that
// safetensors files do not hold here.
std::string_view safetensors_dtype_name(tensor::GgmlType type);

// Whether a tensor holds floats (F32, F16 or BF16), as model weights do.
inline bool is_float_dtype(tensor::GgmlType type) {
  return type == tensor::GgmlType::kF32 || type == tensor::GgmlType::kF16 ||
         type == tensor::GgmlType::kBF16;
}

// One tensor to write: `data` holds its elements in `type` (F32, F16, BF16, I32 or I16),
// row-major, little-endian.
struct SafetensorsTensorData {
  std::string name;
  tensor::GgmlType type = tensor::GgmlType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file of `tensors` (in this order, data 8-byte aligned) with
// __metadata__ {"format": "pt"}. Errors name the file.
Status write_safetensors(const std::string& path,
                         const std::vector<SafetensorsTensorData>& tensors);

}  // namespace vesper::gguf
