#include "grammar/stack_arena.h"

#include <algorithm>

namespace vesper::grammar {

StackArena::StackArena(const Grammar& g) : g_(g) {
  nodes_.push_back({0, 0});  // kEmpty
  nodes_.push_back({0, 0});  // kContext
  ids_.reserve(1 << 12);
}

uint32_t StackArena::push(uint32_t parent, uint32_t pos) {
  const uint64_t key = (uint64_t{pos} << 32) | parent;
  const auto [it, added] = ids_.try_emplace(key, static_cast<uint32_t>(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

uint32_t StackArena::intern(const Stack& stack) {
  uint32_t id = kEmpty;
  for (uint32_t pos : stack) id = push(id, pos);
  return id;
}

uint32_t StackArena::intern_top(const Stack& stack, size_t depth) {
  if (stack.size() <= depth) return intern(stack);
  uint32_t id = kContext;
  for (size_t i = stack.size() - depth; i < stack.size(); ++i) id = push(id, stack[i]);
  return id;
}

bool StackArena::takes_byte(const std::vector<uint32_t>& set, uint8_t byte) const {
  for (uint32_t id : set)
    if (id > kContext && g_.byte_sets[g_.elements[nodes_[id].pos].value].has(byte)) return true;
  return false;
}

// As stack_set.cpp's expand: to a byte element (or empty), through rule references and the ends
// of alternatives, never pushing a continuation that would only end its rule; the alternatives
// entered are counted the same way.
bool StackArena::expand(uint32_t start, std::vector<uint32_t>& out, size_t& explored, size_t max) {
  pending_.push_back(start);
  while (!pending_.empty()) {
    uint32_t id = pending_.back();
    pending_.pop_back();
    bool dead = false;
    while (id > kContext) {
      const Node node = nodes_[id];
      const Element& el = g_.elements[node.pos];
      if (el.kind == Element::Kind::kBytes) break;
      if (el.kind == Element::Kind::kEnd) {
        id = node.parent;
        continue;
      }
      const uint32_t base = g_.elements[node.pos + 1].kind != Element::Kind::kEnd
                                ? push(node.parent, node.pos + 1)
                                : node.parent;
      const std::vector<uint32_t>& alts = g_.rules[el.value].alternatives;
      explored += std::max<size_t>(alts.size(), 1);
      if (explored > max) {
        pending_.clear();
        return false;
      }
      if (alts.empty()) {
        dead = true;
        break;
      }
      for (size_t i = 0; i + 1 < alts.size(); ++i) pending_.push_back(push(base, alts[i]));
      id = push(base, alts.back());
    }
    if (!dead) out.push_back(id);
  }
  return true;
}

bool StackArena::advance(const std::vector<uint32_t>& set, uint8_t byte, std::vector<uint32_t>& out,
                         size_t max_stacks) {
  out.clear();
  size_t explored = 0;
  for (uint32_t id : set) {
    if (id <= kContext) continue;
    const Node node = nodes_[id];
    if (!g_.byte_sets[g_.elements[node.pos].value].has(byte)) continue;
    if (!expand(push(node.parent, node.pos + 1), out, explored, max_stacks)) return false;
  }
  if (out.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out.size() <= max_stacks;
}

}  // namespace vesper::grammar
