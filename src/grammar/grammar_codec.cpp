#include "grammar/grammar_codec.h"

#include <string>
#include <vector>

namespace vesper::grammar {

void write_grammar(ByteWriter& w, const Grammar& g) {
  w.u64(g.elements.size());
  for (const Element& e : g.elements) {
    w.u64(static_cast<uint64_t>(e.kind));
    w.u64(e.value);
  }
  w.u64(g.byte_sets.size());
  for (const ByteSet& b : g.byte_sets)
    for (const uint64_t word : b.words) w.u64(word);
  w.u64(g.rules.size());
  for (const Rule& rule : g.rules) {
    w.str(rule.name);
    w.ints<uint32_t>(rule.alternatives);
  }
  w.u64(g.root);
}

Result<Grammar> read_grammar(ByteReader& r) {
  Grammar g;
  auto num_elements = r.count();
  if (!num_elements) return num_elements.error();
  g.elements.resize(*num_elements);
  for (Element& e : g.elements) {
    auto kind = r.u64();
    if (!kind) return kind.error();
    auto value = r.u64();
    if (!value) return value.error();
    if (*kind > static_cast<uint64_t>(Element::Kind::kRule) || *value > UINT32_MAX)
      return make_error("a grammar element out of range");
    e.kind = static_cast<Element::Kind>(*kind);
    e.value = static_cast<uint32_t>(*value);
  }
  auto num_sets = r.count();
  if (!num_sets) return num_sets.error();
  g.byte_sets.resize(*num_sets);
  for (ByteSet& b : g.byte_sets)
    for (uint64_t& word : b.words) {
      auto v = r.u64();
      if (!v) return v.error();
      word = *v;
    }
  auto num_rules = r.count();
  if (!num_rules) return num_rules.error();
  g.rules.resize(*num_rules);
  for (Rule& rule : g.rules) {
    VESPER_TRY(r.str(rule.name));
    VESPER_TRY(r.ints(rule.alternatives));
    for (const uint32_t start : rule.alternatives)
      if (start >= g.elements.size())
        return make_error("grammar rule '" + rule.name + "' starts outside the elements");
  }
  auto root = r.u64();
  if (!root) return root.error();
  if (*root >= g.rules.size()) return make_error("the grammar's root rule is out of range");
  g.root = static_cast<uint32_t>(*root);
  for (const Element& e : g.elements) {
    if (e.kind == Element::Kind::kBytes && e.value >= g.byte_sets.size())
      return make_error("a grammar element names byte set " + std::to_string(e.value) + " of " +
                        std::to_string(g.byte_sets.size()));
    if (e.kind == Element::Kind::kRule && e.value >= g.rules.size())
      return make_error("a grammar element names rule " + std::to_string(e.value) + " of " +
                        std::to_string(g.rules.size()));
  }
  // Every alternative ends in kEnd before the elements do (the matcher walks to it); every rule
  // has one; and no rule is left-recursive (the matcher would expand it forever).
  if (!g.elements.empty() && g.elements.back().kind != Element::Kind::kEnd)
    return make_error("the grammar's last alternative does not end");
  for (const Rule& rule : g.rules)
    if (rule.alternatives.empty())
      return make_error("grammar rule '" + rule.name + "' has no alternative");
  VESPER_TRY(check_left_recursion(g, [&](uint32_t r) { return g.rules[r].name; }));
  return g;
}

}  // namespace vesper::grammar
