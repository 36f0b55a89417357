// The Jinja engine feature by feature. The table-driven cases (engine_cases.json) were
// checked against Python's jinja2 set up as HF transformers sets it up (gen_expected.py);
// the TESTs below them cover what jinja2 cannot check: error reporting, limits, sharing,
// and where Vesper is deliberately more lenient than jinja2.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "test_helpers.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/jinja/value.h"

namespace vesper::tokenizer::jinja {
namespace {

using test::render;

std::vector<std::string> feature_groups() {
  std::vector<std::string> names;
  const auto groups = test::read_json(test::data_path("engine_cases.json"));
  for (auto it = groups.begin(); it != groups.end(); ++it) names.push_back(it.key());
  return names;
}

class JinjaFeature : public ::testing::TestWithParam<std::string> {};

TEST_P(JinjaFeature, RendersLikeJinja2) {
  const auto groups = test::read_json(test::data_path("engine_cases.json"));
  const auto& cases = groups.at(GetParam());
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const std::string source = c[0].get<std::string>();
    const std::string expected = c[2].get<std::string>();
    const std::string out = render(source, c[1]);
    if (!expected.empty() && expected[0] == '!') {
      ASSERT_FALSE(out.empty()) << source;
      EXPECT_EQ(out[0], '!') << "expected an error for: " << source << "\ngot: " << out;
      EXPECT_NE(out.find(expected.substr(1)), std::string::npos)
          << "template: " << source << "\nerror: " << out << "\nexpected it to mention: " << expected.substr(1);
    } else {
      EXPECT_EQ(out, expected) << "template: " << source;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, JinjaFeature, ::testing::ValuesIn(feature_groups()),
                         [](const auto& info) { return info.param; });

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(render("{{ x }}\n  {% if %}"), "!line 2, column 9: unexpected '%}'");
  EXPECT_EQ(render("ab\n{{ x + }}"), "!line 2, column 8: unexpected '}}'");
  EXPECT_EQ(render("{% if x %}open"), "!line 1, column 15: unexpected end of template, expected 'elif' or 'else' or 'endif'");
  EXPECT_EQ(render("{{ 'abc }}"), "!line 1, column 4: unterminated string literal");
  EXPECT_EQ(render("x\n{{ a "), "!line 2, column 1: unterminated '{{'");
  EXPECT_EQ(render("{# never closed"), "!line 1, column 1: unterminated comment");
  EXPECT_EQ(render("{{ x | nosuchfilter }}"), "!line 1, column 8: no filter named 'nosuchfilter'");
  EXPECT_EQ(render("{{ x is nosuchtest }}"), "!line 1, column 9: no test named 'nosuchtest'");
  EXPECT_EQ(render("{% break %}"), "!line 1, column 4: 'break' outside of a loop");
  EXPECT_EQ(render("{% include 'x.j2' %}"), "!line 1, column 4: the 'include' tag is not supported");
  EXPECT_EQ(render("{% frobnicate %}"), "!line 1, column 4: unknown tag 'frobnicate'");
  EXPECT_EQ(render("{{ a ; b }}"), "!line 1, column 6: unexpected character ';'");
  EXPECT_EQ(render("{% for x in xs %}{% endif %}"), "!line 1, column 21: unknown tag 'endif'");
}

TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
  EXPECT_EQ(render("a\nb\n{{ 1 // 0 }}"), "!line 3: integer division or modulo by zero");
  EXPECT_EQ(render("{% for m in [1] %}\n{{ m.x() }}\n{% endfor %}"), "!line 2: 'int object' has no attribute 'x'");
  EXPECT_EQ(render("{{ missing_function(1) }}"), "!line 1: 'missing_function' is undefined");
}

TEST(JinjaErrors, RaiseExceptionIsReportedAsRaised) {
  auto t = Template::parse("line one\n{{ raise_exception('Only user and assistant roles are supported!') }}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  RenderErrorKind kind = RenderErrorKind::kRuntime;
  auto r = t->render(Value::dict(), {}, &kind);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "line 2: Only user and assistant roles are supported!");
  EXPECT_EQ(kind, RenderErrorKind::kRaised);

  auto broken = Template::parse("{{ 1 + 'a' }}");
  ASSERT_TRUE(broken.ok());
  kind = RenderErrorKind::kRaised;
  EXPECT_FALSE(broken->render(Value::dict(), {}, &kind).ok());
  EXPECT_EQ(kind, RenderErrorKind::kRuntime);
}

TEST(JinjaUndefined, AttributesOfUndefinedAreUndefinedNotErrors) {
  // jinja2's default Undefined raises here; chat templates probe optional fields this way,
  // so Vesper keeps going (like ChainableUndefined and llama.cpp's engine).
  EXPECT_EQ(render("{{ missing.deeper|default('ok') }}"), "ok");
  EXPECT_EQ(render("{{ missing.a.b is defined }}|{{ missing['k'][0] }}|"), "False||");
  EXPECT_EQ(render("{{ m.tool_calls[0].function.name is defined }}", {{"m", {{"role", "user"}}}}), "False");
}

TEST(JinjaLists, AppendOnANamespaceListIsSeenEverywhere) {
  EXPECT_EQ(render("{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set _ = ns.items.append(i * 2) %}"
                   "{% endfor %}{{ ns.items }} {{ ns.items|length }}"),
            "[0, 2, 4] 3");
  EXPECT_EQ(render("{% set xs = [1] %}{% set ys = xs %}{% set _ = ys.append(2) %}{{ xs }}{{ xs.pop() }}{{ xs }}"),
            "[1, 2]2[1]");
  EXPECT_EQ(render("{% set xs = [] %}{% set _ = xs.append(xs) %}"), "!line 1: cannot put a list inside itself");
}

TEST(JinjaLimits, RunawayTemplatesStopWithAnError) {
  RenderLimits small;
  small.max_steps = 10'000;
  EXPECT_NE(render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", {}, small)
                .find("exceeded the limit of 10000 steps"),
            std::string::npos);
  small = {};
  small.max_output_bytes = 1000;
  EXPECT_NE(render("{% for i in range(100) %}{{ 'x' * 50 }}{% endfor %}", {}, small).find("output exceeds"),
            std::string::npos);
  EXPECT_NE(render("{{ 'x' * 10000000000 }}").find("!line 1:"), std::string::npos);
  EXPECT_NE(render("{{ range(100000000)|length }}").find("exceeds the render limit"), std::string::npos);
  EXPECT_NE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nest deeper than 200"),
            std::string::npos);
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_NE(render(deep).find("nests too deeply"), std::string::npos);
  EXPECT_NE(render("{{ 2 ** 64 }}").find("integer overflow"), std::string::npos);
}

TEST(JinjaTemplate, IsSharedAcrossThreads) {
  auto t = Template::parse("{% for m in messages %}<{{ m.role }}:{{ m.content|trim }}>{% endfor %}{{ n }}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  const Template shared = *t;
  std::vector<std::string> outputs(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    threads.emplace_back([&, i] {
      nlohmann::ordered_json vars = {{"messages", {{{"role", "user"}, {"content", " hi "}}}}, {"n", i}};
      for (int k = 0; k < 200; ++k) {
        auto r = shared.render(json_to_value(vars).value());
        outputs[i] = r.ok() ? *r : r.error().message;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < outputs.size(); ++i) EXPECT_EQ(outputs[i], "<user:hi>" + std::to_string(i));
}

TEST(JinjaText, BytesThatAreNotUtf8PassThroughUnchanged) {
  const std::string bad = std::string("a\xff") + "b\xc3";
  auto t = Template::parse("{{ s }}|{{ s|length }}|{{ s[1:] }}|{{ s|upper }}");
  ASSERT_TRUE(t.ok());
  Value vars = Value::dict();
  vars.as_dict().set(Value("s"), Value(bad));
  auto r = t->render(vars);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, bad + "|4|" + bad.substr(1) + "|A\xff" "B\xc3");
}

TEST(JinjaTemplate, GenerationBlocksRenderTheirBody) {
  EXPECT_EQ(render("{% generation %}answer{% endgeneration %}!"), "answer!");
}

TEST(JinjaTemplate, OptionsTurnOffHfWhitespaceHandling) {
  TemplateOptions raw;
  raw.trim_blocks = false;
  raw.lstrip_blocks = false;
  raw.keep_trailing_newline = true;
  auto t = Template::parse("  {% if true %}\nx\n  {% endif %}\n", raw);
  ASSERT_TRUE(t.ok());
  auto r = t->render(Value::dict());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "  \nx\n  \n");
}

TEST(JinjaValue, FloatsPrintLikePythonRepr) {
  EXPECT_EQ(format_python_float(1.0), "1.0");
  EXPECT_EQ(format_python_float(0.1), "0.1");
  EXPECT_EQ(format_python_float(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(format_python_float(1e22), "1e+22");
  EXPECT_EQ(format_python_float(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(format_python_float(9999999999999998.0), "9999999999999998.0");
  EXPECT_EQ(format_python_float(0.0001), "0.0001");
  EXPECT_EQ(format_python_float(-0.0), "-0.0");
  EXPECT_EQ(python_string_repr("it's"), "\"it's\"");
  EXPECT_EQ(python_string_repr("a'\"b\n"), "'a\\'\"b\\n'");
}

}  // namespace
}  // namespace vesper::tokenizer::jinja
