#include "model/quantize.h"

#include <vector>

#include "gguf/composite_weight.h"
#include "gguf/gguf.h"
#include "hf/model_file.h"
#include "tensor/quant.h"

namespace vesper::model {
namespace {

using tensor::GgmlType;

bool fits(GgmlType type, int64_t row) {
  return row % tensor::traits(type).block_size == 0;
}

GgmlType fallback(GgmlType type) {
  switch (type) {
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
      return GgmlType::kQ4_0;
    case GgmlType::kQ4_K:
      return GgmlType::kQ5_0;
    case GgmlType::kQ5_K:
      return GgmlType::kQ5_1;
    case GgmlType::kQ6_K:
      return GgmlType::kQ8_0;
    default:
      return GgmlType::kF16;
  }
}

// llama.cpp's LLAMA_FTYPE numbers, for general.file_type.
uint32_t file_type_of(GgmlType target) {
  switch (target) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ5_1:
      return 9;
    case GgmlType::kQ2_K:
      return 10;
    case GgmlType::kQ3_K:
      return 11;  // Q3_K_S: all matrices q3_K
    case GgmlType::kQ4_K:
      return 14;  // Q4_K_S
    case GgmlType::kQ5_K:
      return 16;  // Q5_K_S
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

}  // namespace

bool is_quantize_target(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return tensor::can_quantize(type);
    default:
      return false;
  }
}

GgmlType quantized_type_for(const std::string& name, const std::vector<int64_t>& shape,
                            GgmlType current, GgmlType target) {
  const bool is_matrix = shape.size() >= 2 && name.size() > 7 && name.ends_with(".weight");
  if (!is_matrix || name.find("_norm") != std::string::npos) return current;
  GgmlType type = target;
  if (name == "output.weight") {
    switch (target) {
      case GgmlType::kQ4_0:
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_0:
      case GgmlType::kQ5_1:
      case GgmlType::kQ2_K:
      case GgmlType::kQ3_K:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        type = GgmlType::kQ6_K;
        break;
      default:
        break;
    }
  }
  while (!fits(type, shape[0])) {
    GgmlType next = fallback(type);
    if (next == type) return GgmlType::kF32;
    type = next;
  }
  return type;
}

Status quantize_model(const std::string& in_path, const std::string& out_path,
                      std::optional<GgmlType> target, ThreadPool& pool,
                      const std::function<void(const QuantizeProgress&)>& progress) {
  if (target && !is_quantize_target(*target))
    return make_error("--type " + std::string(tensor::type_name(*target)) +
                      " is not a quantization target");
  VESPER_ASSIGN_OR_RETURN(gguf::GgufFile in, hf::open_model_file(in_path));
  for (const gguf::TensorInfo& t : in.tensors())
    if (gguf::is_composite_tensor(t.name))
      return make_error(in_path +
                        ": an EXL2 checkpoint cannot be written as GGUF (no GGUF type holds "
                        "EXL2 layers); convert its unquantized checkpoint instead");
  gguf::GgufWriter out;
  out.copy_metadata(in);
  if (target) {
    out.set("general.quantization_version", gguf::Value::u32(2));
    out.set("general.file_type", gguf::Value::u32(file_type_of(*target)));
  }

  QuantizeProgress p;
  p.total = in.tensors().size();
  std::vector<float> f32;
  std::vector<uint8_t> bytes;
  for (const gguf::TensorInfo& t : in.tensors()) {
    const GgmlType to = target ? quantized_type_for(t.name, t.shape, t.type, *target) : t.type;
    p.name = t.name;
    p.from = t.type;
    p.to = to;
    if (to == t.type) {
      VESPER_TRY(out.add_tensor(t.name, t.shape, t.type, {t.data, t.size_bytes}));
    } else {
      if (!tensor::can_dequantize(t.type))
        return make_error(in_path + ": tensor " + t.name + " has type " +
                          std::string(tensor::type_name(t.type)) + ", which cannot be converted");
      const int64_t row = t.shape[0];
      const int64_t rows = t.rows();
      const size_t in_row = tensor::row_size(t.type, row);
      const size_t out_row = tensor::row_size(to, row);
      bytes.assign(out_row * rows, 0);
      pool.parallel_for(static_cast<size_t>(rows), [&](size_t begin, size_t end) {
        std::vector<float> buf(row);
        for (size_t r = begin; r < end; ++r) {
          tensor::dequantize_row(t.type, t.data + r * in_row, buf.data(), row);
          tensor::quantize_row(to, buf.data(), bytes.data() + r * out_row, row);
        }
      });
      VESPER_TRY(out.add_tensor(t.name, t.shape, to, bytes));
    }
    ++p.index;
    if (progress) progress(p);
  }
  return out.write(out_path);
}

}  // namespace vesper::model
