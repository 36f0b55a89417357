// The AVX-512 attention tile (backend/cpu/attention_avx512_tile.h) built on SIMDe instead of the
// instructions, so that its logic is tested bit for bit against the portable kernel on any AVX2
// machine (attention_test.cpp). Compiled with -mavx2 -mfma -mf16c and -ffp-contract=off only:
// SIMDe's native aliases give the tile's _mm512_* names and types, implemented on pairs of AVX2
// vectors (its 512-bit FMA is two 256-bit FMAs, so every lane rounds as the instruction does).
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include "backend/cpu/attention_avx512_tile.h"
#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/attention_walk.h"

namespace vesper::backend::cpu {

void emulated_paged_attention_avx512(const AttentionArgs& args, int64_t begin, int64_t end,
                                     float* scratch) {
  attend_items<Avx512Tile>(args, begin, end, scratch);
}

}  // namespace vesper::backend::cpu
