// Repacking q4_0 / q8_0 weights into 8-row interleaved chunks (layout in packed_weights.h). Runs
// once per matrix at load, portable: speed matters little next to reading the file.
#include "backend/packed_weights.h"

#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "tensor/quant.h"

namespace vesper::backend {
namespace {

using tensor::GgmlType;

constexpr int64_t kRows = 8;   // rows interleaved per chunk
constexpr size_t kAlign = 64;  // a cache line: slices never straddle one

// One chunk: the 8 rows' block b (each at rows[j], in GGUF layout) into quants + scales.
void pack_chunk_q4_0(const uint8_t* const* rows, uint8_t* quants, uint16_t* scales) {
  for (int j = 0; j < kRows; ++j) {
    std::memcpy(&scales[j], rows[j], 2);
    const uint8_t* qs = rows[j] + 2;  // element e < 16: low nibble of qs[e]; e + 16: high nibble
    auto nibble = [qs](int e) { return e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4; };
    for (int k = 0; k < 4; ++k)
      for (int t = 0; t < 4; ++t)
        quants[32 * k + 4 * j + t] =
            static_cast<uint8_t>(nibble(8 * k + t) | (nibble(8 * k + 4 + t) << 4));
  }
}

void pack_chunk_q8_0(const uint8_t* const* rows, uint8_t* quants, uint16_t* scales) {
  for (int j = 0; j < kRows; ++j) {
    std::memcpy(&scales[j], rows[j], 2);
    for (int k = 0; k < 8; ++k) std::memcpy(quants + 32 * k + 4 * j, rows[j] + 2 + 4 * k, 4);
  }
}

}  // namespace

void PackedWeights::Free::operator()(uint8_t* p) const {
  std::free(p);
}

const uint16_t* PackedWeights::scales() const {
  const int64_t chunks = n_out_ / kRows * (n_in_ / 32);
  return reinterpret_cast<const uint16_t*>(data_.get() + chunks * chunk_quant_bytes(type_));
}

int64_t PackedWeights::chunk_quant_bytes(GgmlType type) {
  return type == GgmlType::kQ4_0 ? 128 : 256;
}

bool packable(GgmlType type, int64_t n_in, int64_t n_out) {
  return (type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0) && n_in > 0 && n_in % 32 == 0 &&
         n_out > 0 && n_out % kRows == 0;
}

PackedWeights prepare_weights(GgmlType type, const void* w, int64_t n_in, int64_t n_out) {
  PackedWeights p;
  if (!packable(type, n_in, n_out)) return p;
  const int64_t n_blocks = n_in / 32;
  const int64_t chunks = n_out / kRows * n_blocks;
  const int64_t qbytes = PackedWeights::chunk_quant_bytes(type);
  const size_t total = static_cast<size_t>(chunks * (qbytes + 2 * kRows));
  auto* data =
      static_cast<uint8_t*>(std::aligned_alloc(kAlign, (total + kAlign - 1) / kAlign * kAlign));
  VESPER_CHECK(data != nullptr, "prepare_weights: cannot allocate %zu bytes", total);
  p.data_.reset(data);
  p.bytes_ = total;
  p.type_ = type;
  p.n_in_ = n_in;
  p.n_out_ = n_out;
  auto* scales = reinterpret_cast<uint16_t*>(data + chunks * qbytes);
  const size_t row_bytes = tensor::row_size(type, n_in);
  const size_t block_bytes = row_bytes / static_cast<size_t>(n_blocks);
  const auto* src = static_cast<const uint8_t*>(w);
  for (int64_t g = 0; g < n_out / kRows; ++g) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* rows[kRows];
      for (int j = 0; j < kRows; ++j)
        rows[j] = src + static_cast<size_t>(g * kRows + j) * row_bytes + b * block_bytes;
      const int64_t c = g * n_blocks + b;
      if (type == GgmlType::kQ4_0) {
        pack_chunk_q4_0(rows, data + c * qbytes, scales + c * kRows);
      } else {
        pack_chunk_q8_0(rows, data + c * qbytes, scales + c * kRows);
      }
    }
  }
  return p;
}

}  // namespace vesper::backend
