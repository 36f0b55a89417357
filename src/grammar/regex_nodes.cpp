// The parsed regex's tree (regex_internal.h): building nodes, and the rewriting (non_empty) that
// keeps repetition operands from matching the empty string.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "grammar/regex_internal.h"

namespace vesper::grammar::regex_detail {
namespace {

Node nothing() {
  return set_node({});
}
bool is_nothing(const Node& n) {
  return n.kind == Node::Kind::kSet && n.set.empty();
}

// The language of `n` without the empty string. Repetition operands must not match the empty
// string: GBNF's x* is the rule `s ::= x s |` , left-recursive when x can match nothing.
Node non_empty(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kEmpty:
      return nothing();
    case Node::Kind::kSet:
      return n;
    case Node::Kind::kAlt: {
      std::vector<Node> alts;
      for (const Node& c : n.children) {
        Node ne = non_empty(c);
        if (!is_nothing(ne)) alts.push_back(std::move(ne));
      }
      return alts.empty() ? nothing() : alternation(std::move(alts));
    }
    case Node::Kind::kSeq: {
      if (!nullable(n)) return n;
      // Every item can be empty: a non-empty match has a first item that is not.
      std::vector<Node> alts;
      for (size_t i = 0; i < n.children.size(); ++i) {
        Node first = non_empty(n.children[i]);
        if (is_nothing(first)) continue;
        Node seq;
        seq.kind = Node::Kind::kSeq;
        seq.children.push_back(std::move(first));
        for (size_t j = i + 1; j < n.children.size(); ++j) seq.children.push_back(n.children[j]);
        alts.push_back(seq.children.size() == 1 ? std::move(seq.children.front()) : std::move(seq));
      }
      return alts.empty() ? nothing() : alternation(std::move(alts));
    }
    case Node::Kind::kRepeat: {
      if (n.min > 0) return n;  // its operand is non-empty (make_repeat), so is every match
      Node r = n;
      r.min = 1;
      return r;
    }
  }
  return nothing();
}

size_t tree_size(const Node& n) {
  size_t size = 1;
  for (const Node& c : n.children) size += tree_size(c);
  return size;
}

}  // namespace

Node set_node(CodepointRanges ranges) {
  Node n;
  n.kind = Node::Kind::kSet;
  n.set = normalize(std::move(ranges));
  return n;
}
Node char_node(uint32_t cp) {
  return set_node({{cp, cp}});
}

bool nullable(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kEmpty:
      return true;
    case Node::Kind::kSet:
      return false;
    case Node::Kind::kSeq:
      for (const Node& c : n.children)
        if (!nullable(c)) return false;
      return true;
    case Node::Kind::kAlt:
      for (const Node& c : n.children)
        if (nullable(c)) return true;
      return false;
    case Node::Kind::kRepeat:
      return n.min == 0 || nullable(n.children.front());
  }
  return false;
}

Node alternation(std::vector<Node> alts) {
  if (alts.size() == 1) return std::move(alts.front());
  Node n;
  n.kind = Node::Kind::kAlt;
  n.children = std::move(alts);
  return n;
}

size_t non_empty_size(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kAlt: {
      size_t size = 1;
      for (const Node& c : n.children) size += non_empty_size(c);
      return size;
    }
    case Node::Kind::kSeq: {
      if (!nullable(n)) return tree_size(n);
      std::vector<size_t> suffix(n.children.size() + 1, 0);
      for (size_t i = n.children.size(); i-- > 0;)
        suffix[i] = suffix[i + 1] + tree_size(n.children[i]);
      size_t size = 1;
      for (size_t i = 0; i < n.children.size(); ++i)
        size += 1 + non_empty_size(n.children[i]) + suffix[i + 1];
      return size;
    }
    default:
      return tree_size(n);
  }
}

Node make_repeat(Node x, uint32_t min, uint32_t max) {
  if (max == 0) return Node{};
  if (nullable(x)) {
    x = non_empty(x);
    min = 0;
  }
  if (is_nothing(x)) return min == 0 ? Node{} : nothing();
  if (min == 1 && max == 1) return x;
  Node r;
  r.kind = Node::Kind::kRepeat;
  r.children.push_back(std::move(x));
  r.min = min;
  r.max = max;
  return r;
}

}  // namespace vesper::grammar::regex_detail
