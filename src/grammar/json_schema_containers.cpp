// The JSON schema converter's containers: objects (declared properties in order, required and
// optional ones, additionalProperties with keys other than the declared names) and arrays
// (prefixItems or tuple items, items, minItems/maxItems). Converter methods declared in
// json_schema_converter.h.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/json_schema_converter.h"
#include "grammar/limits.h"
#include "grammar/regex.h"
#include "grammar/utf8_ranges.h"

namespace vesper::grammar::json_schema_detail {
namespace {

// Additional keys are matched against the declared names one character per level.
constexpr size_t kMaxDeclaredNameLength = 1024;

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

}  // namespace

// --- objects ---

std::string Converter::other_key(const TrieNode& node, size_t depth) {
  // Every 64 characters down the trie the rest becomes a rule of its own, so that the GBNF text
  // nests no deeper than that (the parser recurses per level, limits.h kMaxGrammarNesting).
  if (depth > 0 && depth % 64 == 0) {
    std::string rest = other_key(node, depth + 1);
    return rule_for(std::move(rest), "other-key-" + std::to_string(++key_rules_));
  }
  std::vector<std::string> alts;
  if (!node.terminal) alts.push_back(kQuote);
  CodepointRanges taken;
  for (const auto& [cp, child] : node.children) taken.push_back({cp, cp});
  alts.push_back(json_string_char_expression(complement(normalize(taken))) + " " + use("key-char") +
                 "* " + kQuote);
  for (const auto& [cp, child] : node.children) {
    std::string spelled;
    append_json_string_char(cp, spelled);
    alts.push_back(gbnf_literal(spelled) + " " + other_key(child, depth + 1));
  }
  return "( " + join(alts, " | ") + " )";
}

Result<std::string> Converter::object_expr(const Json& s, const std::string& path,
                                           const std::string& name, int depth) {
  GuardScope guard(guard_, open_refs_.size());
  const Json* props = nullptr;
  // Properties are counted over the whole schema before any is converted (a required list is
  // first held to the limit as it is, duplicates and all), so a huge object costs next to
  // nothing to refuse.
  auto count = [&](const char* keyword, size_t n, const char* what) -> Status {
    properties_ += n;
    if (properties_ <= kMaxProperties) return {};
    return error(
        path, "'" + std::string(keyword) + "' " + what + " " + with_separators(n) + " properties" +
                  (properties_ > n ? " (" + with_separators(properties_) + " in the schema)"
                                   : std::string()) +
                  ", more than the limit of " + with_separators(kMaxProperties));
  };
  std::unordered_set<std::string_view> declared;
  if (auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) return error(path, "'properties' must be an object");
    VESPER_TRY(count("properties", it->size(), "declares"));
    props = &*it;
    for (const auto& [key, value] : props->items()) declared.insert(key);
  }
  std::vector<std::string> required;
  std::unordered_set<std::string_view> required_set;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) return error(path, "'required' must be an array of strings");
    if (it->size() > kMaxProperties) VESPER_TRY(count("required", it->size(), "names"));
    size_t undeclared = 0;
    for (const Json& r : *it) {
      if (!r.is_string()) return error(path, "'required' must be an array of strings");
      if (!required_set.insert(r.get_ref<const std::string&>()).second) continue;
      required.push_back(r.get<std::string>());
      if (!declared.count(required.back())) ++undeclared;
    }
    VESPER_TRY(count("required", undeclared, "names"));
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
  auto key_literal = [&](const std::string& key, const std::string& where) -> Result<std::string> {
    auto contents = json_string_contents(key);
    if (!contents) return error(where, "a property name is not valid UTF-8");
    return gbnf_literal("\"" + *contents + "\"");
  };
  if (props) {
    for (const auto& [key, value] : props->items()) {
      const std::string where = path + ".properties." + key;
      const bool req = required_set.count(key) > 0;
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
    if (declared.count(key)) continue;
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
  auto item = [&](size_t i) {
    return members[i].required ? kComma + " " + members[i].kv
                               : "( " + kComma + " " + members[i].kv + " )?";
  };
  // The members from i on (and any further pairs), written out: built only where used, each
  // once, so that the text stays linear in the number of members.
  auto written_rest = [&](size_t i) {
    std::vector<std::string> parts;
    for (size_t j = i; j < n; ++j) parts.push_back(item(j));
    parts.push_back(extra_tail);
    return join(parts, " ");
  };
  // rest[k]: what follows when member k - 1 is the first one present (k up to the first
  // required member, plus one).
  std::vector<std::string> rest(n + 1);
  if (rest_rules) {
    // Rules up to one past the first required member (at most the last member).
    const size_t last_rule = std::min(leading_optional + 1, n - 1);
    rest[last_rule + 1] = written_rest(last_rule + 1);
    for (size_t i = last_rule + 1; i-- > 1;)
      rest[i] = rule_for(join({item(i), rest[i + 1]}, " "), name + "-rest-" + std::to_string(i));
  } else {
    for (size_t i = 1; i <= std::min(leading_optional + 1, n); ++i) rest[i] = written_rest(i);
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

Result<std::string> Converter::array_expr(const Json& s, const std::string& path,
                                          const std::string& name, int depth) {
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
    return error(
        path, "'minItems' " + std::to_string(min) + " is above 'maxItems' " + std::to_string(*max));
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

}  // namespace vesper::grammar::json_schema_detail
