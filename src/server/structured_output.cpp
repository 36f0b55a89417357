#include "server/structured_output.h"

#include <array>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace vesper::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ApiError constraint_error(const std::string& field, const std::string& what) {
  return bad_request("'" + field + "': " + what, field);
}

std::optional<ApiError> from_schema(const json& schema, const ordered_json* ordered,
                                    const std::string& field, OutputConstraint& out) {
  if (!schema.is_object() && !schema.is_boolean())
    return bad_request(
        "'" + field + "' must be a JSON schema (an object), got " + describe_json_value(schema),
        field);
  Result<std::string> gbnf = grammar::json_schema_to_gbnf(as_written(schema, ordered));
  if (!gbnf) return constraint_error(field, gbnf.error().message);
  out = {std::move(gbnf).value(), field};
  return std::nullopt;
}

// A schema given as an object or as its JSON text (vLLM accepts both for guided_json).
std::optional<ApiError> from_schema_field(const json& value, const ordered_json* ordered,
                                          const std::string& field, OutputConstraint& out) {
  if (!value.is_string()) return from_schema(value, ordered, field, out);
  const json parsed = json::parse(value.get<std::string>(), nullptr, false);
  if (parsed.is_discarded())
    return bad_request("'" + field + "' is a string that is not valid JSON", field);
  const ordered_json in_order = ordered_json::parse(value.get<std::string>());
  return from_schema(parsed, &in_order, field, out);
}

std::optional<ApiError> from_regex(const json& value, const ordered_json*, const std::string& field,
                                   OutputConstraint& out) {
  if (!value.is_string())
    return bad_request("'" + field + "' must be a string, got " + describe_json_value(value),
                       field);
  Result<std::string> gbnf = grammar::regex_to_gbnf(value.get<std::string>());
  if (!gbnf) return constraint_error(field, gbnf.error().message);
  out = {std::move(gbnf).value(), field};
  return std::nullopt;
}

std::optional<ApiError> from_choice(const json& value, const ordered_json*,
                                    const std::string& field, OutputConstraint& out) {
  if (!value.is_array() || value.empty())
    return bad_request("'" + field + "' must be a non-empty array of strings", field);
  std::string gbnf = "root ::= ";
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string())
      return bad_request("'" + field + "[" + std::to_string(i) + "]' must be a string, got " +
                             describe_json_value(value[i]),
                         field);
    if (value[i].get<std::string>().empty())
      return bad_request("'" + field + "[" + std::to_string(i) + "]' must not be empty", field);
    if (i > 0) gbnf += " | ";
    gbnf += grammar::gbnf_literal(value[i].get<std::string>());
  }
  out = {gbnf + "\n", field};
  return std::nullopt;
}

std::optional<ApiError> from_grammar(const json& value, const ordered_json*,
                                     const std::string& field, OutputConstraint& out) {
  if (!value.is_string())
    return bad_request(
        "'" + field + "' must be a string (a GBNF grammar), got " + describe_json_value(value),
        field);
  // Parsed (once, then cached) when the service compiles it, before the request is queued: a
  // malformed grammar is a 400 naming `field` from there.
  out = {value.get<std::string>(), field};
  return std::nullopt;
}

std::optional<ApiError> from_response_format(const json& rf, const ordered_json* ordered,
                                             std::optional<OutputConstraint>& out) {
  const JsonFields r(rf, "response_format");
  std::string type;
  VESPER_FIELD(r.require_string("type", type));
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    out = OutputConstraint{grammar::json_any_value_gbnf(), "response_format"};
    return std::nullopt;
  }
  if (type != "json_schema")
    return bad_request(
        "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"" +
            type + "\"",
        "response_format.type");
  const json* js = nullptr;
  VESPER_FIELD(r.object("json_schema", js));
  if (js == nullptr)
    return bad_request(
        "'response_format.json_schema' is required when 'response_format.type' is \"json_schema\"",
        "response_format.json_schema");
  const JsonFields j(*js, "response_format.json_schema");
  std::string name;
  VESPER_FIELD(j.string("name", name));
  bool strict = false;
  VESPER_FIELD(j.boolean("strict", strict));
  OutputConstraint c;
  if (const json* schema = j.value("schema"); schema != nullptr) {
    VESPER_FIELD(from_schema(*schema,
                             ordered_member(ordered_member(ordered, "json_schema"), "schema"),
                             "response_format.json_schema.schema", c));
  } else {
    c = {grammar::json_any_value_gbnf(), "response_format.json_schema"};
  }
  out = std::move(c);
  return std::nullopt;
}

}  // namespace

ordered_json as_written(const json& value, const ordered_json* ordered) {
  if (ordered != nullptr) return *ordered;
  return ordered_json::parse(value.dump());
}

const ordered_json* ordered_member(const ordered_json* ordered, const std::string& key) {
  if (ordered == nullptr || !ordered->is_object()) return nullptr;
  const auto it = ordered->find(key);
  return it == ordered->end() ? nullptr : &*it;
}

const ordered_json* ordered_element(const ordered_json* ordered, size_t index) {
  if (ordered == nullptr || !ordered->is_array() || index >= ordered->size()) return nullptr;
  return &(*ordered)[index];
}

std::optional<ApiError> parse_output_constraint(const JsonFields& f, const ordered_json* ordered,
                                                std::optional<OutputConstraint>& out) {
  out.reset();
  std::string first;  // the field already giving a constraint
  auto take = [&](const std::string& field) -> std::optional<ApiError> {
    if (!first.empty())
      return bad_request(
          "'" + field + "' and '" + first + "' both constrain the output; send one of them", field);
    first = field;
    return std::nullopt;
  };
  for (const char* ignored : {"guided_decoding_backend", "guided_whitespace_pattern"}) {
    std::string unused;
    VESPER_FIELD(f.string(ignored, unused));
  }
  if (const json* rf = f.value("response_format"); rf != nullptr) {
    if (!rf->is_object()) return f.wrong("response_format", "an object", *rf);
    std::optional<OutputConstraint> c;
    VESPER_FIELD(from_response_format(*rf, ordered_member(ordered, "response_format"), c));
    if (c) {
      VESPER_FIELD(take("response_format"));
      out = std::move(c);
    }
  }
  struct Spelling {
    const char* field;
    std::optional<ApiError> (*read)(const json&, const ordered_json*, const std::string&,
                                    OutputConstraint&);
  };
  static constexpr std::array<Spelling, 6> kTopLevel = {{
      {"guided_json", from_schema_field},
      {"json_schema", from_schema_field},  // llama.cpp
      {"guided_regex", from_regex},
      {"guided_choice", from_choice},
      {"guided_grammar", from_grammar},
      {"grammar", from_grammar},  // llama.cpp
  }};
  for (const Spelling& s : kTopLevel) {
    const json* v = f.value(s.field);
    if (v == nullptr) continue;
    OutputConstraint c;
    VESPER_FIELD(s.read(*v, ordered_member(ordered, s.field), s.field, c));
    VESPER_FIELD(take(s.field));
    out = std::move(c);
  }
  if (const json* so = f.value("structured_outputs"); so != nullptr) {
    if (!so->is_object()) return f.wrong("structured_outputs", "an object", *so);
    static constexpr std::array<Spelling, 4> kNested = {{
        {"json", from_schema_field},
        {"regex", from_regex},
        {"choice", from_choice},
        {"grammar", from_grammar},
    }};
    const JsonFields s(*so, "structured_outputs");
    for (const Spelling& sp : kNested) {
      const json* v = s.value(sp.field);
      if (v == nullptr) continue;
      OutputConstraint c;
      VESPER_FIELD(sp.read(*v,
                           ordered_member(ordered_member(ordered, "structured_outputs"), sp.field),
                           s.name(sp.field), c));
      VESPER_FIELD(take(s.name(sp.field)));
      out = std::move(c);
    }
    bool json_object = false;
    VESPER_FIELD(s.boolean("json_object", json_object));
    if (json_object) {
      VESPER_FIELD(take("structured_outputs.json_object"));
      out = OutputConstraint{grammar::json_any_value_gbnf(), "structured_outputs.json_object"};
    }
  }
  return std::nullopt;
}

}  // namespace vesper::server
