#include "int8_peak.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "backend/cpu/matmul_cpu.h"

namespace vesper::bench {
namespace {

// Iterations of the unrolled body between clock reads.
constexpr int kInner = 1 << 16;

// 12 independent accumulators: enough to cover the instruction's latency on every core measured
// (4-5 cycles at 2 per cycle), so the loop runs at issue rate. They are named variables, bound to
// registers by one asm statement a body: an array walked by a loop (the first version of this
// file) made GCC keep them on the stack, so each instruction waited on a store and a load and the
// "peak" came out at a third of what the q4_0 kernel reaches on AMD Zen 5.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) long long vnni_loop(double seconds) {
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  __m512i r0 = _mm512_setzero_si512(), r1 = r0, r2 = r0, r3 = r0, r4 = r0, r5 = r0, r6 = r0,
          r7 = r0, r8 = r0, r9 = r0, r10 = r0, r11 = r0;
  long long bodies = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < kInner; ++i) {
      r0 = _mm512_dpbusd_epi32(r0, a, b);
      r1 = _mm512_dpbusd_epi32(r1, a, b);
      r2 = _mm512_dpbusd_epi32(r2, a, b);
      r3 = _mm512_dpbusd_epi32(r3, a, b);
      r4 = _mm512_dpbusd_epi32(r4, a, b);
      r5 = _mm512_dpbusd_epi32(r5, a, b);
      r6 = _mm512_dpbusd_epi32(r6, a, b);
      r7 = _mm512_dpbusd_epi32(r7, a, b);
      r8 = _mm512_dpbusd_epi32(r8, a, b);
      r9 = _mm512_dpbusd_epi32(r9, a, b);
      r10 = _mm512_dpbusd_epi32(r10, a, b);
      r11 = _mm512_dpbusd_epi32(r11, a, b);
      // Keeps the compiler from folding the loop; the accumulators stay in registers.
      __asm__ volatile(""
                       : "+v"(r0), "+v"(r1), "+v"(r2), "+v"(r3), "+v"(r4), "+v"(r5), "+v"(r6),
                         "+v"(r7), "+v"(r8), "+v"(r9), "+v"(r10), "+v"(r11));
    }
    bodies += kInner;
  }
  const __m512i sum = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(r0, r1), _mm512_add_epi32(r2, r3)),
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(r4, r5), _mm512_add_epi32(r6, r7)),
                       _mm512_add_epi32(_mm512_add_epi32(r8, r9), _mm512_add_epi32(r10, r11))));
  alignas(64) int lanes[16];
  _mm512_store_si512(lanes, sum);
  volatile int sink = lanes[0];
  (void)sink;
  return bodies * 12 * 64;
}

// llama.cpp's AVX2 int8 dot step, with r itself as the unsigned operand: each accumulator's
// products then depend on its own last value, so no two accumulators share a product the compiler
// could compute once (with a loop-invariant operand pair it computed one product an iteration and
// only the adds ran). The chain is vpmaddubsw + vpmaddwd + vpaddd long; 12 of them cover its
// latency at 2 multiplies a cycle, in the 16 registers AVX2 has.
__attribute__((target("avx2"))) inline __m256i dot(__m256i r, __m256i b, __m256i ones) {
  return _mm256_add_epi32(r, _mm256_madd_epi16(_mm256_maddubs_epi16(r, b), ones));
}

__attribute__((target("avx2"))) long long avx2_loop(double seconds) {
  const __m256i b = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
  __m256i r0 = _mm256_set1_epi8(3), r1 = r0, r2 = r0, r3 = r0, r4 = r0, r5 = r0, r6 = r0, r7 = r0,
          r8 = r0, r9 = r0, r10 = r0, r11 = r0;
  long long bodies = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < kInner; ++i) {
      r0 = dot(r0, b, ones);
      r1 = dot(r1, b, ones);
      r2 = dot(r2, b, ones);
      r3 = dot(r3, b, ones);
      r4 = dot(r4, b, ones);
      r5 = dot(r5, b, ones);
      r6 = dot(r6, b, ones);
      r7 = dot(r7, b, ones);
      r8 = dot(r8, b, ones);
      r9 = dot(r9, b, ones);
      r10 = dot(r10, b, ones);
      r11 = dot(r11, b, ones);
      __asm__ volatile(""
                       : "+x"(r0), "+x"(r1), "+x"(r2), "+x"(r3), "+x"(r4), "+x"(r5), "+x"(r6),
                         "+x"(r7), "+x"(r8), "+x"(r9), "+x"(r10), "+x"(r11));
    }
    bodies += kInner;
  }
  const __m256i sum = _mm256_add_epi32(
      _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(r0, r1), _mm256_add_epi32(r2, r3)),
                       _mm256_add_epi32(_mm256_add_epi32(r4, r5), _mm256_add_epi32(r6, r7))),
      _mm256_add_epi32(_mm256_add_epi32(r8, r9), _mm256_add_epi32(r10, r11)));
  volatile int sink = _mm256_extract_epi32(sum, 0);
  (void)sink;
  return bodies * 12 * 32;
}

}  // namespace

Int8Peak measure_int8_peak(int threads) {
  // The instruction the kernels in use are built on (VESPER_MAX_CPU_ISA=avx2 measures AVX2's).
  const bool vnni = backend::cpu::selected_isa() == backend::cpu::Isa::kAvx512Vnni;
  constexpr double kSeconds = 0.2;
  std::vector<long long> macs(static_cast<size_t>(threads), 0);
  std::vector<std::thread> workers;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&macs, t, vnni] {
      macs[static_cast<size_t>(t)] = vnni ? vnni_loop(kSeconds) : avx2_loop(kSeconds);
    });
  for (std::thread& w : workers) w.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long long total = 0;
  for (long long m : macs) total += m;
  return {static_cast<double>(total) / elapsed, vnni ? "vpdpbusd zmm" : "vpmaddubsw+vpmaddwd ymm"};
}

}  // namespace vesper::bench
