// Composite weights in a GGUF file built in memory (GgufFile::assemble): a weight matrix stored as
// parts of different types, each over the inputs an order tensor gathers (backend.h's
// WeightSource::parts says how they multiply). A Vesper-internal layout, not a GGUF standard:
// a format whose layers need it (EXL2, hf/exl2_repack.h) writes these tensors, the model binds
// them as one weight, and such a file is never written out as GGUF (llama.cpp has no such
// tensors).
//
// Weight "blk.0.attn_q.weight" as a composite: "blk.0.attn_q.weight.composite_order" (I32: the
// input each gathered position reads, parts after one another) and
// "blk.0.attn_q.weight.composite_part.<i>" ([part inputs, n_out] of the part's type).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace vesper::gguf {

inline std::string composite_order_name(const std::string& weight_name) {
  return weight_name + ".composite_order";
}

inline std::string composite_part_name(const std::string& weight_name, size_t part) {
  return weight_name + ".composite_part." + std::to_string(part);
}

// Whether `tensor_name` is one of a composite weight's tensors.
inline bool is_composite_tensor(std::string_view tensor_name) {
  return tensor_name.find(".composite_") != std::string_view::npos;
}

}  // namespace vesper::gguf
