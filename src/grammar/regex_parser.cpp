// The regex parser: ECMAScript pattern syntax (regex.h lists what is supported and what is
// refused) to the tree of regex_internal.h, with the escapes' character classes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "grammar/regex_internal.h"

namespace vesper::grammar::regex_detail {
namespace {

// The GBNF parser's own cap on a repetition count; a larger one could not be written anyway.
constexpr uint32_t kMaxRepetition = 10000;
// Groups nest by recursion in the parser and the emitter: bound it.
constexpr int kMaxGroupDepth = 200;
// Repeating a run of optional items expands it (non_empty): bound the nodes that creates.
constexpr size_t kMaxExpandedNodes = 1'000'000;

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

Result<std::vector<TopAlternative>> parse_regex(std::vector<uint32_t> cps) {
  return RegexParser(std::move(cps)).parse();
}

}  // namespace vesper::grammar::regex_detail
