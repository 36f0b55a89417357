#include "grammar/gbnf.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <variant>

#include "grammar/utf8_ranges.h"

namespace vesper::grammar {
namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
// A bounded repetition expands to one element run per repetition: cap it so a typo like
// x{1000000} is an error, not an out-of-memory.
constexpr uint32_t kMaxRepetition = 10000;

// The parsed text, before it is lowered to bytes.
struct Alternatives;
struct Item {
  enum class Kind { kLiteral, kClass, kRule, kGroup, kRepeat } kind = Kind::kLiteral;
  std::vector<uint32_t> codepoints;     // kLiteral
  CodepointRanges ranges;               // kClass (already negated where written [^...])
  std::string rule;                     // kRule
  size_t line = 0, column = 0;          // kRule: where it is used, for "undefined rule" errors
  std::shared_ptr<Alternatives> group;  // kGroup; kRepeat: its single operand as a group
  uint32_t min = 0, max = 0;            // kRepeat; max == kUnbounded for * and +
};
constexpr uint32_t kUnbounded = UINT32_MAX;
using Sequence = std::vector<Item>;
struct Alternatives {
  std::vector<Sequence> sequences;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<std::vector<std::pair<std::string, Alternatives>>> parse() {
    std::vector<std::pair<std::string, Alternatives>> rules;
    skip_space(true);
    while (pos_ < text_.size()) {
      const size_t name_line = line(), name_column = column();
      std::string name = parse_name();
      if (name.empty()) return error("expected a rule name");
      skip_space(false);
      if (text_.substr(pos_, 3) != "::=")
        return error("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      // Not past a newline: an empty body ends there when the next line defines a rule.
      skip_space(false);
      Alternatives alts;
      if (auto e = parse_alternatives(alts, false); !e) return e.error();
      for (const auto& [existing, _] : rules)
        if (existing == name)
          return make_error("line " + std::to_string(name_line) + ", column " +
                            std::to_string(name_column) + ": rule '" + name + "' is defined twice");
      rules.emplace_back(std::move(name), std::move(alts));
      skip_space(true);
    }
    return rules;
  }

  size_t line() const {
    return static_cast<size_t>(std::count(text_.begin(), text_.begin() + pos_, '\n')) + 1;
  }
  size_t column() const {
    const size_t nl = text_.rfind('\n', pos_ == 0 ? 0 : pos_ - 1);
    return nl == std::string_view::npos || pos_ == 0 ? pos_ + 1 : pos_ - nl;
  }

 private:
  Error error(const std::string& what) const {
    return make_error("line " + std::to_string(line()) + ", column " + std::to_string(column()) +
                      ": " + what);
  }

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }

  // Spaces and comments; newlines too when `newlines` (inside a rule body a newline continues
  // the rule only where the next line does not start a new definition, see at_rule_start).
  void skip_space(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  // Whether the text at pos_ (after blank space) is `name ::=`: the start of the next rule.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // One code point of UTF-8 text, or an escape; `quote` is the closing delimiter.
  Result<uint32_t> parse_char() {
    if (pos_ >= text_.size()) return error("unexpected end of grammar");
    const auto c = static_cast<uint8_t>(text_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (pos_ >= text_.size()) return error("unexpected end of grammar after '\\'");
      const char e = text_[pos_++];
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case 'f':
          return uint32_t{'\f'};
        case 'v':
          return uint32_t{'\v'};
        case '0':
          return uint32_t{0};
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<uint32_t>(e);
        default:
          --pos_;
          return error(std::string("unknown escape '\\") + e + "'");
      }
    }
    // UTF-8 passes through as its code point.
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c >= 0x80 && (c < 0xC2 || c > 0xF4)) return error("invalid UTF-8 in grammar");
    if (pos_ + n > text_.size()) return error("truncated UTF-8 in grammar");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < n; ++i) {
      const auto b = static_cast<uint8_t>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) return error("invalid UTF-8 in grammar");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += n;
    return cp;
  }

  Result<uint32_t> parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= text_.size()) return error("expected " + std::to_string(digits) + " hex digits");
      const char h = text_[pos_];
      const int d = (h >= '0' && h <= '9')   ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                             : -1;
      if (d < 0) return error("expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodepoint) return error("code point beyond U+10FFFF");
    return v;
  }

  Status parse_alternatives(Alternatives& alts, bool nested) {
    Sequence seq;
    for (;;) {
      skip_space(nested);
      if (!nested && pos_ < text_.size() && text_[pos_] == '\n') {
        // A newline ends the rule unless the next line continues it (starts with '|', or is not
        // the start of another rule).
        size_t save = pos_;
        skip_space(true);
        if (pos_ >= text_.size() || at_rule_start()) {
          pos_ = save;
          break;
        }
        continue;
      }
      if (pos_ >= text_.size()) break;
      const char c = text_[pos_];
      if (c == '|') {
        ++pos_;
        alts.sequences.push_back(std::move(seq));
        seq.clear();
        continue;
      }
      if (c == ')') {
        if (!nested) return error("unbalanced ')'");
        break;
      }
      Item item;
      if (c == '"') {
        ++pos_;
        item.kind = Item::Kind::kLiteral;
        while (pos_ < text_.size() && text_[pos_] != '"') {
          VESPER_ASSIGN_OR_RETURN(uint32_t cp, parse_char());
          item.codepoints.push_back(cp);
        }
        if (pos_ >= text_.size()) return error("unterminated string literal");
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        item.kind = Item::Kind::kClass;
        bool negated = false;
        if (pos_ < text_.size() && text_[pos_] == '^') {
          negated = true;
          ++pos_;
        }
        CodepointRanges ranges;
        while (pos_ < text_.size() && text_[pos_] != ']') {
          VESPER_ASSIGN_OR_RETURN(uint32_t lo, parse_char());
          uint32_t hi = lo;
          if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
            ++pos_;
            VESPER_ASSIGN_OR_RETURN(hi, parse_char());
            if (hi < lo) return error("character range is out of order");
          }
          ranges.push_back({lo, hi});
        }
        if (pos_ >= text_.size()) return error("unterminated character class");
        ++pos_;
        item.ranges = negated ? complement(ranges) : normalize(ranges);
      } else if (c == '.') {
        ++pos_;
        item.kind = Item::Kind::kClass;
        item.ranges = {{0, kMaxCodepoint}};
      } else if (c == '(') {
        ++pos_;
        item.kind = Item::Kind::kGroup;
        item.group = std::make_shared<Alternatives>();
        if (auto e = parse_alternatives(*item.group, true); !e) return e;
        if (pos_ >= text_.size() || text_[pos_] != ')') return error("expected ')'");
        ++pos_;
      } else if (is_name_char(c)) {
        if (!nested && at_rule_start() && !seq.empty())
          return error("expected newline before rule");
        item.kind = Item::Kind::kRule;
        item.line = line();
        item.column = column();
        item.rule = parse_name();
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return error(std::string("'") + c + "' with nothing to repeat");
      } else {
        return error(std::string("unexpected '") + c + "'");
      }
      // Repetition operators apply to the item just read.
      for (;;) {
        if (pos_ >= text_.size()) break;
        const char op = text_[pos_];
        uint32_t min = 0, max = 0;
        if (op == '*') {
          min = 0, max = kUnbounded;
          ++pos_;
        } else if (op == '+') {
          min = 1, max = kUnbounded;
          ++pos_;
        } else if (op == '?') {
          min = 0, max = 1;
          ++pos_;
        } else if (op == '{') {
          ++pos_;
          skip_space(false);
          VESPER_ASSIGN_OR_RETURN(min, parse_count());
          skip_space(false);
          max = min;
          if (pos_ < text_.size() && text_[pos_] == ',') {
            ++pos_;
            skip_space(false);
            max = kUnbounded;
            if (pos_ < text_.size() && text_[pos_] != '}') {
              VESPER_ASSIGN_OR_RETURN(max, parse_count());
              skip_space(false);
            }
          }
          if (pos_ >= text_.size() || text_[pos_] != '}') return error("expected '}'");
          ++pos_;
          if (max < min) return error("repetition {m,n} with n < m");
        } else {
          break;
        }
        Item rep;
        rep.kind = Item::Kind::kRepeat;
        rep.min = min;
        rep.max = max;
        rep.group = std::make_shared<Alternatives>();
        rep.group->sequences.push_back({std::move(item)});
        item = std::move(rep);
      }
      seq.push_back(std::move(item));
    }
    alts.sequences.push_back(std::move(seq));
    return {};
  }

  Result<uint32_t> parse_count() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(text_[pos_] - '0');
      if (v > kMaxRepetition)
        return error("repetition count above " + std::to_string(kMaxRepetition));
      ++pos_;
    }
    if (pos_ == start) return error("expected a repetition count");
    return static_cast<uint32_t>(v);
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// Lowers parsed rules to the byte-level Grammar.
class Lowering {
 public:
  Result<Grammar> run(std::vector<std::pair<std::string, Alternatives>>& parsed) {
    for (auto& [name, _] : parsed) {
      rule_index_[name] = static_cast<uint32_t>(g_.rules.size());
      g_.rules.push_back(Rule{name, {}});
    }
    const auto root = rule_index_.find("root");
    if (root == rule_index_.end()) return make_error("the grammar has no 'root' rule");
    g_.root = root->second;
    for (auto& [name, alts] : parsed) {
      const uint32_t r = rule_index_[name];
      VESPER_TRY(lower_rule(r, alts));
    }
    VESPER_TRY(check_left_recursion());
    return std::move(g_);
  }

 private:
  uint32_t new_rule(const std::string& base) {
    const auto id = static_cast<uint32_t>(g_.rules.size());
    g_.rules.push_back(Rule{base + "-" + std::to_string(id), {}});
    return id;
  }

  uint32_t byte_set(const ByteSet& s) {
    for (size_t i = 0; i < g_.byte_sets.size(); ++i)
      if (g_.byte_sets[i] == s) return static_cast<uint32_t>(i);
    g_.byte_sets.push_back(s);
    return static_cast<uint32_t>(g_.byte_sets.size() - 1);
  }

  // Appends one alternative (a run of elements closed by kEnd) to `rule`.
  void add_alternative(uint32_t rule, const std::vector<Element>& run) {
    g_.rules[rule].alternatives.push_back(static_cast<uint32_t>(g_.elements.size()));
    g_.elements.insert(g_.elements.end(), run.begin(), run.end());
    g_.elements.push_back(Element{Element::Kind::kEnd, 0});
  }

  Status lower_rule(uint32_t rule, const Alternatives& alts) {
    for (const Sequence& seq : alts.sequences) {
      std::vector<Element> run;
      for (const Item& item : seq) VESPER_TRY(lower_item(item, rule, run));
      add_alternative(rule, run);
    }
    return {};
  }

  Element rule_ref(uint32_t rule) { return Element{Element::Kind::kRule, rule}; }

  // A class: one byte set when every code point is ASCII, else a rule of UTF-8 byte runs
  // (shared between equal classes).
  Element lower_class(const CodepointRanges& ranges, uint32_t owner) {
    if (!ranges.empty() && ranges.back().second < 0x80) {
      ByteSet s;
      for (auto [lo, hi] : ranges) s.add_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
      return Element{Element::Kind::kBytes, byte_set(s)};
    }
    if (auto it = class_rules_.find(ranges); it != class_rules_.end()) return rule_ref(it->second);
    const uint32_t r = new_rule(g_.rules[owner].name + "-char");
    class_rules_[ranges] = r;
    for (const Utf8Sequence& seq : utf8_sequences(ranges)) {
      std::vector<Element> run;
      for (auto [lo, hi] : seq) {
        ByteSet s;
        s.add_range(lo, hi);
        run.push_back(Element{Element::Kind::kBytes, byte_set(s)});
      }
      add_alternative(r, run);
    }
    return rule_ref(r);
  }

  Status lower_item(const Item& item, uint32_t owner, std::vector<Element>& run) {
    switch (item.kind) {
      case Item::Kind::kLiteral: {
        std::string bytes;
        for (uint32_t cp : item.codepoints) append_utf8(cp, bytes);
        for (unsigned char b : bytes) {
          ByteSet s;
          s.add(b);
          run.push_back(Element{Element::Kind::kBytes, byte_set(s)});
        }
        return {};
      }
      case Item::Kind::kClass:
        if (item.ranges.empty()) {
          // Matches nothing: a rule without alternatives.
          run.push_back(rule_ref(new_rule(g_.rules[owner].name + "-empty")));
          return {};
        }
        run.push_back(lower_class(item.ranges, owner));
        return {};
      case Item::Kind::kRule: {
        const auto it = rule_index_.find(item.rule);
        if (it == rule_index_.end())
          return make_error("line " + std::to_string(item.line) + ", column " +
                            std::to_string(item.column) + ": undefined rule '" + item.rule + "'");
        run.push_back(rule_ref(it->second));
        return {};
      }
      case Item::Kind::kGroup: {
        const uint32_t r = new_rule(g_.rules[owner].name);
        VESPER_TRY(lower_rule(r, *item.group));
        run.push_back(rule_ref(r));
        return {};
      }
      case Item::Kind::kRepeat:
        return lower_repeat(item, owner, run);
    }
    return {};
  }

  // x{min,max}: min copies of x, then either x* (a right-recursive rule) or max - min nested
  // optional copies: opt_k ::= x opt_{k-1} | (empty).
  Status lower_repeat(const Item& item, uint32_t owner, std::vector<Element>& run) {
    std::vector<Element> one;
    const Sequence& operand_seq = item.group->sequences.front();
    if (item.group->sequences.size() == 1 && operand_seq.size() == 1 &&
        operand_seq.front().kind != Item::Kind::kGroup) {
      VESPER_TRY(lower_item(operand_seq.front(), owner, one));
    } else {
      const uint32_t r = new_rule(g_.rules[owner].name);
      VESPER_TRY(lower_rule(r, *item.group));
      one.push_back(rule_ref(r));
    }
    // An operand of several elements repeats as one rule, so the optional tail stays small.
    Element x;
    if (one.size() == 1) {
      x = one.front();
    } else {
      const uint32_t r = new_rule(g_.rules[owner].name);
      add_alternative(r, one);
      x = rule_ref(r);
    }
    for (uint32_t i = 0; i < item.min; ++i) run.push_back(x);
    if (item.max == kUnbounded) {
      const uint32_t star = new_rule(g_.rules[owner].name + "-star");
      add_alternative(star, {x, rule_ref(star)});
      add_alternative(star, {});
      run.push_back(rule_ref(star));
      return {};
    }
    if (item.max == item.min) return {};
    std::optional<Element> tail;
    for (uint32_t k = 0; k < item.max - item.min; ++k) {
      const uint32_t opt = new_rule(g_.rules[owner].name + "-opt");
      std::vector<Element> body{x};
      if (tail) body.push_back(*tail);
      add_alternative(opt, body);
      add_alternative(opt, {});
      tail = rule_ref(opt);
    }
    run.push_back(*tail);
    return {};
  }

  Status check_left_recursion() const {
    return grammar::check_left_recursion(g_, [this](uint32_t r) { return display_name(r); });
  }

  // Helper rules are named after the rule they came from; errors name that rule.
  std::string display_name(uint32_t r) const {
    const std::string& name = g_.rules[r].name;
    for (const auto& [written, index] : rule_index_)
      if (index == r) return written;
    return name.substr(0, name.find('-'));
  }

  Grammar g_;
  std::map<std::string, uint32_t> rule_index_;
  std::map<CodepointRanges, uint32_t> class_rules_;
};

}  // namespace

Result<Grammar> parse_gbnf(std::string_view text) {
  Parser parser(text);
  VESPER_ASSIGN_OR_RETURN(auto parsed, parser.parse());
  return Lowering().run(parsed);
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  static const char* kHex = "0123456789ABCDEF";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace vesper::grammar
