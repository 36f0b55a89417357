// Safetensors files (Hugging Face's format for checkpoints and adapters): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and byte range in
// the data that follows, then the data. Read zero-copy from a memory mapping, like GGUF.
//
// SafetensorsFile::open validates everything later readers rely on: the header length against
// the file, the header's JSON, each tensor's dtype (F32, F16, BF16 here), a shape whose element
// count matches its byte range, ranges inside the data and not overlapping. Errors name the file
// and the tensor at fault.
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
  tensor::GgmlType type = tensor::GgmlType::kF32;  // F32, F16 or BF16
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

// One tensor to write: `data` holds its elements in `type` (F32, F16 or BF16), row-major.
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
