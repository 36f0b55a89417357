#include "backend/cpu/matmul_cpu.h"

#include <vector>

#include "backend/cpu/matmul_kernel.h"
#include "backend/matmul.h"
#include "backend/packed_weights.h"
#include "core/check.h"

namespace vesper::backend {
namespace cpu {
namespace {

using tensor::GgmlType;

MatmulKernel avx2_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return matmul_f32_avx2;
    case GgmlType::kF16:
      return matmul_f16_avx2;
    case GgmlType::kBF16:
      return matmul_bf16_avx2;
    case GgmlType::kQ4_0:
      return matmul_q4_0_avx2;
    case GgmlType::kQ4_1:
      return matmul_q4_1_avx2;
    case GgmlType::kQ5_0:
      return matmul_q5_0_avx2;
    case GgmlType::kQ5_1:
      return matmul_q5_1_avx2;
    case GgmlType::kQ8_0:
      return matmul_q8_0_avx2;
    case GgmlType::kQ2_K:
      return matmul_q2_k_avx2;
    case GgmlType::kQ3_K:
      return matmul_q3_k_avx2;
    case GgmlType::kQ4_K:
      return matmul_q4_k_avx2;
    case GgmlType::kQ5_K:
      return matmul_q5_k_avx2;
    case GgmlType::kQ6_K:
      return matmul_q6_k_avx2;
    case GgmlType::kQ8_K:
      return matmul_q8_k_avx2;
    default:
      return nullptr;
  }
}

MatmulKernel kernel_for(Isa isa, GgmlType type) {
  return isa == Isa::kAvx2 ? avx2_kernel(type) : scalar_kernel(type);
}

// Activation rows quantized for the integer-dot kernels, owned by the thread that calls matmul
// and read by every pool thread during the call. Grows to the largest shape seen, then is reused.
Q8Buffer& caller_q8_buffer() {
  thread_local Q8Buffer buffer;
  return buffer;
}

// Per-thread decode buffer. It grows to the largest n_in seen and is then reused, so steady-state
// calls do not allocate.
float* thread_scratch(int64_t n_in) {
  thread_local std::vector<float> scratch;
  const size_t need = kernel_scratch_floats(n_in);
  if (scratch.size() < need) scratch.resize(need);
  return scratch.data();
}

}  // namespace

std::string_view isa_name(Isa isa) {
  return isa == Isa::kAvx2 ? "avx2" : "scalar";
}

bool isa_available(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
#if defined(__x86_64__) || defined(__i386__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
  }
  return false;
}

Isa selected_isa() {
  static const Isa isa = isa_available(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar;
  return isa;
}

namespace {

// Quantizes the activations (integer-dot kernels) and runs `kernel` over output features split
// across the pool: the part of matmul shared by unpacked and packed weights. `interleave` is the
// activation rows' tile (Q8Rows::interleave) the kernel reads.
void run_kernel(Isa isa, MatmulKernel kernel, MatmulArgs& args, ActivationQuant quant,
                int64_t interleave, ThreadPool& pool) {
  const bool avx2 = isa == Isa::kAvx2;
  const float* x = args.x;
  const int64_t n_in = args.n_in, n_out = args.n_out, n_rows = args.n_rows;
  Q8Rows xq;
  if (quant != ActivationQuant::kNone) {
    xq = caller_q8_buffer().prepare(quant, n_in, n_rows, interleave);
    args.xq = &xq;
  }
  // Small products run on the calling thread: waking the pool costs more than they do, and far
  // more when other processes share the cores. Each output's value is the same either way.
  constexpr int64_t kMinParallelMacs = int64_t{1} << 18;
  if (n_in * n_out * n_rows < kMinParallelMacs || pool.num_threads() == 1) {
    if (args.xq != nullptr) quantize_rows(xq, x, 0, n_rows, avx2);
    kernel(args, 0, n_out, thread_scratch(n_in));
    return;
  }
  // Each row is quantized by itself, so splitting rows across threads changes nothing.
  if (args.xq != nullptr) {
    if (n_rows * n_in < (int64_t{1} << 16)) {
      quantize_rows(xq, x, 0, n_rows, avx2);
    } else {
      pool.parallel_for(static_cast<size_t>(n_rows), [&xq, x, avx2](size_t begin, size_t end) {
        quantize_rows(xq, x, static_cast<int64_t>(begin), static_cast<int64_t>(end), avx2);
      });
    }
  }
  // Contiguous ranges of output features, one per thread: each output element is computed by
  // exactly one thread, start to finish, so the thread count cannot change its value. Ranges are
  // whole multiples of 16 features (a 64-byte line of y) so threads never share a line of a row
  // of y. The lambda captures two pointers, small enough for std::function not to allocate.
  struct Job {
    MatmulKernel kernel;
    const MatmulArgs* args;
  } job{kernel, &args};
  pool.run([&job](int thread, int n_threads) {
    constexpr int64_t kAlign = 16;
    const int64_t n = job.args->n_out;
    const int64_t per_thread = ((n + n_threads - 1) / n_threads + kAlign - 1) / kAlign * kAlign;
    const int64_t begin = per_thread * thread;
    const int64_t end = begin + per_thread < n ? begin + per_thread : n;
    if (begin >= end) return;
    job.kernel(*job.args, begin, end, thread_scratch(job.args->n_in));
  });
}

}  // namespace

void matmul_with_isa(Isa isa, GgmlType type, const void* w, int64_t n_in, int64_t n_out,
                     const float* x, int64_t n_rows, float* y, ThreadPool& pool) {
  VESPER_CHECK(isa_available(isa), "matmul: instruction set %s not available",
               isa_name(isa).data());
  const MatmulKernel kernel = kernel_for(isa, type);
  VESPER_CHECK(kernel != nullptr, "matmul: unsupported weight type %s",
               tensor::type_name(type).data());
  const int64_t block = tensor::traits(type).block_size;
  VESPER_CHECK(
      n_in > 0 && n_in % block == 0, "matmul: n_in %lld is not a positive multiple of %lld (%s)",
      static_cast<long long>(n_in), static_cast<long long>(block), tensor::type_name(type).data());
  VESPER_CHECK(n_out >= 0 && n_rows >= 0);
  if (n_out == 0 || n_rows == 0) return;

  MatmulArgs args{
      static_cast<const uint8_t*>(w), tensor::row_size(type, n_in), n_in, n_out, x, n_rows, y};
  run_kernel(isa, kernel, args, matmul_activation_quant(type), 1, pool);
}

void matmul_packed_with_isa(Isa isa, const PackedWeights& w, const float* x, int64_t n_rows,
                            float* y, ThreadPool& pool) {
  VESPER_CHECK(isa_available(isa), "matmul: instruction set %s not available",
               isa_name(isa).data());
  VESPER_CHECK(!w.empty(), "matmul: empty packed weights");
  const MatmulKernel kernel =
      isa == Isa::kAvx2 ? avx2_packed_kernel(w.type()) : scalar_packed_kernel(w.type());
  VESPER_CHECK(kernel != nullptr);
  VESPER_CHECK(n_rows >= 0);
  if (n_rows == 0) return;
  MatmulArgs args{w.quants(), 0, w.n_in(), w.n_out(), x, n_rows, y};
  args.w_scales = w.scales();
  run_kernel(isa, kernel, args, matmul_activation_quant(w.type()), kPackedRowTile, pool);
}

}  // namespace cpu

void matmul(const PackedWeights& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool) {
  cpu::matmul_packed_with_isa(cpu::selected_isa(), w, x, n_rows, y, pool);
}

void matmul(tensor::GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x,
            int64_t n_rows, float* y, ThreadPool& pool) {
  cpu::matmul_with_isa(cpu::selected_isa(), type, w, n_in, n_out, x, n_rows, y, pool);
}

ActivationQuant matmul_activation_quant(tensor::GgmlType type) {
  switch (type) {
    case tensor::GgmlType::kQ4_0:
    case tensor::GgmlType::kQ5_0:
    case tensor::GgmlType::kQ8_0:
      return ActivationQuant::kQ8_0;
    case tensor::GgmlType::kQ4_K:
    case tensor::GgmlType::kQ5_K:
    case tensor::GgmlType::kQ6_K:
      return ActivationQuant::kQ8_K;
    default:
      return ActivationQuant::kNone;
  }
}

bool matmul_supported(tensor::GgmlType type) {
  return cpu::scalar_kernel(type) != nullptr;
}

}  // namespace vesper::backend
