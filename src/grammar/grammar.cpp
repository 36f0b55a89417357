#include "grammar/grammar.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "grammar/stack_set.h"

namespace vesper::grammar {

bool Grammar::matches(std::string_view text) const {
  StackSet stacks = initial_stacks(*this);
  for (unsigned char c : text) {
    stacks = advance_stacks(*this, stacks, c);
    if (stacks.empty()) return false;
  }
  return is_accepting(stacks);
}

std::vector<bool> nullable_rules(const Grammar& g) {
  const size_t n = g.rules.size();
  std::vector<bool> nullable(n, false);
  // Per alternative, its rule references not yet known nullable; an alternative with a byte
  // element never becomes nullable. A rule found nullable settles the alternatives that use it,
  // once per use, so the whole takes one pass over the elements.
  std::vector<uint32_t> alt_rule, pending;
  std::vector<std::vector<uint32_t>> uses(n);
  std::vector<uint32_t> queue;
  for (uint32_t r = 0; r < n; ++r)
    for (uint32_t a : g.rules[r].alternatives) {
      const auto alt = static_cast<uint32_t>(alt_rule.size());
      uint32_t refs = 0;
      bool bytes = false;
      for (uint32_t p = a; g.elements[p].kind != Element::Kind::kEnd; ++p) {
        if (g.elements[p].kind == Element::Kind::kBytes) {
          bytes = true;
          break;
        }
        ++refs;
      }
      alt_rule.push_back(r);
      pending.push_back(bytes ? UINT32_MAX : refs);
      if (bytes) continue;
      for (uint32_t p = a; g.elements[p].kind != Element::Kind::kEnd; ++p)
        uses[g.elements[p].value].push_back(alt);
      if (refs == 0 && !nullable[r]) {
        nullable[r] = true;
        queue.push_back(r);
      }
    }
  while (!queue.empty()) {
    const uint32_t q = queue.back();
    queue.pop_back();
    for (uint32_t alt : uses[q]) {
      if (--pending[alt] != 0) continue;
      const uint32_t r = alt_rule[alt];
      if (!nullable[r]) {
        nullable[r] = true;
        queue.push_back(r);
      }
    }
  }
  return nullable;
}

Status check_left_recursion(const Grammar& g,
                            const std::function<std::string(uint32_t)>& rule_name) {
  const size_t n = g.rules.size();
  const std::vector<bool> nullable = nullable_rules(g);
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r)
    for (uint32_t a : g.rules[r].alternatives)
      for (uint32_t p = a; g.elements[p].kind == Element::Kind::kRule; ++p) {
        left[r].push_back(g.elements[p].value);
        if (!nullable[g.elements[p].value]) break;
      }
  // Depth-first search for a cycle: 0 unvisited, 1 on the path, 2 done.
  std::vector<uint8_t> mark(n, 0);
  std::vector<std::pair<uint32_t, size_t>> stack;
  for (uint32_t start = 0; start < n; ++start) {
    if (mark[start] != 0) continue;
    stack.push_back({start, 0});
    mark[start] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i == left[r].size()) {
        mark[r] = 2;
        stack.pop_back();
        continue;
      }
      const uint32_t next = left[r][i++];
      if (mark[next] == 1) return make_error("rule '" + rule_name(next) + "' is left-recursive");
      if (mark[next] == 0) {
        mark[next] = 1;
        stack.push_back({next, 0});
      }
    }
  }
  return {};
}

}  // namespace vesper::grammar
