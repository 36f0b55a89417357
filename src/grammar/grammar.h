// Grammar: a context-free grammar over bytes, the form every constraint (GBNF, JSON schema,
// regex, choice lists) is compiled to before decoding.
//
// Elements live in one flat array. A rule is a list of alternatives; an alternative is a run of
// elements ending in an kEnd element. A position (an index into `elements`) inside an
// alternative is where a match can stand: the matcher keeps stacks of positions (matcher.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace vesper::grammar {

// A set of bytes: bit b of words[b / 64].
struct ByteSet {
  std::array<uint64_t, 4> words = {};
  bool has(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  enum class Kind : uint8_t { kEnd, kBytes, kRule };
  Kind kind = Kind::kEnd;
  uint32_t value = 0;  // kBytes: index into Grammar::byte_sets; kRule: index into Grammar::rules
};

struct Rule {
  std::string name;                    // as written; helper rules get "name-N"
  std::vector<uint32_t> alternatives;  // start positions in Grammar::elements
};

struct Grammar {
  std::vector<Element> elements;
  std::vector<ByteSet> byte_sets;
  std::vector<Rule> rules;
  uint32_t root = 0;  // index of the rule `root`

  // Whether the whole of `text` is in the language (a slow, direct check used by tests).
  bool matches(std::string_view text) const;
};

// Whether each rule can match the empty string (linear in the grammar's size).
std::vector<bool> nullable_rules(const Grammar& g);

// An error naming (through `rule_name`) a rule reachable from itself without consuming a byte:
// left recursion, which the stack matcher cannot run (it would expand it forever).
Status check_left_recursion(const Grammar& g,
                            const std::function<std::string(uint32_t)>& rule_name);

}  // namespace vesper::grammar
