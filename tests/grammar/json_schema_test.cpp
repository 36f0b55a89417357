#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar/gbnf.h"

namespace vesper::grammar {
namespace {

using nlohmann::ordered_json;

// Converts the schema (JSON text, declaration order kept) and checks the language: every text of
// `yes` matches, none of `no` does.
void expect_language(std::string_view schema, const std::vector<std::string>& yes,
                     const std::vector<std::string>& no) {
  SCOPED_TRACE("schema: " + std::string(schema));
  auto text = json_schema_to_gbnf(ordered_json::parse(schema));
  ASSERT_TRUE(text.ok()) << text.error().message;
  SCOPED_TRACE("grammar:\n" + *text);
  auto g = parse_gbnf(*text);
  ASSERT_TRUE(g.ok()) << g.error().message;
  for (const std::string& s : yes) EXPECT_TRUE(g->matches(s)) << "should match: " << s;
  for (const std::string& s : no) EXPECT_FALSE(g->matches(s)) << "should not match: " << s;
}

std::string schema_error(std::string_view schema) {
  auto text = json_schema_to_gbnf(ordered_json::parse(schema));
  EXPECT_FALSE(text.ok()) << schema << " converted to\n" << (text.ok() ? *text : "");
  return text.ok() ? "" : text.error().message;
}

TEST(JsonSchema, EmptySchemaAndTrueAcceptAnyJsonValue) {
  const std::vector<std::string> values = {"1",
                                           "-0.5e-3",
                                           "\"s\"",
                                           "true",
                                           "null",
                                           "[]",
                                           "{}",
                                           "[1, \"a\", {\"k\": [null]}]",
                                           "{\"a\":{\"b\":[true,false]}}",
                                           "\"\\u00e9\\n\""};
  const std::vector<std::string> not_json = {"",   "tru", "{",     "[1,]",    "{\"a\"}",
                                             "01", "'s'", "{a:1}", "\"\x01\""};
  expect_language("{}", values, not_json);
  expect_language("true", values, not_json);
  expect_language(R"({"description": "anything", "title": "T"})", values, not_json);
}

TEST(JsonSchema, WhitespaceIsBoundedAndNeverAroundTheRoot) {
  expect_language(R"({"type": "object", "properties": {"a": {"type": "integer"}}})",
                  {"{\"a\":1}", "{ \"a\" : 1 }", "{\n  \"a\":\n\t1\n}",
                   "{\n" + std::string(20, ' ') + "\"a\":1}"},
                  {" {\"a\":1}", "{\"a\":1} ", "{\"a\":1}\n", "{  \"a\":1}",
                   "{\n" + std::string(21, ' ') + "\"a\":1}", "{\t\"a\":1}"});
}

TEST(JsonSchema, StringsAndLengths) {
  expect_language(R"({"type": "string"})",
                  {"\"\"", "\"a b\"", "\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00E9\"", "\"é😀\""},
                  {"\"\n\"", "\"\\x\"", "\"\\u12\"", "\"a", "a"});
  expect_language(R"({"type": "string", "minLength": 2, "maxLength": 3})",
                  {"\"ab\"", "\"abc\"", "\"\\n\\t\"", "\"éé\""}, {"\"a\"", "\"abcd\"", "\"\""});
  expect_language(R"({"type": "string", "maxLength": 1})", {"\"\"", "\"x\""}, {"\"xy\""});
  EXPECT_EQ(schema_error(R"({"type": "string", "minLength": 5, "maxLength": 3})"),
            "schema: 'minLength' 5 is above 'maxLength' 3");
  EXPECT_EQ(schema_error(R"({"type": "string", "maxLength": 20000})"),
            "schema: 'maxLength' 20000 is above 10000, the largest supported");
  EXPECT_EQ(schema_error(R"({"type": "string", "minLength": -1})"),
            "schema: 'minLength' must be a non-negative integer");
}

TEST(JsonSchema, EnumAndConstMatchTheValuesAsJson) {
  expect_language(
      R"({"enum": ["a\"b", 1, null, true, {"k": [1, 2]}, "é"]})",
      {"\"a\\\"b\"", "1", "null", "true", "{\"k\":[1,2]}", "{ \"k\" : [ 1 , 2 ] }", "\"é\""},
      {"\"a\"b\"", "\"ab\"", "2", "false", "{\"k\":[2,1]}", "{}", "\"\\u00e9\""});
  expect_language(R"({"const": "x"})", {"\"x\""}, {"\"y\"", "x"});
  // `type` filters the values; `nullable` adds null.
  expect_language(R"({"type": "string", "enum": ["a", 1, "b"]})", {"\"a\"", "\"b\""}, {"1"});
  expect_language(R"({"type": "integer", "enum": [1, 2.0, 2.5], "nullable": true})",
                  {"1", "2.0", "null"}, {"2.5", "2"});
  EXPECT_EQ(schema_error(R"({"type": "string", "enum": [1, 2]})"),
            "schema: no value of 'enum' or 'const' fits the schema's 'type'");
  EXPECT_EQ(schema_error(R"({"enum": ["a"], "maxLength": 3})"),
            "schema: 'maxLength' alongside 'enum' is not supported");
}

TEST(JsonSchema, IntegerRangesAreExact) {
  expect_language(R"({"type": "integer", "minimum": -5, "maximum": 123})",
                  {"-5", "-1", "0", "7", "10", "99", "100", "123"},
                  {"-6", "124", "0123", "1000", "1.5", "-10", "200", "+1", "00"});
  expect_language(R"({"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 1001})",
                  {"10", "500", "999", "1000"}, {"9", "1001", "5", "10000"});
  expect_language(R"({"type": "integer", "minimum": 1000000})",
                  {"1000000", "999999999", "9999999999999999"},
                  {"999999", "0", "-1000000", "10000000000000000"});
  expect_language(R"({"type": "integer", "maximum": -20})", {"-20", "-21", "-9999999999999999"},
                  {"-19", "0", "20", "-0"});
  expect_language(R"({"type": "integer", "minimum": 1.5, "maximum": 3.5})", {"2", "3"}, {"1", "4"});
  // Draft 4: exclusiveMinimum is a flag on minimum.
  expect_language(R"({"type": "integer", "minimum": 0, "exclusiveMinimum": true})", {"1", "42"},
                  {"0", "-1"});
  expect_language(R"({"type": "integer"})", {"0", "-7", "1234567890123456"},
                  {"01", "12345678901234567", "1.0", "-"});
  EXPECT_EQ(schema_error(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
            "schema: 'minimum' and 'maximum' leave no integer of at most 16 digits");
}

TEST(JsonSchema, NumbersAndTheirBounds) {
  expect_language(R"({"type": "number"})", {"0", "-0.25", "1.5e10", "1E+3", "2e-308", "12345.6789"},
                  {"01", "1.", ".5", "+1", "1e1234", "1.12345678901234567", "NaN"});
  expect_language(R"({"type": "number", "exclusiveMinimum": 0})", {"0.1", "0.0001", "1", "12345.5"},
                  {"0", "0.0", "-0.1", "-0", "-1"});
  expect_language(R"({"type": "number", "minimum": 0})", {"0", "0.0", "-0", "3.25"},
                  {"-0.5", "-1"});
  expect_language(R"({"type": "number", "maximum": 10})", {"10", "10.00", "9.99", "-3.5"},
                  {"10.01", "11", "100"});
  expect_language(R"({"type": "number", "minimum": -2, "exclusiveMaximum": 3})",
                  {"-2", "-2.0", "-1.5", "0", "2.999"}, {"-2.01", "-3", "3", "3.0", "3.1"});
  expect_language(R"({"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1})",
                  {"-0.5", "0", "0.99"}, {"-1", "-1.0", "1", "1.0"});
  EXPECT_EQ(schema_error(R"({"type": "number", "minimum": 0.5})"),
            "schema: 'minimum' 0.5 on a number is not supported (only integer bounds)");
  EXPECT_EQ(schema_error(R"({"type": "number", "minimum": 3, "exclusiveMaximum": 3})"),
            "schema: 'minimum' and 'exclusiveMaximum' leave no number");
}

TEST(JsonSchema, BooleansAndNull) {
  expect_language(R"({"type": "boolean"})", {"true", "false"}, {"null", "1", "True"});
  expect_language(R"({"type": "null"})", {"null"}, {"false", "\"null\""});
}

TEST(JsonSchema, Formats) {
  expect_language(R"({"type": "string", "format": "date"})",
                  {"\"2024-02-29\"", "\"2000-02-29\"", "\"2023-12-31\"", "\"2023-04-30\""},
                  {"\"2024-13-01\"", "\"2023-02-29\"", "\"1900-02-29\"", "\"2024-04-31\"",
                   "\"2024-00-10\"", "\"2024-01-00\"", "\"24-01-01\""});
  expect_language(R"({"type": "string", "format": "time"})",
                  {"\"12:30:00Z\"", "\"23:59:59.123+02:00\"", "\"00:00:00z\""},
                  {"\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:30:00\"", "\"12:30Z\""});
  expect_language(R"({"type": "string", "format": "date-time"})",
                  {"\"2024-02-29T12:00:00Z\"", "\"2024-01-01t00:00:00.5-05:30\""},
                  {"\"2024-02-29 12:00:00Z\"", "\"2024-02-30T12:00:00Z\""});
  expect_language(R"({"type": "string", "format": "email"})",
                  {"\"a.b+c@example.com\"", "\"x@sub.example.org\""},
                  {"\"a@b\"", "\"@x.com\"", "\"a..b@x.com\"", "\"a b@x.com\"", "\"a@-x.com\""});
  expect_language(
      R"({"type": "string", "format": "uuid"})", {"\"123e4567-e89b-12d3-a456-426614174000\""},
      {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\""});
  expect_language(R"({"type": "string", "format": "ipv4"})",
                  {"\"192.168.0.1\"", "\"255.255.255.255\"", "\"0.0.0.0\""},
                  {"\"256.1.1.1\"", "\"01.1.1.1\"", "\"1.1.1\""});
  EXPECT_EQ(schema_error(R"({"type": "string", "format": "ipv7"})"),
            "schema: 'format' \"ipv7\" is not supported");
  EXPECT_EQ(schema_error(R"({"type": "string", "format": "date", "maxLength": 3})"),
            "schema: 'format' \"date\" with 'maxLength' 3 leaves no string (\"date\" strings "
            "have 10 characters)");
}

TEST(JsonSchema, PatternsMatchTheStringContentsWithJsonEscapes) {
  expect_language(R"({"type": "string", "pattern": "^[^,]+$"})",
                  {"\"abc\"", "\"a\\\"b\"", "\"a\\\\b\"", "\"line\\nbreak\""},
                  {"\"a,b\"", "\"\"", "\"a\"b\"", "\"a\nb\""});
  expect_language(R"({"type": "string", "pattern": "^\\d{3}-\\d{4}$"})", {"\"555-1234\""},
                  {"\"5551234\"", "\"555-12345\""});
  // JSON Schema patterns are not anchored unless they say so.
  expect_language(R"({"type": "string", "pattern": "[0-9]"})", {"\"a1b\"", "\"7\""},
                  {"\"ab\"", "\"\""});
  expect_language(R"({"type": "string", "pattern": "^\"q\"$"})", {"\"\\\"q\\\"\""}, {"\"q\""});
  EXPECT_EQ(schema_error(R"({"type": "string", "pattern": "(a"})"),
            "schema.pattern: regex: unbalanced '(' (no matching ')') at position 0");
  EXPECT_EQ(
      schema_error(R"({"properties": {"p": {"type": "string", "pattern": "^a", "minLength": 2}}})"),
      "schema.properties.p: 'minLength' alongside 'pattern' is not supported");
}

TEST(JsonSchema, RequiredPropertiesAppearInDeclarationOrder) {
  const char* schema = R"({"type": "object",
      "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name", "age"]})";
  expect_language(schema, {"{\"name\":\"x\",\"age\":3}", "{ \"name\" : \"x\" , \"age\" : 3 }"},
                  {"{\"age\":3,\"name\":\"x\"}", "{\"name\":\"x\"}", "{}",
                   "{\"name\":\"x\",\"age\":3,\"extra\":1}", "{\"name\":\"x\",\"age\":3,}"});
}

TEST(JsonSchema, OptionalPropertiesMayBeSkippedInAnySubset) {
  // Up to five leading optional members (rest rules kick in at four).
  for (int n : {3, 5}) {
    ordered_json schema = {{"type", "object"}, {"properties", ordered_json::object()}};
    for (int i = 0; i < n; ++i)
      schema["properties"]["p" + std::to_string(i)] = {{"type", "integer"}};
    auto text = json_schema_to_gbnf(schema);
    ASSERT_TRUE(text.ok()) << text.error().message;
    auto g = parse_gbnf(*text);
    ASSERT_TRUE(g.ok()) << g.error().message << "\n" << *text;
    for (int mask = 0; mask < (1 << n); ++mask) {
      std::string obj = "{";
      for (int i = 0; i < n; ++i)
        if (mask & (1 << i))
          obj +=
              (obj.size() > 1 ? "," : "") + ("\"p" + std::to_string(i) + "\":" + std::to_string(i));
      obj += "}";
      EXPECT_TRUE(g->matches(obj)) << obj << "\n" << *text;
    }
    EXPECT_FALSE(g->matches("{\"p1\":1,\"p0\":0}"));
    EXPECT_FALSE(g->matches("{\"p0\":0,\"p0\":0}"));
    EXPECT_FALSE(g->matches("{,\"p0\":0}"));
    EXPECT_FALSE(g->matches("{\"p0\":0,}"));
  }
}

TEST(JsonSchema, OptionalAndRequiredPropertiesInterleave) {
  expect_language(
      R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
      "required": ["b"]})",
      {"{\"b\":2}", "{\"a\":1,\"b\":2}", "{\"b\":2,\"c\":3}", "{\"a\":1,\"b\":2,\"c\":3}"},
      {"{}", "{\"a\":1}", "{\"a\":1,\"c\":3}", "{\"b\":2,\"a\":1}"});
  // Many leading optional members before a required one.
  expect_language(R"({"type": "object", "properties": {
      "a": {}, "b": {}, "c": {}, "d": {}, "e": {}, "f": {"type": "null"}},
      "required": ["f"]})",
                  {"{\"f\":null}", "{\"a\":1,\"f\":null}", "{\"b\":1,\"d\":[],\"f\":null}",
                   "{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":null}"},
                  {"{}", "{\"a\":1}", "{\"f\":null,\"a\":1}"});
}

TEST(JsonSchema, AdditionalPropertiesFollowTheDeclaredOnes) {
  const char* declared = R"("properties": {"a": {"type": "integer"}, "b": {"type": "string"}})";
  // Absent (strict default) and false: nothing else.
  for (const std::string extra : {"", R"(, "additionalProperties": false)"}) {
    expect_language("{\"type\": \"object\", " + std::string(declared) + extra + "}",
                    {"{}", "{\"a\":1}", "{\"a\":1,\"b\":\"x\"}"},
                    {"{\"c\":1}", "{\"a\":1,\"c\":1}"});
  }
  expect_language(
      "{\"type\": \"object\", " + std::string(declared) + R"(, "additionalProperties": true})",
      {"{}", "{\"c\":1}", "{\"a\":1,\"c\":[1]}", "{\"a\":1,\"b\":\"x\",\"c\":1,\"d\":{}}",
       "{\"ab\":1}", "{\"\":1}", "{\"b2\":null}"},
      {"{\"c\":1,\"a\":1}", "{\"a\":1,\"a\":2}", "{\"a\":1,\"b\":\"x\",\"b\":\"y\"}",
       "{\"\\u0061\":1}"});
  expect_language("{\"type\": \"object\", " + std::string(declared) +
                      R"(, "additionalProperties": {"type": "integer"}})",
                  {"{\"c\":1}", "{\"a\":1,\"c\":2,\"d\":3}"},
                  {"{\"c\":\"s\"}", "{\"a\":1,\"c\":true}"});
  // No properties: any object, or values of one schema.
  expect_language(R"({"type": "object"})", {"{}", "{\"x\":[1,{}]}", "{\"a\":1,\"a\":2}"},
                  {"[]", "1"});
  expect_language(R"({"type": "object", "additionalProperties": {"type": "boolean"}})",
                  {"{}", "{\"x\":true,\"y\":false}"}, {"{\"x\":1}"});
  expect_language(R"({"type": "object", "additionalProperties": false})", {"{}", "{ }"},
                  {"{\"x\":1}"});
}

TEST(JsonSchema, RequiredNamesOutsideProperties) {
  expect_language(R"({"type": "object", "required": ["id"]})",
                  {"{\"id\":1}", "{\"id\":\"x\",\"other\":2}"}, {"{}", "{\"other\":2}"});
  EXPECT_EQ(schema_error(R"({"type": "object", "properties": {}, "required": ["id"],
                             "additionalProperties": false})"),
            "schema.required: 'id' is not in 'properties' and additionalProperties is false");
}

TEST(JsonSchema, FalsePropertySchemas) {
  expect_language(R"({"type": "object", "properties": {"a": false, "b": {"type": "integer"}},
                      "additionalProperties": true})",
                  {"{}", "{\"b\":1}", "{\"b\":1,\"c\":2}"}, {"{\"a\":1}", "{\"b\":1,\"a\":2}"});
  EXPECT_EQ(schema_error(R"({"type": "object", "properties": {"a": false}, "required": ["a"]})"),
            "schema.properties.a: the property is required but its schema is 'false'");
}

TEST(JsonSchema, Arrays) {
  expect_language(R"({"type": "array", "items": {"type": "integer"}})",
                  {"[]", "[1]", "[1, 2,3]", "[ ]"}, {"[\"a\"]", "[1,]", "[,1]", "{}"});
  expect_language(
      R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})",
      {"[1,2]", "[1,2,3]"}, {"[]", "[1]", "[1,2,3,4]"});
  expect_language(R"({"type": "array", "minItems": 1})", {"[null]", "[1,\"a\",{}]"}, {"[]"});
  expect_language(R"({"type": "array", "maxItems": 0})", {"[]"}, {"[1]"});
  expect_language(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                      "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4})",
                  {"[1]", "[1,\"a\"]", "[1,\"a\",true,false]"},
                  {"[]", "[\"a\"]", "[1,2]", "[1,\"a\",true,false,true]", "[1,\"a\",3]"});
  expect_language(
      R"({"type": "array", "prefixItems": [{"const": 1}, {"const": 2}], "items": false})",
      {"[]", "[1]", "[1,2]"}, {"[2]", "[1,2,3]"});
  // Draft 4 tuples.
  expect_language(
      R"({"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "null"}})",
      {"[\"a\"]", "[\"a\",null,null]"}, {"[\"a\",1]", "[null]"});
  EXPECT_EQ(
      schema_error(R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})"),
      "schema: 'minItems' 2 is above the 1 items allowed");
  EXPECT_EQ(schema_error(R"({"type": "array", "minItems": 3, "maxItems": 2})"),
            "schema: 'minItems' 3 is above 'maxItems' 2");
}

TEST(JsonSchema, AlternativesTypeArraysAndNullable) {
  expect_language(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})",
                  {"1", "\"a\""}, {"\"ab\"", "null"});
  expect_language(R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})", {"true", "null"}, {"0"});
  expect_language(R"({"type": ["string", "null"]})", {"\"a\"", "null"}, {"1"});
  expect_language(R"({"type": ["integer", "number"]})", {"1", "1.5"}, {"\"1\""});
  expect_language(R"({"type": "string", "nullable": true})", {"\"a\"", "null"}, {"1"});
  expect_language(R"({"anyOf": [false, {"type": "integer"}]})", {"1"}, {"true"});
  expect_language(R"({"allOf": [{"type": "integer"}, {"description": "an annotation"}, true]})",
                  {"5"}, {"\"5\""});
  EXPECT_EQ(schema_error(R"({"allOf": [{"type": "integer"}, {"minimum": 0}]})"),
            "schema: 'allOf' with several constraining members is not supported");
  EXPECT_EQ(schema_error(R"({"type": "string", "anyOf": [{"minLength": 1}]})"),
            "schema: 'type' alongside 'anyOf' is not supported");
  EXPECT_EQ(schema_error(R"({"anyOf": [false]})"), "schema: every member of 'anyOf' is 'false'");
}

TEST(JsonSchema, TypeIsInferredFromKeywordsWhenAbsent) {
  expect_language(R"({"properties": {"a": {"const": 1}}, "required": ["a"]})", {"{\"a\":1}"},
                  {"1", "\"a\""});
  expect_language(R"({"items": {"type": "integer"}})", {"[1]"}, {"1"});
  expect_language(R"({"maxLength": 2})", {"\"ab\""}, {"1", "\"abc\""});
  expect_language(R"({"minimum": 1})", {"1", "2.5"}, {"0", "\"1\""});
}

TEST(JsonSchema, References) {
  expect_language(R"({"$defs": {"pos": {"type": "integer", "minimum": 1}},
                      "type": "array", "items": {"$ref": "#/$defs/pos"}})",
                  {"[1,2]"}, {"[0]"});
  expect_language(R"({"definitions": {"s": {"type": "string"}},
                      "properties": {"a": {"$ref": "#/definitions/s"}, "b": {"$ref": "#/definitions/s"}}})",
                  {"{\"a\":\"x\",\"b\":\"y\"}"}, {"{\"a\":1}"});
  // Any JSON pointer into the schema, with ~1 for '/'.
  expect_language(
      R"({"properties": {"a/b": {"type": "boolean"}, "c": {"$ref": "#/properties/a~1b"}}})",
      {"{\"a/b\":true,\"c\":false}"}, {"{\"c\":1}"});
  // Each referenced schema is one rule, emitted once.
  auto text = json_schema_to_gbnf(ordered_json::parse(
      R"({"$defs": {"pt": {"type": "integer"}}, "prefixItems": [{"$ref": "#/$defs/pt"}, {"$ref": "#/$defs/pt"}], "type": "array"})"));
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("\npt ::= integer\n"), std::string::npos) << *text;
  EXPECT_EQ(text->find("pt-2"), std::string::npos) << *text;

  EXPECT_EQ(schema_error(R"({"$ref": "#/$defs/missing"})"),
            "schema.$ref '#/$defs/missing' does not resolve");
  EXPECT_EQ(schema_error(R"({"properties": {"a": {"$ref": "other.json#/x"}}})"),
            "schema.properties.a.$ref 'other.json#/x' is not supported (only references into "
            "this schema, '#...')");
  EXPECT_EQ(
      schema_error(
          R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})"),
      "schema.$defs.a.anyOf[0].$ref '#/$defs/a' recurses without an object or array in "
      "between, which is not supported");
  EXPECT_EQ(schema_error(R"({"$ref": "#/$defs/a", "type": "object"})"),
            "schema: 'type' alongside '$ref' is not supported");
}

TEST(JsonSchema, RecursiveTreeThreeLevelsDeep) {
  const char* tree = R"({
    "$defs": {"node": {"type": "object",
      "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["name"]}},
    "$ref": "#/$defs/node"})";
  expect_language(tree,
                  {"{\"name\":\"a\"}", "{\"name\":\"a\",\"children\":[]}",
                   "{\"name\":\"a\",\"children\":[{\"name\":\"b\",\"children\":[{\"name\":\"c\","
                   "\"children\":[{\"name\":\"d\"}]}]},{\"name\":\"e\"}]}"},
                  {"{\"name\":\"a\",\"children\":[{\"children\":[]}]}",
                   "{\"name\":\"a\",\"children\":[{\"name\":\"b\",\"children\":[{\"name\":\"c\","
                   "\"children\":[{\"nam\":\"d\"}]}]}]}"});
  // Recursion to the root.
  expect_language(R"({"type": "object", "properties": {"next": {"$ref": "#"}}})",
                  {"{}", "{\"next\":{\"next\":{}}}"}, {"{\"next\":1}"});
}

TEST(JsonSchema, AnnotationsAndUnknownKeywordsAreIgnored) {
  expect_language(R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x",
      "$comment": "c", "title": "T", "description": "D", "default": 1, "examples": [1],
      "deprecated": false, "readOnly": true, "writeOnly": false, "contentMediaType": "text/plain",
      "contentEncoding": "base64", "x-vendor": {"anything": true}, "type": "integer"})",
                  {"1"}, {"\"1\""});
}

TEST(JsonSchema, UnsupportedKeywordsAreErrorsNamingKeywordAndPath) {
  for (const char* keyword :
       {"multipleOf", "uniqueItems", "patternProperties", "propertyNames", "not", "if", "then",
        "else", "dependentRequired", "dependentSchemas", "minProperties", "maxProperties",
        "contains", "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems"}) {
    ordered_json schema = {{"type", "object"},
                           {"properties", {{"age", {{"type", "integer"}, {keyword, 2}}}}}};
    auto text = json_schema_to_gbnf(schema);
    ASSERT_FALSE(text.ok()) << keyword;
    EXPECT_EQ(text.error().message,
              std::string("schema.properties.age: '") + keyword + "' is not supported");
  }
  EXPECT_EQ(schema_error(R"({"items": {"not": {}}})"), "schema.items: 'not' is not supported");
  EXPECT_EQ(schema_error(R"({"anyOf": [{}, {"type": "integer", "multipleOf": 3}]})"),
            "schema.anyOf[1]: 'multipleOf' is not supported");
  // Values that say nothing are fine.
  expect_language(R"({"type": "array", "uniqueItems": false})", {"[1,1]"}, {});
}

TEST(JsonSchema, MalformedSchemasAreErrors) {
  EXPECT_EQ(schema_error("false"), "schema: the schema 'false' matches nothing");
  EXPECT_EQ(schema_error("3"), "schema: a schema must be an object or a boolean, not number");
  EXPECT_EQ(schema_error(R"({"type": "strin"})"), "schema: unknown type 'strin'");
  EXPECT_EQ(schema_error(R"({"properties": {"x": {"type": 5}}})"),
            "schema.properties.x: 'type' must be a string or an array of strings");
  EXPECT_EQ(schema_error(R"({"items": false, "type": "array", "minItems": 1})"),
            "schema: 'minItems' 1 is above the 0 items allowed");
  ordered_json deep = {{"type", "integer"}};
  for (int i = 0; i < 200; ++i) deep = {{"type", "array"}, {"items", deep}};
  auto text = json_schema_to_gbnf(deep);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.error().message.find("nested deeper than 128"), std::string::npos);
}

TEST(JsonSchema, RuleNamesAreValidForAnyPropertyName) {
  expect_language(
      R"({"type": "object", "properties": {
      "a b/é\"": {"type": "object", "properties": {"x.y": {"type": "integer"}}},
      "": {"type": "boolean"}, "root": {"type": "null"}, "string": {"type": "integer"}},
      "required": ["a b/é\""]})",
      {"{\"a b/é\\\"\":{\"x.y\":1},\"\":true,\"root\":null,\"string\":2}", "{\"a b/é\\\"\":{}}"},
      {"{\"a b/é\\\"\":{\"x.y\":\"1\"}}"});
}

// Additional keys are matched against the declared names one character per level of nesting;
// long names are split into rules so that the grammar's nesting stays small.
TEST(JsonSchema, AdditionalKeysBesideLongDeclaredNames) {
  const std::string name(1000, 'n');
  ordered_json schema = {{"type", "object"},
                         {"properties", {{name, {{"type", "integer"}}}}},
                         {"additionalProperties", {{"type", "boolean"}}}};
  auto text = json_schema_to_gbnf(schema);
  ASSERT_TRUE(text.ok()) << text.error().message;
  auto g = parse_gbnf(*text);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(g->matches("{\"" + name + "\":1}"));
  EXPECT_TRUE(g->matches("{\"" + name + "\":1,\"" + name.substr(0, 999) + "x\":true}"));
  EXPECT_TRUE(g->matches("{\"" + name + "n\":true}"));
  EXPECT_FALSE(g->matches("{\"" + name + "\":1,\"" + name + "\":true}"));
  EXPECT_FALSE(g->matches("{\"" + name + "n\":1}"));
}

TEST(JsonSchema, SharedRulesAreEmittedOnce) {
  auto text = json_schema_to_gbnf(ordered_json::parse(R"({"type": "object", "properties": {
      "a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "array", "items": {"type": "string"}},
      "d": {}}})"));
  ASSERT_TRUE(text.ok());
  for (const char* rule : {"\nstring ::= ", "\nws ::= ", "\nvalue ::= ", "\nchar ::= "}) {
    const size_t first = text->find(rule);
    EXPECT_NE(first, std::string::npos) << rule;
    EXPECT_EQ(text->find(rule, first + 1), std::string::npos) << rule << "\n" << *text;
  }
}

TEST(JsonSchema, UnorderedJsonSortsProperties) {
  // nlohmann::json keeps keys sorted: the declaration order is lost.
  const nlohmann::json schema = nlohmann::json::parse(
      R"({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
          "required": ["a", "b"]})");
  auto text = json_schema_to_gbnf(schema);
  ASSERT_TRUE(text.ok()) << text.error().message;
  auto g = parse_gbnf(*text);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->matches("{\"a\":1,\"b\":2}"));
  EXPECT_FALSE(g->matches("{\"b\":2,\"a\":1}"));
}

TEST(JsonSchema, AnyObjectGrammarForJsonObjectMode) {
  auto g = parse_gbnf(json_any_value_gbnf());
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(g->matches("{}"));
  EXPECT_TRUE(g->matches("{\"a\": [1, {\"b\": null}], \"c\": \"d\"}"));
  EXPECT_FALSE(g->matches("[]"));
  EXPECT_FALSE(g->matches("1"));
  EXPECT_FALSE(g->matches("{\"a\":}"));
  EXPECT_FALSE(g->matches(" {}"));
}

}  // namespace
}  // namespace vesper::grammar
