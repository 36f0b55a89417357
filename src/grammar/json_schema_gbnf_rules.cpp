// The GBNF rules every grammar converted from a JSON schema may share (whitespace, any value,
// the formats...), and the text helpers that assemble GBNF expressions; declared in
// json_schema_converter.h for the converter's files.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "grammar/json_schema_converter.h"
#include "grammar/regex.h"
#include "grammar/utf8_ranges.h"

namespace vesper::grammar::json_schema_detail {
namespace {

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

}  // namespace

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

std::string alternatives(std::vector<std::string> alts) {
  // Hashed, not compared pairwise: an enum may have thousands of values.
  std::unordered_set<std::string_view> seen;
  std::vector<std::string_view> unique;
  for (const std::string& a : alts)
    if (seen.insert(a).second) unique.push_back(a);
  if (unique.size() == 1) return std::string(unique.front());
  std::string out = "( ";
  for (size_t i = 0; i < unique.size(); ++i) {
    if (unique[i].empty()) continue;
    if (out.size() > 2) out += " | ";
    out += unique[i];
  }
  return out + " )";
}

std::string repeat_suffix(uint64_t min, std::optional<uint64_t> max) {
  if (!max) return min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}";
  if (min == *max) return min == 1 ? "" : "{" + std::to_string(min) + "}";
  if (min == 0 && *max == 1) return "?";
  return "{" + std::to_string(min) + "," + std::to_string(*max) + "}";
}

std::string compact(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

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

}  // namespace vesper::grammar::json_schema_detail
