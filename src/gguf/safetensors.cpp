#include "gguf/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/json_nesting.h"

namespace vesper::gguf {
namespace {

struct Dtype {
  std::string_view name;
  tensor::GgmlType type;
};
constexpr Dtype kDtypes[] = {{"F32", tensor::GgmlType::kF32},
                             {"F16", tensor::GgmlType::kF16},
                             {"BF16", tensor::GgmlType::kBF16},
                             {"I32", tensor::GgmlType::kI32},
                             {"I16", tensor::GgmlType::kI16}};
constexpr const char* kDtypeList = "F32, F16, BF16, I32 or I16";

}  // namespace

std::string_view safetensors_dtype_name(tensor::GgmlType type) {
  for (const Dtype& d : kDtypes)
    if (d.type == type) return d.name;
  return {};
}

int64_t SafetensorsTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  VESPER_ASSIGN_OR_RETURN(f.file_, MappedFile::open(path));
  const size_t size = f.file_.size();
  if (size < 8)
    return make_error(path + ": not a safetensors file (shorter than its 8-byte header length)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | f.file_.data()[i];
  if (header_len > size - 8)
    return make_error(path + ": safetensors header of " + std::to_string(header_len) +
                      " bytes runs past the end of the file");
  const auto* header = reinterpret_cast<const char*>(f.file_.data() + 8);
  if (find_json_nesting_over(std::string_view(header, header_len), 8) != std::string_view::npos)
    return make_error(path + ": the safetensors header nests deeper than a header can");
  const nlohmann::json j = nlohmann::json::parse(header, header + header_len, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(path + ": the safetensors header is not a JSON object");
  const uint8_t* data = f.file_.data() + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor " + name;
    if (!info.is_object() || !info.contains("dtype") || !info["dtype"].is_string() ||
        !info.contains("shape") || !info["shape"].is_array() || !info.contains("data_offsets") ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2)
      return make_error(where + ": needs \"dtype\", \"shape\" and two \"data_offsets\"");
    SafetensorsTensor t;
    t.name = name;
    const std::string dtype = info["dtype"].get<std::string>();
    const Dtype* known = nullptr;
    for (const Dtype& d : kDtypes)
      if (d.name == dtype) known = &d;
    if (known == nullptr)
      return make_error(where + ": dtype " + dtype + " is not supported (" + kDtypeList + ")");
    t.type = known->type;
    int64_t elements = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
        return make_error(where + ": a shape of non-negative integers is needed");
      t.shape.push_back(d.get<int64_t>());
      if (t.shape.back() != 0 && elements > (int64_t{1} << 50) / t.shape.back())
        return make_error(where + ": the shape's element count overflows");
      elements *= t.shape.back();
    }
    const auto& offsets = info["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      return make_error(where + ": data_offsets must be non-negative integers");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size)
      return make_error(where + ": data [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") lies outside the file's " + std::to_string(data_size) +
                        " bytes of data");
    const uint64_t want = static_cast<uint64_t>(elements) * tensor::traits(t.type).type_size;
    if (end - begin != want)
      return make_error(where + ": " + std::to_string(end - begin) + " bytes of data for " +
                        std::to_string(elements) + " " + dtype + " elements (" +
                        std::to_string(want) + " bytes)");
    t.data = data + begin;
    t.size_bytes = end - begin;
    f.tensors_.push_back(std::move(t));
  }
  // Ranges must not overlap: a corrupt file could otherwise alias one tensor's bytes as another's.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->data + by_offset[i - 1]->size_bytes > by_offset[i]->data)
      return make_error(path + ": tensors " + by_offset[i - 1]->name + " and " +
                        by_offset[i]->name + " overlap");
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

Result<const SafetensorsTensor*> SafetensorsFile::require(std::string_view name) const {
  if (const SafetensorsTensor* t = find(name)) return t;
  return make_error(path() + ": missing tensor \"" + std::string(name) + "\"");
}

Status write_safetensors(const std::string& path,
                         const std::vector<SafetensorsTensorData>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const SafetensorsTensorData& t : tensors) {
    const std::string_view dtype = safetensors_dtype_name(t.type);
    if (dtype.empty())
      return make_error(path + ": tensor " + t.name + " of type " +
                        std::string(tensor::type_name(t.type)) +
                        " cannot be written to safetensors (" + kDtypeList + ")");
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    const uint64_t bytes = static_cast<uint64_t>(elements) * tensor::traits(t.type).type_size;
    header[t.name] = {{"dtype", std::string(dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(path + ": cannot write");
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (size_t i = 0; i < tensors.size(); ++i)
    out.write(static_cast<const char*>(tensors[i].data), static_cast<std::streamsize>(sizes[i]));
  if (!out.flush()) return make_error(path + ": write failed");
  return {};
}

}  // namespace vesper::gguf
