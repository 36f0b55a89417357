// The AVX-512 paged-attention kernel: the walk of cpu/attention_walk.h over the AVX-512 tile
// (cpu/attention_avx512_tile.h). It matches paged_attention_scalar bit for bit.
//
// GCC 12's avx512fintrin.h draws false -Wmaybe-uninitialized warnings (-Wuninitialized in the
// ThreadSanitizer build's flags) from its _mm512_undefined_* (GCC bug 105593, fixed in 13) where
// vectors are cast, inserted or shuffled, as in matmul_packed_avx512_vnni.cpp; -Werror would make
// that a build failure.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "backend/cpu/attention_avx512_tile.h"
#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/attention_walk.h"

namespace vesper::backend::cpu {

void paged_attention_avx512(const AttentionArgs& args, int64_t begin, int64_t end, float* scratch) {
  attend_items<Avx512Tile>(args, begin, end, scratch);
}

}  // namespace vesper::backend::cpu
