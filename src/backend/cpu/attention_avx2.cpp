// The AVX2 + FMA paged-attention kernel: the walk of cpu/attention_walk.h over the AVX2 tile
// (cpu/attention_avx2_tile.h). It matches paged_attention_scalar bit for bit.
#include "backend/cpu/attention_avx2_tile.h"
#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/attention_walk.h"

namespace vesper::backend::cpu {

void paged_attention_avx2(const AttentionArgs& args, int64_t begin, int64_t end, float* scratch) {
  attend_items<Avx2Tile>(args, begin, end, scratch);
}

}  // namespace vesper::backend::cpu
