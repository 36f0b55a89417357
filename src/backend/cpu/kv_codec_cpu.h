// Per-ISA encoders of KIVI groups (kv_codec.h's rule): KvCache quantizes a group's residual rows
// through the best one available. Every one gives the portable encoder's bytes (decode_kv_row of
// the f16 rows, then encode_kv_group), bit for bit.
#pragma once

#include <cstddef>

#include "backend/kv_cache_spec.h"

namespace vesper::backend::cpu {

// Encodes one head's group of `dtype` (kivi2 / kivi4) on `side` from its spec.block_size residual
// rows (f16, rows[i] the i-th token's) into group[spec.group_bytes(dtype, side)]. AVX2 + F16C;
// only callable on a CPU that has them.
void encode_kivi_group_avx2(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                            const std::byte* const* rows, std::byte* group);

}  // namespace vesper::backend::cpu
