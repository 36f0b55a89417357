// JSON Schema to GBNF: a grammar (start rule `root`) whose language is the JSON texts valid
// under a schema, after llama.cpp's json-schema-to-grammar and xgrammar's strict mode. Where a
// choice had to be made the grammar is tighter than the schema, never looser: a keyword that
// constrains and is not supported is an error naming its path from the schema root
// ("schema.properties.age: 'multipleOf' is not supported"), never ignored.
//
// The texts:
//  - Whitespace: `ws ::= | " " | "\n" [ \t]{0,20}` between tokens (bounded, so that a model
//    cannot loop on it); none before the root value or after it.
//  - Strings: any JSON escape in plain strings; minLength/maxLength count characters (an escape
//    is one). `pattern` has JSON Schema's semantics (ECMAScript search: an end without ^ or $ is
//    unanchored) and its characters are written in one canonical spelling (regex.h): raw where
//    JSON allows, else the short escape, else \u00xx. format: date, time, date-time (RFC 3339,
//    calendar-exact: 2023-02-29 is refused, 2024-02-29 accepted; T/Z in either case; seconds
//    00-59, fraction of at most 9 digits), email (dot-atom local part, a domain of at least two
//    labels), uuid, ipv4; any other format is an error. A format with minLength/maxLength
//    holds both exactly (length_bounded.h: no string outside the bounds, none in them lost);
//    bounds that leave no string of the format are an error.
//  - Integers: "-"? (0 | [1-9][0-9]{0,15}); minimum/maximum/exclusive* build an exact range.
//    Numbers: the integer part, a fraction of at most 16 digits and an exponent of at most 3;
//    bounds on numbers must be integers (exact at the endpoints: maximum 5 accepts 5.000, not
//    5.1), and a bounded number has no exponent. -0 is 0.
//  - Objects: properties in declaration order (pass an ordered_json to keep the schema's order;
//    nlohmann::json sorts keys), required ones present, optional ones in any subset.
//    additionalProperties false, or absent when `properties` is given (xgrammar's strict
//    default): no other keys. True or a schema: more pairs after the declared ones, keys any
//    string other than the declared names (in canonical spelling, so that no escape can spell a
//    declared name). An object schema without properties and additionalProperties: any object.
//  - Arrays: prefixItems (or draft-4 tuple `items` with additionalItems), items, minItems,
//    maxItems; no items: any values.
//  - enum/const: the values as nlohmann writes them compactly (objects with their keys in the
//    value's order), with ws allowed between tokens.
//  - anyOf/oneOf as alternatives (oneOf is not checked for exclusivity), allOf with one
//    constraining member, $ref to "#", "#/$defs/NAME", "#/definitions/NAME" or any JSON pointer
//    into the schema (recursion allowed through an object or array; each target is one rule),
//    type arrays, OpenAPI `nullable: true`, {} and true (any value). Without `type`, a schema
//    with keywords of one kind (properties, items, minLength, minimum...) is of that type, as in
//    llama.cpp and xgrammar.
// Annotations and unknown keywords are ignored. Schemas nest at most 128 deep; limits.h bounds
// the enum values, properties and subschemas of a schema, checked before what would pass them
// is converted ("schema: 'enum' has 100,000 values, more than the limit of 10,000").
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"

namespace vesper::grammar {

// The GBNF grammar of the JSON texts valid under `schema`. The ordered_json form keeps the
// declaration order of properties.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema);
Result<std::string> json_schema_to_gbnf(const nlohmann::json& schema);

// A grammar for any JSON object (any values inside): response_format {"type": "json_object"}.
std::string json_any_value_gbnf();

}  // namespace vesper::grammar
