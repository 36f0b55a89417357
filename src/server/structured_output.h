// Structured output in requests: the fields OpenAI, vLLM and llama.cpp clients use to constrain
// a completion, read into one GBNF grammar (grammar/) that the sampler enforces.
//
// Accepted (one per request; a second is a 400 naming it):
//  - OpenAI: response_format {"type": "text" | "json_object" | "json_schema",
//    "json_schema": {"name", "schema", "strict", "description"}};
//  - vLLM: guided_json (a schema, or its JSON text), guided_regex, guided_choice (strings),
//    guided_grammar (GBNF), and the newer structured_outputs {json | regex | choice | grammar |
//    json_object}; guided_decoding_backend and guided_whitespace_pattern are accepted and
//    ignored (there is one backend; whitespace is llama.cpp's bounded rule);
//  - llama.cpp: grammar (GBNF) and json_schema.
// Errors are 400s whose param is the field, and whose message names the schema keyword,
// regex construct or grammar line at fault. A schema keyword that cannot be enforced is refused,
// never ignored.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace vesper::server {

struct OutputConstraint {
  std::string gbnf;   // the grammar the output follows (a complete GBNF text, rule `root`)
  std::string field;  // the request field it came from, for errors found when compiling it
};

// Reads the fields above from a request body. `out` stays empty when none is set (or
// response_format is "text"). `ordered` is the same body parsed with its keys in the order the
// client wrote them (nlohmann::json sorts them), so that objects come out with their properties
// in the schema's order, as OpenAI's do; null: sorted order.
std::optional<ApiError> parse_output_constraint(const JsonFields& f,
                                                const nlohmann::ordered_json* ordered,
                                                std::optional<OutputConstraint>& out);

// `value` (a part of a request body) as the client wrote it: `ordered` when given (the same part
// of the body parsed with key order kept), else `value` with its keys sorted.
nlohmann::ordered_json as_written(const nlohmann::json& value,
                                  const nlohmann::ordered_json* ordered);
// The member `key` (or element `index`) of `ordered`, or null.
const nlohmann::ordered_json* ordered_member(const nlohmann::ordered_json* ordered,
                                             const std::string& key);
const nlohmann::ordered_json* ordered_element(const nlohmann::ordered_json* ordered, size_t index);

}  // namespace vesper::server
