#include "grammar/stack_set.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/check.h"

namespace vesper::grammar {
namespace {

// Moves `stack` to byte elements (or to empty), following rule references and the ends of
// alternatives, appending what it reaches to `out`. Terminates because left recursion is
// refused when the grammar is built. `explored` counts the alternatives entered (a rule without
// any counts one); false once it passes `max`. A worklist rather than recursion: a chain of
// rules whose first alternatives lead into each other can be as long as the grammar.
bool expand(const Grammar& g, Stack stack, StackSet& out, size_t& explored, size_t max,
            std::vector<Stack>& pending) {
  for (;;) {
    bool dead = false;
    while (!stack.empty()) {
      const uint32_t pos = stack.back();
      const Element& el = g.elements[pos];
      if (el.kind == Element::Kind::kBytes) break;
      stack.pop_back();
      if (el.kind == Element::Kind::kEnd) continue;
      if (g.elements[pos + 1].kind != Element::Kind::kEnd) stack.push_back(pos + 1);
      const std::vector<uint32_t>& alts = g.rules[el.value].alternatives;
      explored += std::max<size_t>(alts.size(), 1);
      if (explored > max) {
        pending.clear();
        return false;
      }
      if (alts.empty()) {
        dead = true;
        break;
      }
      // The first alternative now, the others later in order (the output comes out nearly
      // sorted, as canonicalize likes it).
      for (size_t i = alts.size() - 1; i > 0; --i) {
        pending.push_back(stack);
        pending.back().push_back(alts[i]);
      }
      stack.push_back(alts.front());
    }
    if (!dead) out.push_back(std::move(stack));
    if (pending.empty()) return true;
    stack = std::move(pending.back());
    pending.pop_back();
  }
}

// expand's worklist, one per thread, kept so that a step allocates no more than the stacks it
// makes (it is empty between steps).
std::vector<Stack>& expand_worklist() {
  thread_local std::vector<Stack> pending;
  return pending;
}

void canonicalize(StackSet& s) {
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
}

}  // namespace

bool initial_stacks(const Grammar& g, size_t max_stacks, StackSet& out) {
  out.clear();
  size_t explored = 0;
  std::vector<Stack>& pending = expand_worklist();
  for (uint32_t a : g.rules[g.root].alternatives)
    if (!expand(g, Stack{a}, out, explored, max_stacks, pending)) return false;
  canonicalize(out);
  return out.size() <= max_stacks;
}

StackSet initial_stacks(const Grammar& g) {
  StackSet out;
  VESPER_CHECK(initial_stacks(g, SIZE_MAX, out));
  return out;
}

bool takes_byte(const Grammar& g, const StackSet& stacks, uint8_t byte) {
  for (const Stack& s : stacks)
    if (!s.empty() && g.byte_sets[g.elements[s.back()].value].has(byte)) return true;
  return false;
}

bool advance_stacks(const Grammar& g, const StackSet& stacks, uint8_t byte, size_t max_stacks,
                    StackSet& out) {
  out.clear();
  size_t explored = 0;
  std::vector<Stack>& pending = expand_worklist();
  for (const Stack& s : stacks) {
    if (s.empty() || !g.byte_sets[g.elements[s.back()].value].has(byte)) continue;
    Stack next = s;
    next.back() += 1;
    if (!expand(g, std::move(next), out, explored, max_stacks, pending)) return false;
  }
  canonicalize(out);
  return out.size() <= max_stacks;
}

StackSet advance_stacks(const Grammar& g, const StackSet& stacks, uint8_t byte) {
  StackSet out;
  VESPER_CHECK(advance_stacks(g, stacks, byte, SIZE_MAX, out));
  return out;
}

bool is_accepting(const StackSet& stacks) {
  return !stacks.empty() && stacks.front().empty();
}

bool can_continue(const StackSet& stacks) {
  return !stacks.empty() && !stacks.back().empty();
}

}  // namespace vesper::grammar
