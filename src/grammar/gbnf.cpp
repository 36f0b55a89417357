#include "grammar/gbnf.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>

#include "grammar/limits.h"
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
  std::vector<uint32_t> codepoints;  // kLiteral
  CodepointRanges ranges;            // kClass (already negated where written [^...])
  std::string rule;                  // kRule
  // Where it starts (kRepeat: where its operand starts), for errors.
  size_t line = 0, column = 0;
  std::shared_ptr<Alternatives> group;  // kGroup; kRepeat: its single operand as a group
  uint32_t min = 0, max = 0;            // kRepeat; max == kUnbounded for * and +
  std::string op;                       // kRepeat: the operator as written ("*", "{2,}")
  // Groups and repetitions nested in this item, itself included: how deep lowering recurses.
  size_t height = 0;
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
    std::unordered_set<std::string> names;
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
      if (!names.insert(name).second)
        return make_error("line " + std::to_string(name_line) + ", column " +
                          std::to_string(name_column) + ": rule '" + name + "' is defined twice");
      rules.emplace_back(std::move(name), std::move(alts));
      skip_space(true);
    }
    return rules;
  }

  // Counted on from where they were last asked for (the parser rarely moves back), so that
  // asking at every item stays linear in the text.
  size_t line() const {
    advance_line_count();
    return line_;
  }
  size_t column() const {
    advance_line_count();
    return pos_ - line_start_ + 1;
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
      item.line = line();
      item.column = column();
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
        if (depth_ + 1 > kMaxGrammarNesting)
          return error("groups and repetitions nest more than " +
                       with_separators(kMaxGrammarNesting) + " deep (the limit)");
        ++pos_;
        item.kind = Item::Kind::kGroup;
        item.group = std::make_shared<Alternatives>();
        ++depth_;
        auto inner = parse_alternatives(*item.group, true);
        --depth_;
        if (!inner) return inner;
        if (pos_ >= text_.size() || text_[pos_] != ')') return error("expected ')'");
        ++pos_;
        item.height = 1;
        for (const Sequence& seq : item.group->sequences)
          for (const Item& inner_item : seq)
            item.height = std::max(item.height, inner_item.height + 1);
      } else if (is_name_char(c)) {
        if (!nested && at_rule_start() && !seq.empty())
          return error("expected newline before rule");
        item.kind = Item::Kind::kRule;
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
        const size_t op_start = pos_;
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
        if (depth_ + item.height + 1 > kMaxGrammarNesting)
          return error("groups and repetitions nest more than " +
                       with_separators(kMaxGrammarNesting) + " deep (the limit)");
        Item rep;
        rep.kind = Item::Kind::kRepeat;
        rep.min = min;
        rep.max = max;
        rep.op = std::string(text_.substr(op_start, pos_ - op_start));
        rep.line = item.line;
        rep.column = item.column;
        rep.height = item.height + 1;
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

  void advance_line_count() const {
    if (pos_ < counted_to_) counted_to_ = 0, line_ = 1, line_start_ = 0;
    for (; counted_to_ < pos_; ++counted_to_)
      if (text_[counted_to_] == '\n') ++line_, line_start_ = counted_to_ + 1;
  }

  std::string_view text_;
  size_t pos_ = 0;
  size_t depth_ = 0;  // groups open around pos_
  mutable size_t counted_to_ = 0, line_ = 1, line_start_ = 0;
};

// Whether a repetition's operand lowers in place (a literal, a class or a rule reference); a
// group or a repetition becomes a rule of its own.
bool simple_operand(const Item& repeat) {
  const std::vector<Sequence>& seqs = repeat.group->sequences;
  return seqs.size() == 1 && seqs.front().size() == 1 &&
         seqs.front().front().kind != Item::Kind::kGroup &&
         seqs.front().front().kind != Item::Kind::kRepeat;
}

// The size of the Grammar that Lowering (below) builds from parsed rules, counted without
// building it: every rule, alternative and element it adds, before left factoring (which adds
// at most one rule, alternative and element per group of alternatives it merges). Refusing a
// grammar over limits.h's bounds here costs a walk of the parsed text; building it could cost a
// repetition count's worth of memory per element written.
class SizeCount {
 public:
  Status run(const std::vector<std::pair<std::string, Alternatives>>& parsed) {
    rules_ += parsed.size();
    for (const auto& [name, alts] : parsed) count_rule(alts);
    while (!pending_.empty()) {
      const Alternatives* alts = pending_.back();
      pending_.pop_back();
      count_rule(*alts);
    }
    auto over = [](uint64_t n, uint64_t limit, const char* what) -> Status {
      if (n <= limit) return {};
      return make_error("the grammar has " + with_separators(n) + " " + what +
                        ", more than the limit of " + with_separators(limit));
    };
    VESPER_TRY(over(elements_, kMaxGrammarElements, "elements"));
    VESPER_TRY(over(rules_, kMaxGrammarRules, "rules"));
    return over(alternatives_, kMaxGrammarAlternatives, "alternatives");
  }

 private:
  void count_rule(const Alternatives& alts) {
    for (const Sequence& seq : alts.sequences) {
      uint64_t run = 0;
      for (const Item& item : seq) run += count_item(item);
      alternatives_ += 1;
      elements_ += run + 1;
    }
  }

  // The elements `item` adds to its alternative; what it adds elsewhere goes to the totals.
  uint64_t count_item(const Item& item) {
    switch (item.kind) {
      case Item::Kind::kLiteral: {
        std::string bytes;
        for (uint32_t cp : item.codepoints) append_utf8(cp, bytes);
        return bytes.size();
      }
      case Item::Kind::kClass:
        if (item.ranges.empty()) {
          rules_ += 1;
        } else if (item.ranges.back().second >= 0x80 && classes_.insert(item.ranges).second) {
          rules_ += 1;
          for (const Utf8Sequence& seq : utf8_sequences(item.ranges)) {
            alternatives_ += 1;
            elements_ += seq.size() + 1;
          }
        }
        return 1;
      case Item::Kind::kRule:
        return 1;
      case Item::Kind::kGroup:
        rules_ += 1;
        pending_.push_back(item.group.get());
        return 1;
      case Item::Kind::kRepeat:
        return count_repeat(item);
    }
    return 0;
  }

  uint64_t count_repeat(const Item& item) {
    uint64_t one = 1;
    if (simple_operand(item)) {
      one = count_item(item.group->sequences.front().front());
    } else {
      rules_ += 1;
      pending_.push_back(item.group.get());
    }
    if (one != 1) {
      rules_ += 1;
      alternatives_ += 1;
      elements_ += one + 1;
    }
    if (item.max == kUnbounded) {
      rules_ += 1;
      alternatives_ += 2;
      elements_ += 4;
      return item.min + 1;
    }
    if (item.max == item.min) return item.min;
    const uint64_t optional = item.max - item.min;
    rules_ += optional;
    alternatives_ += 2 * optional;
    elements_ += 4 * optional - 1;  // the innermost copy has no tail
    return item.min + 1;
  }

  uint64_t elements_ = 0, rules_ = 0, alternatives_ = 0;
  std::set<CodepointRanges> classes_;
  std::vector<const Alternatives*> pending_;  // groups to count, as Lowering defers them
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
    while (!pending_.empty()) {
      const auto [rule, alts] = pending_.back();
      pending_.pop_back();
      VESPER_TRY(lower_rule(rule, *alts));
    }
    const std::vector<bool> nullable = nullable_rules(g_);
    for (const Star& star : stars_)
      if (star.operand.kind == Element::Kind::kRule && nullable[star.operand.value])
        return make_error("line " + std::to_string(star.line) + ", column " +
                          std::to_string(star.column) + ": rule '" + display_name(star.owner) +
                          "' repeats, with '" + star.op +
                          "', something that can match the empty string (it could repeat "
                          "forever without reading anything)");
    VESPER_TRY(check_left_recursion());
    return std::move(g_);
  }

 private:
  // An unbounded repetition, x* or x+ or x{m,}: refused with its own message when x can match
  // the empty string (the star rule would be left-recursive).
  struct Star {
    Element operand;
    uint32_t owner;
    size_t line, column;
    std::string op;
  };

  uint32_t new_rule(const std::string& base) {
    const auto id = static_cast<uint32_t>(g_.rules.size());
    g_.rules.push_back(Rule{base + "-" + std::to_string(id), {}});
    return id;
  }

  uint32_t byte_set(const ByteSet& s) {
    const auto [it, added] =
        byte_set_ids_.try_emplace(s.words, static_cast<uint32_t>(g_.byte_sets.size()));
    if (added) g_.byte_sets.push_back(s);
    return it->second;
  }

  // Appends one alternative (a run of elements closed by kEnd) to `rule`.
  void add_alternative(uint32_t rule, std::span<const Element> run) {
    g_.rules[rule].alternatives.push_back(static_cast<uint32_t>(g_.elements.size()));
    g_.elements.insert(g_.elements.end(), run.begin(), run.end());
    g_.elements.push_back(Element{Element::Kind::kEnd, 0});
  }

  Status lower_rule(uint32_t rule, const Alternatives& alts) {
    // Every alternative's elements, one after another in `flat`; `runs` delimits them.
    std::vector<Element> flat;
    std::vector<std::pair<size_t, size_t>> runs;
    for (const Sequence& seq : alts.sequences) {
      std::vector<Element> run;
      for (const Item& item : seq) VESPER_TRY(lower_item(item, rule, run));
      runs.emplace_back(flat.size(), flat.size() + run.size());
      flat.insert(flat.end(), run.begin(), run.end());
    }
    add_factored(rule, flat, std::move(runs));
    return {};
  }

  // Adds `runs` (ranges of `flat`) as the alternatives of `rule`, left-factored: runs that begin
  // with the same element share their longest common prefix, followed by a helper rule holding
  // their rests (a run written twice ends up once). Many literals (an enum, a choice list)
  // so become a trie, and the matcher keeps one stack where it would keep one per literal. The
  // language is unchanged, and so is what each rule can begin with (left recursion is found the
  // same). Each level of the trie strips at least one element from its runs, and nothing is
  // copied but the alternatives written, so this is linear in the elements.
  void add_factored(uint32_t rule, const std::vector<Element>& flat,
                    std::vector<std::pair<size_t, size_t>> runs) {
    auto key = [](const Element& e) {
      return (uint64_t{static_cast<uint8_t>(e.kind)} << 32) | e.value;
    };
    struct Work {
      uint32_t rule;
      std::vector<std::pair<size_t, size_t>> runs;
    };
    std::vector<Work> work;
    work.push_back({rule, std::move(runs)});
    std::vector<Element> head;
    while (!work.empty()) {
      Work w = std::move(work.back());
      work.pop_back();
      // Groups by first element, in order of first appearance; empty runs form one group.
      std::unordered_map<uint64_t, size_t> group_of;
      std::vector<std::vector<size_t>> groups;
      std::optional<size_t> empty_group;
      for (size_t i = 0; i < w.runs.size(); ++i) {
        const auto [begin, end] = w.runs[i];
        if (begin == end) {
          if (!empty_group) {
            empty_group = groups.size();
            groups.push_back({i});
          }
          continue;
        }
        const auto [it, added] = group_of.try_emplace(key(flat[begin]), groups.size());
        if (added) groups.emplace_back();
        groups[it->second].push_back(i);
      }
      for (const std::vector<size_t>& group : groups) {
        const auto first = w.runs[group.front()];
        if (group.size() == 1) {
          add_alternative(w.rule, std::span(flat).subspan(first.first, first.second - first.first));
          continue;
        }
        size_t common = first.second - first.first;
        for (size_t i : group) {
          const auto [begin, end] = w.runs[i];
          size_t n = 0;
          while (n < common && begin + n < end &&
                 key(flat[begin + n]) == key(flat[first.first + n]))
            ++n;
          common = n;
        }
        // Repeated runs are not looked for here: they stay together level after level and end
        // as one empty run.
        std::vector<std::pair<size_t, size_t>> rests;
        for (size_t i : group) rests.emplace_back(w.runs[i].first + common, w.runs[i].second);
        head.assign(flat.begin() + static_cast<ptrdiff_t>(first.first),
                    flat.begin() + static_cast<ptrdiff_t>(first.first + common));
        const uint32_t helper = new_rule(g_.rules[w.rule].name);
        head.push_back(rule_ref(helper));
        add_alternative(w.rule, head);
        work.push_back({helper, std::move(rests)});
      }
    }
  }

  Element rule_ref(uint32_t rule) { return Element{Element::Kind::kRule, rule}; }

  // A new rule for `alts`, lowered once the rules being lowered are done: groups in groups are
  // lowered one after another, not one inside another, so that nesting costs no stack.
  uint32_t deferred_rule(uint32_t owner, const Alternatives& alts) {
    const uint32_t r = new_rule(g_.rules[owner].name);
    pending_.push_back({r, &alts});
    return r;
  }

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
      case Item::Kind::kGroup:
        run.push_back(rule_ref(deferred_rule(owner, *item.group)));
        return {};
      case Item::Kind::kRepeat:
        return lower_repeat(item, owner, run);
    }
    return {};
  }

  // x{min,max}: min copies of x, then either x* (a right-recursive rule) or max - min nested
  // optional copies: opt_k ::= x opt_{k-1} | (empty).
  Status lower_repeat(const Item& item, uint32_t owner, std::vector<Element>& run) {
    std::vector<Element> one;
    if (simple_operand(item))
      VESPER_TRY(lower_item(item.group->sequences.front().front(), owner, one));
    else
      one.push_back(rule_ref(deferred_rule(owner, *item.group)));
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
      const Element body[] = {x, rule_ref(star)};
      add_alternative(star, body);
      add_alternative(star, {});
      run.push_back(rule_ref(star));
      stars_.push_back({x, owner, item.line, item.column, item.op});
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
  std::map<std::array<uint64_t, 4>, uint32_t> byte_set_ids_;
  std::vector<Star> stars_;
  std::vector<std::pair<uint32_t, const Alternatives*>> pending_;  // deferred_rule's
};

}  // namespace

Result<Grammar> parse_gbnf(std::string_view text) {
  if (text.size() > kMaxGrammarTextBytes)
    return make_error("the grammar text has " + with_separators(text.size()) +
                      " bytes, more than the limit of " + with_separators(kMaxGrammarTextBytes));
  Parser parser(text);
  VESPER_ASSIGN_OR_RETURN(auto parsed, parser.parse());
  VESPER_TRY(SizeCount().run(parsed));
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
