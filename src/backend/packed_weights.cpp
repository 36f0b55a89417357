// Repacking q4_0 / q8_0 and k-quant (q2_K ... q6_K) weights into 8-row interleaved chunks (layout
// in packed_weights.h). Runs once per matrix at load, portable: speed matters little next to
// reading the file.
#include "backend/packed_weights.h"

#include <cstring>

#include "core/check.h"
#include "core/large_buffer.h"
#include "tensor/quant.h"
#include "tensor/quant_blocks.h"

namespace vesper::backend {
namespace {

using tensor::GgmlType;

constexpr int64_t kRows = 8;  // rows interleaved per chunk

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

// q4_K / q5_K: the 8 rows' super-block b. Each row's 32-element sub-block s is laid out as a q4_0
// chunk's block (without the -8), q5_K's fifth bits following it in one vector, and the scales and
// mins are unpacked from their 6-bit packing.
template <bool kFifthBit>
void pack_chunk_k45(const uint8_t* const* rows, uint8_t* quants, uint16_t* meta) {
  constexpr int kSubBlockBytes = kFifthBit ? 160 : 128;
  auto* sc = reinterpret_cast<uint8_t*>(meta + 16);
  uint8_t* mins = sc + 64;
  for (int j = 0; j < kRows; ++j) {
    std::memcpy(&meta[j], rows[j], 2);          // d
    std::memcpy(&meta[8 + j], rows[j] + 2, 2);  // dmin
    const uint8_t* qh = rows[j] + 16;           // q5_K only
    const uint8_t* qs = rows[j] + (kFifthBit ? 48 : 16);
    // Element 64c + l in the low nibble of qs[32c + l], 64c + 32 + l in its high nibble; q5_K's
    // fifth bit of element 32s + l is bit s of qh[l].
    auto nibble = [qs](int e) {
      const uint8_t byte = qs[32 * (e / 64) + e % 32];
      return (e / 32) % 2 == 0 ? byte & 0xF : byte >> 4;
    };
    auto fifth = [qh](int e) { return (qh[e % 32] >> (e / 32)) & 1; };
    for (int s = 0; s < 8; ++s) {
      uint8_t scale, min;
      tensor::unpack_scale_min_k4(s, rows[j] + 4, &scale, &min);
      sc[8 * s + j] = scale;
      mins[16 * (s / 2) + 2 * j + s % 2] = min;
      uint8_t* sub = quants + kSubBlockBytes * s;
      for (int t = 0; t < 4; ++t) {
        uint8_t high = 0;
        for (int k = 0; k < 4; ++k) {
          const int e = 32 * s + 8 * k + t;
          sub[32 * k + 4 * j + t] = static_cast<uint8_t>(nibble(e) | (nibble(e + 4) << 4));
          if (kFifthBit)
            high |= static_cast<uint8_t>(fifth(e) << (2 * k) | fifth(e + 4) << (2 * k + 1));
        }
        if (kFifthBit) sub[128 + 4 * j + t] = high;
      }
    }
  }
}

// The sub-block byte order of the q2_K / q3_K / q6_K scales (and q2_K's mins): byte 16p + 2j + h
// is row j's sub-block 2p + h.
constexpr int sub16_at(int j, int u) {
  return 16 * (u / 2) + 2 * j + u % 2;
}

// q6_K: the 8 rows' super-block b, in 8 groups of 32 elements. A group's low nibbles are laid out
// as a q4_0 chunk's block; its high 2-bit pairs follow in 2 vectors, vector m holding, in byte
// 4j + t, row j's elements 16m + t (bits 0-1), 16m + 4 + t (2-3), 16m + 8 + t (4-5) and
// 16m + 12 + t (6-7) of the group. Scales and d go to `meta`.
void pack_chunk_q6_k(const uint8_t* const* rows, uint8_t* quants, uint16_t* meta) {
  auto* sc = reinterpret_cast<uint8_t*>(meta + 8);
  for (int j = 0; j < kRows; ++j) {
    const uint8_t* b = rows[j];
    std::memcpy(&meta[j], b + 208, 2);  // d
    for (int u = 0; u < 16; ++u) sc[sub16_at(j, u)] = b[192 + u];
    // Element 128h + 32s + l: low 4 bits in nibble s / 2 of ql[64h + 32(s % 2) + l], high 2 bits
    // at bit 2s of qh[32h + l].
    auto low = [b](int e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      const uint8_t byte = b[64 * h + 32 * (s % 2) + l];
      return s < 2 ? byte & 0xF : byte >> 4;
    };
    auto high = [b](int e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      return (b[128 + 32 * h + l] >> (2 * s)) & 3;
    };
    for (int g = 0; g < 8; ++g) {
      uint8_t* group = quants + 192 * g;
      const int e0 = 32 * g;
      for (int k = 0; k < 4; ++k)
        for (int t = 0; t < 4; ++t)
          group[32 * k + 4 * j + t] =
              static_cast<uint8_t>(low(e0 + 8 * k + t) | (low(e0 + 8 * k + 4 + t) << 4));
      for (int m = 0; m < 2; ++m)
        for (int t = 0; t < 4; ++t)
          group[128 + 32 * m + 4 * j + t] = static_cast<uint8_t>(
              high(e0 + 16 * m + t) | (high(e0 + 16 * m + 4 + t) << 2) |
              (high(e0 + 16 * m + 8 + t) << 4) | (high(e0 + 16 * m + 12 + t) << 6));
    }
  }
}

// q3_K: the 8 rows' super-block b in 8 groups of 32 elements. Per group, 2 vectors of the low 2
// bits of the unsigned quants q = low + 4 * third bit (the weight is sc * (q - 4)): byte 4j + t of
// vector m holds row j's group elements 16m + t, 16m + 4 + t, 16m + 8 + t and 16m + 12 + t in bits
// 0-1, 2-3, 4-5 and 6-7; then one vector of the third bits, bit 4m + i of byte 4j + t for element
// 16m + 4i + t. d and the int8 scales go to `meta`.
void pack_chunk_q3_k(const uint8_t* const* rows, uint8_t* quants, uint16_t* meta) {
  auto* sc = reinterpret_cast<int8_t*>(meta + 8);
  for (int j = 0; j < kRows; ++j) {
    const uint8_t* b = rows[j];  // hmask@0[32], qs@32[64], scales@96[12], d@108
    std::memcpy(&meta[j], b + 108, 2);
    for (int u = 0; u < 16; ++u)
      sc[sub16_at(j, u)] = static_cast<int8_t>(tensor::unpack_scale_q3_k(u, b + 96));
    // Element 128n + 32s + l: low 2 bits at bit 2s of qs[32n + l], third bit at bit 4n + s of
    // hmask[l].
    auto low = [b](int e) {
      return (b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    };
    auto high = [b](int e) { return (b[e % 32] >> (4 * (e / 128) + (e % 128) / 32)) & 1; };
    for (int g = 0; g < 8; ++g) {
      uint8_t* group = quants + 96 * g;
      for (int t = 0; t < 4; ++t) {
        uint8_t third = 0;
        for (int m = 0; m < 2; ++m) {
          uint8_t lows = 0;
          for (int i = 0; i < 4; ++i) {
            const int e = 32 * g + 16 * m + 4 * i + t;
            lows |= static_cast<uint8_t>(low(e) << (2 * i));
            third |= static_cast<uint8_t>(high(e) << (4 * m + i));
          }
          group[32 * m + 4 * j + t] = lows;
        }
        group[64 + 4 * j + t] = third;
      }
    }
  }
}

// q2_K: the 8 rows' super-block b in 8 groups of 32 elements, each 2 vectors of 2-bit quants laid
// out as q3_K's low bits. d, dmin, the 4-bit scales and the 4-bit mins go to `meta`.
void pack_chunk_q2_k(const uint8_t* const* rows, uint8_t* quants, uint16_t* meta) {
  auto* sc = reinterpret_cast<uint8_t*>(meta + 16);
  uint8_t* mins = sc + 128;
  for (int j = 0; j < kRows; ++j) {
    const uint8_t* b = rows[j];  // scales@0[16], qs@16[64], d@80, dmin@82
    std::memcpy(&meta[j], b + 80, 2);
    std::memcpy(&meta[8 + j], b + 82, 2);
    for (int u = 0; u < 16; ++u) {
      sc[sub16_at(j, u)] = b[u] & 0xF;
      mins[sub16_at(j, u)] = b[u] >> 4;
    }
    // Element 128n + 32s + l at bit 2s of qs[32n + l].
    auto quant = [b](int e) {
      return (b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    };
    for (int g = 0; g < 8; ++g)
      for (int m = 0; m < 2; ++m)
        for (int t = 0; t < 4; ++t) {
          uint8_t byte = 0;
          for (int i = 0; i < 4; ++i)
            byte |= static_cast<uint8_t>(quant(32 * g + 16 * m + 4 * i + t) << (2 * i));
          quants[64 * g + 32 * m + 4 * j + t] = byte;
        }
  }
}

// Everything the layout of one packed type is (packed_weights.h): elements of a row per chunk,
// bytes of a chunk's quants, uint16 scale entries per chunk, and the function that packs a chunk.
struct ChunkFormat {
  int64_t block;
  int64_t quant_bytes;
  int64_t scale_count;
  void (*pack)(const uint8_t* const* rows, uint8_t* quants, uint16_t* scales);
};

// The format of `type`, or nullptr if the type is not packed.
const ChunkFormat* chunk_format(GgmlType type) {
  static constexpr ChunkFormat kQ4_0{32, 128, 8, pack_chunk_q4_0};
  static constexpr ChunkFormat kQ8_0{32, 256, 8, pack_chunk_q8_0};
  static constexpr ChunkFormat kQ2_K{256, 512, 144, pack_chunk_q2_k};
  static constexpr ChunkFormat kQ3_K{256, 768, 72, pack_chunk_q3_k};
  static constexpr ChunkFormat kQ4_K{256, 1024, 80, pack_chunk_k45<false>};
  static constexpr ChunkFormat kQ5_K{256, 1280, 80, pack_chunk_k45<true>};
  static constexpr ChunkFormat kQ6_K{256, 1536, 72, pack_chunk_q6_k};
  switch (type) {
    case GgmlType::kQ4_0:
      return &kQ4_0;
    case GgmlType::kQ8_0:
      return &kQ8_0;
    case GgmlType::kQ2_K:
      return &kQ2_K;
    case GgmlType::kQ3_K:
      return &kQ3_K;
    case GgmlType::kQ4_K:
      return &kQ4_K;
    case GgmlType::kQ5_K:
      return &kQ5_K;
    case GgmlType::kQ6_K:
      return &kQ6_K;
    default:
      return nullptr;
  }
}

// The format of a type the caller knows to be packed.
const ChunkFormat& packed_format(GgmlType type) {
  const ChunkFormat* f = chunk_format(type);
  VESPER_CHECK(f != nullptr, "packed weights: type %s is not packed",
               tensor::type_name(type).data());
  return *f;
}

}  // namespace

const uint16_t* PackedWeights::scales() const {
  const ChunkFormat& f = packed_format(type_);
  const int64_t chunks = n_out_ / kRows * (n_in_ / f.block);
  return reinterpret_cast<const uint16_t*>(data_.get() + chunks * f.quant_bytes);
}

int64_t PackedWeights::chunk_block(GgmlType type) {
  return packed_format(type).block;
}

int64_t PackedWeights::chunk_quant_bytes(GgmlType type) {
  return packed_format(type).quant_bytes;
}

int64_t PackedWeights::chunk_scale_count(GgmlType type) {
  return packed_format(type).scale_count;
}

bool packable(GgmlType type, int64_t n_in, int64_t n_out) {
  const ChunkFormat* f = chunk_format(type);
  return f != nullptr && n_in > 0 && n_in % f->block == 0 && n_out > 0 && n_out % kRows == 0;
}

PackedWeights prepare_weights(GgmlType type, const void* w, int64_t n_in, int64_t n_out) {
  PackedWeights p;
  if (!packable(type, n_in, n_out)) return p;
  const ChunkFormat& f = packed_format(type);
  const int64_t n_blocks = n_in / f.block;
  const int64_t chunks = n_out / kRows * n_blocks;
  const int64_t qbytes = f.quant_bytes;
  const int64_t n_scales = f.scale_count;
  const size_t total = static_cast<size_t>(chunks * (qbytes + 2 * n_scales));
  // Huge pages where the matrix is large enough (core/large_buffer.h): the kernels stream it.
  p.data_ = allocate_large_array<uint8_t>(total);
  VESPER_CHECK(p.data_ != nullptr, "prepare_weights: cannot allocate %zu bytes", total);
  uint8_t* data = p.data_.get();
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
      f.pack(rows, data + c * qbytes, scales + c * n_scales);
    }
  }
  return p;
}

}  // namespace vesper::backend
