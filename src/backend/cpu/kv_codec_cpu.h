// Per-ISA encoders of KV cache rows and KIVI groups (kv_codec.h's rules): KvCache writes f16 rows
// and quantizes a group's residual rows through the best one available. Every one gives the
// portable encoder's bytes (encode_kv_row; decode_kv_row of the f16 rows, then encode_kv_group),
// bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/kv_cache_spec.h"

namespace vesper::backend::cpu {

// encode_kv_row(KvDtype::kF16, x, n, row): n elements to f16 by F16C (round to nearest even, as
// f32_to_fp16), a NaN stored as f32_to_fp16 stores it (its sign, quiet, no payload). AVX2 + F16C;
// only callable on a CPU that has them.
void encode_f16_row_avx2(const float* x, int64_t n, std::byte* row);

// Encodes one head's group of `dtype` (kivi2 / kivi4) on `side` from its spec.block_size residual
// rows (f16, rows[i] the i-th token's) into group[spec.group_bytes(dtype, side)]. AVX2 + F16C;
// only callable on a CPU that has them.
void encode_kivi_group_avx2(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                            const std::byte* const* rows, std::byte* group);

}  // namespace vesper::backend::cpu
