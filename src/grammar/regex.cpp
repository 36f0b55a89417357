#include "grammar/regex.h"

#include <algorithm>
#include <utility>

#include "grammar/gbnf.h"

namespace vesper::grammar {
namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr uint32_t kUnbounded = UINT32_MAX;
// The GBNF parser's own cap on a repetition count; a larger one could not be written anyway.
constexpr uint32_t kMaxRepetition = 10000;
// Groups nest by recursion in the parser and the emitter: bound it.
constexpr int kMaxGroupDepth = 200;
// Repeating a run of optional items expands it (non_empty): bound the nodes that creates.
constexpr size_t kMaxExpandedNodes = 1'000'000;

// A regex after parsing. kSet with no ranges matches nothing (an empty class); kEmpty matches
// the empty string.
struct Node {
  enum class Kind { kEmpty, kSet, kSeq, kAlt, kRepeat } kind = Kind::kEmpty;
  CodepointRanges set;         // kSet
  std::vector<Node> children;  // kSeq, kAlt; kRepeat: its one operand
  uint32_t min = 0, max = 0;   // kRepeat; max may be kUnbounded
};

Node set_node(CodepointRanges ranges) {
  Node n;
  n.kind = Node::Kind::kSet;
  n.set = normalize(std::move(ranges));
  return n;
}
Node char_node(uint32_t cp) {
  return set_node({{cp, cp}});
}
Node nothing() {
  return set_node({});
}
bool is_nothing(const Node& n) {
  return n.kind == Node::Kind::kSet && n.set.empty();
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

// tree_size(non_empty(n)), without building it: a sequence of optional items becomes one
// alternative per item, each with a copy of the items after it (quadratic in the length).
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

// x{min,max}, with the operand made non-empty: x{m,n} with x nullable is x'{0,n}.
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

CodepointRanges intersect(const CodepointRanges& a, const CodepointRanges& b) {
  CodepointRanges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first);
    const uint32_t hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.push_back({lo, hi});
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return out;
}

const CodepointRanges& digit_set() {
  static const CodepointRanges s = {{'0', '9'}};
  return s;
}
const CodepointRanges& word_set() {
  static const CodepointRanges s = normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
  return s;
}
// ECMAScript's WhiteSpace and LineTerminator code points.
const CodepointRanges& space_set() {
  static const CodepointRanges s = normalize({{0x09, 0x0D},
                                              {0x20, 0x20},
                                              {0xA0, 0xA0},
                                              {0x1680, 0x1680},
                                              {0x2000, 0x200A},
                                              {0x2028, 0x2029},
                                              {0x202F, 0x202F},
                                              {0x205F, 0x205F},
                                              {0x3000, 0x3000},
                                              {0xFEFF, 0xFEFF}});
  return s;
}

// Code points that may stand raw between a JSON string's quotes (the `char` rule of
// json_schema.h: not ", not \, not a control character, not U+007F).
const CodepointRanges& json_raw_set() {
  static const CodepointRanges s =
      normalize({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}, {0x80, kMaxCodepoint}});
  return s;
}

char hex_digit(uint32_t v) {
  return "0123456789abcdef"[v & 15];
}

std::string hex(uint32_t v, int digits) {
  std::string s(static_cast<size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, v >>= 4)
    s[static_cast<size_t>(i)] = "0123456789ABCDEF"[v & 15];
  return s;
}

// One code point inside a GBNF class.
void append_class_char(uint32_t cp, std::string& out) {
  switch (cp) {
    case '\\':
    case ']':
    case '[':
    case '-':
    case '^':
    case '"':
      out += '\\';
      out += static_cast<char>(cp);
      return;
    default:
      break;
  }
  if (cp < 0x20 || cp == 0x7F) {
    out += "\\x" + hex(cp, 2);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp <= 0xFFFF) {
    out += "\\u" + hex(cp, 4);
  } else {
    out += "\\U" + hex(cp, 8);
  }
}

std::string literal_of(const std::vector<uint32_t>& cps) {
  std::string bytes;
  for (uint32_t cp : cps) append_utf8(cp, bytes);
  return gbnf_literal(bytes);
}

// A set of code points as one GBNF item: a literal for one code point, else the shorter of the
// class and its negation.
std::string plain_set_expression(const CodepointRanges& set) {
  if (set.empty()) return "[]";
  if (set.size() == 1 && set[0].first == set[0].second) return literal_of({set[0].first});
  const CodepointRanges negated = complement(set);
  if (negated.empty()) return ".";  // every code point
  const bool negate = negated.size() < set.size();
  const CodepointRanges& ranges = negate ? negated : set;
  std::string out = negate ? "[^" : "[";
  for (auto [lo, hi] : ranges) {
    append_class_char(lo, out);
    if (hi == lo) continue;
    if (hi > lo + 1) out += '-';
    append_class_char(hi, out);
  }
  return out + "]";
}

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

// One top-level alternative and its anchors.
struct TopAlternative {
  Node seq;
  bool anchored_start = false;
  bool anchored_end = false;
};

class RegexParser {
 public:
  explicit RegexParser(std::vector<uint32_t> cps) : s_(std::move(cps)) {}

  Result<std::vector<TopAlternative>> parse() {
    std::vector<TopAlternative> alts;
    for (;;) {
      TopAlternative alt;
      VESPER_ASSIGN_OR_RETURN(alt.seq, parse_sequence(0, &alt));
      alts.push_back(std::move(alt));
      if (at('|')) {
        ++pos_;
        continue;
      }
      if (at(')')) return invalid("unbalanced ')'", pos_);
      break;
    }
    return alts;
  }

 private:
  bool at(uint32_t c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool at(size_t p, uint32_t c) const { return p < s_.size() && s_[p] == c; }

  static Error invalid(const std::string& what, size_t pos) {
    return make_error("regex: " + what + " at position " + std::to_string(pos));
  }
  static Error unsupported(const std::string& what, size_t pos) {
    return make_error("regex: " + what + " at position " + std::to_string(pos) +
                      " is not supported");
  }

  std::string text(size_t from, size_t to) const {
    std::string out;
    for (size_t i = from; i < to && i < s_.size(); ++i) append_utf8(s_[i], out);
    return out;
  }

  static bool is_digit(uint32_t c) { return c >= '0' && c <= '9'; }
  static int hex_value(uint32_t c) {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
    return -1;
  }

  Result<Node> parse_alternation(int depth) {
    std::vector<Node> alts;
    for (;;) {
      VESPER_ASSIGN_OR_RETURN(Node seq, parse_sequence(depth, nullptr));
      alts.push_back(std::move(seq));
      if (!at('|')) break;
      ++pos_;
    }
    return alternation(std::move(alts));
  }

  // Items up to '|', ')' or the end. `top`: the regex's own alternatives, where anchors may
  // stand at the ends.
  Result<Node> parse_sequence(int depth, TopAlternative* top) {
    Node seq;
    seq.kind = Node::Kind::kSeq;
    while (pos_ < s_.size() && !at('|') && !at(')')) {
      const size_t start = pos_;
      const uint32_t c = s_[pos_];
      if (c == '^') {
        if (top == nullptr || !seq.children.empty() || top->anchored_start)
          return unsupported("anchor ^ (allowed only at the start of the regex)", start);
        top->anchored_start = true;
        ++pos_;
        continue;
      }
      if (c == '$') {
        if (top == nullptr || !(pos_ + 1 == s_.size() || at(pos_ + 1, '|')))
          return unsupported("anchor $ (allowed only at the end of the regex)", start);
        top->anchored_end = true;
        ++pos_;
        continue;
      }
      Node atom;
      if (c == '(') {
        VESPER_ASSIGN_OR_RETURN(atom, parse_group(depth));
      } else if (c == '[') {
        VESPER_ASSIGN_OR_RETURN(CodepointRanges set, parse_class());
        atom = set_node(std::move(set));
      } else if (c == '.') {
        ++pos_;
        atom = set_node(complement({{'\n', '\n'}}));
      } else if (c == '\\') {
        VESPER_ASSIGN_OR_RETURN(CodepointRanges set, parse_escape(false));
        atom = set_node(std::move(set));
      } else if (c == '*' || c == '+' || c == '?' || (c == '{' && quantifier_at(pos_))) {
        return invalid("quantifier '" + quantifier_text(pos_) + "' with nothing to repeat", start);
      } else {
        ++pos_;
        atom = char_node(c);
      }
      VESPER_ASSIGN_OR_RETURN(atom, parse_quantifiers(std::move(atom)));
      seq.children.push_back(std::move(atom));
    }
    if (seq.children.size() == 1) return std::move(seq.children.front());
    if (seq.children.empty()) return Node{};
    return seq;
  }

  struct Quantifier {
    uint32_t min = 0, max = 0;
    size_t end = 0;  // position after it
  };

  // {m} {m,} {m,n} at `p` (counts unchecked), or nullopt when `{` there is a literal.
  std::optional<Quantifier> quantifier_at(size_t p) const {
    if (!at(p, '{')) return std::nullopt;
    size_t q = p + 1;
    auto number = [&](uint32_t& v) {
      const size_t from = q;
      uint64_t n = 0;
      while (q < s_.size() && is_digit(s_[q])) {
        n = std::min<uint64_t>(n * 10 + (s_[q] - '0'), uint64_t{kUnbounded} - 1);
        ++q;
      }
      v = static_cast<uint32_t>(n);
      return q > from;
    };
    Quantifier r;
    if (!number(r.min)) return std::nullopt;
    r.max = r.min;
    if (at(q, ',')) {
      ++q;
      r.max = kUnbounded;
      if (q < s_.size() && is_digit(s_[q]) && !number(r.max)) return std::nullopt;
    }
    if (!at(q, '}')) return std::nullopt;
    r.end = q + 1;
    return r;
  }

  std::string quantifier_text(size_t p) const {
    if (auto q = quantifier_at(p)) return text(p, q->end);
    return text(p, p + 1);
  }

  Result<Node> parse_quantifiers(Node atom) {
    if (pos_ >= s_.size()) return atom;
    const size_t start = pos_;
    const uint32_t c = s_[pos_];
    uint32_t min = 0, max = 0;
    if (c == '*') {
      min = 0, max = kUnbounded, ++pos_;
    } else if (c == '+') {
      min = 1, max = kUnbounded, ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (auto q = quantifier_at(pos_)) {
      const std::string written = text(pos_, q->end);
      for (uint32_t count : {q->min, q->max})
        if (count != kUnbounded && count > kMaxRepetition)
          return invalid(
              "repetition count in " + written + " above " + std::to_string(kMaxRepetition), start);
      if (q->max < q->min) return invalid("quantifier " + written + " with min > max", start);
      min = q->min, max = q->max, pos_ = q->end;
    } else {
      return atom;
    }
    const std::string written = text(start, pos_);
    if (nullable(atom)) {
      expanded_nodes_ += non_empty_size(atom);
      if (expanded_nodes_ > kMaxExpandedNodes)
        return unsupported(
            "repetition " + written + " of a long run of optional items (too large once expanded)",
            start);
    }
    if (at('?')) {
      ++pos_;  // lazy: matches the same strings
    } else if (at('+')) {
      return unsupported("possessive quantifier " + written + "+", start);
    }
    if (pos_ < s_.size() &&
        (s_[pos_] == '*' || s_[pos_] == '+' || s_[pos_] == '?' || quantifier_at(pos_)))
      return invalid("quantifier '" + quantifier_text(pos_) + "' directly after quantifier '" +
                         written + "' (put the first in a group)",
                     pos_);
    return make_repeat(std::move(atom), min, max);
  }

  Result<Node> parse_group(int depth) {
    const size_t start = pos_;
    if (depth >= kMaxGroupDepth)
      return unsupported("groups nested deeper than " + std::to_string(kMaxGroupDepth), start);
    ++pos_;  // (
    if (at('?')) {
      const uint32_t k = pos_ + 1 < s_.size() ? s_[pos_ + 1] : 0;
      const uint32_t k2 = pos_ + 2 < s_.size() ? s_[pos_ + 2] : 0;
      if (k == ':') {
        pos_ += 2;
      } else if (k == '=') {
        return unsupported("lookahead (?=", start);
      } else if (k == '!') {
        return unsupported("negative lookahead (?!", start);
      } else if (k == '<' && k2 == '=') {
        return unsupported("lookbehind (?<=", start);
      } else if (k == '<' && k2 == '!') {
        return unsupported("negative lookbehind (?<!", start);
      } else if (k == '>') {
        return unsupported("atomic group (?>", start);
      } else if (k == '<' || (k == 'P' && k2 == '<')) {
        pos_ += k == '<' ? 2 : 3;
        const size_t name_start = pos_;
        while (pos_ < s_.size() && s_[pos_] != '>' && s_[pos_] != ')') ++pos_;
        if (!at('>') || pos_ == name_start) return invalid("malformed group name", start);
        ++pos_;
      } else if (k == 'P' && k2 == '=') {
        return unsupported("named backreference (?P=", start);
      } else {
        return unsupported("group syntax " + text(start, pos_ + 2) + " (inline flags?)", start);
      }
    }
    VESPER_ASSIGN_OR_RETURN(Node inner, parse_alternation(depth + 1));
    if (!at(')')) return invalid("unbalanced '(' (no matching ')')", start);
    ++pos_;
    return inner;
  }

  // A class [...] as the set of code points it matches.
  Result<CodepointRanges> parse_class() {
    const size_t start = pos_;
    ++pos_;  // [
    bool negated = false;
    if (at('^')) {
      negated = true;
      ++pos_;
    }
    CodepointRanges set;
    bool first = true;
    for (;;) {
      if (pos_ >= s_.size()) return invalid("unterminated character class '['", start);
      if (s_[pos_] == ']' && !first) break;
      first = false;
      const size_t atom_start = pos_;
      VESPER_ASSIGN_OR_RETURN(CodepointRanges lo, parse_class_atom());
      const bool single = lo.size() == 1 && lo[0].first == lo[0].second && !was_class_escape_;
      if (single && at('-') && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        VESPER_ASSIGN_OR_RETURN(CodepointRanges hi, parse_class_atom());
        if (hi.size() == 1 && hi[0].first == hi[0].second && !was_class_escape_) {
          if (hi[0].first < lo[0].first)
            return invalid("bad range " + text(atom_start, pos_) + " in a character class",
                           atom_start);
          set.push_back({lo[0].first, hi[0].first});
        } else {
          // [a-\d]: the '-' is a literal (Annex B).
          set.insert(set.end(), lo.begin(), lo.end());
          set.push_back({'-', '-'});
          set.insert(set.end(), hi.begin(), hi.end());
        }
        continue;
      }
      set.insert(set.end(), lo.begin(), lo.end());
    }
    ++pos_;  // ]
    set = normalize(std::move(set));
    return negated ? complement(set) : set;
  }

  // One member of a class: a code point or (for \d and its kin) a set. Sets was_class_escape_.
  Result<CodepointRanges> parse_class_atom() {
    was_class_escape_ = false;
    if (s_[pos_] == '\\') {
      const bool shorthand = pos_ + 1 < s_.size() &&
                             (s_[pos_ + 1] == 'd' || s_[pos_ + 1] == 'D' || s_[pos_ + 1] == 'w' ||
                              s_[pos_ + 1] == 'W' || s_[pos_ + 1] == 's' || s_[pos_ + 1] == 'S');
      VESPER_ASSIGN_OR_RETURN(CodepointRanges set, parse_escape(true));
      was_class_escape_ = shorthand;
      return set;
    }
    const uint32_t c = s_[pos_++];
    return CodepointRanges{{c, c}};
  }

  Result<uint32_t> parse_hex_digits(size_t n, size_t esc_start) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      const int d = pos_ < s_.size() ? hex_value(s_[pos_]) : -1;
      if (d < 0)
        return invalid(
            "escape " + text(esc_start, pos_ + 1) + " needs " + std::to_string(n) + " hex digits",
            esc_start);
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // \uHHHH (a surrogate pair of two such escapes is one code point) or \u{H...}.
  Result<uint32_t> parse_unicode_escape(size_t esc_start) {
    if (at('{')) {
      ++pos_;
      uint32_t v = 0;
      size_t digits = 0;
      while (pos_ < s_.size() && hex_value(s_[pos_]) >= 0) {
        v = v * 16 + static_cast<uint32_t>(hex_value(s_[pos_]));
        if (v > kMaxCodepoint) return invalid("escape \\u{...} beyond U+10FFFF", esc_start);
        ++pos_, ++digits;
      }
      if (digits == 0 || !at('}')) return invalid("malformed escape \\u{...}", esc_start);
      ++pos_;
      if (v >= 0xD800 && v <= 0xDFFF)
        return unsupported("lone surrogate " + text(esc_start, pos_), esc_start);
      return v;
    }
    VESPER_ASSIGN_OR_RETURN(uint32_t v, parse_hex_digits(4, esc_start));
    if (v >= 0xD800 && v <= 0xDBFF && at('\\') && at(pos_ + 1, 'u')) {
      const size_t save = pos_;
      pos_ += 2;
      auto low = parse_hex_digits(4, save);
      if (low.ok() && *low >= 0xDC00 && *low <= 0xDFFF)
        return 0x10000 + ((v - 0xD800) << 10) + (*low - 0xDC00);
      pos_ = save;
    }
    if (v >= 0xD800 && v <= 0xDFFF)
      return unsupported("lone surrogate " + text(esc_start, pos_), esc_start);
    return v;
  }

  // An escape at pos_ (a backslash): the set it matches.
  Result<CodepointRanges> parse_escape(bool in_class) {
    const size_t start = pos_;
    ++pos_;
    if (pos_ >= s_.size()) return invalid("trailing backslash", start);
    const uint32_t e = s_[pos_++];
    auto one = [](uint32_t cp) { return CodepointRanges{{cp, cp}}; };
    switch (e) {
      case 'd':
        return digit_set();
      case 'D':
        return complement(digit_set());
      case 'w':
        return word_set();
      case 'W':
        return complement(word_set());
      case 's':
        return space_set();
      case 'S':
        return complement(space_set());
      case 'n':
        return one('\n');
      case 't':
        return one('\t');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'b':
        if (in_class) return one(0x08);
        return unsupported("word boundary \\b", start);
      case 'B':
        return unsupported("non-word-boundary \\B", start);
      case '0':
        if (pos_ < s_.size() && is_digit(s_[pos_]))
          return unsupported("octal escape " + text(start, pos_ + 1), start);
        return one(0);
      case 'x': {
        VESPER_ASSIGN_OR_RETURN(uint32_t v, parse_hex_digits(2, start));
        return one(v);
      }
      case 'u': {
        VESPER_ASSIGN_OR_RETURN(uint32_t v, parse_unicode_escape(start));
        return one(v);
      }
      case 'c': {
        const uint32_t l = pos_ < s_.size() ? s_[pos_] : 0;
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')))
          return invalid("escape \\c needs a letter", start);
        ++pos_;
        return one(l % 32);
      }
      case 'k':
        if (at('<')) return unsupported("named backreference \\k<...>", start);
        return invalid("unknown escape \\k", start);
      case 'p':
      case 'P':
        return unsupported(std::string("unicode property escape \\") + static_cast<char>(e), start);
      default:
        break;
    }
    if (is_digit(e)) {
      while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
      return unsupported((in_class ? "octal escape " : "backreference ") + text(start, pos_),
                         start);
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
      return invalid("unknown escape " + text(start, pos_), start);
    return one(e);  // \. \\ \/ \- \* and any other punctuation or non-ASCII: itself
  }

  std::vector<uint32_t> s_;
  size_t pos_ = 0;
  bool was_class_escape_ = false;
  size_t expanded_nodes_ = 0;
};

}  // namespace

std::optional<std::vector<uint32_t>> decode_utf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return std::nullopt;
    }
    if (i + n > text.size()) return std::nullopt;
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<uint8_t>(text[i + k]);
      if ((b & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_json_string_char(uint32_t cp, std::string& out) {
  switch (cp) {
    case '"':
      out += "\\\"";
      return;
    case '\\':
      out += "\\\\";
      return;
    case 0x08:
      out += "\\b";
      return;
    case 0x09:
      out += "\\t";
      return;
    case 0x0A:
      out += "\\n";
      return;
    case 0x0C:
      out += "\\f";
      return;
    case 0x0D:
      out += "\\r";
      return;
    default:
      break;
  }
  if (cp < 0x20 || cp == 0x7F) {
    out += "\\u00";
    out += hex_digit(cp >> 4);
    out += hex_digit(cp);
    return;
  }
  append_utf8(cp, out);
}

std::string json_string_char_expression(const CodepointRanges& chars) {
  if (chars.empty()) return "[]";
  std::vector<std::string> alts;
  const CodepointRanges raw = intersect(chars, json_raw_set());
  if (!raw.empty()) alts.push_back(plain_set_expression(raw));
  // Short escapes: one `"\\" [...]` item for all of them.
  std::string short_letters;
  std::vector<uint32_t> short_cps;
  // \u00XX escapes, grouped by their high hex digit (0, 1 or 7).
  std::vector<std::vector<uint32_t>> by_high(8);
  for (auto [lo, hi] : intersect(chars, complement(json_raw_set()))) {
    for (uint32_t cp = lo; cp <= hi; ++cp) {
      std::string spelled;
      append_json_string_char(cp, spelled);
      if (spelled.size() == 2) {
        short_letters += spelled[1];
        short_cps.push_back(static_cast<uint32_t>(static_cast<unsigned char>(spelled[1])));
      } else {
        by_high[cp >> 4].push_back(cp & 15);
      }
    }
  }
  if (short_cps.size() == 1) {
    alts.push_back(gbnf_literal("\\" + short_letters));
  } else if (!short_cps.empty()) {
    CodepointRanges letters;
    for (uint32_t c : short_cps) letters.push_back({c, c});
    alts.push_back(gbnf_literal("\\") + " " + plain_set_expression(normalize(letters)));
  }
  for (uint32_t high = 0; high < by_high.size(); ++high) {
    if (by_high[high].empty()) continue;
    std::string prefix = "\\u00";
    prefix += hex_digit(high);
    if (by_high[high].size() == 1) {
      prefix += hex_digit(by_high[high][0]);
      alts.push_back(gbnf_literal(prefix));
      continue;
    }
    CodepointRanges lows;
    for (uint32_t low : by_high[high]) {
      const auto d = static_cast<uint32_t>(static_cast<unsigned char>(hex_digit(low)));
      lows.push_back({d, d});
    }
    alts.push_back(gbnf_literal(prefix) + " " + plain_set_expression(normalize(lows)));
  }
  if (alts.size() == 1 && alts.front().find(' ') == std::string::npos) return alts.front();
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

Result<std::string> regex_to_gbnf_expression(std::string_view regex) {
  return regex_to_gbnf_expression(regex, RegexOptions{});
}

Result<std::string> regex_to_gbnf_expression(std::string_view regex, const RegexOptions& options) {
  auto cps = decode_utf8(regex);
  if (!cps) return make_error("regex: not valid UTF-8");
  RegexParser parser(std::move(*cps));
  VESPER_ASSIGN_OR_RETURN(std::vector<TopAlternative> top, parser.parse());
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
