// The binary form of SamplingParams (core/byte_stream.h): a step plan brings each new sequence's
// parameters to its runner, which may live in another thread or process. A structured-output
// grammar travels as its Grammar; the reader compiles it with the caller's `GrammarCompiler`
// (against the receiving runner's vocabulary).
#pragma once

#include <functional>
#include <memory>

#include "core/byte_stream.h"
#include "core/result.h"
#include "grammar/compiled_grammar.h"
#include "sample/sampling_params.h"

namespace vesper::sample {

using GrammarCompiler =
    std::function<std::shared_ptr<const grammar::CompiledGrammar>(grammar::Grammar)>;

void write_sampling_params(ByteWriter& w, const SamplingParams& p);
// Errors for corrupt bytes, and for a grammar when `compile` is empty.
Status read_sampling_params(ByteReader& r, SamplingParams& p, const GrammarCompiler& compile);

// Every field equal (grammars by content): what a round trip through bytes keeps.
bool same_sampling_params(const SamplingParams& a, const SamplingParams& b);

}  // namespace vesper::sample
