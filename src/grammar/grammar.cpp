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

Status check_left_recursion(const Grammar& g,
                            const std::function<std::string(uint32_t)>& rule_name) {
  const size_t n = g.rules.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (uint32_t a : g.rules[r].alternatives) {
        bool all = true;
        for (uint32_t p = a; g.elements[p].kind != Element::Kind::kEnd; ++p)
          if (g.elements[p].kind == Element::Kind::kBytes || !nullable[g.elements[p].value]) {
            all = false;
            break;
          }
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
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
