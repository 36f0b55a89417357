// Chat templates of real models rendered for fixed conversations, byte for byte against
// what HF transformers' apply_chat_template gives (expected outputs made by jinja2 with
// gen_expected.py and, for llama.cpp's conversation, equal to llama.cpp's published ones),
// plus the ChatTemplate API: message forms, extra context, errors, the default template and
// the template inside a GGUF file.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "test_helpers.h"
#include "tokenizer/chat_template.h"

namespace vesper::tokenizer {
namespace {

using nlohmann::ordered_json;

const ordered_json& test_data() {
  static const ordered_json data = test::read_json(test::data_path("conversations.json"));
  return data;
}

const ordered_json& conversation(const std::string& name) { return test_data().at("conversations").at(name); }

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& c : test::read_json(test::data_path("cases.json"))) names.push_back(c.at("name").get<std::string>());
  return names;
}

ordered_json find_case(const std::string& name) {
  for (const auto& c : test::read_json(test::data_path("cases.json"))) {
    if (c.at("name") == name) return c;
  }
  return nullptr;
}

std::string expected_output(const std::string& case_name) {
  return test::read_file(test::data_path("templates/" + case_name + ".expected"));
}

ChatTemplate load_template(const std::string& name) {
  const std::string source = test::read_file(test::data_path("templates/" + name + ".jinja"));
  EXPECT_FALSE(source.empty()) << name;
  auto t = ChatTemplate::parse(source);
  EXPECT_TRUE(t.ok()) << name << ": " << (t.ok() ? "" : t.error().message);
  return t.ok() ? std::move(t).value() : ChatTemplate();
}

Result<std::string> apply_case(const ordered_json& c) {
  ChatTemplateInputs in;
  in.messages = conversation(c.at("conversation").get<std::string>());
  in.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
  in.bos_token = c.at("bos_token").get<std::string>();
  in.eos_token = c.at("eos_token").get<std::string>();
  in.now = test::fixed_now();
  if (c.contains("extra")) {
    for (auto it = c["extra"].begin(); it != c["extra"].end(); ++it) {
      in.extra[it.key()] = it.value() == "$tools" ? test_data().at("tools") : it.value();
    }
  }
  return load_template(c.at("template").get<std::string>()).apply(in);
}

class RealTemplate : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTemplate, RendersLikeTransformers) {
  const ordered_json c = find_case(GetParam());
  ASSERT_FALSE(c.is_null());
  auto out = apply_case(c);
  if (c.contains("error")) {
    ASSERT_FALSE(out.ok()) << "expected the template to reject the conversation, got:\n" << *out;
    EXPECT_NE(out.error().message.find(c["error"].get<std::string>()), std::string::npos) << out.error().message;
    EXPECT_EQ(out.error().message.rfind("chat template rejected the conversation: ", 0), 0u) << out.error().message;
    return;
  }
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, expected_output(GetParam()));
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s;
  for (const char ch : info.param) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Cases, RealTemplate, ::testing::ValuesIn(case_names()), test_name);

TEST(RealTemplate, CoverTheMajorModelFamilies) {
  const std::vector<std::string> names = case_names();
  for (const std::string family : {"llama-2-chat", "llama-3-instruct", "llama-3.2-instruct", "qwen2.5-instruct",
                                   "mistral-v1", "mistral-nemo-v3-tekken", "chatml", "gemma-it", "phi-3-mini",
                                   "deepseek-coder-instruct", "deepseek-r1-distill-qwen", "zephyr"}) {
    bool found = false;
    for (const auto& n : names) found = found || n.rfind(family + ".", 0) == 0;
    EXPECT_TRUE(found) << family;
  }
  EXPECT_GE(names.size(), 60u);
}

TEST(ChatTemplate, RendersTheTemplateStoredInAGgufFile) {
  auto file = gguf::GgufFile::open("../shared/tokenizer-vectors/ggml-vocab-phi-3.gguf");
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto source = file->require_string("tokenizer.chat_template");
  ASSERT_TRUE(source.ok()) << source.error().message;
  EXPECT_EQ(*source, test::read_file(test::data_path("templates/phi-3-mini.jinja")));
  auto t = ChatTemplate::parse(*source);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatTemplateInputs in;
  in.messages = conversation("basic");
  in.bos_token = "<s>";
  in.eos_token = "<|endoftext|>";
  auto out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out,
            "<s><|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n"
            "<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n");
  EXPECT_EQ(*out, expected_output("phi-3-mini.basic"));
}

TEST(ChatTemplate, DefaultTemplateIsChatml) {
  auto t = ChatTemplate::parse(default_chat_template());
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatTemplateInputs in;
  in.messages = conversation("basic");
  auto out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, expected_output("chatml.basic"));

  in.messages = ordered_json::array({{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", nullptr}}});
  in.add_generation_prompt = false;
  out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n");
}

TEST(ChatTemplate, RendersChatMessages) {
  auto t = ChatTemplate::parse(test::read_file(test::data_path("templates/llama-3-instruct.jinja")));
  ASSERT_TRUE(t.ok()) << t.error().message;
  std::vector<ChatMessage> messages;
  for (const auto& m : conversation("basic")) {
    messages.push_back(ChatMessage{m["role"].get<std::string>(), m["content"].get<std::string>(), "", "", nullptr});
  }
  auto out = t->render(messages, true, "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, expected_output("llama-3-instruct.basic"));
}

TEST(ChatTemplate, ChatMessageOptionalFieldsReachTheTemplate) {
  auto t = ChatTemplate::parse(
      "{% for m in messages %}{{ m.role }}|{{ m.name is defined }}|{{ m.tool_call_id|default('-') }}|"
      "{{ m.tool_calls|default([])|length }};{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatMessage call{"assistant", "", "", "", nlohmann::ordered_json::array({{{"id", "c1"}}})};
  ChatMessage result{"tool", "42", "calc", "c1", nullptr};
  auto out = t->render({ChatMessage{"user", "q", "", "", nullptr}, call, result}, false, "", "");
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, "user|False|-|0;assistant|False|-|1;tool|True|c1|0;");
}

TEST(ChatTemplate, RendersOpenAiJsonMessagesWithContentParts) {
  auto t = ChatTemplate::parse(test::read_file(test::data_path("templates/chatml.jinja")));
  ASSERT_TRUE(t.ok()) << t.error().message;
  const nlohmann::json messages = nlohmann::json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": "x"}},
                                 {"type": "text", "text": "this."}]}])");
  auto out = t->render(messages, true, "", "");
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nDescribe\nthis.<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, ContentPartsCanReachTheTemplateAsAList) {
  auto t = ChatTemplate::parse(
      "{% for m in messages %}{% for p in m.content %}[{{ p.type }}:{{ p.text|default('') }}]{% endfor %}{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}])");
  in.flatten_content_parts = false;
  auto out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, "[image:][text:hi]");
}

// Found by tests/fuzz/fuzz_chat_template: a content part whose "type" was not a string made
// nlohmann's value("type", "") throw out of render(), which aborted the process.
TEST(ChatTemplate, ContentPartsOfOddShapesAreSkippedWithoutThrowing) {
  auto t = ChatTemplate::parse("[{{ messages[0].content }}]");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": [
      {"type": 5, "text": "a"}, {"type": null}, {"type": ["text"], "text": "b"}, {"type": "text", "text": 7},
      {"type": "text"}, {"text": "c"}, 3, null, [], {"type": "text", "text": "kept"}, "also kept"]}])");
  auto out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, "[kept\nalso kept]");
}

TEST(ChatTemplate, ExtraContextBecomesTemplateVariables) {
  auto t = ChatTemplate::parse(
      "{{ enable_thinking }} {{ tools is none }} {{ documents is none }} {{ custom.k }} {{ bos_token }}{{ eos_token }}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto out = t->render(std::vector<ChatMessage>{}, true, "<s>", "</s>",
                       nlohmann::json{{"enable_thinking", false}, {"custom", {{"k", 1.5}}}});
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, "False True True 1.5 <s></s>");
}

TEST(ChatTemplate, OrderedJsonKeepsToolKeyOrderLikeTransformers) {
  auto t = ChatTemplate::parse("{{ tools[0]|tojson }}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatTemplateInputs in;
  in.extra["tools"] = ordered_json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"description", "d"}}}}});
  auto out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, R"({"type": "function", "function": {"name": "f", "description": "d"}})");
}

TEST(ChatTemplate, StrftimeNowFormatsTheGivenDate) {
  auto t = ChatTemplate::parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatTemplateInputs in;
  in.now = test::fixed_now();
  auto out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, "26 Jul 2024");
  in.now.reset();
  out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out->size(), 11u);  // today, in the same format
}

TEST(ChatTemplate, ErrorsAreResultsThatNameTheProblem) {
  auto bad = ChatTemplate::parse("{% for m in messages %}{{ m.content }");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("chat template: line 1, column ", 0), 0u) << bad.error().message;

  auto t = ChatTemplate::parse("{{ messages[0].content + 1 }}");
  ASSERT_TRUE(t.ok());
  auto out = t->render(std::vector<ChatMessage>{ChatMessage{"user", "x", "", "", nullptr}}, true, "", "");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().message, "chat template: line 1: unsupported operand type(s) for +: 'str' and 'int'");

  auto chatml = ChatTemplate::parse(default_chat_template());
  ASSERT_TRUE(chatml.ok());
  EXPECT_FALSE(chatml->render(nlohmann::json::object(), true, "", "").ok());
  EXPECT_FALSE(chatml->render(nlohmann::json::array({1}), true, "", "").ok());
}

// `levels` arrays, each the only item of the one around it, around the number 1.
ordered_json nested_arrays(int levels) {
  ordered_json v = 1;
  for (int i = 0; i < levels; ++i) {
    ordered_json outer = ordered_json::array();
    outer.push_back(std::move(v));
    v = std::move(outer);
  }
  return v;
}

// Found by tests/fuzz/fuzz_chat_template: the JSON -> template value conversion recursed once per
// nesting level, so a request body of a few hundred KB of '[' overflowed the stack.
TEST(ChatTemplate, JsonNestedDeeperThan256LevelsIsAnErrorNotAStackOverflow) {
  auto t = ChatTemplate::parse("{{ messages|length }} {{ deep|length }}");
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatTemplateInputs in;
  in.extra["deep"] = nested_arrays(kMaxJsonDepth);
  auto out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, "0 1");

  in.extra["deep"] = nested_arrays(kMaxJsonDepth + 1);
  out = t->apply(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().message,
            "chat template: extra context \"deep\" is nested deeper than 256 levels");

  // What a 400 KB request body parses to (nlohmann's parser itself does not recurse).
  const std::string brackets = std::string(200000, '[') + std::string(200000, ']');
  in.extra["deep"] = ordered_json::parse(brackets);
  out = t->apply(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().message,
            "chat template: extra context \"deep\" is nested deeper than 256 levels");

  // A message is level 1, so its content may nest 255 levels more.
  in.extra = ordered_json::object({{"deep", ordered_json::array({1})}});
  in.messages =
      ordered_json::array({{{"role", "user"}, {"content", nested_arrays(kMaxJsonDepth - 1)}}});
  out = t->apply(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  in.messages.push_back({{"role", "user"}, {"content", ordered_json::parse(brackets)}});
  out = t->apply(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().message, "chat template: message 1 is nested deeper than 256 levels");

  // The render() overloads copy their JSON (recursively) before converting it, so they check first.
  out = t->render(
      nlohmann::json::array({{{"role", "user"}, {"content", nlohmann::json::parse(brackets)}}}),
      true, "", "");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().message, "chat template: messages are nested deeper than 256 levels");
  out = t->render(std::vector<ChatMessage>{}, true, "", "",
                  nlohmann::json{{"deep", nlohmann::json::parse(brackets)}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().message, "chat template: extra context is nested deeper than 256 levels");
  std::vector<ChatMessage> calls(1);  // moved in: copying the deep tool_calls would recurse
  calls[0].role = "assistant";
  calls[0].tool_calls = ordered_json::array({ordered_json::parse(brackets)});
  out = t->render(calls, true, "", "");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().message, "chat template: message 0 is nested deeper than 256 levels");

  auto value = json_to_value(ordered_json::parse(brackets));
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.error().message, "chat template: JSON value is nested deeper than 256 levels");
  EXPECT_TRUE(json_to_value(nested_arrays(kMaxJsonDepth)).ok());
}

TEST(ChatTemplate, RejectedConversationsSayWhy) {
  const ordered_json c = find_case("gemma-it.basic");
  ASSERT_FALSE(c.is_null());
  auto out = apply_case(c);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().message, "chat template rejected the conversation: line 1: System role not supported");
}

}  // namespace
}  // namespace vesper::tokenizer
