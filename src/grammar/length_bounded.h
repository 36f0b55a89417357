// Length-bounded expansion: the strings of a grammar whose lengths lie in [min, max], written as
// GBNF. A JSON schema's `format` with minLength/maxLength needs it (json_schema_scalars.cpp):
// the string must be in the format AND have such a length, and GBNF has no intersection.
//
// For grammars of finite languages only (no rule reachable from itself), lengths counted in
// bytes (the caller's formats are ASCII, so bytes are characters). Each rule's set of string
// lengths is computed first; then a rule is rewritten for a range of lengths by splitting the
// range over each alternative's elements: an element of one length takes it, the one varying
// element of a run takes what the others leave, and where several vary, each length of the
// first is tried in turn with the rest of the range left to the others. Every (rule, range) and
// (run, range) reached becomes one rule, and rules with equal bodies are one, so the result is
// exact (no string outside the range, none inside it lost) and its size grows with the varying
// elements' lengths times the ranges reached, not with the strings: an email address of at
// most 40 characters takes about 7,000 grammar elements, of at most 128 (the largest) 50,000.
// Trying lengths side by side is ambiguity the matcher follows with parallel stacks: at most
// about 250 alternatives explored in a step for an email address, a quarter of the bound.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace vesper::grammar {

struct LengthBoundedGbnf {
  std::string expression;                                  // one GBNF item
  std::vector<std::pair<std::string, std::string>> rules;  // (name, body), to define alongside
};

// The shortest and longest strings of `g`'s language (which must be finite).
std::pair<uint64_t, uint64_t> string_length_range(const Grammar& g);

// GBNF text: the non-empty `parts` joined with `sep` (an empty part is an empty sequence, which
// adds nothing to a sequence or an alternation written this way).
std::string join(const std::vector<std::string>& parts, std::string_view sep);

// The strings of `g` (its root rule) with lengths in [min, max]; nullopt when there are none.
// `rule_name()` names each new rule (unique in the caller's grammar). `named_rule(r)`: the
// GBNF name under which the caller already defines rule r of `g` unchanged, or nullopt; used
// where a range admits all of r's strings, instead of a copy.
std::optional<LengthBoundedGbnf> length_bounded_gbnf(
    const Grammar& g, uint64_t min, uint64_t max, const std::function<std::string()>& rule_name,
    const std::function<std::optional<std::string>(uint32_t rule)>& named_rule);

}  // namespace vesper::grammar
