// What the files behind regex.h share with each other, and nothing else: the parsed regex (Node)
// and the operations that build it (regex_nodes.cpp), the parser (regex_parser.cpp), and code
// point sets written as GBNF items (regex_charsets.cpp); regex.cpp lowers the parsed regex to
// one GBNF expression.
// Internal to the regex converter: include it only from regex*.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "grammar/utf8_ranges.h"

namespace vesper::grammar::regex_detail {

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
inline constexpr uint32_t kUnbounded = UINT32_MAX;

// ---------------------------------------------------------------------------------------------
// The parsed regex (regex_nodes.cpp)

// A regex after parsing. kSet with no ranges matches nothing (an empty class); kEmpty matches
// the empty string.
struct Node {
  enum class Kind { kEmpty, kSet, kSeq, kAlt, kRepeat } kind = Kind::kEmpty;
  CodepointRanges set;         // kSet
  std::vector<Node> children;  // kSeq, kAlt; kRepeat: its one operand
  uint32_t min = 0, max = 0;   // kRepeat; max may be kUnbounded
};

Node set_node(CodepointRanges ranges);
Node char_node(uint32_t cp);
bool nullable(const Node& n);
Node alternation(std::vector<Node> alts);
// tree_size(non_empty(n)), without building it: a sequence of optional items becomes one
// alternative per item, each with a copy of the items after it (quadratic in the length).
size_t non_empty_size(const Node& n);
// x{min,max}, with the operand made non-empty: x{m,n} with x nullable is x'{0,n}.
Node make_repeat(Node x, uint32_t min, uint32_t max);

// ---------------------------------------------------------------------------------------------
// Parsing (regex_parser.cpp)

// One top-level alternative and its anchors.
struct TopAlternative {
  Node seq;
  bool anchored_start = false;
  bool anchored_end = false;
};

// The regex's top-level alternatives, or an error naming the construct and its 0-based
// position in code points (regex.h).
Result<std::vector<TopAlternative>> parse_regex(std::vector<uint32_t> cps);

// ---------------------------------------------------------------------------------------------
// Code point sets as GBNF (regex_charsets.cpp)

// A set of code points as one GBNF item: a literal for one code point, else the shorter of the
// class and its negation.
std::string plain_set_expression(const CodepointRanges& set);

}  // namespace vesper::grammar::regex_detail
