// The pushdown matcher's state: a set of stacks of grammar positions (llama.cpp's approach).
//
// A stack's top (its back) is the position of a byte element waiting for input; the positions
// below it are where each enclosing rule continues once the one above it ends. An empty stack
// means the root rule has been matched completely. A set holds every way the input so far can
// be read (the grammar may be ambiguous), sorted and without duplicates so equal states compare
// equal. Continuations that would only end their rule are never pushed (a tail call), so
// right-recursive repetition keeps the stacks flat.
//
// An ambiguous grammar can make the sets grow without bound (`s ::= "a" s "b" | "a" s "c" | ""`
// doubles them with every "a"), so the steps that serve decoding take a bound, `max_stacks`:
// a step fails (returns false) when it explores more than that many alternatives or leaves more
// than that many stacks. The count depends only on the stacks and the byte, so the same input
// always fails at the same byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "grammar/grammar.h"

namespace vesper::grammar {

using Stack = std::vector<uint32_t>;
using StackSet = std::vector<Stack>;

// The state before any input: the root rule's alternatives, expanded (unbounded).
StackSet initial_stacks(const Grammar& g);
// The state after one more byte (empty when the byte cannot come next; unbounded).
StackSet advance_stacks(const Grammar& g, const StackSet& stacks, uint8_t byte);
// The same within `max_stacks` (above): false when the step exceeds it (`out` is then
// unspecified).
bool initial_stacks(const Grammar& g, size_t max_stacks, StackSet& out);
bool advance_stacks(const Grammar& g, const StackSet& stacks, uint8_t byte, size_t max_stacks,
                    StackSet& out);
// Whether any stack's top takes `byte` (the cheap test before advance_stacks).
bool takes_byte(const Grammar& g, const StackSet& stacks, uint8_t byte);
// The input so far is a complete match of the root rule.
bool is_accepting(const StackSet& stacks);
// More input can follow.
bool can_continue(const StackSet& stacks);

}  // namespace vesper::grammar
