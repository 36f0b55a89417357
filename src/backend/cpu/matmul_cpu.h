// The CPU implementation of backend::matmul (backend/matmul.h): picks the kernel set once, at the
// first call, from runtime CPU detection (__builtin_cpu_supports); for integer-dot types quantizes
// the activation rows once per call (shared by all threads); and splits output features across
// the thread pool in contiguous ranges, one per thread.
//
// Exposed so tests and benchmarks can run a given instruction set; the model uses matmul.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/matmul_kernel.h"
#include "backend/matmul.h"
#include "backend/packed_weights.h"
#include "core/thread_pool.h"
#include "tensor/ggml_type.h"

namespace vesper::backend::cpu {

// Instruction sets, each a superset of the one before. An op without a kernel of its own for an
// instruction set runs the next lower one's (AVX-512 VNNI has packed q4_0 / q8_0 / k-quant matmul
// kernels; everything else there runs the AVX2 kernels).
enum class Isa {
  kScalar,      // portable C++ (matmul_scalar.cpp)
  kAvx2,        // AVX2 + FMA + F16C (*_avx2.cpp)
  kAvx512Vnni,  // and AVX-512 F/BW/VL + VNNI (*_avx512_vnni.cpp)
};

std::string_view isa_name(Isa isa);

// Whether this CPU can run kernels of `isa`.
bool isa_available(Isa isa);

// Every instruction set this CPU can run, portable first: what tests compare.
std::vector<Isa> available_isas();

// The environment variable that caps the instruction set selected_isa() picks, as oneDNN's
// ONEDNN_MAX_CPU_ISA: "scalar", "avx2" or "avx512_vnni" (isa_name's names); unset or empty: no
// cap. It lets one CPU run, and measure, the kernels a CPU without its best instruction set gets
// (bench/compare-llamacpp --isa); results are the same bits on every instruction set.
inline constexpr const char* kMaxIsaVariable = "VESPER_MAX_CPU_ISA";

// What is wrong with VESPER_MAX_CPU_ISA's value (naming the variable, the value and the names it
// takes), or "" when it is unset, empty or an instruction set's name. The CLI checks it before a
// command runs; selected_isa() stops the process with this message otherwise.
std::string max_isa_error();

// Whether VESPER_MAX_CPU_ISA holds selected_isa() below what this CPU can run.
bool isa_capped();

// The instruction set the kernels use (backend::matmul, attention, the KV codecs, the other ops):
// the best available, at most VESPER_MAX_CPU_ISA's, decided once per process.
Isa selected_isa();

// backend::matmul on the kernels of `isa`, which must be available.
void matmul_with_isa(Isa isa, tensor::GgmlType type, const void* w, int64_t n_in, int64_t n_out,
                     const float* x, int64_t n_rows, float* y, ThreadPool& pool);

// backend::matmul over packed weights (backend/packed_weights.h) on the kernels of `isa`.
void matmul_packed_with_isa(Isa isa, const PackedWeights& w, const float* x, int64_t n_rows,
                            float* y, ThreadPool& pool);

// backend::matmul over packed weights with a given packed kernel (MatmulKernel of
// matmul_kernel.h), for tests of kernels built outside the library (an emulated instruction set).
// The activations are quantized as on `activation_isa` (the same bits on every one).
void matmul_packed_with_kernel(Isa activation_isa, MatmulKernel kernel, const PackedWeights& w,
                               const float* x, int64_t n_rows, float* y, ThreadPool& pool);

// backend::matmul_group on the kernels of `isa`.
void matmul_group_with_isa(Isa isa, const MatmulTarget* targets, int n_targets, int64_t n_in,
                           const float* x, int64_t n_rows, ThreadPool& pool);

}  // namespace vesper::backend::cpu
