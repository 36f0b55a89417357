// Fuzz target: the real chat templates of tests/chat_template/templates (and the default
// ChatML one) rendered with fuzzed conversations and extra context through
// tokenizer::ChatTemplate::apply, as the server renders requests. chat_template.h promises that
// rendering never throws, crashes or runs unbounded: every failure is a Result error starting
// "chat template". Also checked: rendering is deterministic (the parsed template is immutable),
// and valid UTF-8 in gives valid UTF-8 out.
//
// Input layout (FuzzedDataProvider): the last byte picks the template, the two before it are
// flags. With the JSON flag the rest is a JSON document: {"messages": [...], "extra": {...},
// "bos_token": "...", "eos_token": "..."} or just the messages array (the seed corpus has real
// conversations in this form). Otherwise the rest drives a builder: messages with fuzzed roles,
// content strings or content-part arrays, names and tool calls, and extra context of nested
// JSON, some of it nested thousands of levels deep.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_template/test_helpers.h"
#include "core/check.h"
#include "fuzz_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/utf8.h"

namespace vesper::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

// An empty object with room for `n` members. nlohmann's ordered_map is a vector of
// pair<const string, json>, which copies (not moves) its members when it grows, and copying
// a deeply nested member recurses once per level: so objects here never grow.
Json object_for(size_t n) {
  Json o = Json::object();
  o.get_ref<Json::object_t&>().reserve(n);
  return o;
}

// Whether the JSON text nests arrays and objects deeper than `max_depth` (strings skipped).
bool nests_deeper_than(const std::string& text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

std::vector<ChatTemplate> load_templates() {
  std::vector<std::string> paths;
  const std::string dir = fuzz::repo_path("tests/chat_template/templates");
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".jinja") paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());  // a fixed order keeps reproducers reproducible
  std::vector<ChatTemplate> out;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream source;
    source << in.rdbuf();
    auto t = ChatTemplate::parse(source.str());
    VESPER_CHECK(t.ok(), "%s: %s", path.c_str(), t.error().message.c_str());
    out.push_back(std::move(t).value());
  }
  auto fallback = ChatTemplate::parse(default_chat_template());
  VESPER_CHECK(fallback.ok());
  out.push_back(std::move(fallback).value());
  return out;
}

const std::vector<ChatTemplate>& templates() {
  static const std::vector<ChatTemplate> all = load_templates();
  return all;
}

constexpr const char* kRoles[] = {"system",   "user",      "assistant", "tool",
                                  "function", "developer", "ipython"};
// Keys chat templates read from messages, tool calls and the extra context.
constexpr const char* kKeys[] = {"role",
                                 "content",
                                 "name",
                                 "type",
                                 "text",
                                 "function",
                                 "arguments",
                                 "parameters",
                                 "description",
                                 "properties",
                                 "required",
                                 "tool_calls",
                                 "tool_call_id",
                                 "id",
                                 "tools",
                                 "documents",
                                 "enable_thinking",
                                 "date_string",
                                 "reasoning_content",
                                 "tools_in_user_message",
                                 "builtin_tools",
                                 "custom_tools",
                                 "add_generation_prompt",
                                 "bos_token",
                                 "eos_token",
                                 "title",
                                 "image_url",
                                 "url",
                                 "strftime_now",
                                 "messages"};

class Builder {
 public:
  Builder(FuzzedDataProvider& fdp, bool valid_utf8) : fdp_(fdp), valid_utf8_(valid_utf8) {}

  std::string string(size_t max_length = 48) {
    std::string s = fdp_.ConsumeRandomLengthString(max_length);
    return valid_utf8_ ? to_valid_utf8_lenient(s) : s;
  }

  std::string key() {
    if (fdp_.ConsumeBool()) return fdp_.PickValueInArray(kKeys);
    return string(16);
  }

  // A JSON value; containers hold up to four items and nest up to `depth` levels, except that
  // a "deep" value wraps a leaf in 200 to 600 arrays or objects (either side of kMaxJsonDepth),
  // or in 100000 (far past what the stack would survive if the conversion recursed freely).
  Json value(int depth) {
    const int kind = fdp_.ConsumeIntegralInRange<int>(0, depth > 0 ? 15 : 5);
    switch (kind) {
      case 0:
        return nullptr;
      case 1:
        return fdp_.ConsumeBool();
      case 2:
        return fdp_.ConsumeIntegral<int64_t>();
      case 3:
        return fdp_.ConsumeFloatingPoint<double>();
      case 4:
        return fdp_.ConsumeIntegral<uint64_t>();
      case 5:
        return string();
      case 15:
        return deep();
      default:
        break;
    }
    const int n = fdp_.ConsumeIntegralInRange<int>(0, 4);
    if (kind <= 10) {
      Json a = Json::array();
      for (int i = 0; i < n; ++i) a.push_back(value(depth - 1));
      return a;
    }
    Json o = object_for(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) o[key()] = value(depth - 1);
    return o;
  }

  // Built from the inside out: nlohmann's parser and destructor are iterative, but recursion
  // here would defeat the point.
  Json deep() {
    uint32_t levels = fdp_.ConsumeIntegralInRange<uint32_t>(200, 600);
    // Rare (a two-byte key), as building it takes a good part of a second under ASan.
    if (fdp_.ConsumeIntegral<uint16_t>() == 0xDEE9) levels = 100000;
    const bool objects = fdp_.ConsumeBool();
    const std::string k = key();
    Json v = value(0);
    for (uint32_t i = 0; i < levels; ++i) {
      Json outer = objects ? object_for(1) : Json::array();
      if (objects) {
        outer[k] = std::move(v);
      } else {
        outer.push_back(std::move(v));
      }
      v = std::move(outer);
    }
    return v;
  }

  Json content() {
    switch (fdp_.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
      case 1:
        return string(256);
      case 2:
        return nullptr;
      case 3: {  // OpenAI content parts
        Json parts = Json::array();
        const int n = fdp_.ConsumeIntegralInRange<int>(0, 4);
        for (int i = 0; i < n; ++i) {
          switch (fdp_.ConsumeIntegralInRange<int>(0, 3)) {
            case 0:
              parts.push_back({{"type", "text"}, {"text", string(128)}});
              break;
            case 1:
              parts.push_back({{"type", "image_url"}, {"image_url", {{"url", string()}}}});
              break;
            case 2:
              parts.push_back(string());
              break;
            default:
              parts.push_back(value(2));
              break;
          }
        }
        return parts;
      }
      default:
        return value(3);
    }
  }

  Json tool_calls() {
    Json calls = Json::array();
    const int n = fdp_.ConsumeIntegralInRange<int>(0, 3);
    for (int i = 0; i < n; ++i) {
      Json arguments = fdp_.ConsumeBool() ? Json(string()) : value(3);
      calls.push_back({{"id", string(16)},
                       {"type", "function"},
                       {"function", {{"name", string(16)}, {"arguments", std::move(arguments)}}}});
    }
    return calls;
  }

  Json message() {
    Json m = object_for(8);
    m["role"] = fdp_.ConsumeBool() ? Json(fdp_.PickValueInArray(kRoles)) : Json(string(16));
    if (!fdp_.ConsumeBool() || fdp_.ConsumeBool()) m["content"] = content();
    const uint8_t optional = fdp_.ConsumeIntegral<uint8_t>();
    if (optional & 1) m["name"] = string(16);
    if (optional & 2) m["tool_calls"] = tool_calls();
    if (optional & 4) m["tool_call_id"] = string(16);
    if (optional & 8) m["reasoning_content"] = string();
    if (optional & 16) m[key()] = value(3);
    return m;
  }

  void fill(ChatTemplateInputs& in) {
    const int n_messages = fdp_.ConsumeIntegralInRange<int>(0, 8);
    for (int i = 0; i < n_messages; ++i) in.messages.push_back(message());
    const int n_extra = fdp_.ConsumeIntegralInRange<int>(0, 4);
    in.extra = object_for(static_cast<size_t>(n_extra));
    for (int i = 0; i < n_extra; ++i) in.extra[key()] = value(4);
    if (fdp_.ConsumeBool()) in.bos_token = string(16);
    if (fdp_.ConsumeBool()) in.eos_token = string(16);
  }

 private:
  FuzzedDataProvider& fdp_;
  bool valid_utf8_;
};

// Fills `in` from a JSON document; false when it is not JSON, or too deep for nlohmann's
// ordered_json parser (see object_for; the builder makes the deep documents).
bool fill_from_json(const std::string& text, ChatTemplateInputs& in) {
  if (nests_deeper_than(text, 1000)) return false;
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return false;
  if (doc.is_array()) {
    in.messages = std::move(doc);
    return true;
  }
  if (!doc.is_object()) {
    in.extra["value"] = std::move(doc);
    return true;
  }
  if (auto it = doc.find("messages"); it != doc.end()) in.messages = std::move(*it);
  if (auto it = doc.find("extra"); it != doc.end()) in.extra = std::move(*it);
  if (auto it = doc.find("bos_token"); it != doc.end() && it->is_string()) in.bos_token = *it;
  if (auto it = doc.find("eos_token"); it != doc.end() && it->is_string()) in.eos_token = *it;
  return true;
}


}  // namespace
}  // namespace vesper::tokenizer

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vesper::tokenizer;
  const auto& all = templates();
  FuzzedDataProvider fdp(data, size);
  const ChatTemplate& tmpl = all[fdp.ConsumeIntegralInRange<size_t>(0, all.size() - 1)];
  const uint16_t flags = fdp.ConsumeIntegral<uint16_t>();
  const bool from_json = (flags & 1) != 0;
  // nlohmann's parser rejects invalid UTF-8, so JSON input is always valid.
  const bool valid_utf8 = from_json || (flags & 2) != 0;

  ChatTemplateInputs in;
  in.add_generation_prompt = (flags & 4) != 0;
  in.flatten_content_parts = (flags & 8) == 0;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now = test::fixed_now();  // the chat template tests' date: renders are reproducible
  // Smaller than the defaults so that one input stays fast; the limits are still exercised.
  in.limits.max_output_bytes = size_t{1} << 20;
  in.limits.max_collection_items = size_t{1} << 16;
  in.limits.max_steps = 200'000;
  if (from_json) {
    if (!fill_from_json(fdp.ConsumeRemainingBytesAsString(), in)) return 0;
  } else {
    Builder(fdp, valid_utf8).fill(in);
  }

  const vesper::Result<std::string> out = tmpl.apply(in);
  if (!out.ok()) {
    VESPER_CHECK(out.error().message.rfind("chat template", 0) == 0,
                 "error without the chat template prefix: %s", out.error().message.c_str());
  } else if (valid_utf8) {
    VESPER_CHECK(is_valid_utf8(*out), "valid UTF-8 in, invalid UTF-8 out");
  }
  if (flags & 16) {
    const vesper::Result<std::string> again = tmpl.apply(in);
    VESPER_CHECK(again.ok() == out.ok(), "a second render %s", again.ok() ? "succeeds" : "fails");
    if (out.ok()) {
      VESPER_CHECK(*again == *out, "a second render differs");
    } else {
      VESPER_CHECK(again.error().message == out.error().message,
                   "a second render fails differently");
    }
  }
  return 0;
}
