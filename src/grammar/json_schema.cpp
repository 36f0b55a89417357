// JSON schema -> GBNF (json_schema.h): the entry points and the core of the Converter: the walk
// over a schema (combinators, types, nullable), $ref resolution, enum/const, and the rule
// bookkeeping. Strings and numbers are in json_schema_scalars.cpp, objects and arrays in
// json_schema_containers.cpp, the shared rules and text helpers in json_schema_gbnf_rules.cpp.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/json_schema_converter.h"
#include "grammar/limits.h"

namespace vesper::grammar {
namespace json_schema_detail {
namespace {

constexpr int kMaxDepth = 128;

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

bool is_rule_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_'))
      return false;
  return true;
}

std::string type_name(const Json& j) {
  return j.type_name();
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

}  // namespace

Converter::Converter(const Json& root) : root_(root) {
  used_names_.insert("root");
  for (const SharedRule& r : shared_rules()) used_names_.insert(r.name);
  for (const char* f : kFormats) used_names_.insert(f);
}

Result<std::string> Converter::run() {
  ref_rules_["#"] = "root";
  open_refs_.push_back("#");
  rules_.push_back({"root", ""});
  VESPER_ASSIGN_OR_RETURN(std::string expr, visit(root_, "schema", "root", 0));
  rules_[0].second = std::move(expr);
  return text();
}

std::string Converter::any_object() {
  rules_.push_back({"root", use("object")});
  return text();
}

std::string Converter::text() const {
  std::string out;
  for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
  for (const SharedRule& r : shared_rules())
    if (shared_used_.count(r.name)) out += std::string(r.name) + " ::= " + r.body + "\n";
  return out;
}

std::string Converter::use(std::string_view name) {
  for (const SharedRule& r : shared_rules()) {
    if (r.name != name) continue;
    if (shared_used_.insert(r.name).second)
      for (const char* dep : r.deps) use(dep);
    return r.name;
  }
  VESPER_CHECK(false, "unknown shared rule %s", std::string(name).c_str());
  return "";
}

std::string Converter::unique_name(std::string_view hint) {
  std::string base;
  for (char c : hint.substr(0, 64))
    base += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '-';
  if (base.empty()) base = "rule";
  std::string name = base;
  for (int i = 2; used_names_.count(name); ++i) name = base + "-" + std::to_string(i);
  used_names_.insert(name);
  return name;
}

std::string Converter::rule_for(std::string expr, std::string_view hint) {
  if (is_rule_name(expr)) return expr;
  std::string name = unique_name(hint);
  rules_.push_back({name, std::move(expr)});
  return name;
}

Error Converter::error(const std::string& path, const std::string& what) {
  return make_error(path + ": " + what);
}

Result<std::string> Converter::visit(const Json& s, const std::string& path,
                                     const std::string& name, int depth) {
  if (++subschemas_ > kMaxSubschemas)
    return error(path, "the schema has more than " + with_separators(kMaxSubschemas) +
                           " subschemas, the limit");
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
        return error(path, "'" + k + "' alongside '" + std::string(keyword) + "' is not supported");
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
          std::string expr, visit(members[i], path + "." + keyword + "[" + std::to_string(i) + "]",
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

bool Converter::annotation_only(const Json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (!s.is_object()) return false;
  for (const auto& [key, value] : s.items())
    if (kConstraining.count(key) || kUnsupported.count(key) || key == "nullable") return false;
  return true;
}

Result<std::vector<std::string>> Converter::parse_types(const Json& t, const std::string& path) {
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

Result<std::string> Converter::visit_ref(const std::string& ref, const std::string& path,
                                         int depth) {
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

Result<std::string> Converter::json_value_literal(const Json& v, const std::string& path) {
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

Result<std::string> Converter::enum_expr(const Json& s, const std::string& path,
                                         const std::optional<std::vector<std::string>>& types,
                                         bool nullable) {
  std::vector<const Json*> values;
  if (auto c = s.find("const"); c != s.end()) {
    values.push_back(&*c);
  }
  if (auto e = s.find("enum"); e != s.end()) {
    if (!e->is_array() || e->empty()) return error(path, "'enum' must be a non-empty array");
    // Counted before any value is converted, over the whole schema: many enums cost as one.
    enum_values_ += e->size();
    if (enum_values_ > kMaxEnumValues)
      return error(path, "'enum' has " + with_separators(e->size()) + " values" +
                             (enum_values_ > e->size()
                                  ? " (" + with_separators(enum_values_) + " in the schema)"
                                  : std::string()) +
                             ", more than the limit of " + with_separators(kMaxEnumValues));
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

}  // namespace json_schema_detail

Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  return json_schema_detail::Converter(schema).run();
}

Result<std::string> json_schema_to_gbnf(const nlohmann::json& schema) {
  return json_schema_to_gbnf(nlohmann::ordered_json(schema));
}

std::string json_any_value_gbnf() {
  static const nlohmann::ordered_json kEmpty = nlohmann::ordered_json::object();
  return json_schema_detail::Converter(kEmpty).any_object();
}

}  // namespace vesper::grammar
