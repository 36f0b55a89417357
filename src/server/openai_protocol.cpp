#include "server/openai_protocol.h"

#include <cmath>
#include <limits>
#include <set>
#include <sstream>

namespace vesper::server {
namespace {

using nlohmann::json;

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Field readers: each returns an ApiError naming the field when the type or range is wrong.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  bool has(const char* key) const { return body_.contains(key) && !body_.at(key).is_null(); }

  std::optional<ApiError> number(const char* key, float& out, double lo, double hi) const {
    if (!has(key)) return std::nullopt;
    const json& v = body_.at(key);
    if (!v.is_number()) return bad_request("'" + std::string(key) + "' must be a number, got " + type_name(v), key);
    const double d = v.get<double>();
    if (!(d >= lo && d <= hi))
      return bad_request("'" + std::string(key) + "' must be between " + num(lo) + " and " + num(hi) + ", got " + num(d), key);
    out = static_cast<float>(d);
    return std::nullopt;
  }

  template <class Int>
  std::optional<ApiError> integer(const char* key, Int& out, int64_t lo, int64_t hi) const {
    if (!has(key)) return std::nullopt;
    const json& v = body_.at(key);
    if (!(v.is_number_integer() || v.is_number_unsigned()))
      return bad_request("'" + std::string(key) + "' must be an integer, got " + type_name(v), key);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
      return bad_request("'" + std::string(key) + "' must be at most " + std::to_string(hi), key);
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi)
      return bad_request("'" + std::string(key) + "' must be between " + std::to_string(lo) + " and " +
                             std::to_string(hi) + ", got " + std::to_string(i), key);
    out = static_cast<Int>(i);
    return std::nullopt;
  }

  std::optional<ApiError> boolean(const char* key, bool& out) const {
    if (!has(key)) return std::nullopt;
    const json& v = body_.at(key);
    if (!v.is_boolean()) return bad_request("'" + std::string(key) + "' must be a boolean, got " + type_name(v), key);
    out = v.get<bool>();
    return std::nullopt;
  }

  std::optional<ApiError> string(const char* key, std::string& out) const {
    if (!has(key)) return std::nullopt;
    const json& v = body_.at(key);
    if (!v.is_string()) return bad_request("'" + std::string(key) + "' must be a string, got " + type_name(v), key);
    out = v.get<std::string>();
    return std::nullopt;
  }

  static std::string num(double d) {
    std::ostringstream os;
    os << d;
    return os.str();
  }

 private:
  const json& body_;
};

#define VESPER_CHECK_FIELD(expr)          \
  do {                                    \
    if (auto err_ = (expr); err_) return *err_; \
  } while (0)

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

// The sampling fields the two endpoints share.
std::optional<ApiError> parse_sampling(const Fields& f, const json& body, sample::SamplingParams& p, int32_t& priority,
                                       bool& stream, bool& include_usage) {
  VESPER_CHECK_FIELD(f.number("temperature", p.temperature, 0.0, 100.0));
  VESPER_CHECK_FIELD(f.number("top_p", p.top_p, 0.0, 1.0));
  if (f.has("top_p") && p.top_p <= 0.0f) return bad_request("'top_p' must be greater than 0, got 0", "top_p");
  VESPER_CHECK_FIELD(f.integer("top_k", p.top_k, -1, kMaxInt));
  VESPER_CHECK_FIELD(f.number("min_p", p.min_p, 0.0, 1.0));
  VESPER_CHECK_FIELD(f.number("presence_penalty", p.presence_penalty, -2.0, 2.0));
  VESPER_CHECK_FIELD(f.number("frequency_penalty", p.frequency_penalty, -2.0, 2.0));
  VESPER_CHECK_FIELD(f.number("repetition_penalty", p.repetition_penalty, 1e-6, 100.0));
  VESPER_CHECK_FIELD(f.integer("n", p.n, 1, 64));
  VESPER_CHECK_FIELD(f.integer("min_tokens", p.min_tokens, 0, kMaxInt));
  VESPER_CHECK_FIELD(f.boolean("ignore_eos", p.ignore_eos));
  VESPER_CHECK_FIELD(f.boolean("skip_special_tokens", p.skip_special_tokens));
  VESPER_CHECK_FIELD(f.boolean("include_stop_str_in_output", p.include_stop_str_in_output));
  VESPER_CHECK_FIELD(f.boolean("skip_reading_prefix_cache", p.skip_reading_prefix_cache));
  VESPER_CHECK_FIELD(f.string("cache_salt", p.cache_salt));
  if (f.has("cache_salt") && p.cache_salt.empty())
    return bad_request("'cache_salt' must be a non-empty string", "cache_salt");
  VESPER_CHECK_FIELD(f.integer("priority", priority, -kMaxInt, kMaxInt));
  VESPER_CHECK_FIELD(f.boolean("stream", stream));
  if (f.has("seed")) {
    int64_t seed = 0;
    VESPER_CHECK_FIELD(f.integer("seed", seed, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    p.seed = static_cast<uint64_t>(seed);
  }
  if (f.has("stop")) {
    const json& s = body.at("stop");
    if (s.is_string()) {
      p.stop = {s.get<std::string>()};
    } else if (s.is_array()) {
      for (const auto& item : s) {
        if (!item.is_string()) return bad_request("'stop' must be a string or an array of strings", "stop");
        p.stop.push_back(item.get<std::string>());
      }
    } else {
      return bad_request("'stop' must be a string or an array of strings, got " + type_name(s), "stop");
    }
    if (p.stop.size() > 16) return bad_request("'stop' may hold at most 16 strings", "stop");
    for (const auto& s2 : p.stop)
      if (s2.empty()) return bad_request("'stop' strings must not be empty", "stop");
  }
  if (f.has("stop_token_ids")) {
    const json& s = body.at("stop_token_ids");
    if (!s.is_array()) return bad_request("'stop_token_ids' must be an array of integers", "stop_token_ids");
    for (const auto& item : s) {
      if (!item.is_number_integer()) return bad_request("'stop_token_ids' must be an array of integers", "stop_token_ids");
      p.stop_token_ids.push_back(item.get<int32_t>());
    }
  }
  if (f.has("stream_options")) {
    const json& so = body.at("stream_options");
    if (!so.is_object()) return bad_request("'stream_options' must be an object", "stream_options");
    if (so.contains("include_usage")) {
      if (!so.at("include_usage").is_boolean())
        return bad_request("'stream_options.include_usage' must be a boolean", "stream_options.include_usage");
      include_usage = so.at("include_usage").get<bool>();
    }
    if (!stream) return bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
  }
  if (f.has("logit_bias") && !(body.at("logit_bias").is_object() && body.at("logit_bias").empty()))
    return bad_request("'logit_bias' is not supported", "logit_bias");
  if (f.has("best_of")) {
    int32_t best_of = 1;
    VESPER_CHECK_FIELD(f.integer("best_of", best_of, 1, 64));
    if (best_of != p.n) return bad_request("'best_of' other than 'n' is not supported", "best_of");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json& v, std::vector<PromptInput>& out) {
  auto ids_of = [](const json& arr, std::vector<int32_t>& ids) -> bool {
    for (const auto& t : arr) {
      if (!t.is_number_integer()) return false;
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > kMaxInt) return false;
      ids.push_back(static_cast<int32_t>(id));
    }
    return true;
  };
  const std::string shape = "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids";
  if (v.is_string()) {
    out.emplace_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.empty()) return bad_request("'prompt' must not be empty", "prompt");
    if (v[0].is_number_integer()) {
      std::vector<int32_t> ids;
      if (!ids_of(v, ids)) return bad_request(shape, "prompt");
      out.emplace_back(std::move(ids));
    } else {
      for (const auto& item : v) {
        if (item.is_string()) {
          out.emplace_back(item.get<std::string>());
        } else if (item.is_array()) {
          std::vector<int32_t> ids;
          if (item.empty() || !ids_of(item, ids)) return bad_request(shape, "prompt");
          out.emplace_back(std::move(ids));
        } else {
          return bad_request(shape, "prompt");
        }
      }
    }
  } else {
    return bad_request(shape + ", got " + type_name(v), "prompt");
  }
  if (out.size() > 1024) return bad_request("'prompt' may hold at most 1024 prompts", "prompt");
  return std::nullopt;
}

}  // namespace

std::variant<CompletionRequest, ApiError> parse_completion_request(const json& body) {
  CompletionRequest r;
  Fields f(body);
  VESPER_CHECK_FIELD(f.string("model", r.model));
  if (!body.contains("prompt")) return bad_request("'prompt' is required", "prompt");
  VESPER_CHECK_FIELD(parse_prompt(body.at("prompt"), r.prompts));
  r.params.max_tokens = 16;  // OpenAI's default for completions
  VESPER_CHECK_FIELD(f.integer("max_tokens", r.params.max_tokens, 0, kMaxInt));
  VESPER_CHECK_FIELD(parse_sampling(f, body, r.params, r.priority, r.stream, r.include_usage));
  VESPER_CHECK_FIELD(f.boolean("echo", r.echo));
  if (f.has("logprobs")) {
    VESPER_CHECK_FIELD(f.integer("logprobs", r.params.logprobs, 0, 20));
  }
  if (f.has("suffix")) return bad_request("'suffix' is not supported", "suffix");
  if (r.params.min_tokens > r.params.max_tokens)
    return bad_request("'min_tokens' must not exceed 'max_tokens'", "min_tokens");
  return r;
}

std::variant<ChatRequest, ApiError> parse_chat_request(const json& body) {
  ChatRequest r;
  Fields f(body);
  VESPER_CHECK_FIELD(f.string("model", r.model));
  if (!body.contains("messages")) return bad_request("'messages' is required", "messages");
  const json& msgs = body.at("messages");
  if (!msgs.is_array() || msgs.empty()) return bad_request("'messages' must be a non-empty array", "messages");
  static const std::set<std::string> kRoles = {"system", "user", "assistant", "tool", "developer"};
  r.messages = json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = msgs[i];
    if (!m.is_object()) return bad_request("'" + where + "' must be an object", where);
    if (!m.contains("role") || !m.at("role").is_string())
      return bad_request("'" + where + ".role' is required and must be a string", where + ".role");
    const std::string role = m.at("role").get<std::string>();
    if (!kRoles.count(role))
      return bad_request("'" + where + ".role' must be one of system, user, assistant, tool, developer; got \"" + role + "\"",
                         where + ".role");
    json msg = {{"role", role}};
    if (!m.contains("content") || m.at("content").is_null()) {
      if (role != "assistant") return bad_request("'" + where + ".content' is required", where + ".content");
      msg["content"] = "";
    } else if (m.at("content").is_string()) {
      msg["content"] = m.at("content");
    } else if (m.at("content").is_array()) {
      // Text parts are joined; other part types (images, audio) are not supported.
      std::string text;
      for (const auto& part : m.at("content")) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part.at("text").is_string())
          return bad_request("'" + where + ".content' parts must be {\"type\": \"text\", \"text\": string}",
                             where + ".content");
        if (!text.empty()) text += "\n";
        text += part.at("text").get<std::string>();
      }
      msg["content"] = text;
    } else {
      return bad_request("'" + where + ".content' must be a string or an array of text parts", where + ".content");
    }
    if (m.contains("name") && m.at("name").is_string()) msg["name"] = m.at("name");
    r.messages.push_back(std::move(msg));
  }
  r.params.max_tokens = -1;  // default: the rest of the context (set by the server)
  if (f.has("max_completion_tokens")) {
    VESPER_CHECK_FIELD(f.integer("max_completion_tokens", r.params.max_tokens, 0, kMaxInt));
    r.max_tokens_given = true;
  } else if (f.has("max_tokens")) {
    VESPER_CHECK_FIELD(f.integer("max_tokens", r.params.max_tokens, 0, kMaxInt));
    r.max_tokens_given = true;
  }
  VESPER_CHECK_FIELD(parse_sampling(f, body, r.params, r.priority, r.stream, r.include_usage));
  VESPER_CHECK_FIELD(f.boolean("logprobs", r.logprobs));
  VESPER_CHECK_FIELD(f.integer("top_logprobs", r.top_logprobs, 0, 20));
  if (f.has("top_logprobs") && !r.logprobs)
    return bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
  if (r.logprobs) r.params.logprobs = r.top_logprobs;
  VESPER_CHECK_FIELD(f.boolean("add_generation_prompt", r.add_generation_prompt));
  if (f.has("chat_template_kwargs")) {
    if (!body.at("chat_template_kwargs").is_object())
      return bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    r.chat_template_kwargs = body.at("chat_template_kwargs");
  }
  if (f.has("tools") || f.has("tool_choice") || f.has("response_format")) {
    if (f.has("response_format") && body.at("response_format").is_object() &&
        body.at("response_format").value("type", "text") == "text") {
      // plain text is what Vesper produces anyway
    } else {
      return bad_request("tools, tool_choice and structured response_format are not supported yet",
                         f.has("tools") ? "tools" : (f.has("tool_choice") ? "tool_choice" : "response_format"));
    }
  }
  return r;
}

nlohmann::json completion_logprobs_json(const std::vector<engine::LogprobEntry>& entries,
                                        const std::function<std::string(int32_t)>& piece_of, size_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t offset = text_offset;
  for (const auto& e : entries) {
    const std::string piece = piece_of(e.token);
    tokens.push_back(piece);
    token_logprobs.push_back(e.logprob);
    json t = json::object();
    for (const auto& alt : e.top) t[piece_of(alt.token)] = alt.logprob;
    top.push_back(t);
    offsets.push_back(offset);
    offset += piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

nlohmann::json chat_logprobs_json(const std::vector<engine::LogprobEntry>& entries,
                                  const std::function<std::string(int32_t)>& piece_of) {
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  json content = json::array();
  for (const auto& e : entries) {
    const std::string piece = piece_of(e.token);
    json top = json::array();
    for (const auto& alt : e.top) {
      const std::string p = piece_of(alt.token);
      top.push_back({{"token", p}, {"logprob", alt.logprob}, {"bytes", bytes_of(p)}});
    }
    content.push_back({{"token", piece}, {"logprob", e.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

}  // namespace vesper::server
