// What the files behind json_schema.h share with each other, and nothing else: the GBNF rules
// every converted grammar may use and the text helpers that build expressions
// (json_schema_gbnf_rules.cpp), and the Converter that walks a schema, its methods defined by
// concern: the walk, $ref and enum/const (json_schema.cpp), strings and numbers
// (json_schema_scalars.cpp), objects and arrays (json_schema_containers.cpp).
// Internal to the JSON schema converter: include it only from json_schema*.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "grammar/length_bounded.h"

namespace vesper::grammar::json_schema_detail {

using Json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Shared rules and text helpers (json_schema_gbnf_rules.cpp)

// Rules every grammar may share, emitted once and only when used.
struct SharedRule {
  const char* name;
  std::string body;
  std::vector<const char*> deps;
};

// Every shared rule, in the order a grammar's text lists the ones it uses.
const std::vector<SharedRule>& shared_rules();

// The supported values of `format`, each the name of a shared rule.
extern const char* const kFormats[6];

// JSON's quote, and its comma and colon with whitespace around, as GBNF items.
extern const std::string kQuote;
extern const std::string kComma;
extern const std::string kColon;

using grammar::join;  // length_bounded.h
// Alternatives as one item of a sequence.
std::string alternatives(std::vector<std::string> alts);
// {min,max} as a GBNF suffix; nullopt max: unbounded.
std::string repeat_suffix(uint64_t min, std::optional<uint64_t> max);

std::string compact(const Json& j);
// Canonical JSON text of a string's contents (regex.h); nullopt if not valid UTF-8.
std::optional<std::string> json_string_contents(std::string_view utf8);
bool integral(double x);

// A bound of a range of magnitudes or integers.
struct Bound {
  int64_t value = 0;
  bool exclusive = false;
};

struct TrieNode {
  bool terminal = false;
  std::map<uint32_t, TrieNode> children;
};

// ---------------------------------------------------------------------------------------------
// The converter: one per schema, run() (or any_object()) once.

class Converter {
 public:
  explicit Converter(const Json& root);

  Result<std::string> run();
  std::string any_object();

 private:
  // --- the walk, $ref, enum/const (json_schema.cpp) ---

  std::string text() const;
  // A shared rule's name, emitting it (and the rules it uses) once.
  std::string use(std::string_view name);
  std::string unique_name(std::string_view hint);
  // `expr` as a rule reference: itself when it is one, else a new rule named after `hint`.
  std::string rule_for(std::string expr, std::string_view hint);
  static Error error(const std::string& path, const std::string& what);

  Result<std::string> visit(const Json& s, const std::string& path, const std::string& name,
                            int depth);
  // Whether a schema says nothing about instances (an allOf member that can be dropped).
  static bool annotation_only(const Json& s);
  Result<std::vector<std::string>> parse_types(const Json& t, const std::string& path);

  Result<std::string> visit_ref(const std::string& ref, const std::string& path, int depth);

  Result<std::string> json_value_literal(const Json& v, const std::string& path);
  Result<std::string> enum_expr(const Json& s, const std::string& path,
                                const std::optional<std::vector<std::string>>& types,
                                bool nullable);

  // --- strings and numbers (json_schema_scalars.cpp) ---

  // A count keyword (minLength, maxItems...): nullopt when absent.
  Result<std::optional<uint64_t>> count_keyword(const Json& s, const char* keyword,
                                                const std::string& path);
  Result<std::string> string_expr(const Json& s, const std::string& path);
  // The contents of a string in `format` with a length in [min, max] characters: the format's
  // rule where the bounds leave all its strings, else an exact length-bounded expansion of it
  // (length_bounded.h; rules shared by every string with the same format and bounds).
  Result<std::string> format_in_lengths(const std::string& format, std::optional<uint64_t> min,
                                        std::optional<uint64_t> max, const std::string& path);

  // The bound a keyword sets, as an integer clamped to just beyond the 16-digit range (a bound
  // beyond it is as good as none, or leaves nothing). `lower`: minimum-like keyword.
  struct RawBound {
    const Json* value = nullptr;
    bool exclusive = false;
    const char* keyword = "";
  };

  Result<std::optional<RawBound>> tighter_bound(const Json& s, const std::string& path, bool lower);
  // An integer value of a bound keyword clamped to [-(kMax + 1), kMax + 1]; for integer
  // schemas a fractional value is rounded inward (`lower`: up).
  static int64_t clamp_integer(const Json& v, bool lower);
  // Integers in [lo, hi] (|lo|, |hi| <= kMax), "-0" included when 0 is.
  std::string int_range(int64_t lo, int64_t hi);
  // Magnitudes (an integer part and an optional fraction) in the range `lower`..`upper` of
  // integers, lower.value >= 0; nullopt when none.
  std::optional<std::string> magnitude_range(Bound lower, std::optional<Bound> upper);
  Result<std::string> number_expr(const Json& s, const std::string& path, bool integer);

  // --- objects and arrays (json_schema_containers.cpp) ---

  // A key that is none of `names`, in canonical spelling: at each node of the names' trie the
  // key ends (where no name does), or takes a character no name takes there, or follows one.
  std::string other_key(const TrieNode& node, size_t depth = 0);
  Result<std::string> object_expr(const Json& s, const std::string& path, const std::string& name,
                                  int depth);
  Result<std::string> array_expr(const Json& s, const std::string& path, const std::string& name,
                                 int depth);

  const Json& root_;
  std::vector<std::pair<std::string, std::string>> rules_;  // in order of creation, root first
  std::set<std::string> used_names_;
  std::set<std::string> shared_used_;
  std::map<std::string, std::string> ref_rules_;  // normalized $ref -> its rule
  // $refs whose conversion is under way, outermost first; those at index >= guard_ were opened
  // after the innermost object or array being converted.
  std::vector<std::string> open_refs_;
  size_t guard_ = 0;
  std::map<std::string, std::string> bounded_formats_;  // "format-min-max" -> its expression
  uint64_t bounded_rules_ = 0;                          // rules those expressions defined
  uint64_t key_rules_ = 0;                              // rules other_key() split off
  // What the schema has asked for so far, against limits.h's bounds.
  uint64_t enum_values_ = 0, properties_ = 0, subschemas_ = 0;
};

}  // namespace vesper::grammar::json_schema_detail
