// The host's int8 multiply-add peak, measured at run time: the yardstick the matmul benchmarks
// state their efficiency against (issue: "each kernel's achieved fraction of the measured peak").
//
// The peak is a loop of independent integer dot-product instructions on registers, with no loads,
// run on `threads` threads at once for a fixed time: the instructions the kernels' inner loops
// are built on, at the rate the cores can issue them.
// Which one: the instruction set the kernels run on (backend::cpu::selected_isa(), so
// VESPER_MAX_CPU_ISA=avx2 measures the AVX2 kernels against the AVX2 peak).
//  - AVX-512 VNNI: vpdpbusd on zmm registers (64 u8 x s8 products summed into 16 int32 lanes).
//  - AVX2 (no VNNI): vpmaddubsw, then vpmaddwd against ones, then vpaddd (32 products per
//    three instructions), llama.cpp's AVX2 dot.
#pragma once

#include <string>

namespace vesper::bench {

struct Int8Peak {
  double macs_per_second = 0;  // int8 multiply-adds a second, all threads together
  std::string instruction;     // "vpdpbusd zmm" or "vpmaddubsw+vpmaddwd ymm"
};

// Measures it now, on `threads` threads, for about 0.2 s. The matmul benchmarks call it right
// after their own timed loop, so that the product and the peak see the same machine load (these
// machines are shared).
Int8Peak measure_int8_peak(int threads);

}  // namespace vesper::bench
