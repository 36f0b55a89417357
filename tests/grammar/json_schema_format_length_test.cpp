// JSON schema strings with both a `format` and minLength/maxLength (zod's
// z.string().email().max(40), pydantic's EmailStr with max_length): the string must be in the
// format AND have a length in [minLength, maxLength] characters, exactly.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/limits.h"
#include "grammar/stack_set.h"

namespace vesper::grammar {
namespace {

using nlohmann::ordered_json;

Grammar compile_schema(const ordered_json& schema) {
  auto text = json_schema_to_gbnf(schema);
  EXPECT_TRUE(text.ok()) << schema.dump() << ": " << (text.ok() ? "" : text.error().message);
  if (!text.ok()) return Grammar{};
  auto g = parse_gbnf(*text);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return g.ok() ? std::move(g).value() : Grammar{};
}

ordered_json format_schema(const std::string& format, std::optional<int> min,
                           std::optional<int> max) {
  ordered_json s = {{"type", "string"}, {"format", format}};
  if (min) s["minLength"] = *min;
  if (max) s["maxLength"] = *max;
  return s;
}

std::string quoted(const std::string& s) {
  return "\"" + s + "\"";
}

// Strings of `g`'s language (a JSON string: quotes included), by random walks: each step takes
// a byte the grammar allows, either any such byte (with probability `spread`) or one of a stack
// chosen first (an email's letters are one stack's, '.' and '@' others'), and a walk stops
// where the grammar accepts with probability `stop`. Low spreads give short strings, high ones
// long strings (an email's parts end when '.' or '@' comes up among all its letters), so the
// walks reach all lengths.
std::vector<std::string> sample(const Grammar& g, std::mt19937_64& rng, int count, double stop,
                                double spread) {
  std::vector<std::string> out;
  std::uniform_real_distribution<double> coin(0, 1);
  auto pick = [&](const ByteSet& set) {
    std::vector<uint8_t> bytes;
    for (unsigned b = 0; b < 256; ++b)
      if (set.has(static_cast<uint8_t>(b))) bytes.push_back(static_cast<uint8_t>(b));
    return bytes[rng() % bytes.size()];
  };
  for (int i = 0; i < count; ++i) {
    StackSet s = initial_stacks(g);
    std::string text;
    while (text.size() < 400 && can_continue(s)) {
      if (is_accepting(s) && coin(rng) < stop) break;
      ByteSet any;
      std::vector<const ByteSet*> tops;
      for (const Stack& st : s) {
        if (st.empty()) continue;
        tops.push_back(&g.byte_sets[g.elements[st.back()].value]);
        for (size_t w = 0; w < 4; ++w) any.words[w] |= tops.back()->words[w];
      }
      const uint8_t b = coin(rng) < spread ? pick(any) : pick(*tops[rng() % tops.size()]);
      text.push_back(static_cast<char>(b));
      s = advance_stacks(g, s, b);
    }
    out.push_back(text);
  }
  return out;
}

// The bounded grammar accepts exactly the format's strings with a length in [min, max]: checked
// on strings of the format (which it must accept or refuse by length alone) and on near misses
// (each sampled string with a character dropped, doubled or changed).
void expect_exact(const std::string& format, std::optional<int> min, std::optional<int> max,
                  uint64_t seed, bool bounds_cut = true) {
  SCOPED_TRACE(format + " [" + std::to_string(min.value_or(-1)) + ", " +
               std::to_string(max.value_or(-1)) + "] seed " + std::to_string(seed));
  const Grammar plain = compile_schema(format_schema(format, std::nullopt, std::nullopt));
  const Grammar bounded = compile_schema(format_schema(format, min, max));
  std::mt19937_64 rng(seed);
  std::vector<std::string> texts;
  for (double spread : {0.0, 0.7, 0.95, 1.0}) {
    std::vector<std::string> more = sample(plain, rng, 10, 0.2, spread);
    texts.insert(texts.end(), more.begin(), more.end());
  }
  const size_t sampled = texts.size();
  for (size_t i = 0; i < sampled; ++i) {
    const std::string t = texts[i];
    if (t.size() < 3) continue;
    const size_t at = 1 + rng() % (t.size() - 2);
    switch (rng() % 3) {
      case 0:
        texts.push_back(t.substr(0, at) + t.substr(at + 1));
        break;
      case 1:
        texts.push_back(t.substr(0, at) + t[at] + t.substr(at));
        break;
      default:
        texts.push_back(t.substr(0, at) + "x" + t.substr(at + 1));
    }
  }
  int in_range = 0, out_of_range = 0;
  for (const std::string& t : texts) {
    const int length = static_cast<int>(t.size()) - 2;  // the formats are ASCII: bytes are chars
    const bool in_format = plain.matches(t);
    const bool fits = length >= min.value_or(0) && length <= max.value_or(1 << 30);
    EXPECT_EQ(bounded.matches(t), in_format && fits) << t << " (" << length << " characters)";
    if (in_format) (fits ? in_range : out_of_range)++;
  }
  // The samples exercised both sides of the bounds.
  EXPECT_GT(in_range, 0);
  if (bounds_cut) {
    EXPECT_GT(out_of_range, 0);
  }
}

TEST(JsonSchemaFormatLength, EmailWithMaxLength) {
  const Grammar g = compile_schema(format_schema("email", std::nullopt, 10));
  for (const char* yes : {"a@b.co", "ab@cd.efgh", "x.y@a.b.c"})
    EXPECT_TRUE(g.matches(quoted(yes))) << yes;
  for (const char* no : {"abcde@fg.hi", "a@b", "a..b@c.d", "a@b.co.uk.org"})
    EXPECT_FALSE(g.matches(quoted(no))) << no;
  for (int max : {10, 40, 100}) expect_exact("email", std::nullopt, max, 1);
  // RFC 5321's 254: the longest local part and labels, one character short of it and over it.
  const Grammar rfc = compile_schema(format_schema("email", std::nullopt, 254));
  const std::string local(64, 'l'), label(63, 'd');
  const std::string longest = local + "@" + label + "." + label + ".";
  EXPECT_TRUE(rfc.matches(quoted(longest + std::string(61, 'x'))));  // 254 characters
  EXPECT_FALSE(rfc.matches(quoted(longest + std::string(62, 'x'))));
  EXPECT_FALSE(rfc.matches(quoted(std::string(65, 'l') + "@b.co")));  // a local part over 64
}

TEST(JsonSchemaFormatLength, EmailWithMinAndMaxLength) {
  const Grammar g = compile_schema(format_schema("email", 8, 12));
  EXPECT_FALSE(g.matches(quoted("a@b.co")));       // 6
  EXPECT_TRUE(g.matches(quoted("abc@de.fg")));     // 9
  EXPECT_TRUE(g.matches(quoted("abcde@fgh.ij")));  // 12
  EXPECT_FALSE(g.matches(quoted("abcdef@fgh.ij")));
  expect_exact("email", 8, 12, 2);
  expect_exact("email", 30, 90, 3);
  expect_exact("email", 60, std::nullopt, 4);
}

TEST(JsonSchemaFormatLength, DateTimeAndTime) {
  const Grammar dt = compile_schema(format_schema("date-time", std::nullopt, 20));
  EXPECT_TRUE(dt.matches(quoted("2024-01-01T00:00:00Z")));
  EXPECT_FALSE(dt.matches(quoted("2024-01-01T00:00:00.5Z")));  // 22 characters
  EXPECT_FALSE(dt.matches(quoted("2024-02-30T00:00:00Z")));    // not a date
  const Grammar t = compile_schema(format_schema("time", 12, 12));
  EXPECT_TRUE(t.matches(quoted("12:30:00.12Z")));
  EXPECT_FALSE(t.matches(quoted("12:30:00.1Z")));
  EXPECT_FALSE(t.matches(quoted("12:30:00+01:00")));
  expect_exact("time", std::nullopt, 9, 5);
  expect_exact("time", 12, 16, 6);
  expect_exact("date-time", 22, 30, 7);
}

TEST(JsonSchemaFormatLength, FixedLengthFormatsAndIpv4) {
  // A date has 10 characters, a uuid 36: bounds that admit them change nothing.
  const Grammar date = compile_schema(format_schema("date", 10, 10));
  EXPECT_TRUE(date.matches(quoted("2024-02-29")));
  EXPECT_FALSE(date.matches(quoted("2023-02-29")));
  const Grammar uuid = compile_schema(format_schema("uuid", 1, 100));
  EXPECT_TRUE(uuid.matches(quoted("123e4567-e89b-12d3-a456-426614174000")));
  expect_exact("date", 0, 10, 8, /*bounds_cut=*/false);
  expect_exact("uuid", 36, 36, 9, /*bounds_cut=*/false);
  const Grammar ip = compile_schema(format_schema("ipv4", std::nullopt, 9));
  EXPECT_TRUE(ip.matches(quoted("1.2.3.4")));
  EXPECT_TRUE(ip.matches(quoted("10.2.3.45")));
  EXPECT_FALSE(ip.matches(quoted("10.20.30.4")));
  expect_exact("ipv4", 9, 11, 10);
}

TEST(JsonSchemaFormatLength, BoundsThatLeaveNoStringAreErrors) {
  auto error = [](const ordered_json& schema) {
    auto text = json_schema_to_gbnf(schema);
    EXPECT_FALSE(text.ok()) << schema.dump();
    return text.ok() ? std::string() : text.error().message;
  };
  EXPECT_EQ(error(format_schema("date", 11, std::nullopt)),
            "schema: 'format' \"date\" with 'minLength' 11 leaves no string (\"date\" strings "
            "have 10 characters)");
  EXPECT_EQ(error(format_schema("email", 3, 4)),
            "schema: 'format' \"email\" with 'minLength' 3 and 'maxLength' 4 leaves no string "
            "(\"email\" strings have 5 to 320 characters)");
  EXPECT_EQ(error(format_schema("uuid", 40, 50)),
            "schema: 'format' \"uuid\" with 'minLength' 40 and 'maxLength' 50 leaves no string "
            "(\"uuid\" strings have 36 characters)");
  EXPECT_EQ(error(format_schema("email", 10, 5)), "schema: 'minLength' 10 is above 'maxLength' 5");
}

// The expansions try lengths side by side (an email's local part, 1 to 64 characters, is
// followed by as many domains), so the matcher holds several stacks at once: they stay within
// half of the bound past which a state fails as too ambiguous.
TEST(JsonSchemaFormatLength, ExpansionsStayWellWithinTheAmbiguityBound) {
  const size_t bound = kMaxStacksPerState / 2;
  for (const auto& [min, max] : std::vector<std::pair<std::optional<int>, std::optional<int>>>{
           {std::nullopt, 40}, {std::nullopt, 254}, {30, 90}}) {
    const Grammar g = compile_schema(format_schema("email", min, max));
    for (const std::string text :
         {"a@b.co", "abc.def@ghi.jkl.mn", "abcdefghijklmnopqrstuvwxyzabcdef@example.com"}) {
      StackSet s;
      ASSERT_TRUE(initial_stacks(g, bound, s));
      for (unsigned char c : quoted(text)) {
        StackSet next;
        ASSERT_TRUE(advance_stacks(g, s, c, bound, next)) << text;
        s = std::move(next);
      }
    }
  }
}

TEST(JsonSchemaFormatLength, SharedByFieldsWithTheSameBounds) {
  ordered_json schema = {{"type", "object"},
                         {"properties",
                          {{"from", format_schema("email", std::nullopt, 30)},
                           {"to", format_schema("email", std::nullopt, 30)},
                           {"cc", format_schema("email", std::nullopt, 20)}}},
                         {"required", {"from", "to"}}};
  auto one = json_schema_to_gbnf(
      ordered_json{{"type", "object"}, {"properties", {{"from", schema["properties"]["from"]}}}});
  auto three = json_schema_to_gbnf(schema);
  ASSERT_TRUE(one.ok() && three.ok());
  // The second field with the same bounds adds a rule that names the first's, not a copy.
  EXPECT_LT(three->size(), 3 * one->size());
  const Grammar g = compile_schema(schema);
  EXPECT_TRUE(g.matches(R"({"from":"a@b.co","to":"cd@ef.gh","cc":"x@y.zz"})"));
  EXPECT_FALSE(g.matches(R"({"from":"a@b.co","to":"cd@ef.gh","cc":"abcdefghijklmnop@y.zz"})"));
}

}  // namespace
}  // namespace vesper::grammar
