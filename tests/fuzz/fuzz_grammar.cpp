// Fuzz target: the grammar compilers that take text from requests (GBNF, regex, JSON schema;
// src/grammar/), checked against their promises:
//  - malformed input is an error with a message, never a crash, a hang or a huge allocation;
//  - what parse_gbnf accepts is well formed: every rule reference and byte set in range, every
//    alternative closed by kEnd, a root rule, and its initial state can be computed;
//  - what regex_to_gbnf and json_schema_to_gbnf produce always parses as GBNF.
// Matching is not run: an ambiguous grammar may take exponential time by design (the server
// bounds it with max_tokens, one token at a time).
//
// Input layout: the last byte picks the compiler (GBNF, regex, JSON schema); the rest is its
// text.
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar/stack_set.h"

namespace vesper::grammar {
namespace {

void check_well_formed(const Grammar& g) {
  VESPER_CHECK(g.root < g.rules.size(), "root %u of %zu rules", g.root, g.rules.size());
  for (const Rule& r : g.rules)
    for (uint32_t a : r.alternatives) {
      VESPER_CHECK(a < g.elements.size(), "alternative at %u of %zu", a, g.elements.size());
      uint32_t p = a;
      while (p < g.elements.size() && g.elements[p].kind != Element::Kind::kEnd) {
        const Element& e = g.elements[p];
        if (e.kind == Element::Kind::kRule)
          VESPER_CHECK(e.value < g.rules.size(), "rule reference %u", e.value);
        else
          VESPER_CHECK(e.value < g.byte_sets.size(), "byte set %u", e.value);
        ++p;
      }
      VESPER_CHECK(p < g.elements.size(), "alternative of %s not closed", r.name.c_str());
    }
  (void)initial_stacks(g);
}

void check_gbnf_output(const Result<std::string>& gbnf, const char* what) {
  if (!gbnf) {
    VESPER_CHECK(!gbnf.error().message.empty(), "%s: an error without a message", what);
    return;
  }
  auto g = parse_gbnf(*gbnf);
  VESPER_CHECK(g.ok(), "%s produced GBNF that does not parse: %s\n%s", what,
               g.ok() ? "" : g.error().message.c_str(), gbnf->c_str());
  check_well_formed(*g);
}

}  // namespace
}  // namespace vesper::grammar

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vesper::grammar;
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size - 1);
  switch (data[size - 1] % 3) {
    case 0: {
      auto g = parse_gbnf(text);
      if (g)
        check_well_formed(*g);
      else
        VESPER_CHECK(!g.error().message.empty(), "GBNF: an error without a message");
      break;
    }
    case 1:
      check_gbnf_output(regex_to_gbnf(text), "regex_to_gbnf");
      break;
    default: {
      const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text, nullptr, false);
      if (!schema.is_discarded())
        check_gbnf_output(json_schema_to_gbnf(schema), "json_schema_to_gbnf");
      break;
    }
  }
  return 0;
}
