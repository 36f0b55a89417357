// The limits that bound what one constraint may cost. A request's JSON schema, regex or GBNF is
// compiled on a server worker and matched on the engine thread, so a hostile or careless one must
// be refused early, cheaply and with a message naming the limit ("the grammar has 412,000
// elements, more than the limit of 250,000"), or, where only decoding can tell (an ambiguous
// grammar), fail one sequence rather than stall the step loop.
//
// Each limit sits well above what real schemas use (tests/server/schemas: at most 1,829
// elements, 344 rules, 724 alternatives, 32 alternatives explored in a step) and low enough
// that what is within them compiles in well under a second (README.md has the measurements).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vesper::grammar {

// GBNF (gbnf.h), checked before or while parsing, before the grammar is built.
inline constexpr size_t kMaxGrammarTextBytes = size_t{4} << 20;  // the text itself
inline constexpr uint64_t kMaxGrammarElements = 250'000;         // Grammar::elements
inline constexpr uint64_t kMaxGrammarRules = 50'000;             // Grammar::rules
inline constexpr uint64_t kMaxGrammarAlternatives = 100'000;     // over all rules
// Groups and repetitions nested in each other: the parser recurses once per level (4 to 8 KB
// of stack per level in the AddressSanitizer build, whose threads have 8 MB). Regexes nest at
// most 200 groups, each with its quantifier; JSON schemas nest less than this except for tuples
// (prefixItems) of hundreds of items.
inline constexpr size_t kMaxGrammarNesting = 512;

// JSON schemas (json_schema.h), each over the whole schema, checked before the values or
// properties that would pass it are converted.
inline constexpr uint64_t kMaxEnumValues = 10'000;  // in every enum
inline constexpr uint64_t kMaxProperties = 2'000;   // declared, and named in every required
inline constexpr uint64_t kMaxSubschemas = 50'000;  // schemas visited (refs once each)

// Matching (stack_set.h, compiled_grammar.h): the stacks a state may hold and the alternatives
// one byte of input may explore. Past it a state fails as too ambiguous. A mask walks the
// vocabulary's trie with at most this many stacks per node, so it is bounded too (below a
// second for a 32,000-token vocabulary, the worst grammars built for it).
inline constexpr size_t kMaxStacksPerState = 1'024;

// `n` with thousands separators: 412000 -> "412,000".
std::string with_separators(uint64_t n);

}  // namespace vesper::grammar
