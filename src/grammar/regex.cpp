// Regex -> GBNF (regex.h): the entry points, and the lowering of the parsed regex
// (regex_internal.h) to one GBNF expression with as few parentheses as the precedence needs.
// Parsing is in regex_parser.cpp, the tree's operations in regex_nodes.cpp, characters and
// their spellings in regex_charsets.cpp.
#include "grammar/regex.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/regex_internal.h"

namespace vesper::grammar {
namespace regex_detail {
namespace {

// Items of a GBNF expression, for deciding where parentheses go.
enum class Prec { kAtom, kSeq, kAlt };
struct Emitted {
  std::string text;
  Prec prec = Prec::kAtom;
};

std::string parenthesized(const Emitted& e, Prec at_most) {
  return e.prec <= at_most ? e.text : "(" + e.text + ")";
}

class Emitter {
 public:
  explicit Emitter(bool json_string) : json_string_(json_string) {}

  Emitted emit(const Node& n) const {
    switch (n.kind) {
      case Node::Kind::kEmpty:
        return {"\"\"", Prec::kAtom};
      case Node::Kind::kSet:
        return {set_expression(n.set), Prec::kAtom};
      case Node::Kind::kSeq:
        return emit_seq(n.children);
      case Node::Kind::kAlt: {
        std::string text;
        for (const Node& c : n.children) {
          if (!text.empty()) text += " | ";
          text += emit(c).text;
        }
        return {text, Prec::kAlt};
      }
      case Node::Kind::kRepeat: {
        const Emitted x = emit(n.children.front());
        return {parenthesized(x, Prec::kAtom) + repeat_suffix(n.min, n.max), Prec::kSeq};
      }
    }
    return {};
  }

 private:
  static std::string repeat_suffix(uint32_t min, uint32_t max) {
    if (max == kUnbounded) {
      if (min == 0) return "*";
      if (min == 1) return "+";
      return "{" + std::to_string(min) + ",}";
    }
    if (min == 0 && max == 1) return "?";
    if (min == max) return "{" + std::to_string(min) + "}";
    return "{" + std::to_string(min) + "," + std::to_string(max) + "}";
  }

  std::string set_expression(const CodepointRanges& set) const {
    return json_string_ ? json_string_char_expression(set) : plain_set_expression(set);
  }

  // Runs of single characters become one literal.
  Emitted emit_seq(const std::vector<Node>& items) const {
    std::vector<Emitted> parts;
    std::string run;  // raw text of the current run of single characters
    auto flush = [&] {
      if (run.empty()) return;
      parts.push_back({gbnf_literal(run), Prec::kAtom});
      run.clear();
    };
    for (const Node& item : items) {
      if (item.kind == Node::Kind::kEmpty) continue;
      if (item.kind == Node::Kind::kSet && item.set.size() == 1 &&
          item.set[0].first == item.set[0].second) {
        if (json_string_)
          append_json_string_char(item.set[0].first, run);
        else
          append_utf8(item.set[0].first, run);
        continue;
      }
      flush();
      const Emitted e = emit(item);
      parts.push_back({parenthesized(e, Prec::kSeq), std::min(e.prec, Prec::kSeq)});
    }
    flush();
    if (parts.empty()) return {"\"\"", Prec::kAtom};
    if (parts.size() == 1) return parts.front();
    std::string text;
    for (const Emitted& p : parts) text += (text.empty() ? "" : " ") + p.text;
    return {text, Prec::kSeq};
  }

  bool json_string_;
};

}  // namespace
}  // namespace regex_detail

using regex_detail::alternation;
using regex_detail::Emitter;
using regex_detail::kMaxCodepoint;
using regex_detail::kUnbounded;
using regex_detail::make_repeat;
using regex_detail::Node;
using regex_detail::parse_regex;
using regex_detail::set_node;
using regex_detail::TopAlternative;

Result<std::string> regex_to_gbnf_expression(std::string_view regex) {
  return regex_to_gbnf_expression(regex, RegexOptions{});
}

Result<std::string> regex_to_gbnf_expression(std::string_view regex, const RegexOptions& options) {
  auto cps = decode_utf8(regex);
  if (!cps) return make_error("regex: not valid UTF-8");
  VESPER_ASSIGN_OR_RETURN(std::vector<TopAlternative> top, parse_regex(std::move(*cps)));
  // Search semantics: an unanchored end matches any text there.
  const Node any_text = make_repeat(set_node({{0, kMaxCodepoint}}), 0, kUnbounded);
  std::vector<Node> alts;
  for (TopAlternative& alt : top) {
    if (!options.search || (alt.anchored_start && alt.anchored_end)) {
      alts.push_back(std::move(alt.seq));
      continue;
    }
    Node seq;
    seq.kind = Node::Kind::kSeq;
    if (!alt.anchored_start) seq.children.push_back(any_text);
    seq.children.push_back(std::move(alt.seq));
    if (!alt.anchored_end) seq.children.push_back(any_text);
    alts.push_back(std::move(seq));
  }
  return Emitter(options.json_string).emit(alternation(std::move(alts))).text;
}

Result<std::string> regex_to_gbnf(std::string_view regex) {
  VESPER_ASSIGN_OR_RETURN(std::string expr, regex_to_gbnf_expression(regex));
  return "root ::= " + expr + "\n";
}

}  // namespace vesper::grammar
