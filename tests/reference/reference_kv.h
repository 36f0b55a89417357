// Test oracle for backend/kv_codec.h: the KV cache's element encodings written from their
// definitions (kv_codec.h's header comment), sharing no code with src/backend/: fp8 values from
// the format's bit fields, the nearest fp8 code found by searching all 256, f16 scales rounded up
// by searching the f16 values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/kv_cache_spec.h"

namespace vesper::reference {

// The exact value of fp8 code `code` (e4m3: bias 7, no infinities; e5m2: bias 15).
double fp8_value(uint8_t code, bool e4m3);

// The row encode_kv_row must write for x[0..n): elements, then metadata.
std::vector<std::byte> encode_kv_row(backend::KvDtype dtype, const float* x, int64_t n);

// The row encode_fp8_row_scaled must write for x[0..n) against the f16 scale `scale_bits`
// (fp8 types only).
std::vector<std::byte> encode_fp8_row_scaled(backend::KvDtype dtype, const float* x, int64_t n,
                                             uint16_t scale_bits);

// The exact values of a row's n elements, in f64.
std::vector<double> decode_kv_row(backend::KvDtype dtype, const std::byte* row, int64_t n);

// The KIVI group encode_kv_group must write for x[g][d] (kv_codec.h's layout), and the exact
// values [g][d] a group's elements decode to (q * scale + zero, in f64).
std::vector<std::byte> encode_kivi_group(backend::KvDtype dtype, backend::KvSide side,
                                         const float* x, int64_t g, int64_t d);
std::vector<double> decode_kivi_group(backend::KvDtype dtype, backend::KvSide side,
                                      const std::byte* group, int64_t g, int64_t d);

}  // namespace vesper::reference
