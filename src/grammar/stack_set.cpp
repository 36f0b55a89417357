#include "grammar/stack_set.h"

#include <algorithm>

namespace vesper::grammar {
namespace {

// Moves every stack to a byte element (or to empty), following rule references and the ends
// of alternatives. Terminates because left recursion is refused when the grammar is built.
void expand(const Grammar& g, Stack stack, StackSet& out) {
  while (!stack.empty()) {
    const uint32_t pos = stack.back();
    const Element& el = g.elements[pos];
    if (el.kind == Element::Kind::kBytes) break;
    stack.pop_back();
    if (el.kind == Element::Kind::kEnd) continue;
    if (g.elements[pos + 1].kind != Element::Kind::kEnd) stack.push_back(pos + 1);
    const std::vector<uint32_t>& alts = g.rules[el.value].alternatives;
    for (size_t i = 0; i + 1 < alts.size(); ++i) {
      Stack branch = stack;
      branch.push_back(alts[i]);
      expand(g, std::move(branch), out);
    }
    if (alts.empty()) return;
    stack.push_back(alts.back());
  }
  out.push_back(std::move(stack));
}

void canonicalize(StackSet& s) {
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
}

}  // namespace

StackSet initial_stacks(const Grammar& g) {
  StackSet out;
  for (uint32_t a : g.rules[g.root].alternatives) expand(g, Stack{a}, out);
  canonicalize(out);
  return out;
}

bool takes_byte(const Grammar& g, const StackSet& stacks, uint8_t byte) {
  for (const Stack& s : stacks)
    if (!s.empty() && g.byte_sets[g.elements[s.back()].value].has(byte)) return true;
  return false;
}

StackSet advance_stacks(const Grammar& g, const StackSet& stacks, uint8_t byte) {
  StackSet out;
  for (const Stack& s : stacks) {
    if (s.empty() || !g.byte_sets[g.elements[s.back()].value].has(byte)) continue;
    Stack next = s;
    next.back() += 1;
    expand(g, std::move(next), out);
  }
  canonicalize(out);
  return out;
}

bool is_accepting(const StackSet& stacks) {
  return !stacks.empty() && stacks.front().empty();
}

bool can_continue(const StackSet& stacks) {
  return !stacks.empty() && !stacks.back().empty();
}

}  // namespace vesper::grammar
