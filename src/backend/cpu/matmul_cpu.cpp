#include "backend/cpu/matmul_cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <optional>
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
  return isa == Isa::kScalar ? scalar_kernel(type) : avx2_kernel(type);
}

MatmulKernel packed_kernel_for(Isa isa, GgmlType type) {
  switch (isa) {
    case Isa::kScalar:
      return scalar_packed_kernel(type);
    case Isa::kAvx2:
      return avx2_packed_kernel(type);
    case Isa::kAvx512Vnni:
      if (MatmulKernel k = avx512_vnni_packed_kernel(type)) return k;
      return avx2_packed_kernel(type);
  }
  return nullptr;
}

// Activation rows quantized for the integer-dot kernels, owned by the thread that calls matmul
// and read by every pool thread during the call; one per activation layout a group of products
// can need. Each grows to the largest shape seen, then is reused.
Q8Buffer& caller_q8_buffer(int i) {
  thread_local Q8Buffer buffers[kMaxMatmulGroup];
  return buffers[i];
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
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512Vnni:
      return "avx512_vnni";
  }
  return "?";
}

#if defined(__x86_64__) || defined(__i386__)
namespace {

// F16C from CPUID leaf 1 directly: clang before 16 rejects "f16c" in __builtin_cpu_supports.
// Read once: CPUID is serializing, and in a virtual machine each one traps to the hypervisor
// (microseconds), while kernels ask isa_available on every call.
bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

}  // namespace
#endif

bool isa_available(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return avx2;
    case Isa::kAvx512Vnni:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == Isa::kScalar;
#endif
}

namespace {
constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni};  // portable first
}  // namespace

std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
  for (Isa isa : kAllIsas)
    if (isa_available(isa)) isas.push_back(isa);
  return isas;
}

namespace {

// VESPER_MAX_CPU_ISA's value when it is set and not empty.
std::optional<std::string_view> max_isa_value() {
  const char* v = std::getenv(kMaxIsaVariable);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string_view(v);
}

// The cap VESPER_MAX_CPU_ISA names (the best instruction set when it is unset); nullopt when it
// names none.
std::optional<Isa> max_isa() {
  const std::optional<std::string_view> value = max_isa_value();
  if (!value) return Isa::kAvx512Vnni;
  for (Isa isa : kAllIsas)
    if (*value == isa_name(isa)) return isa;
  return std::nullopt;
}

}  // namespace

std::string max_isa_error() {
  if (max_isa()) return "";
  std::string names;
  for (Isa isa : kAllIsas) names += (names.empty() ? "" : ", ") + std::string(isa_name(isa));
  return std::string(kMaxIsaVariable) + "=\"" + std::string(*max_isa_value()) +
         "\" is not an instruction set: expected one of " + names;
}

bool isa_capped() {
  return selected_isa() != available_isas().back();
}

Isa selected_isa() {
  static const Isa isa = [] {
    const std::optional<Isa> cap = max_isa();
    VESPER_CHECK(cap.has_value(), "%s", max_isa_error().c_str());
    Isa best = Isa::kScalar;
    for (Isa available : available_isas())
      if (available <= *cap) best = available;
    return best;
  }();
  return isa;
}

namespace {

// One product of a call: its kernel and arguments, and the activation layout the kernel reads
// (`quant`, and the row tile of Q8Rows::interleave).
struct Part {
  MatmulKernel kernel = nullptr;
  MatmulArgs args{};
  ActivationQuant quant = ActivationQuant::kNone;
  int64_t interleave = 1;
};

// Quantizes the activations of the parts (integer-dot kernels), once per distinct layout, and
// runs each part's kernel over its output features split across the pool, all parts in one pool
// job: the part of matmul shared by unpacked and packed weights and by groups of products. Every
// part reads the same x (n_rows rows of n_in).
void run_parts(Isa isa, Part* parts, int n_parts, ThreadPool& pool) {
  const bool avx2 = isa != Isa::kScalar;  // the AVX2 activation quantizer (same bits)
  const float* x = parts[0].args.x;
  const int64_t n_in = parts[0].args.n_in, n_rows = parts[0].args.n_rows;
  Q8Rows layouts[kMaxMatmulGroup];
  int n_layouts = 0;
  int64_t macs = 0;
  for (int i = 0; i < n_parts; ++i) {
    Part& p = parts[i];
    macs += n_in * p.args.n_out * n_rows;
    if (p.quant == ActivationQuant::kNone) continue;
    int k = 0;
    while (k < n_layouts && (layouts[k].format != p.quant || layouts[k].interleave != p.interleave))
      ++k;
    if (k == n_layouts)
      layouts[n_layouts++] = caller_q8_buffer(k).prepare(p.quant, n_in, n_rows, p.interleave);
    p.args.xq = &layouts[k];
  }
  // Small products run on the calling thread: waking the pool costs more than they do, and far
  // more when other processes share the cores. Each output's value is the same either way.
  constexpr int64_t kMinParallelMacs = int64_t{1} << 18;
  if (macs < kMinParallelMacs || pool.num_threads() == 1) {
    for (int k = 0; k < n_layouts; ++k) quantize_rows(layouts[k], x, 0, n_rows, avx2);
    for (int i = 0; i < n_parts; ++i)
      parts[i].kernel(parts[i].args, 0, parts[i].args.n_out, thread_scratch(n_in));
    return;
  }
  // Each part's output features in pieces of 32 (two 64-byte lines of a row of y, so threads never
  // share a line; whole pairs of the 8-feature groups that the wide kernels take two at a time),
  // the parts' pieces one after another, taken by the threads as ThreadPool::for_each_piece deals
  // them. Each output element is computed by exactly one thread, start to finish, so neither the
  // thread count nor which thread takes a piece can change its value. The lambdas capture one
  // pointer, small enough for std::function not to allocate.
  constexpr int64_t kPiece = 32;
  // Each row is quantized by itself, so splitting rows across threads changes nothing. Many rows
  // (prefill) are split as parallel_for splits them, in a job of their own. Fewer (decode
  // batches) are quantized in the pieces' job, before the pieces, 4 rows (a packed kernel's row
  // tile, whose blocks interleave: no two threads write one cache line of it) at a time per
  // layout: a job of their own would cost more than they take, and on the calling thread alone,
  // with the others idle, they took 4% of its time in a 110M model's decode step of 8 sequences,
  // most of it its stores waiting for the cache lines the other thread had read in the product
  // before.
  constexpr int64_t kQuantizeRows = 4;
  const bool quantize_first = n_rows * n_in < (int64_t{1} << 16);
  if (!quantize_first) {
    for (int k = 0; k < n_layouts; ++k) {
      const Q8Rows& xq = layouts[k];
      pool.parallel_for(static_cast<size_t>(n_rows), [&xq, x, avx2](size_t begin, size_t end) {
        quantize_rows(xq, x, static_cast<int64_t>(begin), static_cast<int64_t>(end), avx2);
      });
    }
  }
  struct Job {
    const Part* parts;
    int n_parts;
    int64_t first_piece[kMaxMatmulGroup + 1];  // part i's pieces are [first_piece[i], [i + 1])
    const Q8Rows* layouts;
    int64_t row_items;  // items of kQuantizeRows rows per layout
    const float* x;
    int64_t n_rows;
    bool avx2;
  } job{parts, n_parts, {}, layouts, (n_rows + kQuantizeRows - 1) / kQuantizeRows, x, n_rows, avx2};
  for (int i = 0; i < n_parts; ++i)
    job.first_piece[i + 1] = job.first_piece[i] + (parts[i].args.n_out + kPiece - 1) / kPiece;
  const Job* const jp = &job;
  const auto quantize = [jp](int64_t item) {
    const int64_t r = item % jp->row_items * kQuantizeRows;
    quantize_rows(jp->layouts[item / jp->row_items], jp->x, r,
                  std::min(jp->n_rows, r + kQuantizeRows), jp->avx2);
  };
  pool.for_each_piece(quantize_first ? n_layouts * job.row_items : 0, quantize,
                      job.first_piece[n_parts], [jp](int64_t piece) {
                        int i = 0;
                        while (piece >= jp->first_piece[i + 1]) ++i;
                        const Part& p = jp->parts[i];
                        const int64_t begin = (piece - jp->first_piece[i]) * kPiece;
                        p.kernel(p.args, begin, std::min(p.args.n_out, begin + kPiece),
                                 thread_scratch(p.args.n_in));
                      });
}

// The part that computes y = W x for weights in place; checks what matmul's callers may get
// wrong.
Part unpacked_part(Isa isa, GgmlType type, const void* w, int64_t n_in, int64_t n_out,
                   const float* x, int64_t n_rows, float* y) {
  Part p;
  p.kernel = kernel_for(isa, type);
  VESPER_CHECK(p.kernel != nullptr, "matmul: unsupported weight type %s",
               tensor::type_name(type).data());
  const int64_t block = tensor::traits(type).block_size;
  VESPER_CHECK(
      n_in > 0 && n_in % block == 0, "matmul: n_in %lld is not a positive multiple of %lld (%s)",
      static_cast<long long>(n_in), static_cast<long long>(block), tensor::type_name(type).data());
  VESPER_CHECK(n_out >= 0 && n_rows >= 0);
  p.args = MatmulArgs{
      static_cast<const uint8_t*>(w), tensor::row_size(type, n_in), n_in, n_out, x, n_rows, y};
  p.quant = matmul_activation_quant(type);
  return p;
}

// The part that computes y = W x for packed weights.
Part packed_part(Isa isa, const PackedWeights& w, const float* x, int64_t n_rows, float* y) {
  VESPER_CHECK(!w.empty(), "matmul: empty packed weights");
  Part p;
  p.kernel = packed_kernel_for(isa, w.type());
  VESPER_CHECK(p.kernel != nullptr);
  VESPER_CHECK(n_rows >= 0);
  p.args = MatmulArgs{w.quants(), 0, w.n_in(), w.n_out(), x, n_rows, y};
  p.args.w_scales = w.scales();
  p.quant = matmul_activation_quant(w.type());
  p.interleave = kPackedRowTile;
  return p;
}

}  // namespace

void matmul_with_isa(Isa isa, GgmlType type, const void* w, int64_t n_in, int64_t n_out,
                     const float* x, int64_t n_rows, float* y, ThreadPool& pool) {
  VESPER_CHECK(isa_available(isa), "matmul: instruction set %s not available",
               isa_name(isa).data());
  Part part = unpacked_part(isa, type, w, n_in, n_out, x, n_rows, y);
  if (n_out == 0 || n_rows == 0) return;
  run_parts(isa, &part, 1, pool);
}

void matmul_packed_with_isa(Isa isa, const PackedWeights& w, const float* x, int64_t n_rows,
                            float* y, ThreadPool& pool) {
  VESPER_CHECK(isa_available(isa), "matmul: instruction set %s not available",
               isa_name(isa).data());
  Part part = packed_part(isa, w, x, n_rows, y);
  if (n_rows == 0) return;
  run_parts(isa, &part, 1, pool);
}

void matmul_packed_with_kernel(Isa activation_isa, MatmulKernel kernel, const PackedWeights& w,
                               const float* x, int64_t n_rows, float* y, ThreadPool& pool) {
  VESPER_CHECK(isa_available(activation_isa));
  Part part = packed_part(activation_isa, w, x, n_rows, y);
  part.kernel = kernel;
  if (n_rows == 0) return;
  run_parts(activation_isa, &part, 1, pool);
}

void matmul_group_with_isa(Isa isa, const MatmulTarget* targets, int n_targets, int64_t n_in,
                           const float* x, int64_t n_rows, ThreadPool& pool) {
  VESPER_CHECK(isa_available(isa), "matmul: instruction set %s not available",
               isa_name(isa).data());
  VESPER_CHECK(n_targets >= 1 && n_targets <= kMaxMatmulGroup, "matmul_group: %d targets (1 to %d)",
               n_targets, kMaxMatmulGroup);
  Part parts[kMaxMatmulGroup];
  int n_parts = 0;
  for (int i = 0; i < n_targets; ++i) {
    const MatmulTarget& t = targets[i];
    if (t.packed != nullptr) {
      VESPER_CHECK(t.packed->n_in() == n_in, "matmul_group: target %d has n_in %lld, not %lld", i,
                   static_cast<long long>(t.packed->n_in()), static_cast<long long>(n_in));
      parts[n_parts] = packed_part(isa, *t.packed, x, n_rows, t.y);
    } else {
      parts[n_parts] = unpacked_part(isa, t.type, t.w, n_in, t.n_out, x, n_rows, t.y);
    }
    if (parts[n_parts].args.n_out > 0) ++n_parts;
  }
  if (n_parts == 0 || n_rows == 0) return;
  run_parts(isa, parts, n_parts, pool);
}

}  // namespace cpu

void matmul_group(const MatmulTarget* targets, int n_targets, int64_t n_in, const float* x,
                  int64_t n_rows, ThreadPool& pool) {
  cpu::matmul_group_with_isa(cpu::selected_isa(), targets, n_targets, n_in, x, n_rows, pool);
}

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
    case tensor::GgmlType::kQ2_K:
    case tensor::GgmlType::kQ3_K:
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
