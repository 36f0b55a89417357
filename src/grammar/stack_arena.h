// StackArena: the matcher's stacks as hash-consed linked nodes, for the hot loop of computing a
// state's allowed tokens (a walk of the whole vocabulary trie that advances the stacks by one
// byte per trie node). A stack is the id of its top node (0 is the empty stack); a push is a
// lookup, a pop is following the parent, and equal stacks have equal ids, so a stack set is a
// sorted vector of ids and nothing is copied or allocated per byte once the arena is warm.
// Same semantics as stack_set.h (the stack sets it builds are the same, as ids).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/stack_set.h"

namespace vesper::grammar {

class StackArena {
 public:
  explicit StackArena(const Grammar& g);

  static constexpr uint32_t kEmpty = 0;
  // The bottom of a stack cut to its top elements: popping to it means the rest of the input
  // belongs to the part cut off (the context), which this walk does not know.
  static constexpr uint32_t kContext = 1;

  // The id of `stack` (bottom first, as Stack holds it).
  uint32_t intern(const Stack& stack);
  // The id of `stack`'s top `depth` elements over kContext (the whole stack when it is not
  // deeper than that).
  uint32_t intern_top(const Stack& stack, size_t depth);
  // Whether some stack of `set` takes `byte` next.
  bool takes_byte(const std::vector<uint32_t>& set, uint8_t byte) const;
  // `set` after `byte`, into `out` (sorted, unique; empty when no stack takes it). A stack
  // that pops into its context appears as kContext; kContext itself takes no bytes. False when
  // the step exceeds `max_stacks`, counted as stack_set.h counts it (`out` is then
  // unspecified); a stack cut to its top explores no more than the whole stack would.
  bool advance(const std::vector<uint32_t>& set, uint8_t byte, std::vector<uint32_t>& out,
               size_t max_stacks = SIZE_MAX);

 private:
  struct Node {
    uint32_t pos;
    uint32_t parent;
  };
  uint32_t push(uint32_t parent, uint32_t pos);
  bool expand(uint32_t id, std::vector<uint32_t>& out, size_t& explored, size_t max);

  const Grammar& g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> ids_;
  std::vector<uint32_t> pending_;  // expand's worklist, kept to reuse its memory
};

}  // namespace vesper::grammar
