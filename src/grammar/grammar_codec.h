// The binary form of a Grammar (core/byte_stream.h), so that a constraint can travel with a step
// plan to a runner in another thread or process, which compiles it against its own vocabulary.
// Reading checks every index (rules, byte sets, alternative starts), so a corrupt message is an
// error, never a grammar that walks out of its arrays.
#pragma once

#include "core/byte_stream.h"
#include "core/result.h"
#include "grammar/grammar.h"

namespace vesper::grammar {

void write_grammar(ByteWriter& w, const Grammar& g);
Result<Grammar> read_grammar(ByteReader& r);

}  // namespace vesper::grammar
