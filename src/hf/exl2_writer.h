// `vesper quantize DIR --to exl2 --bits B [--head-bits H] -o OUTDIR`: a Hugging Face checkpoint
// written as an EXL2 checkpoint (exllamav2's tensor names, dtypes, shapes and packing; see
// exl2_format.h and exl2_pack.h).
//
// Bit allocation, by measured error (a simpler search than exllamav2's): every linear layer of
// the blocks gets one of a ladder of plans, from 2 to 8 bits: one width throughout, or the more
// important half of its input rows one step wider. Each plan's error is measured on the layer
// itself: the squared reconstruction error of round-to-nearest quantization, weighted per input
// row by that row's importance, relative to the layer's weighted squared norm. With calibration
// (`--calibration FILE`: Exl2WriteOptions::input_energy, measured by model/calibration.h), a
// row's importance is the mean square of its input on the calibration text, which makes the
// weighted error the layer's expected output error on that text (cross terms between inputs
// left out). Without it, importance is the row's squared norm across outputs (the weights stand
// in for the activations). Starting from the narrowest plan everywhere, the layer whose next plan
// buys the most error reduction per extra bit moves up, until the average bits per weight (scales
// included) reaches B. Act order sorts each layer's input rows by importance, most important first,
// so the wider groups take them, as exllamav2 does. lm_head gets H bits (default 6) in 32-row
// groups. Embeddings and norms keep their stored dtype (exllamav2 casts them to f16 at load).
//
// Memory: the checkpoint stays mapped; a layer is widened to f32 only while a thread measures or
// quantizes it, so the writer holds at most one layer in f32 per thread beside the packed output.
//
// A layer whose input count is not a multiple of 32 (stories260K's 172-wide down projection)
// cannot be packed into EXL2 groups: it is written unquantized, as a plain .weight in its stored
// dtype, which Vesper loads and exllamav2 does not. The writer says so for each such layer.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/thread_pool.h"

namespace vesper::hf {

struct Exl2WriteOptions {
  double bits = 4.0;       // target average bits per weight over the blocks' linear layers
  double head_bits = 6.0;  // lm_head (rounded to a supported width)
  // Calibration: per GGUF weight name ("blk.0.attn_q.weight"), the mean square of each input
  // channel over the calibration tokens (model::InputEnergy). Empty: no calibration. When set,
  // every quantized block layer must have an entry of its input count.
  std::map<std::string, std::vector<double>> input_energy;
  std::string calibration;  // what config.json says of it ("FILE: N tokens in chunks of C")
};

struct Exl2WriteReport {
  double bits = 0.0;     // the average reached, scales included
  int layers = 0;        // quantized linear layers (lm_head included)
  int plain_layers = 0;  // written unquantized (input count not a multiple of 32)
};

// Writes the checkpoint in `in_dir` (f32/f16/bf16 weights) as EXL2 into `out_dir` (created;
// config.json gains quantization_config, the tokenizer files are copied). `progress`, if given,
// gets what is being done to which layer as it starts ("measuring ..." then "quantizing ..."),
// one call at a time. Layers are measured and quantized on `pool`'s threads, each layer on one
// (the result does not depend on the thread count). Errors name the file and the fault.
Result<Exl2WriteReport> write_exl2_checkpoint(
    const std::string& in_dir, const std::string& out_dir, const Exl2WriteOptions& options,
    ThreadPool& pool, const std::function<void(const std::string&)>& progress = {});

}  // namespace vesper::hf
