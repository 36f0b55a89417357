// The CPU implementation of backend::paged_attention (backend/paged_attention.h): picks the kernel
// once, from the same runtime CPU detection as matmul (cpu/matmul_cpu.h), and splits work items
// ((token, KV head) pairs) across the thread pool in contiguous ranges of equal cost.
//
// Exposed so tests and benchmarks can run a given instruction set; the model uses
// paged_attention.h.
#pragma once

#include <cstdint>

#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/matmul_cpu.h"
#include "backend/kv_cache.h"
#include "backend/paged_attention.h"
#include "core/thread_pool.h"

namespace vesper::backend::cpu {

// backend::paged_attention on the kernel of `isa`, which must be available.
void paged_attention_with_isa(Isa isa, const KvCache& cache, int64_t layer,
                              const AttentionBatch& batch, const float* q, int64_t n_heads,
                              float scale, float* out, ThreadPool& pool);

// The kernel paged_attention_with_isa runs for `isa` (which must be available): the portable one,
// AVX2's, or on AVX-512 VNNI hosts the AVX-512 one (which needs AVX-512 F alone).
AttentionKernel attention_kernel(Isa isa);

// backend::paged_attention on a given kernel (tests run a kernel built on SIMDe through it).
void paged_attention_with_kernel(AttentionKernel kernel, const KvCache& cache, int64_t layer,
                                 const AttentionBatch& batch, const float* q, int64_t n_heads,
                                 float scale, float* out, ThreadPool& pool);

}  // namespace vesper::backend::cpu
