// What one constraint may cost (limits.h): schemas and grammars past a limit are refused early,
// with a message naming the limit and the value; those within compile quickly.
#include "grammar/limits.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "grammar/gbnf.h"
#include "grammar/grammar_cache.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace vesper::grammar {
namespace {

using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Generous: the refusals take microseconds; this only catches work that grows with the input.
constexpr double kRefusalMs = 200;
// The sanitizer builds run the library several times slower.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSlowdown = 10;
#else
constexpr double kSlowdown = 1;
#endif

std::string schema_error(const ordered_json& schema, double& ms) {
  const auto start = Clock::now();
  auto text = json_schema_to_gbnf(schema);
  ms = ms_since(start);
  EXPECT_FALSE(text.ok());
  return text.ok() ? "" : text.error().message;
}

std::string gbnf_error(const std::string& gbnf, double& ms) {
  const auto start = Clock::now();
  auto g = parse_gbnf(gbnf);
  ms = ms_since(start);
  EXPECT_FALSE(g.ok());
  return g.ok() ? "" : g.error().message;
}

TEST(GrammarLimits, WithSeparators) {
  EXPECT_EQ(with_separators(0), "0");
  EXPECT_EQ(with_separators(999), "999");
  EXPECT_EQ(with_separators(1000), "1,000");
  EXPECT_EQ(with_separators(412000), "412,000");
  EXPECT_EQ(with_separators(4194304), "4,194,304");
}

TEST(GrammarLimits, HugeEnumIsRefusedBeforeItsValuesAreConverted) {
  ordered_json schema = {{"enum", ordered_json::array()}};
  for (int i = 0; i < 100000; ++i) schema["enum"].push_back("value-" + std::to_string(i));
  double ms = 0;
  EXPECT_EQ(schema_error(schema, ms),
            "schema: 'enum' has 100,000 values, more than the limit of 10,000");
  EXPECT_LT(ms, kRefusalMs);
  // Counted over the whole schema.
  ordered_json two = {
      {"type", "array"},
      {"prefixItems", {{{"enum", ordered_json::array()}}, {{"enum", ordered_json::array()}}}}};
  for (int i = 0; i < 6000; ++i) {
    two["prefixItems"][0]["enum"].push_back(i);
    two["prefixItems"][1]["enum"].push_back(-i);
  }
  EXPECT_EQ(schema_error(two, ms),
            "schema.prefixItems[1]: 'enum' has 6,000 values (12,000 in the schema), more than the "
            "limit of 10,000");
}

TEST(GrammarLimits, ThousandsOfPropertiesAreRefusedBeforeAnyIsConverted) {
  ordered_json schema = {{"type", "object"},
                         {"properties", ordered_json::object()},
                         {"required", ordered_json::array()}};
  for (int i = 0; i < 5000; ++i) {
    schema["properties"]["field_" + std::to_string(i)] = {{"type", "string"}};
    schema["required"].push_back("field_" + std::to_string(i));
  }
  double ms = 0;
  EXPECT_EQ(schema_error(schema, ms),
            "schema: 'properties' declares 5,000 properties, more than the limit of 2,000");
  EXPECT_LT(ms, kRefusalMs);
  // A required list alone counts too.
  ordered_json names = {{"type", "object"}, {"required", ordered_json::array()}};
  for (int i = 0; i < 3000; ++i) names["required"].push_back("k" + std::to_string(i));
  EXPECT_EQ(schema_error(names, ms),
            "schema: 'required' names 3,000 properties, more than the limit of 2,000");
}

// Near the limits: 1,900 properties (9,500 enum values among them), converted, parsed and
// compiled with the initial mask, well within a second (about 22 ms in a release build).
TEST(GrammarLimits, LargeSchemaWithinTheLimitsCompilesQuickly) {
  ordered_json schema = {{"type", "object"},
                         {"properties", ordered_json::object()},
                         {"required", ordered_json::array()}};
  std::string instance = "{";
  for (int i = 0; i < 1900; ++i) {
    const std::string name = "p" + std::to_string(i);
    ordered_json values = ordered_json::array();
    for (int v = 0; v < 5; ++v) values.push_back(name + "-v" + std::to_string(v));
    schema["properties"][name] = {{"enum", values}};
    schema["required"].push_back(name);
    instance += (i ? ",\"" : "\"") + name + "\":\"" + name + "-v" + std::to_string(i % 5) + "\"";
  }
  instance += "}";
  const auto start = Clock::now();
  auto text = json_schema_to_gbnf(schema);
  ASSERT_TRUE(text.ok()) << text.error().message;
  GrammarCache cache(std::make_shared<TokenVocabulary>(
                         std::vector<std::string>{"", "{", "}", "\"", "p", "1", ",", ":", "-v"},
                         std::vector<int32_t>{0}),
                     4);
  auto compiled = cache.get(*text);
  const double ms = ms_since(start);
  ASSERT_TRUE(compiled.ok()) << compiled.error().message;
  std::cout << "[ measured ] 1,900 properties, 9,500 enum values: compiled in " << ms << " ms\n";
  EXPECT_LT(ms, 1000 * kSlowdown);
  EXPECT_TRUE((*compiled)->grammar().matches(instance));
  EXPECT_FALSE((*compiled)->grammar().matches(instance.substr(0, instance.size() - 1)));
}

TEST(GrammarLimits, GbnfTextSizeIsCheckedFirst) {
  double ms = 0;
  EXPECT_EQ(gbnf_error("root ::= \"a\"\n" + std::string(kMaxGrammarTextBytes, ' '), ms),
            "the grammar text has 4,194,317 bytes, more than the limit of 4,194,304");
  EXPECT_LT(ms, kRefusalMs);
}

TEST(GrammarLimits, GbnfSizeIsCountedBeforeTheGrammarIsBuilt) {
  double ms = 0;
  // Each "a"{10000} writes 10,000 elements: 26 of them and the alternative's end.
  std::string text = "root ::=";
  for (int i = 0; i < 26; ++i) text += " \"a\"{10000}";
  EXPECT_EQ(gbnf_error(text + "\n", ms),
            "the grammar has 260,001 elements, more than the limit of 250,000");
  EXPECT_LT(ms, kRefusalMs);
  // Each x{0,10000} writes 10,000 nested optional rules.
  text = "root ::=";
  for (int i = 0; i < 6; ++i) text += " \"a\"{0,10000}";
  EXPECT_EQ(gbnf_error(text + "\n", ms),
            "the grammar has 60,001 rules, more than the limit of 50,000");
  EXPECT_LT(ms, kRefusalMs);
  text = "root ::= \"a\"";
  for (int i = 0; i < 100000; ++i) text += " | \"a\"";
  EXPECT_EQ(gbnf_error(text + "\n", ms),
            "the grammar has 100,001 alternatives, more than the limit of 100,000");
  // Just within: builds.
  text = "root ::=";
  for (int i = 0; i < 24; ++i) text += " \"a\"{10000}";
  auto g = parse_gbnf(text + "\n");
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->elements.size(), 240001u);
}

TEST(GrammarLimits, DeepNestingIsRefusedNotACrash) {
  double ms = 0;
  const std::string deep = "root ::= " + std::string(600, '(') + "\"a\"" + std::string(600, ')');
  EXPECT_EQ(gbnf_error(deep + "\n", ms),
            "line 1, column 522: groups and repetitions nest more than 512 deep (the limit)");
  // Repetition operators nest as groups do.
  const std::string ops = "root ::= \"a\"" + std::string(600, '?');
  EXPECT_NE(gbnf_error(ops + "\n", ms).find("nest more than 512 deep"), std::string::npos);
  const std::string mixed =
      "root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')') + std::string(300, '*');
  EXPECT_NE(gbnf_error(mixed + "\n", ms).find("nest more than 512 deep"), std::string::npos);
  // Within the limit: fine, and so is the deepest regex (200 groups, each repeated).
  auto g = parse_gbnf("root ::= " + std::string(400, '(') + "\"a\"" + std::string(400, ')') + "\n");
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(g->matches("a"));
  std::string regex;
  for (int i = 0; i < 199; ++i) regex += "(x";
  regex += "a";
  for (int i = 0; i < 199; ++i) regex += ")?";
  auto text = regex_to_gbnf(regex);
  ASSERT_TRUE(text.ok()) << text.error().message;
  auto r = parse_gbnf(*text);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->matches("xx"));
  EXPECT_TRUE(r->matches(std::string(199, 'x') + "a"));
  EXPECT_FALSE(r->matches("xa"));
}

}  // namespace
}  // namespace vesper::grammar
