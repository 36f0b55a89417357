#include "int8_peak.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace vesper::bench {
namespace {

// Iterations of the unrolled body between clock reads.
constexpr int kInner = 1 << 16;

// 12 independent accumulators: enough to cover the instruction's latency on every core measured
// (4-5 cycles at 2 per cycle), so the loop runs at issue rate.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) long long vnni_loop(double seconds) {
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  __m512i acc[12];
  for (__m512i& r : acc) r = _mm512_setzero_si512();
  long long bodies = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < kInner; ++i) {
      for (__m512i& r : acc) r = _mm512_dpbusd_epi32(r, a, b);
      // Keep the compiler from folding the loop: the accumulators stay live in registers.
      for (__m512i& r : acc) __asm__ volatile("" : "+v"(r));
    }
    bodies += kInner;
  }
  __m512i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  alignas(64) int lanes[16];
  _mm512_store_si512(lanes, sum);
  volatile int sink = lanes[0];
  (void)sink;
  return bodies * 12 * 64;
}

__attribute__((target("avx2"))) long long avx2_loop(double seconds) {
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
  __m256i acc[8];
  for (__m256i& r : acc) r = _mm256_setzero_si256();
  long long bodies = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < kInner; ++i) {
      for (__m256i& r : acc)
        r = _mm256_add_epi32(r, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
      for (__m256i& r : acc) __asm__ volatile("" : "+x"(r));
    }
    bodies += kInner;
  }
  __m256i sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm256_add_epi32(sum, acc[i]);
  volatile int sink = _mm256_extract_epi32(sum, 0);
  (void)sink;
  return bodies * 8 * 32;
}

}  // namespace

Int8Peak measure_int8_peak(int threads) {
  const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
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
