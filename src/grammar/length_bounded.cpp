#include "grammar/length_bounded.h"

#include <bitset>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "core/check.h"

namespace vesper::grammar {
namespace {

// The longest string a bounded grammar may have (an email address has at most 320).
constexpr size_t kMaxLength = 512;
using Lengths = std::bitset<kMaxLength>;

// {a + b : a in x, b in y}, cut at kMaxLength.
Lengths sum(const Lengths& x, const Lengths& y) {
  Lengths out;
  for (size_t a = 0; a < kMaxLength; ++a)
    if (x[a]) out |= y << a;
  return out;
}

// Narrows [lo, hi] to the lengths of `set` it holds at its ends; false when it holds none.
bool clamp(const Lengths& set, size_t& lo, size_t& hi) {
  hi = std::min(hi, kMaxLength - 1);
  while (lo <= hi && !set[lo]) ++lo;
  while (hi > lo && !set[hi]) --hi;
  return lo <= hi && set[lo];
}

std::string byte_class(const ByteSet& s) {
  std::string out = "[";
  char hex[8];
  for (unsigned b = 0; b < 256; ++b) {
    if (!s.has(static_cast<uint8_t>(b))) continue;
    unsigned e = b;
    while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
    std::snprintf(hex, sizeof(hex), "\\x%02X", b);
    out += hex;
    if (e > b) {
      std::snprintf(hex, sizeof(hex), "-\\x%02X", e);
      out += hex;
    }
    b = e;
  }
  return out + "]";
}

class Expansion {
 public:
  Expansion(const Grammar& g, const std::function<std::string()>& rule_name,
            const std::function<std::optional<std::string>(uint32_t)>& named_rule)
      : g_(g), rule_name_(rule_name), named_rule_(named_rule) {}

  const Lengths& rule_lengths(uint32_t r) {
    if (auto it = rule_lengths_.find(r); it != rule_lengths_.end()) return it->second;
    VESPER_CHECK(visiting_.insert(r).second, "rule %s is recursive: its language may be infinite",
                 g_.rules[r].name.c_str());
    Lengths out;
    for (uint32_t a : g_.rules[r].alternatives) out |= run_lengths(a);
    visiting_.erase(r);
    return rule_lengths_.emplace(r, out).first->second;
  }

  // One item matching r's strings with lengths in [lo, hi]; nullopt when there are none.
  std::optional<std::string> rule_in(uint32_t r, size_t lo, size_t hi) {
    const Lengths& lengths = rule_lengths(r);
    if (!clamp(lengths, lo, hi)) return std::nullopt;
    if (lo == first(lengths) && hi == last(lengths))
      if (std::optional<std::string> name = named_rule_(r)) return name;
    const auto key = std::make_tuple(r, lo, hi);
    if (auto it = rule_items_.find(key); it != rule_items_.end()) return it->second;
    std::vector<std::string> alts;
    for (uint32_t a : g_.rules[r].alternatives)
      if (std::optional<std::string> e = run_in(a, lo, hi)) alts.push_back(*e);
    std::string item = define(alts);
    rule_items_.emplace(key, item);
    return item;
  }

  std::vector<std::pair<std::string, std::string>> take_rules() { return std::move(rules_); }

  static size_t first(const Lengths& s) {
    size_t i = 0;
    while (i < kMaxLength && !s[i]) ++i;
    return i;
  }
  static size_t last(const Lengths& s) {
    size_t i = kMaxLength;
    while (i > 0 && !s[i - 1]) --i;
    return i - 1;
  }

 private:
  // The lengths of the run of elements from `pos` to its alternative's end.
  const Lengths& run_lengths(uint32_t pos) {
    if (auto it = run_lengths_.find(pos); it != run_lengths_.end()) return it->second;
    Lengths out;
    const Element& e = g_.elements[pos];
    if (e.kind == Element::Kind::kEnd)
      out.set(0);
    else
      out = sum(element_lengths(e), run_lengths(pos + 1));
    return run_lengths_.emplace(pos, out).first->second;
  }

  Lengths element_lengths(const Element& e) {
    if (e.kind == Element::Kind::kRule) return rule_lengths(e.value);
    Lengths one;
    one.set(1);
    return one;
  }

  // One item matching any of `alts` (sequences; "" is the empty one): the item itself when it
  // is one, else a rule, the same rule for equal bodies. Equal (rule, range) pairs often have
  // equal languages (an optional chain x{0,61} held to exactly j characters is x{j} whichever
  // link it starts at), and built bottom up their bodies are equal too, so one rule serves all.
  std::string define(const std::vector<std::string>& alts) {
    VESPER_CHECK(!alts.empty());
    std::vector<std::string> written;
    for (const std::string& a : alts) written.push_back(a.empty() ? "\"\"" : a);
    if (written.size() == 1 && written[0].find(' ') == std::string::npos) return written[0];
    std::string body = join(written, " | ");
    if (auto it = bodies_.find(body); it != bodies_.end()) return it->second;
    std::string name = rule_name_();
    bodies_.emplace(body, name);
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  std::string element_in(const Element& e, size_t lo, size_t hi) {
    // A class stays one element (a rule would be one more alternative for the matcher).
    if (e.kind == Element::Kind::kBytes) return byte_class(g_.byte_sets[e.value]);
    std::optional<std::string> item = rule_in(e.value, lo, hi);
    VESPER_CHECK(item.has_value());
    return *item;
  }

  // The run from `pos` with a total length in [lo, hi], as a sequence ("" when it is empty).
  std::optional<std::string> run_in(uint32_t pos, size_t lo, size_t hi) {
    const Lengths& total = run_lengths(pos);
    if (!clamp(total, lo, hi)) return std::nullopt;
    const Element& e = g_.elements[pos];
    if (e.kind == Element::Kind::kEnd) return std::string();
    const auto key = std::make_tuple(pos, lo, hi);
    if (auto it = runs_.find(key); it != runs_.end()) return it->second;
    const Lengths own = element_lengths(e);
    const Lengths& rest = run_lengths(pos + 1);
    std::string out;
    if (own.count() == 1) {
      // Its one length; the rest of the range to the elements after it (lo is in own + rest).
      const size_t len = first(own);
      std::optional<std::string> tail = run_in(pos + 1, lo - len, hi - len);
      VESPER_CHECK(tail.has_value());
      out = join({element_in(e, len, len), *tail}, " ");
    } else if (rest.count() == 1) {
      // The elements after it have one length; it takes what they leave.
      const size_t len = first(rest);
      std::optional<std::string> tail = run_in(pos + 1, len, len);
      VESPER_CHECK(tail.has_value());
      out = join({element_in(e, lo - len, hi - len), *tail}, " ");
    } else {
      // Each of its lengths in turn, the rest of the range to the elements after it.
      std::vector<std::string> alts;
      for (size_t len = first(own); len <= hi; ++len) {
        if (!own[len]) continue;
        std::optional<std::string> tail = run_in(pos + 1, lo > len ? lo - len : 0, hi - len);
        if (tail) alts.push_back(join({element_in(e, len, len), *tail}, " "));
      }
      out = define(alts);
    }
    runs_.emplace(key, out);
    return out;
  }

  const Grammar& g_;
  const std::function<std::string()>& rule_name_;
  const std::function<std::optional<std::string>(uint32_t)>& named_rule_;
  std::unordered_map<uint32_t, Lengths> rule_lengths_, run_lengths_;
  std::set<uint32_t> visiting_;
  std::map<std::tuple<uint32_t, size_t, size_t>, std::string> rule_items_, runs_;
  std::unordered_map<std::string, std::string> bodies_;  // body -> the rule defined with it
  std::vector<std::pair<std::string, std::string>> rules_;
};

}  // namespace

std::pair<uint64_t, uint64_t> string_length_range(const Grammar& g) {
  const std::function<std::string()> no_names = [] { return std::string(); };
  const std::function<std::optional<std::string>(uint32_t)> none = [](uint32_t) {
    return std::optional<std::string>();
  };
  Expansion x(g, no_names, none);
  const Lengths& lengths = x.rule_lengths(g.root);
  VESPER_CHECK(lengths.any(), "a grammar without strings");
  return {Expansion::first(lengths), Expansion::last(lengths)};
}

std::optional<LengthBoundedGbnf> length_bounded_gbnf(
    const Grammar& g, uint64_t min, uint64_t max, const std::function<std::string()>& rule_name,
    const std::function<std::optional<std::string>(uint32_t rule)>& named_rule) {
  if (min >= kMaxLength || min > max) return std::nullopt;
  Expansion x(g, rule_name, named_rule);
  std::optional<std::string> root = x.rule_in(g.root, min, std::min<uint64_t>(max, kMaxLength));
  if (!root) return std::nullopt;
  return LengthBoundedGbnf{*root, x.take_rules()};
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

}  // namespace vesper::grammar
