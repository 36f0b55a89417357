#include "grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/regex.h"
#include "grammar/utf8_ranges.h"

namespace vesper::grammar {
namespace {

using Json = nlohmann::ordered_json;

// Integers (and the integer part of numbers) have at most 16 digits, as in llama.cpp.
constexpr int64_t kMaxMagnitude = 9'999'999'999'999'999;
// The GBNF parser's cap on a repetition count (minLength, maxItems...).
constexpr uint64_t kMaxCount = 10000;
constexpr int kMaxDepth = 128;
// Additional keys are matched against the declared names one character per level.
constexpr size_t kMaxDeclaredNameLength = 1024;

// Standard keywords that constrain instances and are not supported: an error, never ignored.
const std::set<std::string_view> kUnsupported = {"multipleOf",
                                                 "uniqueItems",
                                                 "patternProperties",
                                                 "propertyNames",
                                                 "not",
                                                 "if",
                                                 "then",
                                                 "else",
                                                 "dependentRequired",
                                                 "dependentSchemas",
                                                 "dependencies",
                                                 "minProperties",
                                                 "maxProperties",
                                                 "contains",
                                                 "minContains",
                                                 "maxContains",
                                                 "unevaluatedProperties",
                                                 "unevaluatedItems",
                                                 "$dynamicRef",
                                                 "$recursiveRef"};

// The keywords that constrain and are supported. Every other keyword (title, description,
// default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly,
// contentMediaType, contentEncoding, $defs, definitions and anything non-standard) is ignored.
const std::set<std::string_view> kConstraining = {"type",
                                                  "enum",
                                                  "const",
                                                  "$ref",
                                                  "anyOf",
                                                  "oneOf",
                                                  "allOf",
                                                  "properties",
                                                  "required",
                                                  "additionalProperties",
                                                  "items",
                                                  "prefixItems",
                                                  "additionalItems",
                                                  "minItems",
                                                  "maxItems",
                                                  "minLength",
                                                  "maxLength",
                                                  "pattern",
                                                  "format",
                                                  "minimum",
                                                  "maximum",
                                                  "exclusiveMinimum",
                                                  "exclusiveMaximum"};

const char* const kTypes[] = {"string", "number", "integer", "boolean", "null", "object", "array"};

// Rules every grammar may share, emitted once and only when used.
struct SharedRule {
  const char* name;
  std::string body;
  std::vector<const char*> deps;
};

std::string nonzero_fraction_body() {
  // "." then 1..16 digits, not all zero: the first non-zero digit after k zeros.
  std::string inner = "[1-9]";
  for (int remaining = 2; remaining <= 16; ++remaining)
    inner = "[1-9] [0-9]{0," + std::to_string(remaining - 1) + "} | \"0\" (" + inner + ")";
  return "\".\" (" + inner + ")";
}

// email-local-K: what may follow an atext character of a local part with K characters left:
// the end, another atext, or a dot and an atext (no dot at either end, no two in a row).
void append_email_local_rules(std::vector<SharedRule>& rules) {
  static std::vector<std::string> names;  // the rules hold their names as const char*
  names.reserve(64);
  for (int k = 0; k <= 63; ++k) names.push_back("email-local-" + std::to_string(k));
  rules.push_back({names[0].c_str(), "", {}});
  rules.push_back({names[1].c_str(), "| email-atext", {"email-atext"}});
  for (int k = 2; k <= 63; ++k)
    rules.push_back({names[k].c_str(),
                     "| email-atext " + names[k - 1] + " | \".\" email-atext " + names[k - 2],
                     {"email-atext", names[k - 1].c_str(), names[k - 2].c_str()}});
}

const std::vector<SharedRule>& shared_rules() {
  static std::vector<SharedRule> rules = {
      {"ws", R"gbnf(| " " | "\n" [ \t]{0,20})gbnf", {}},
      {"value",
       "object | array | string | number | boolean | null",
       {"object", "array", "string", "number", "boolean", "null"}},
      {"object",
       R"gbnf("{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* ws )? "}")gbnf",
       {"ws", "string", "value"}},
      {"array", R"gbnf("[" ws ( value ( ws "," ws value )* ws )? "]")gbnf", {"ws", "value"}},
      {"string", R"gbnf("\"" char* "\"")gbnf", {"char"}},
      {"char", R"gbnf([^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ))gbnf", {}},
      {"number", R"gbnf(integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?)gbnf", {"integer"}},
      {"integer", R"gbnf("-"? ( "0" | [1-9] [0-9]{0,15} ))gbnf", {}},
      {"boolean", R"gbnf("true" | "false")gbnf", {}},
      {"null", R"gbnf("null")gbnf", {}},
      {"fraction-nonzero", nonzero_fraction_body(), {}},
      // RFC 3339 full-date, with the days of each month and Feb 29 only in leap years.
      {"date",
       R"gbnf([0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ) | ( [0-9]{2} ( "0" [48] | [2468] [048] | [13579] [26] ) | ( [02468] [048] | [13579] [26] ) "00" ) "-02-29")gbnf",
       {}},
      // RFC 3339 full-time.
      {"time",
       R"gbnf(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( [Zz] | [-+] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))gbnf",
       {}},
      {"date-time", "date [Tt] time", {"date", "time"}},
      // ajv's "email" (a dot-atom local part, a domain of two or more labels) within RFC 5321's
      // and RFC 1035's limits: a local part of at most 64 characters (email-local-*), labels
      // of at most 63, and at most four labels. Without the bounds a model that does not
      // write '@' soon fills its whole budget with the local part.
      {"email",
       R"gbnf(email-local "@" email-label ( "." email-label ){1,3})gbnf",
       {"email-local", "email-label"}},
      {"email-atext", R"gbnf([A-Za-z0-9!#$%&'*+/=?\^_`{|}~\-])gbnf", {}},
      {"email-label", R"gbnf([A-Za-z0-9] ( [A-Za-z0-9\-]{0,61} [A-Za-z0-9] )?)gbnf", {}},
      {"email-local", "email-atext email-local-63", {"email-atext", "email-local-63"}},
      {"uuid",
       R"gbnf([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})gbnf",
       {}},
      {"ipv4",
       R"gbnf(( ( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) "." ){3} ( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9] ))gbnf",
       {}},
      // One character of a key in its canonical spelling (regex.h).
      {"key-char", json_string_char_expression(normalize({{0, 0x10FFFF}})), {}},
  };
  static const bool local_rules_added = [] {
    append_email_local_rules(rules);
    return true;
  }();
  (void)local_rules_added;
  return rules;
}

const char* const kFormats[] = {"date", "time", "date-time", "email", "uuid", "ipv4"};

const std::string kQuote = R"gbnf("\"")gbnf";
const std::string kComma = R"gbnf(ws "," ws)gbnf";
const std::string kColon = R"gbnf(ws ":" ws)gbnf";

bool is_rule_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_'))
      return false;
  return true;
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

// Alternatives as one item of a sequence.
std::string alternatives(std::vector<std::string> alts) {
  std::vector<std::string> unique;
  for (std::string& a : alts)
    if (std::find(unique.begin(), unique.end(), a) == unique.end()) unique.push_back(std::move(a));
  if (unique.size() == 1) return unique.front();
  return "( " + join(unique, " | ") + " )";
}

// {min,max} as a GBNF suffix; nullopt max: unbounded.
std::string repeat_suffix(uint64_t min, std::optional<uint64_t> max) {
  if (!max) return min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}";
  if (min == *max) return min == 1 ? "" : "{" + std::to_string(min) + "}";
  if (min == 0 && *max == 1) return "?";
  return "{" + std::to_string(min) + "," + std::to_string(*max) + "}";
}

std::string type_name(const Json& j) {
  return j.type_name();
}

std::string compact(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Canonical JSON text of a string's contents (regex.h); nullopt if not valid UTF-8.
std::optional<std::string> json_string_contents(std::string_view utf8) {
  auto cps = decode_utf8(utf8);
  if (!cps) return std::nullopt;
  std::string out;
  for (uint32_t cp : *cps) append_json_string_char(cp, out);
  return out;
}

bool integral(double x) {
  return std::isfinite(x) && std::floor(x) == x;
}

bool has_type(const Json& v, std::string_view t) {
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer")
    return v.is_number_integer() || (v.is_number_float() && integral(v.get<double>()));
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  return false;
}

// Decimal strings of equal length with lo <= hi: the GBNF of every string between them.
std::string digit_range(std::string_view lo, std::string_view hi) {
  if (lo.empty()) return "";
  auto all = [](std::string_view s, char c) {
    return std::all_of(s.begin(), s.end(), [c](char x) { return x == c; });
  };
  auto any_digits = [](size_t n) {
    return n == 0   ? std::string()
           : n == 1 ? std::string("[0-9]")
                    : "[0-9]{" + std::to_string(n) + "}";
  };
  auto digits = [](char a, char b) {
    return a == b ? "\"" + std::string(1, a) + "\""
                  : "[" + std::string(1, a) + "-" + std::string(1, b) + "]";
  };
  const size_t rest = lo.size() - 1;
  if (lo[0] == hi[0])
    return join({digits(lo[0], lo[0]), digit_range(lo.substr(1), hi.substr(1))}, " ");
  // The first digit's range splits into: lo[0] with the rest from lo's tail, the digits strictly
  // between with any rest, hi[0] with the rest up to hi's tail (merged when a tail is full).
  char mid_lo = static_cast<char>(lo[0] + 1), mid_hi = static_cast<char>(hi[0] - 1);
  std::vector<std::string> alts;
  if (all(lo.substr(1), '0'))
    mid_lo = lo[0];
  else
    alts.push_back(
        join({digits(lo[0], lo[0]), digit_range(lo.substr(1), std::string(rest, '9'))}, " "));
  const bool hi_full = all(hi.substr(1), '9');
  if (hi_full) mid_hi = hi[0];
  if (mid_lo <= mid_hi) alts.push_back(join({digits(mid_lo, mid_hi), any_digits(rest)}, " "));
  if (!hi_full)
    alts.push_back(
        join({digits(hi[0], hi[0]), digit_range(std::string(rest, '0'), hi.substr(1))}, " "));
  return alternatives(std::move(alts));
}

int64_t pow10(size_t n) {
  int64_t v = 1;
  while (n-- > 0) v *= 10;
  return v;
}

// The decimal strings (no leading zeros) of the integers in [a, b], 0 <= a <= b.
std::string uint_range(int64_t a, int64_t b) {
  const std::string sa = std::to_string(a), sb = std::to_string(b);
  std::vector<std::string> alts;
  for (size_t len = sa.size(); len <= sb.size(); ++len) {
    const int64_t lo = len == sa.size() ? a : pow10(len - 1);
    const int64_t hi = len == sb.size() ? b : pow10(len) - 1;
    alts.push_back(digit_range(std::to_string(lo), std::to_string(hi)));
  }
  return alternatives(std::move(alts));
}

// A bound of a range of magnitudes or integers.
struct Bound {
  int64_t value = 0;
  bool exclusive = false;
};

// Restores the recursion guard when an object or array is done.
class GuardScope {
 public:
  GuardScope(size_t& guard, size_t value) : guard_(guard), saved_(guard) { guard_ = value; }
  ~GuardScope() { guard_ = saved_; }
  GuardScope(const GuardScope&) = delete;
  GuardScope& operator=(const GuardScope&) = delete;

 private:
  size_t& guard_;
  size_t saved_;
};

struct TrieNode {
  bool terminal = false;
  std::map<uint32_t, TrieNode> children;
};

class Converter {
 public:
  explicit Converter(const Json& root) : root_(root) {
    used_names_.insert("root");
    for (const SharedRule& r : shared_rules()) used_names_.insert(r.name);
    for (const char* f : kFormats) used_names_.insert(f);
  }

  Result<std::string> run() {
    ref_rules_["#"] = "root";
    open_refs_.push_back("#");
    rules_.push_back({"root", ""});
    VESPER_ASSIGN_OR_RETURN(std::string expr, visit(root_, "schema", "root", 0));
    rules_[0].second = std::move(expr);
    return text();
  }

  std::string any_object() {
    rules_.push_back({"root", use("object")});
    return text();
  }

 private:
  std::string text() const {
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    for (const SharedRule& r : shared_rules())
      if (shared_used_.count(r.name)) out += std::string(r.name) + " ::= " + r.body + "\n";
    return out;
  }

  // A shared rule's name, emitting it (and the rules it uses) once.
  std::string use(std::string_view name) {
    for (const SharedRule& r : shared_rules()) {
      if (r.name != name) continue;
      if (shared_used_.insert(r.name).second)
        for (const char* dep : r.deps) use(dep);
      return r.name;
    }
    VESPER_CHECK(false, "unknown shared rule %s", std::string(name).c_str());
    return "";
  }

  std::string unique_name(std::string_view hint) {
    std::string base;
    for (char c : hint.substr(0, 64))
      base += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '-';
    if (base.empty()) base = "rule";
    std::string name = base;
    for (int i = 2; used_names_.count(name); ++i) name = base + "-" + std::to_string(i);
    used_names_.insert(name);
    return name;
  }

  // `expr` as a rule reference: itself when it is one, else a new rule named after `hint`.
  std::string rule_for(std::string expr, std::string_view hint) {
    if (is_rule_name(expr)) return expr;
    std::string name = unique_name(hint);
    rules_.push_back({name, std::move(expr)});
    return name;
  }

  static Error error(const std::string& path, const std::string& what) {
    return make_error(path + ": " + what);
  }

  Result<std::string> visit(const Json& s, const std::string& path, const std::string& name,
                            int depth) {
    if (depth > kMaxDepth)
      return error(path, "schemas nested deeper than " + std::to_string(kMaxDepth) +
                             " levels are not supported");
    if (s.is_boolean()) {
      if (s.get<bool>()) return use("value");
      return error(path, "the schema 'false' matches nothing");
    }
    if (!s.is_object())
      return error(path, "a schema must be an object or a boolean, not " + type_name(s));
    for (const auto& [key, value] : s.items()) {
      if (!kUnsupported.count(key)) continue;
      if (key == "uniqueItems" && value == false) continue;  // says nothing
      if ((key == "minProperties" || key == "minContains") && value == 0) continue;
      return error(path, "'" + key + "' is not supported");
    }
    bool nullable = false;
    if (auto it = s.find("nullable"); it != s.end()) {
      if (!it->is_boolean()) return error(path, "'nullable' must be a boolean");
      nullable = it->get<bool>();
    }
    std::vector<std::string> constraining;
    for (const auto& [key, value] : s.items())
      if (kConstraining.count(key)) constraining.push_back(key);
    auto with_null = [&](std::string expr) {
      return nullable ? alternatives({std::move(expr), use("null")}) : expr;
    };
    // A keyword that stands for the whole schema: any other constraint beside it is refused
    // rather than dropped.
    auto alone = [&](std::string_view keyword) -> Status {
      for (const std::string& k : constraining)
        if (k != keyword)
          return error(path,
                       "'" + k + "' alongside '" + std::string(keyword) + "' is not supported");
      return {};
    };

    if (auto it = s.find("$ref"); it != s.end()) {
      VESPER_TRY(alone("$ref"));
      if (!it->is_string()) return error(path, "'$ref' must be a string");
      VESPER_ASSIGN_OR_RETURN(std::string rule, visit_ref(it->get<std::string>(), path, depth));
      return with_null(rule);
    }

    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->empty()) return error(path, "'allOf' must be a non-empty array");
      std::vector<size_t> members;
      for (size_t i = 0; i < it->size(); ++i) {
        const Json& m = (*it)[i];
        if (!annotation_only(m)) members.push_back(i);
      }
      if (members.size() > 1)
        return error(path, "'allOf' with several constraining members is not supported");
      if (members.size() == 1) {
        VESPER_TRY(alone("allOf"));
        const size_t i = members.front();
        VESPER_ASSIGN_OR_RETURN(
            std::string expr,
            visit((*it)[i], path + ".allOf[" + std::to_string(i) + "]", name, depth + 1));
        return with_null(expr);
      }
      constraining.erase(std::find(constraining.begin(), constraining.end(), "allOf"));
    }

    const bool any_of = s.contains("anyOf"), one_of = s.contains("oneOf");
    if (any_of && one_of) return error(path, "'oneOf' alongside 'anyOf' is not supported");
    if (any_of || one_of) {
      const std::string keyword = any_of ? "anyOf" : "oneOf";
      VESPER_TRY(alone(keyword));
      const Json& members = s[keyword];
      if (!members.is_array() || members.empty())
        return error(path, "'" + keyword + "' must be a non-empty array");
      std::vector<std::string> alts;
      for (size_t i = 0; i < members.size(); ++i) {
        if (members[i] == false) continue;  // matches nothing: drop the branch
        VESPER_ASSIGN_OR_RETURN(
            std::string expr,
            visit(members[i], path + "." + keyword + "[" + std::to_string(i) + "]",
                  name + "-" + std::to_string(i), depth + 1));
        alts.push_back(std::move(expr));
      }
      if (alts.empty()) return error(path, "every member of '" + keyword + "' is 'false'");
      return with_null(alternatives(std::move(alts)));
    }

    std::optional<std::vector<std::string>> types;
    if (auto it = s.find("type"); it != s.end()) {
      VESPER_ASSIGN_OR_RETURN(types, parse_types(*it, path));
    }

    if (s.contains("enum") || s.contains("const")) {
      for (const std::string& k : constraining)
        if (k != "enum" && k != "const" && k != "type")
          return error(path, "'" + k + "' alongside '" + (s.contains("const") ? "const" : "enum") +
                                 "' is not supported");
      return enum_expr(s, path, types, nullable);
    }

    if (!types) {
      // No `type`: the kind the keywords imply (llama.cpp, xgrammar), or any value.
      types.emplace();
      auto implies = [&](std::initializer_list<const char*> keys, const char* type) {
        for (const char* k : keys)
          if (s.contains(k)) {
            types->push_back(type);
            return;
          }
      };
      implies({"properties", "required", "additionalProperties"}, "object");
      implies({"items", "prefixItems", "additionalItems", "minItems", "maxItems"}, "array");
      implies({"minLength", "maxLength", "pattern", "format"}, "string");
      implies({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}, "number");
      if (types->empty()) return use("value");
    }
    if (nullable) types->push_back("null");
    const bool has_number = std::count(types->begin(), types->end(), "number") > 0;
    std::vector<std::string> alts;
    std::set<std::string> done;
    for (const std::string& t : *types) {
      if (!done.insert(t).second || (t == "integer" && has_number)) continue;
      if (t == "string") {
        VESPER_ASSIGN_OR_RETURN(std::string e, string_expr(s, path));
        alts.push_back(std::move(e));
      } else if (t == "integer" || t == "number") {
        VESPER_ASSIGN_OR_RETURN(std::string e, number_expr(s, path, t == "integer"));
        alts.push_back(std::move(e));
      } else if (t == "boolean" || t == "null") {
        alts.push_back(use(t));
      } else if (t == "object") {
        VESPER_ASSIGN_OR_RETURN(std::string e, object_expr(s, path, name, depth));
        alts.push_back(std::move(e));
      } else {
        VESPER_ASSIGN_OR_RETURN(std::string e, array_expr(s, path, name, depth));
        alts.push_back(std::move(e));
      }
    }
    return alternatives(std::move(alts));
  }

  // Whether a schema says nothing about instances (an allOf member that can be dropped).
  static bool annotation_only(const Json& s) {
    if (s.is_boolean()) return s.get<bool>();
    if (!s.is_object()) return false;
    for (const auto& [key, value] : s.items())
      if (kConstraining.count(key) || kUnsupported.count(key) || key == "nullable") return false;
    return true;
  }

  Result<std::vector<std::string>> parse_types(const Json& t, const std::string& path) {
    std::vector<std::string> out;
    auto add = [&](const Json& name) -> Status {
      if (!name.is_string()) return error(path, "'type' must be a string or an array of strings");
      const std::string n = name.get<std::string>();
      if (std::find(std::begin(kTypes), std::end(kTypes), n) == std::end(kTypes))
        return error(path, "unknown type '" + n + "'");
      out.push_back(n);
      return {};
    };
    if (t.is_array()) {
      if (t.empty()) return error(path, "'type' is an empty array");
      for (const Json& n : t) VESPER_TRY(add(n));
    } else {
      VESPER_TRY(add(t));
    }
    return out;
  }

  // --- $ref ---

  Result<std::string> visit_ref(const std::string& ref, const std::string& path, int depth) {
    const std::string at = path + ".$ref '" + ref + "'";
    if (ref.empty() || ref[0] != '#')
      return make_error(at + " is not supported (only references into this schema, '#...')");
    const std::string key = ref == "#/" ? "#" : ref;
    if (auto it = ref_rules_.find(key); it != ref_rules_.end()) {
      // A reference back into a schema being converted, with no object or array opened since:
      // the rule would be left-recursive.
      const auto open = std::find(open_refs_.begin(), open_refs_.end(), key);
      if (open != open_refs_.end() && static_cast<size_t>(open - open_refs_.begin()) >= guard_)
        return make_error(at +
                          " recurses without an object or array in between, which is not "
                          "supported");
      return it->second;
    }
    const Json* target = &root_;
    std::string target_path = "schema", last = "ref";
    std::string fragment;
    for (size_t i = 1; i < key.size(); ++i) {
      // URI fragments may percent-encode.
      if (key[i] == '%' && i + 2 < key.size() &&
          std::isxdigit(static_cast<unsigned char>(key[i + 1])) &&
          std::isxdigit(static_cast<unsigned char>(key[i + 2]))) {
        fragment += static_cast<char>(std::stoi(key.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        fragment += key[i];
      }
    }
    if (!fragment.empty()) {
      if (fragment[0] != '/') return make_error(at + " does not resolve");
      size_t start = 1;
      for (;;) {
        const size_t end = fragment.find('/', start);
        std::string token = fragment.substr(start, end == std::string::npos ? end : end - start);
        std::string unescaped;
        for (size_t i = 0; i < token.size(); ++i) {
          if (token[i] == '~' && i + 1 < token.size() &&
              (token[i + 1] == '0' || token[i + 1] == '1')) {
            unescaped += token[i + 1] == '0' ? '~' : '/';
            ++i;
          } else {
            unescaped += token[i];
          }
        }
        if (target->is_object()) {
          auto it = target->find(unescaped);
          if (it == target->end()) return make_error(at + " does not resolve");
          target = &*it;
        } else if (target->is_array() && !unescaped.empty() &&
                   std::all_of(unescaped.begin(), unescaped.end(),
                               [](char c) { return c >= '0' && c <= '9'; }) &&
                   unescaped.size() < 10 && std::stoul(unescaped) < target->size()) {
          target = &(*target)[std::stoul(unescaped)];
        } else {
          return make_error(at + " does not resolve");
        }
        target_path += "." + unescaped;
        last = unescaped;
        if (end == std::string::npos) break;
        start = end + 1;
      }
    }
    const std::string rule = unique_name(last);
    ref_rules_[key] = rule;
    const size_t slot = rules_.size();
    rules_.push_back({rule, ""});
    open_refs_.push_back(key);
    auto expr = visit(*target, target_path, rule, depth + 1);
    open_refs_.pop_back();
    if (!expr.ok()) return expr.error();
    rules_[slot].second = std::move(expr).value();
    return rule;
  }

  // --- enum / const ---

  Result<std::string> json_value_literal(const Json& v, const std::string& path) {
    if (v.is_string()) {
      auto contents = json_string_contents(v.get_ref<const std::string&>());
      if (!contents) return error(path, "a string in 'enum' or 'const' is not valid UTF-8");
      return gbnf_literal("\"" + *contents + "\"");
    }
    if (v.is_array()) {
      std::vector<std::string> items;
      for (const Json& item : v) {
        VESPER_ASSIGN_OR_RETURN(std::string e, json_value_literal(item, path));
        items.push_back(std::move(e));
      }
      use("ws");
      if (items.empty()) return std::string(R"gbnf("[" ws "]")gbnf");
      return R"gbnf("[" ws )gbnf" + join(items, " " + kComma + " ") + R"gbnf( ws "]")gbnf";
    }
    if (v.is_object()) {
      std::vector<std::string> members;
      for (const auto& [key, value] : v.items()) {
        auto contents = json_string_contents(key);
        if (!contents) return error(path, "a key in 'enum' or 'const' is not valid UTF-8");
        VESPER_ASSIGN_OR_RETURN(std::string e, json_value_literal(value, path));
        members.push_back(gbnf_literal("\"" + *contents + "\"") + " " + kColon + " " + e);
      }
      use("ws");
      if (members.empty()) return std::string(R"gbnf("{" ws "}")gbnf");
      return R"gbnf("{" ws )gbnf" + join(members, " " + kComma + " ") + R"gbnf( ws "}")gbnf";
    }
    if (v.is_number() || v.is_boolean() || v.is_null()) return gbnf_literal(compact(v));
    return error(path, "'enum' holds a value that is not JSON");
  }

  Result<std::string> enum_expr(const Json& s, const std::string& path,
                                const std::optional<std::vector<std::string>>& types,
                                bool nullable) {
    std::vector<const Json*> values;
    if (auto c = s.find("const"); c != s.end()) {
      values.push_back(&*c);
    }
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) return error(path, "'enum' must be a non-empty array");
      if (values.empty()) {
        for (const Json& v : *e) values.push_back(&v);
      } else if (std::find(e->begin(), e->end(), *values.front()) == e->end()) {
        values.clear();  // const not among the enum values
      }
    }
    std::vector<std::string> alts;
    bool has_null = false;
    for (const Json* v : values) {
      if (types && !(nullable && v->is_null()) &&
          std::none_of(types->begin(), types->end(),
                       [&](const std::string& t) { return has_type(*v, t); }))
        continue;
      has_null = has_null || v->is_null();
      VESPER_ASSIGN_OR_RETURN(std::string lit, json_value_literal(*v, path));
      alts.push_back(std::move(lit));
    }
    if (nullable && !has_null) alts.push_back(use("null"));
    if (alts.empty()) return error(path, "no value of 'enum' or 'const' fits the schema's 'type'");
    return alternatives(std::move(alts));
  }

  // --- strings ---

  // A count keyword (minLength, maxItems...): nullopt when absent.
  Result<std::optional<uint64_t>> count_keyword(const Json& s, const char* keyword,
                                                const std::string& path) {
    auto it = s.find(keyword);
    if (it == s.end()) return std::optional<uint64_t>();
    uint64_t v = 0;
    if (it->is_number_unsigned()) {
      v = it->get<uint64_t>();
    } else if (it->is_number_integer() && it->get<int64_t>() >= 0) {
      v = static_cast<uint64_t>(it->get<int64_t>());  // built in code rather than parsed
    } else if (it->is_number_float() && integral(it->get<double>()) && it->get<double>() >= 0) {
      v = it->get<double>() > 1e18 ? UINT64_MAX : static_cast<uint64_t>(it->get<double>());
    } else {
      return error(path, "'" + std::string(keyword) + "' must be a non-negative integer");
    }
    if (v > kMaxCount)
      return error(path, "'" + std::string(keyword) + "' " + compact(*it) + " is above " +
                             std::to_string(kMaxCount) + ", the largest supported");
    return std::optional<uint64_t>(v);
  }

  Result<std::string> string_expr(const Json& s, const std::string& path) {
    const char* const others[] = {"format", "minLength", "maxLength"};
    if (auto it = s.find("pattern"); it != s.end()) {
      for (const char* k : others)
        if (s.contains(k))
          return error(path, "'" + std::string(k) + "' alongside 'pattern' is not supported");
      if (!it->is_string()) return error(path, "'pattern' must be a string");
      RegexOptions options;
      options.search = true;
      options.json_string = true;
      auto expr = regex_to_gbnf_expression(it->get<std::string>(), options);
      if (!expr.ok()) return make_error(path + ".pattern: " + expr.error().message);
      return kQuote + " ( " + *expr + " ) " + kQuote;
    }
    if (auto it = s.find("format"); it != s.end()) {
      for (const char* k : {"minLength", "maxLength"})
        if (s.contains(k))
          return error(path, "'" + std::string(k) + "' alongside 'format' is not supported");
      const std::string format = it->is_string() ? it->get<std::string>() : compact(*it);
      if (std::find(std::begin(kFormats), std::end(kFormats), format) == std::end(kFormats))
        return error(path, "'format' \"" + format + "\" is not supported");
      return kQuote + " " + use(format) + " " + kQuote;
    }
    VESPER_ASSIGN_OR_RETURN(std::optional<uint64_t> min, count_keyword(s, "minLength", path));
    VESPER_ASSIGN_OR_RETURN(std::optional<uint64_t> max, count_keyword(s, "maxLength", path));
    if (min && max && *min > *max)
      return error(path, "'minLength' " + std::to_string(*min) + " is above 'maxLength' " +
                             std::to_string(*max));
    if (!min.value_or(0) && !max) return use("string");
    return kQuote + " " + use("char") + repeat_suffix(min.value_or(0), max) + " " + kQuote;
  }

  // --- numbers ---

  // The bound a keyword sets, as an integer clamped to just beyond the 16-digit range (a bound
  // beyond it is as good as none, or leaves nothing). `lower`: minimum-like keyword.
  struct RawBound {
    const Json* value = nullptr;
    bool exclusive = false;
    const char* keyword = "";
  };

  Result<std::optional<RawBound>> tighter_bound(const Json& s, const std::string& path,
                                                bool lower) {
    const char* inclusive_kw = lower ? "minimum" : "maximum";
    const char* exclusive_kw = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    std::optional<RawBound> out;
    auto inc = s.find(inclusive_kw);
    auto exc = s.find(exclusive_kw);
    if (inc != s.end()) {
      if (!inc->is_number())
        return error(path, "'" + std::string(inclusive_kw) + "' must be a number");
      out = RawBound{&*inc, false, inclusive_kw};
    }
    if (exc != s.end()) {
      if (exc->is_boolean()) {  // draft 4: a flag on minimum/maximum
        if (out && exc->get<bool>()) out->exclusive = true;
      } else if (exc->is_number()) {
        const double e = exc->get<double>();
        if (!out || (lower ? e >= out->value->get<double>() : e <= out->value->get<double>()))
          out = RawBound{&*exc, true, exclusive_kw};
      } else {
        return error(path, "'" + std::string(exclusive_kw) + "' must be a number");
      }
    }
    return out;
  }

  // An integer value of a bound keyword clamped to [-(kMax + 1), kMax + 1]; for integer
  // schemas a fractional value is rounded inward (`lower`: up).
  static int64_t clamp_integer(const Json& v, bool lower) {
    constexpr int64_t kBeyond = kMaxMagnitude + 1;
    if (v.is_number_unsigned())
      return v.get<uint64_t>() > uint64_t{kBeyond} ? kBeyond : v.get<int64_t>();
    if (v.is_number_integer()) return std::clamp<int64_t>(v.get<int64_t>(), -kBeyond, kBeyond);
    double x = v.get<double>();
    x = lower ? std::ceil(x) : std::floor(x);
    if (x >= static_cast<double>(kBeyond)) return kBeyond;
    if (x <= -static_cast<double>(kBeyond)) return -kBeyond;
    return static_cast<int64_t>(x);
  }

  // Integers in [lo, hi] (|lo|, |hi| <= kMax), "-0" included when 0 is.
  std::string int_range(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    if (hi >= 0) alts.push_back(uint_range(std::max<int64_t>(lo, 0), hi));
    if (lo <= 0 && std::max<int64_t>(0, -hi) <= -lo)
      alts.push_back("\"-\" " + uint_range(std::max<int64_t>(0, -hi), -lo));
    return alternatives(std::move(alts));
  }

  // Magnitudes (an integer part and an optional fraction) in the range `lower`..`upper` of
  // integers, lower.value >= 0; nullopt when none.
  std::optional<std::string> magnitude_range(Bound lower, std::optional<Bound> upper) {
    const int64_t any_lo = lower.exclusive ? lower.value + 1 : lower.value;
    const int64_t any_hi = upper ? std::min(upper->value - 1, kMaxMagnitude) : kMaxMagnitude;
    std::vector<std::string> alts;
    if (any_lo <= any_hi)
      alts.push_back(uint_range(any_lo, any_hi) + R"gbnf( ( "." [0-9]{1,16} )?)gbnf");
    // Just above an exclusive lower bound: a fraction that is not zero.
    if (lower.exclusive && lower.value <= kMaxMagnitude && (!upper || lower.value < upper->value))
      alts.push_back(gbnf_literal(std::to_string(lower.value)) + " " + use("fraction-nonzero"));
    // At an inclusive upper bound: only zeros after the point.
    if (upper && !upper->exclusive && upper->value <= kMaxMagnitude &&
        (upper->value > lower.value || (upper->value == lower.value && !lower.exclusive)))
      alts.push_back(gbnf_literal(std::to_string(upper->value)) + R"gbnf( ( "." "0"{1,16} )?)gbnf");
    if (alts.empty()) return std::nullopt;
    return alternatives(std::move(alts));
  }

  Result<std::string> number_expr(const Json& s, const std::string& path, bool integer) {
    VESPER_ASSIGN_OR_RETURN(std::optional<RawBound> lower, tighter_bound(s, path, true));
    VESPER_ASSIGN_OR_RETURN(std::optional<RawBound> upper, tighter_bound(s, path, false));
    if (!lower && !upper) return use(integer ? "integer" : "number");
    std::string keywords;
    for (const auto& b : {lower, upper})
      if (b) keywords += std::string(keywords.empty() ? "'" : " and '") + b->keyword + "'";
    if (integer) {
      int64_t lo = -kMaxMagnitude, hi = kMaxMagnitude;
      if (lower) {
        lo = clamp_integer(*lower->value, true);
        if (lower->exclusive && integral(lower->value->get<double>())) ++lo;
        lo = std::max(lo, -kMaxMagnitude);
      }
      if (upper) {
        hi = clamp_integer(*upper->value, false);
        if (upper->exclusive && integral(upper->value->get<double>())) --hi;
        hi = std::min(hi, kMaxMagnitude);
      }
      if (lo > hi) return error(path, keywords + " leave no integer of at most 16 digits");
      return int_range(lo, hi);
    }
    for (const auto& b : {lower, upper})
      if (b && !integral(b->value->get<double>()))
        return error(path, "'" + std::string(b->keyword) + "' " + compact(*b->value) +
                               " on a number is not supported (only integer bounds)");
    std::optional<Bound> lo, hi;
    if (lower) lo = Bound{clamp_integer(*lower->value, true), lower->exclusive};
    if (upper) hi = Bound{clamp_integer(*upper->value, false), upper->exclusive};
    if (lo && lo->value < -kMaxMagnitude) lo.reset();  // below every 16-digit number
    if (hi && hi->value > kMaxMagnitude) hi.reset();
    std::vector<std::string> alts;
    // Non-negative texts: the value is the magnitude.
    if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
      Bound m_lo{0, false};
      if (lo && lo->value >= 0) m_lo = *lo;
      if (auto e = magnitude_range(m_lo, hi)) alts.push_back(*e);
    }
    // Texts with a minus sign: the value is minus the magnitude (-0 is 0).
    if (!lo || lo->value < 0 || (lo->value == 0 && !lo->exclusive)) {
      std::optional<Bound> m_hi;
      if (lo) m_hi = Bound{-lo->value, lo->exclusive};
      Bound m_lo{0, false};
      if (hi && hi->value <= 0) m_lo = Bound{-hi->value, hi->exclusive};
      if (auto e = magnitude_range(m_lo, m_hi)) alts.push_back("\"-\" " + *e);
    }
    if (alts.empty()) return error(path, keywords + " leave no number");
    return alternatives(std::move(alts));
  }

  // --- objects ---

  // A key that is none of `names`, in canonical spelling: at each node of the names' trie the
  // key ends (where no name does), or takes a character no name takes there, or follows one.
  std::string other_key(const TrieNode& node) {
    std::vector<std::string> alts;
    if (!node.terminal) alts.push_back(kQuote);
    CodepointRanges taken;
    for (const auto& [cp, child] : node.children) taken.push_back({cp, cp});
    alts.push_back(json_string_char_expression(complement(normalize(taken))) + " " +
                   use("key-char") + "* " + kQuote);
    for (const auto& [cp, child] : node.children) {
      std::string spelled;
      append_json_string_char(cp, spelled);
      alts.push_back(gbnf_literal(spelled) + " " + other_key(child));
    }
    return "( " + join(alts, " | ") + " )";
  }

  Result<std::string> object_expr(const Json& s, const std::string& path, const std::string& name,
                                  int depth) {
    GuardScope guard(guard_, open_refs_.size());
    const Json* props = nullptr;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return error(path, "'properties' must be an object");
      props = &*it;
    }
    std::vector<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return error(path, "'required' must be an array of strings");
      for (const Json& r : *it) {
        if (!r.is_string()) return error(path, "'required' must be an array of strings");
        if (std::find(required.begin(), required.end(), r.get<std::string>()) == required.end())
          required.push_back(r.get<std::string>());
      }
    }
    // Values of keys beyond the declared ones: nullopt when there may be none.
    std::optional<std::string> extra_value;
    const auto addl = s.find("additionalProperties");
    const bool addl_false = addl != s.end() && *addl == false;
    if (addl == s.end()) {
      if (!props) extra_value = use("value");  // strict only where properties are declared
    } else if (addl->is_boolean()) {
      if (addl->get<bool>()) extra_value = use("value");
    } else if (addl->is_object()) {
      VESPER_ASSIGN_OR_RETURN(std::string e, visit(*addl, path + ".additionalProperties",
                                                   name + "-additional", depth + 1));
      extra_value = rule_for(std::move(e), name + "-additional");
    } else {
      return error(path, "'additionalProperties' must be a boolean or a schema");
    }

    use("ws");
    struct Member {
      std::string kv;
      bool required;
    };
    std::vector<Member> members;
    std::vector<std::string> names;  // every declared name, for the keys of further pairs
    auto key_literal = [&](const std::string& key,
                           const std::string& where) -> Result<std::string> {
      auto contents = json_string_contents(key);
      if (!contents) return error(where, "a property name is not valid UTF-8");
      return gbnf_literal("\"" + *contents + "\"");
    };
    if (props) {
      for (const auto& [key, value] : props->items()) {
        const std::string where = path + ".properties." + key;
        const bool req = std::find(required.begin(), required.end(), key) != required.end();
        names.push_back(key);
        if (value == false) {
          if (req) return error(where, "the property is required but its schema is 'false'");
          continue;  // may not appear: leave it out
        }
        VESPER_ASSIGN_OR_RETURN(std::string e, visit(value, where, name + "-" + key, depth + 1));
        const std::string rule = rule_for(std::move(e), name + "-" + key);
        VESPER_ASSIGN_OR_RETURN(std::string lit, key_literal(key, where));
        members.push_back({lit + " " + kColon + " " + rule, req});
      }
    }
    for (const std::string& key : required) {
      if (props && props->contains(key)) continue;
      if (addl_false)
        return error(path + ".required", "'" + key +
                                             "' is not in 'properties' and additionalProperties "
                                             "is false");
      VESPER_ASSIGN_OR_RETURN(std::string lit, key_literal(key, path + ".required"));
      members.push_back({lit + " " + kColon + " " + extra_value.value_or(use("value")), true});
      names.push_back(key);
    }
    if (members.empty() && extra_value && *extra_value == "value") return use("object");

    std::string extra_kv, extra_tail;
    if (extra_value) {
      std::string key = use("string");
      if (!names.empty()) {
        TrieNode trie;
        for (const std::string& n : names) {
          auto cps = decode_utf8(n);
          if (!cps) return error(path, "a property name is not valid UTF-8");
          if (cps->size() > kMaxDeclaredNameLength)
            return error(path, "a property name longer than " +
                                   std::to_string(kMaxDeclaredNameLength) +
                                   " characters is not supported with additionalProperties");
          TrieNode* node = &trie;
          for (uint32_t cp : *cps) node = &node->children[cp];
          node->terminal = true;
        }
        key = rule_for(kQuote + " " + other_key(trie), name + "-additional-key");
      }
      extra_kv = key + " " + kColon + " " + *extra_value;
      extra_tail = "( " + kComma + " " + extra_kv + " )*";
    }

    // Members in order, each required one present: the alternatives are "the first member
    // present is k" (k up to the first required one), each followed by the rest, where every
    // optional member may be skipped. With many leading optional members the rests become
    // rules, so the grammar stays linear in the number of properties.
    const size_t n = members.size();
    size_t leading_optional = 0;
    while (leading_optional < n && !members[leading_optional].required) ++leading_optional;
    const bool rest_rules = leading_optional >= 4;
    std::vector<std::string> rest(n + 1);
    rest[n] = extra_tail;
    for (size_t i = n; i-- > 1;) {
      const std::string item = members[i].required ? kComma + " " + members[i].kv
                                                   : "( " + kComma + " " + members[i].kv + " )?";
      std::string body = join({item, rest[i + 1]}, " ");
      rest[i] = rest_rules && i <= leading_optional + 1
                    ? rule_for(std::move(body), name + "-rest-" + std::to_string(i))
                    : std::move(body);
    }
    std::vector<std::string> alts;
    for (size_t k = 0; k < n; ++k) {
      alts.push_back(join({members[k].kv, rest[k + 1]}, " "));
      if (members[k].required) break;
    }
    const bool may_be_empty = leading_optional == n;
    if (may_be_empty && extra_value) alts.push_back(join({extra_kv, extra_tail}, " "));
    if (alts.empty()) return std::string(R"gbnf("{" ws "}")gbnf");
    const std::string body = alternatives(std::move(alts));
    if (may_be_empty) return R"gbnf("{" ws ( )gbnf" + body + R"gbnf( ws )? "}")gbnf";
    return R"gbnf("{" ws )gbnf" + body + R"gbnf( ws "}")gbnf";
  }

  // --- arrays ---

  Result<std::string> array_expr(const Json& s, const std::string& path, const std::string& name,
                                 int depth) {
    GuardScope guard(guard_, open_refs_.size());
    std::vector<std::string> prefix;
    const Json* rest_schema = nullptr;  // nullptr: any value
    std::string rest_path;
    auto items = s.find("items");
    auto visit_prefix = [&](const Json& list, const std::string& list_path) -> Status {
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string where = list_path + "[" + std::to_string(i) + "]";
        VESPER_ASSIGN_OR_RETURN(
            std::string e, visit(list[i], where, name + "-item-" + std::to_string(i), depth + 1));
        prefix.push_back(rule_for(std::move(e), name + "-item-" + std::to_string(i)));
      }
      return {};
    };
    if (auto p = s.find("prefixItems"); p != s.end()) {
      if (!p->is_array()) return error(path, "'prefixItems' must be an array of schemas");
      if (items != s.end() && items->is_array())
        return error(path, "'items' as an array alongside 'prefixItems' is not supported");
      VESPER_TRY(visit_prefix(*p, path + ".prefixItems"));
      if (items != s.end()) rest_schema = &*items, rest_path = path + ".items";
    } else if (items != s.end() && items->is_array()) {
      // Draft 4 to 2019-09 tuples: `items` is the prefix, `additionalItems` the rest.
      VESPER_TRY(visit_prefix(*items, path + ".items"));
      if (auto a = s.find("additionalItems"); a != s.end())
        rest_schema = &*a, rest_path = path + ".additionalItems";
    } else if (items != s.end()) {
      rest_schema = &*items, rest_path = path + ".items";
    }
    const bool rest_allowed = !(rest_schema && *rest_schema == false);
    std::string rest;
    if (rest_allowed) {
      if (rest_schema) {
        VESPER_ASSIGN_OR_RETURN(std::string e,
                                visit(*rest_schema, rest_path, name + "-item", depth + 1));
        rest = rule_for(std::move(e), name + "-item");
      } else {
        rest = use("value");
      }
    }
    VESPER_ASSIGN_OR_RETURN(std::optional<uint64_t> min_items, count_keyword(s, "minItems", path));
    VESPER_ASSIGN_OR_RETURN(std::optional<uint64_t> max_items, count_keyword(s, "maxItems", path));
    const uint64_t min = min_items.value_or(0);
    std::optional<uint64_t> max = max_items;
    const uint64_t k = prefix.size();
    if (!rest_allowed) {
      if (min > k)
        return error(path, "'minItems' " + std::to_string(min) + " is above the " +
                               std::to_string(k) + " items allowed");
      max = std::min<uint64_t>(max.value_or(k), k);
    }
    if (max && min > *max)
      return error(path, "'minItems' " + std::to_string(min) + " is above 'maxItems' " +
                             std::to_string(*max));
    use("ws");
    const uint64_t used_prefix = max ? std::min(k, *max) : k;
    const bool more = rest_allowed && (!max || *max > used_prefix);
    const uint64_t more_min = min > used_prefix ? min - used_prefix : 0;
    std::optional<uint64_t> more_max;
    if (max) more_max = *max - used_prefix;
    std::string elements;
    if (used_prefix == 0) {
      if (!more) return std::string(R"gbnf("[" ws "]")gbnf");
      // The first element has no comma before it.
      std::optional<uint64_t> tail_max;
      if (more_max) tail_max = *more_max - 1;
      elements = rest;
      if (!tail_max || *tail_max > 0)
        elements += " ( " + kComma + " " + rest + " )" +
                    repeat_suffix(more_min > 0 ? more_min - 1 : 0, tail_max);
    } else {
      std::string tail;
      if (more) tail = "( " + kComma + " " + rest + " )" + repeat_suffix(more_min, more_max);
      for (uint64_t i = used_prefix; i-- > 0;) {
        std::string e = join({i > 0 ? kComma + " " + prefix[i] : prefix[i], tail}, " ");
        tail = i > 0 && i >= min ? "( " + e + " )?" : e;
      }
      elements = tail;
    }
    if (min == 0) return R"gbnf("[" ws ( )gbnf" + elements + R"gbnf( ws )? "]")gbnf";
    return R"gbnf("[" ws )gbnf" + elements + R"gbnf( ws "]")gbnf";
  }

  const Json& root_;
  std::vector<std::pair<std::string, std::string>> rules_;  // in order of creation, root first
  std::set<std::string> used_names_;
  std::set<std::string> shared_used_;
  std::map<std::string, std::string> ref_rules_;  // normalized $ref -> its rule
  // $refs whose conversion is under way, outermost first; those at index >= guard_ were opened
  // after the innermost object or array being converted.
  std::vector<std::string> open_refs_;
  size_t guard_ = 0;
};

}  // namespace

Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  return Converter(schema).run();
}

Result<std::string> json_schema_to_gbnf(const nlohmann::json& schema) {
  return json_schema_to_gbnf(nlohmann::ordered_json(schema));
}

std::string json_any_value_gbnf() {
  static const nlohmann::ordered_json kEmpty = nlohmann::ordered_json::object();
  return Converter(kEmpty).any_object();
}

}  // namespace vesper::grammar
