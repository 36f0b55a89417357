#include "server/tool_calls.h"

#include <algorithm>
#include <cstring>

#include "grammar/json_schema.h"
#include "server/random_id.h"

namespace vesper::server {
namespace {

using nlohmann::json;
constexpr size_t npos = std::string::npos;

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

// --- A small scanner over JSON text that may still be growing. Positions past the end are npos.

size_t skip_ws(const std::string& t, size_t i) {
  while (i < t.size() && std::strchr(" \t\n\r", t[i]) != nullptr && t[i] != '\0') ++i;
  return i;
}

// Just past the string literal starting at t[i] == '"'.
size_t string_end(const std::string& t, size_t i) {
  for (size_t k = i + 1; k < t.size(); ++k) {
    if (t[k] == '\\') {
      ++k;
    } else if (t[k] == '"') {
      return k + 1;
    }
  }
  return npos;
}

// Just past the JSON value starting at t[i] (a scalar is complete only once a delimiter follows
// it: more digits could come).
size_t value_end(const std::string& t, size_t i) {
  if (i >= t.size()) return npos;
  const char c = t[i];
  if (c == '"') return string_end(t, i);
  if (c == '{' || c == '[') {
    int depth = 0;
    for (size_t k = i; k < t.size(); ++k) {
      if (t[k] == '"') {
        k = string_end(t, k);
        if (k == npos) return npos;
        --k;
      } else if (t[k] == '{' || t[k] == '[') {
        ++depth;
      } else if (t[k] == '}' || t[k] == ']') {
        if (--depth == 0) return k + 1;
      }
    }
    return npos;
  }
  size_t k = i;
  while (k < t.size() && std::strchr(",}] \t\n\r", t[k]) == nullptr) ++k;
  return k < t.size() ? k : npos;
}

// One call of a "required" choice's array, as far as the text goes.
struct PartialCall {
  std::string name;
  bool name_done = false;
  size_t args_begin = npos, args_end = npos;  // the "parameters" value; end npos: still growing
};

std::vector<PartialCall> scan_call_array(const std::string& t) {
  std::vector<PartialCall> out;
  size_t i = skip_ws(t, 0);
  if (i >= t.size() || t[i] != '[') return out;
  ++i;
  for (;;) {
    i = skip_ws(t, i);
    if (i >= t.size() || t[i] == ']') return out;
    if (t[i] == ',') {
      ++i;
      continue;
    }
    if (t[i] != '{') return out;
    ++i;
    PartialCall& call = out.emplace_back();
    for (;;) {
      i = skip_ws(t, i);
      if (i >= t.size()) return out;
      if (t[i] == '}') {
        ++i;
        break;
      }
      if (t[i] == ',') {
        ++i;
        continue;
      }
      if (t[i] != '"') return out;
      const size_t key_end = string_end(t, i);
      if (key_end == npos) return out;
      const json key = json::parse(t.substr(i, key_end - i), nullptr, false);
      i = skip_ws(t, key_end);
      if (i >= t.size() || t[i] != ':') return out;
      i = skip_ws(t, i + 1);
      if (i >= t.size()) return out;
      const size_t end = value_end(t, i);
      if (key == "parameters") {
        call.args_begin = i;
        call.args_end = end;
      }
      if (end == npos) return out;
      if (key == "name") {
        const json name = json::parse(t.substr(i, end - i), nullptr, false);
        if (!name.is_string()) return out;
        call.name = name.get<std::string>();
        call.name_done = true;
      }
      i = end;
    }
  }
}

json call_header(size_t index, const ToolCall& call) {
  return {{"index", index},
          {"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", ""}}}};
}

json arguments_delta(size_t index, const std::string& piece) {
  return {{"index", index}, {"function", {{"arguments", piece}}}};
}

// {"name": ..., "arguments" | "parameters": {...}} as a call; nullopt when it is not one.
std::optional<ToolCall> call_from_object(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ToolCall call{make_tool_call_id(), j["name"].get<std::string>(), "{}"};
  for (const char* key : {"arguments", "parameters"}) {
    if (!j.contains(key)) continue;
    const json& a = j[key];
    call.arguments = a.is_string() ? a.get<std::string>() : a.dump();
    break;
  }
  return call;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r");
  if (b == npos) return "";
  const size_t e = s.find_last_not_of(" \t\n\r");
  return s.substr(b, e - b + 1);
}

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

ParsedToolOutput parse_hermes(const std::string& text) {
  ParsedToolOutput out;
  const size_t first = text.find(kHermesOpen);
  if (first == npos) return {text, {}};
  for (size_t at = first; at != npos; at = text.find(kHermesOpen, at)) {
    const size_t body = at + kHermesOpen.size();
    size_t close = text.find(kHermesClose, body);
    // A call cut by the end of generation still parses when its JSON is complete.
    const std::string inner = text.substr(body, close == npos ? npos : close - body);
    auto call = call_from_object(json::parse(trim(inner), nullptr, false));
    if (!call) return {text, {}};
    out.calls.push_back(std::move(*call));
    at = close == npos ? npos : close + kHermesClose.size();
  }
  out.content = trim(text.substr(0, first));
  return out;
}

ParsedToolOutput parse_llama3_json(const std::string& text) {
  std::string t = trim(text);
  if (t.starts_with(kPythonTag)) t = trim(t.substr(kPythonTag.size()));
  if (t.empty() || t[0] != '{') return {text, {}};
  ParsedToolOutput out;
  size_t i = 0;
  while (i < t.size()) {
    const size_t end = value_end(t + " ", i);  // a final object is complete at the end
    if (end == npos) return {text, {}};
    auto call = call_from_object(json::parse(t.substr(i, end - i), nullptr, false));
    if (!call) return {text, {}};
    out.calls.push_back(std::move(*call));
    i = skip_ws(t, end);
    if (i < t.size() && t[i] == ';')
      i = skip_ws(t, i + 1);
    else if (i < t.size())
      return {text, {}};
  }
  return out;
}

}  // namespace

Result<ToolCallParser> tool_call_parser_from_name(const std::string& name) {
  if (name == "hermes") return ToolCallParser::kHermes;
  if (name == "llama3_json") return ToolCallParser::kLlama3Json;
  return make_error("unknown tool call parser \"" + name + "\" (choose hermes or llama3_json)");
}

std::optional<ApiError> parse_tools(const JsonFields& f, const nlohmann::ordered_json* ordered,
                                    json& tools, ToolChoice& choice,
                                    std::optional<OutputConstraint>& constraint) {
  tools = json::array();
  const json* given = nullptr;
  VESPER_FIELD(f.array("tools", given));
  std::vector<const json*> parameters;
  if (given != nullptr) {
    for (size_t i = 0; i < given->size(); ++i) {
      const std::string where = "tools[" + std::to_string(i) + "]";
      const json& t = (*given)[i];
      if (!t.is_object())
        return bad_request("'" + where + "' must be an object, got " + describe_json_value(t),
                           where);
      const JsonFields tf(t, where);
      std::string type;
      VESPER_FIELD(tf.require_string("type", type));
      if (type != "function")
        return bad_request("'" + where + ".type' must be \"function\", got \"" + type + "\"",
                           where + ".type");
      const json* fn = nullptr;
      VESPER_FIELD(tf.object("function", fn));
      if (fn == nullptr)
        return bad_request("'" + where + ".function' is required", where + ".function");
      const JsonFields ff(*fn, where + ".function");
      std::string name, description;
      VESPER_FIELD(ff.require_string("name", name));
      if (!valid_function_name(name))
        return bad_request("'" + where +
                               ".function.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got \"" +
                               name + "\"",
                           where + ".function.name");
      for (size_t k = 0; k < i; ++k)
        if ((*given)[k]["function"]["name"] == name)
          return bad_request("'" + where + ".function.name' \"" + name + "\" is given twice",
                             where + ".function.name");
      VESPER_FIELD(ff.string("description", description));
      const json* params = nullptr;
      VESPER_FIELD(ff.object("parameters", params));
      parameters.push_back(params);
      tools.push_back(t);
    }
  }
  // OpenAI's default: "auto" when tools are given, else "none".
  choice = ToolChoice{tools.empty() ? ToolChoice::Kind::kNone : ToolChoice::Kind::kAuto, ""};
  if (const json* tc = f.value("tool_choice"); tc != nullptr) {
    if (tc->is_string()) {
      const std::string s = tc->get<std::string>();
      if (s == "none")
        choice.kind = ToolChoice::Kind::kNone;
      else if (s == "auto")
        choice.kind = ToolChoice::Kind::kAuto;
      else if (s == "required")
        choice.kind = ToolChoice::Kind::kRequired;
      else
        return bad_request(
            "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
            "\"function\": {\"name\": ...}}, got \"" +
                s + "\"",
            "tool_choice");
    } else if (tc->is_object()) {
      const JsonFields cf(*tc, "tool_choice");
      std::string type;
      VESPER_FIELD(cf.require_string("type", type));
      if (type != "function")
        return bad_request("'tool_choice.type' must be \"function\", got \"" + type + "\"",
                           "tool_choice.type");
      const json* fn = nullptr;
      VESPER_FIELD(cf.object("function", fn));
      if (fn == nullptr)
        return bad_request("'tool_choice.function' is required", "tool_choice.function");
      VESPER_FIELD(JsonFields(*fn, "tool_choice.function").require_string("name", choice.name));
      choice.kind = ToolChoice::Kind::kNamed;
    } else {
      return f.wrong("tool_choice", "a string or an object", *tc);
    }
    if (choice.kind != ToolChoice::Kind::kNone && tools.empty())
      return bad_request("'tool_choice' needs 'tools'", "tool_choice");
  }
  if (choice.kind != ToolChoice::Kind::kRequired && choice.kind != ToolChoice::Kind::kNamed)
    return std::nullopt;
  if (constraint)
    return bad_request("'tool_choice' \"required\" or a named function constrains the output; '" +
                           constraint->field + "' cannot be sent with it",
                       constraint->field);
  // Each tool's parameters as the client wrote them (properties in their order).
  auto params_of = [&](size_t i) {
    if (parameters[i] == nullptr)
      return nlohmann::ordered_json{{"type", "object"},
                                    {"properties", nlohmann::ordered_json::object()}};
    const nlohmann::ordered_json* written = ordered_member(
        ordered_member(ordered_element(ordered_member(ordered, "tools"), i), "function"),
        "parameters");
    return as_written(*parameters[i], written);
  };
  nlohmann::ordered_json schema;
  std::string field = "tool_choice";
  if (choice.kind == ToolChoice::Kind::kNamed) {
    size_t i = 0;
    while (i < tools.size() && tools[i]["function"]["name"] != choice.name) ++i;
    if (i == tools.size())
      return bad_request("'tool_choice.function.name' \"" + choice.name + "\" is not in 'tools'",
                         "tool_choice.function.name");
    schema = params_of(i);
    field = "tools[" + std::to_string(i) + "].function.parameters";
  } else {
    nlohmann::ordered_json any_of = nlohmann::ordered_json::array();
    for (size_t i = 0; i < tools.size(); ++i)
      any_of.push_back({{"type", "object"},
                        {"properties",
                         {{"name", {{"const", tools[i]["function"]["name"].get<std::string>()}}},
                          {"parameters", params_of(i)}}},
                        {"required", {"name", "parameters"}},
                        {"additionalProperties", false}});
    // OpenAI's parallel_tool_calls (default true): false allows one call per answer.
    bool parallel = true;
    VESPER_FIELD(f.boolean("parallel_tool_calls", parallel));
    schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", std::move(any_of)}}}};
    if (!parallel) schema["maxItems"] = 1;
    field = "tools";
  }
  auto gbnf = grammar::json_schema_to_gbnf(schema);
  if (!gbnf) return bad_request("'" + field + "': " + gbnf.error().message, field);
  constraint = OutputConstraint{std::move(gbnf).value(), field};
  return std::nullopt;
}

std::string make_tool_call_id() {
  return random_id("chatcmpl-tool-");
}

std::vector<ToolCall> parse_forced_tool_calls(const ToolChoice& choice, const std::string& text) {
  if (!json::accept(text)) return {};
  if (choice.kind == ToolChoice::Kind::kNamed) return {{make_tool_call_id(), choice.name, text}};
  std::vector<ToolCall> calls;
  for (const PartialCall& p : scan_call_array(text)) {
    if (!p.name_done || p.args_end == npos) return {};
    calls.push_back(
        {make_tool_call_id(), p.name, text.substr(p.args_begin, p.args_end - p.args_begin)});
  }
  return calls;
}

ParsedToolOutput parse_tool_calls(ToolCallParser parser, const std::string& text) {
  switch (parser) {
    case ToolCallParser::kHermes:
      return parse_hermes(text);
    case ToolCallParser::kLlama3Json:
      return parse_llama3_json(text);
    case ToolCallParser::kNone:
      break;
  }
  return {text, {}};
}

size_t streamable_content(ToolCallParser parser, const std::string& text) {
  if (parser == ToolCallParser::kHermes) {
    if (const size_t at = text.find(kHermesOpen); at != npos) return at;
    // Hold back an ending that may be the start of "<tool_call>".
    for (size_t keep = std::min(text.size(), kHermesOpen.size() - 1); keep > 0; --keep)
      if (kHermesOpen.starts_with(std::string_view(text).substr(text.size() - keep)))
        return text.size() - keep;
    return text.size();
  }
  if (parser == ToolCallParser::kLlama3Json) {
    const size_t b = text.find_first_not_of(" \t\n\r");
    if (b == npos) return 0;
    const std::string_view rest = std::string_view(text).substr(b);
    if (rest[0] == '{' || kPythonTag.starts_with(rest.substr(0, kPythonTag.size())) ||
        rest.starts_with(kPythonTag))
      return 0;
    return text.size();
  }
  return text.size();
}

json ToolCallStream::update(const std::string& text) {
  json deltas = json::array();
  if (choice_.kind == ToolChoice::Kind::kNamed) {
    if (calls_.empty()) {
      calls_.push_back({make_tool_call_id(), choice_.name, ""});
      deltas.push_back(call_header(0, calls_[0]));
    }
    if (text.size() > calls_[0].arguments.size()) {
      deltas.push_back(arguments_delta(0, text.substr(calls_[0].arguments.size())));
      calls_[0].arguments = text;
    }
    return deltas;
  }
  const std::vector<PartialCall> partial = scan_call_array(text);
  for (size_t k = 0; k < partial.size(); ++k) {
    const PartialCall& p = partial[k];
    if (k == calls_.size()) {
      if (!p.name_done) break;
      calls_.push_back({make_tool_call_id(), p.name, ""});
      deltas.push_back(call_header(k, calls_[k]));
    }
    if (p.args_begin == npos) continue;
    const size_t end = p.args_end == npos ? text.size() : p.args_end;
    const std::string args = text.substr(p.args_begin, end - p.args_begin);
    if (args.size() > calls_[k].arguments.size()) {
      deltas.push_back(arguments_delta(k, args.substr(calls_[k].arguments.size())));
      calls_[k].arguments = args;
    }
  }
  return deltas;
}

}  // namespace vesper::server
