#include "server/openai_protocol.h"

#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "server/json_fields.h"

namespace vesper::server {
namespace {

using nlohmann::json;

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

// A list of token ids (each in [0, n_vocab) when n_vocab > 0), or the error naming `field`.
std::optional<ApiError> token_ids(const json& arr, const std::string& field, int32_t n_vocab,
                                  std::vector<int32_t>& out) {
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    const int64_t hi = n_vocab > 0 ? n_vocab - 1 : kMaxInt;
    int64_t id = -1;
    if (t.is_number_integer()) id = t.get<int64_t>();
    if (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(kMaxInt)) id = -1;
    if (!t.is_number_integer() || id < 0 || id > hi) {
      const std::string where = field + "[" + std::to_string(i) + "]";
      return bad_request("'" + where + "' must be a token id in the vocabulary (0.." +
                             std::to_string(hi) + "), got " + describe_json_value(t),
                         field);
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}.
std::optional<ApiError> parse_logit_bias(const json& obj, int32_t n_vocab,
                                         sample::SamplingParams& p) {
  const int64_t hi = n_vocab > 0 ? n_vocab - 1 : kMaxInt;
  for (const auto& [key, value] : obj.items()) {
    const std::string where = "logit_bias[\"" + key + "\"]";
    int64_t id = -1;
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    if (digits) id = std::stoll(key);
    if (!digits || id > hi)
      return bad_request("'logit_bias' keys must be token ids in the vocabulary (0.." +
                             std::to_string(hi) + "), got \"" + key + "\"",
                         "logit_bias");
    if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0))
      return bad_request(
          "'" + where + "' must be a number in [-100, 100], got " + describe_json_value(value),
          "logit_bias");
    p.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  return std::nullopt;
}

// The sampling fields the two endpoints share.
std::optional<ApiError> parse_sampling(const JsonFields& f, const ProtocolLimits& limits,
                                       sample::SamplingParams& p, int32_t& priority, bool& stream,
                                       bool& include_usage) {
  VESPER_FIELD(f.number("temperature", p.temperature, 0.0, 100.0));
  VESPER_FIELD(f.number("top_p", p.top_p, 0.0, 1.0));
  if (f.has("top_p") && p.top_p <= 0.0f)
    return bad_request("'top_p' must be greater than 0, got 0", "top_p");
  VESPER_FIELD(f.integer("top_k", p.top_k, -1, kMaxInt));
  VESPER_FIELD(f.number("min_p", p.min_p, 0.0, 1.0));
  VESPER_FIELD(f.number("presence_penalty", p.presence_penalty, -2.0, 2.0));
  VESPER_FIELD(f.number("frequency_penalty", p.frequency_penalty, -2.0, 2.0));
  VESPER_FIELD(f.number("repetition_penalty", p.repetition_penalty, 1e-6, 100.0));
  VESPER_FIELD(f.integer("n", p.n, 1, 64));
  VESPER_FIELD(f.integer("min_tokens", p.min_tokens, 0, kMaxInt));
  VESPER_FIELD(f.boolean("ignore_eos", p.ignore_eos));
  VESPER_FIELD(f.boolean("skip_special_tokens", p.skip_special_tokens));
  VESPER_FIELD(f.boolean("return_tokens_as_token_ids", p.return_tokens_as_token_ids));
  VESPER_FIELD(f.boolean("include_stop_str_in_output", p.include_stop_str_in_output));
  VESPER_FIELD(f.boolean("skip_reading_prefix_cache", p.skip_reading_prefix_cache));
  VESPER_FIELD(f.string("cache_salt", p.cache_salt));
  if (f.has("cache_salt") && p.cache_salt.empty())
    return bad_request("'cache_salt' must be a non-empty string", "cache_salt");
  if (f.has("kv_sparsity")) {
    std::string sparsity;
    VESPER_FIELD(f.string("kv_sparsity", sparsity));
    if (sparsity != "none" && sparsity != "auto")
      return bad_request(
          "'kv_sparsity' must be \"none\" (attend densely) or \"auto\" (the "
          "server's --kv-window), got \"" +
              sparsity + "\"",
          "kv_sparsity");
    p.kv_dense = sparsity == "none";
  }
  VESPER_FIELD(f.integer("priority", priority, -kMaxInt, kMaxInt));
  VESPER_FIELD(f.boolean("stream", stream));
  if (f.has("seed")) {
    int64_t seed = 0;
    VESPER_FIELD(f.integer("seed", seed, std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()));
    p.seed = static_cast<uint64_t>(seed);
  }
  if (const json* stop = f.value("stop")) {
    if (stop->is_string()) {
      p.stop = {stop->get<std::string>()};
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        const json& item = (*stop)[i];
        if (!item.is_string())
          return bad_request("'stop[" + std::to_string(i) + "]' must be a string, got " +
                                 describe_json_value(item),
                             "stop");
        p.stop.push_back(item.get<std::string>());
      }
    } else {
      return f.wrong("stop", "a string or an array of strings", *stop);
    }
    if (p.stop.size() > 16) return bad_request("'stop' may hold at most 16 strings", "stop");
    for (const auto& s2 : p.stop)
      if (s2.empty()) return bad_request("'stop' strings must not be empty", "stop");
  }
  const json* stop_ids = nullptr;
  VESPER_FIELD(f.array("stop_token_ids", stop_ids));
  if (stop_ids != nullptr)
    VESPER_FIELD(token_ids(*stop_ids, "stop_token_ids", limits.n_vocab, p.stop_token_ids));
  const json* stream_options = nullptr;
  VESPER_FIELD(f.object("stream_options", stream_options));
  if (stream_options != nullptr) {
    VESPER_FIELD(
        JsonFields(*stream_options, "stream_options").boolean("include_usage", include_usage));
    if (!stream)
      return bad_request("'stream_options' is only allowed when 'stream' is true",
                         "stream_options");
  }
  const json* logit_bias = nullptr;
  VESPER_FIELD(f.object("logit_bias", logit_bias));
  if (logit_bias != nullptr) VESPER_FIELD(parse_logit_bias(*logit_bias, limits.n_vocab, p));
  const json* allowed = nullptr;
  VESPER_FIELD(f.array("allowed_token_ids", allowed));
  if (allowed != nullptr) {
    if (allowed->empty())
      return bad_request(
          "'allowed_token_ids' must not be empty (leave it out to allow every token)",
          "allowed_token_ids");
    VESPER_FIELD(token_ids(*allowed, "allowed_token_ids", limits.n_vocab, p.allowed_token_ids));
  }
  const json* bad_words = nullptr;
  VESPER_FIELD(f.array("bad_words", bad_words));
  if (bad_words != nullptr) {
    if (bad_words->size() > 256)
      return bad_request("'bad_words' may hold at most 256 words", "bad_words");
    for (size_t i = 0; i < bad_words->size(); ++i) {
      const json& w = (*bad_words)[i];
      const std::string where = "bad_words[" + std::to_string(i) + "]";
      if (!w.is_string() || w.get<std::string>().find_first_not_of(' ') == std::string::npos)
        return bad_request(
            "'" + where + "' must be a non-blank string, got " + describe_json_value(w),
            "bad_words");
      p.bad_words.push_back(w.get<std::string>());
    }
  }
  if (f.has("best_of")) {
    int32_t best_of = 1;
    VESPER_FIELD(f.integer("best_of", best_of, 1, 64));
    if (best_of != p.n) return bad_request("'best_of' other than 'n' is not supported", "best_of");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const JsonFields& f, const ProtocolLimits& limits,
                                     std::vector<PromptInput>& out) {
  const std::string shape =
      "a string, an array of strings, an array of token ids or an array of arrays of token ids";
  const json* prompt = f.value("prompt");
  if (prompt == nullptr) return bad_request("'prompt' is required", "prompt");
  if (prompt->is_string()) {
    out.emplace_back(prompt->get<std::string>());
    return std::nullopt;
  }
  if (!prompt->is_array()) return f.wrong("prompt", shape, *prompt);
  const json* list = prompt;
  if (list->empty()) return bad_request("'prompt' must not be empty", "prompt");
  if ((*list)[0].is_number()) {
    std::vector<int32_t> ids;
    VESPER_FIELD(token_ids(*list, "prompt", limits.n_vocab, ids));
    out.emplace_back(std::move(ids));
    return std::nullopt;
  }
  if (list->size() > 1024) return bad_request("'prompt' may hold at most 1024 prompts", "prompt");
  for (size_t i = 0; i < list->size(); ++i) {
    const json& item = (*list)[i];
    const std::string where = "prompt[" + std::to_string(i) + "]";
    if (item.is_string()) {
      out.emplace_back(item.get<std::string>());
    } else if (item.is_array() && !item.empty()) {
      std::vector<int32_t> ids;
      VESPER_FIELD(token_ids(item, where, limits.n_vocab, ids));
      out.emplace_back(std::move(ids));
    } else {
      return bad_request("'" + where +
                             "' must be a string or a non-empty array of token ids, got " +
                             describe_json_value(item),
                         "prompt");
    }
  }
  return std::nullopt;
}

// An assistant message's earlier calls, for the template: each {id, type, function: {name,
// arguments}}, with arguments given back as a JSON object when they parse (templates write them
// with tojson, as vLLM passes them).
std::optional<ApiError> parse_message_tool_calls(const JsonFields& mf, const std::string& where,
                                                 json& msg) {
  const json* calls = nullptr;
  VESPER_FIELD(mf.array("tool_calls", calls));
  if (calls == nullptr) return std::nullopt;
  json out = json::array();
  for (size_t k = 0; k < calls->size(); ++k) {
    const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
    const json& c = (*calls)[k];
    if (!c.is_object())
      return bad_request("'" + cw + "' must be an object, got " + describe_json_value(c), cw);
    const JsonFields cf(c, cw);
    std::string id, name, arguments;
    VESPER_FIELD(cf.string("id", id));
    const json* fn = nullptr;
    VESPER_FIELD(cf.object("function", fn));
    if (fn == nullptr) return bad_request("'" + cw + ".function' is required", cw + ".function");
    const JsonFields ff(*fn, cw + ".function");
    VESPER_FIELD(ff.require_string("name", name));
    VESPER_FIELD(ff.string("arguments", arguments));
    json args = json::parse(arguments, nullptr, false);
    if (args.is_discarded()) args = arguments;
    out.push_back({{"id", id},
                   {"type", "function"},
                   {"function", {{"name", name}, {"arguments", std::move(args)}}}});
  }
  msg["tool_calls"] = std::move(out);
  return std::nullopt;
}

// messages: an array of {role, content (string, null or text parts), name}.
std::optional<ApiError> parse_messages(const JsonFields& f, json& out) {
  const json* msgs = nullptr;
  VESPER_FIELD(f.require_array("messages", msgs));
  if (msgs->empty()) return bad_request("'messages' must be a non-empty array", "messages");
  static const std::set<std::string> kRoles = {"system", "user", "assistant", "tool", "developer"};
  out = json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = (*msgs)[i];
    if (!m.is_object())
      return bad_request("'" + where + "' must be an object, got " + describe_json_value(m), where);
    const JsonFields mf(m, where);
    std::string role;
    VESPER_FIELD(mf.require_string("role", role));
    if (!kRoles.count(role))
      return bad_request(
          "'" + where + ".role' must be one of system, user, assistant, tool, developer; got \"" +
              role + "\"",
          where + ".role");
    json msg = {{"role", role}};
    std::string text;
    const json* content = mf.value("content");
    if (content == nullptr) {
      if (role != "assistant")
        return bad_request("'" + where + ".content' is required", where + ".content");
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (!content->is_array()) {
      return mf.wrong("content", "a string or an array of text parts", *content);
    } else {
      const json* parts = content;
      // Text parts are joined; other part types (images, audio) are not supported.
      for (size_t k = 0; k < parts->size(); ++k) {
        const std::string part_where = where + ".content[" + std::to_string(k) + "]";
        const json& part = (*parts)[k];
        if (!part.is_object())
          return bad_request(
              "'" + part_where + "' must be an object, got " + describe_json_value(part),
              part_where);
        const JsonFields pf(part, part_where);
        std::string type, part_text;
        VESPER_FIELD(pf.require_string("type", type));
        if (type != "text")
          return bad_request("'" + part_where + ".type' \"" + type +
                                 "\" is not supported; only \"text\" parts are",
                             part_where + ".type");
        VESPER_FIELD(pf.require_string("text", part_text));
        if (!text.empty()) text += "\n";
        text += part_text;
      }
    }
    msg["content"] = text;
    std::string name;
    VESPER_FIELD(mf.string("name", name));
    if (!name.empty()) msg["name"] = name;
    if (role == "assistant") VESPER_FIELD(parse_message_tool_calls(mf, where, msg));
    if (role == "tool") {
      std::string tool_call_id;
      VESPER_FIELD(mf.string("tool_call_id", tool_call_id));
      if (!tool_call_id.empty()) msg["tool_call_id"] = tool_call_id;
    }
    out.push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_template_kwargs(const JsonFields& f, json& out) {
  const json* kwargs = nullptr;
  VESPER_FIELD(f.object("chat_template_kwargs", kwargs));
  if (kwargs != nullptr) out = *kwargs;
  return std::nullopt;
}

}  // namespace

std::variant<CompletionRequest, ApiError> parse_completion_request(
    const json& body, const ProtocolLimits& limits, const nlohmann::ordered_json* ordered) {
  CompletionRequest r;
  const JsonFields f(body);
  VESPER_FIELD(f.string("model", r.model));
  VESPER_FIELD(parse_prompt(f, limits, r.prompts));
  r.params.max_tokens = 16;  // OpenAI's default for completions
  VESPER_FIELD(f.integer("max_tokens", r.params.max_tokens, 0, kMaxInt));
  VESPER_FIELD(parse_sampling(f, limits, r.params, r.priority, r.stream, r.include_usage));
  VESPER_FIELD(parse_output_constraint(f, ordered, r.constraint));
  VESPER_FIELD(f.boolean("echo", r.echo));
  VESPER_FIELD(f.integer("logprobs", r.params.logprobs, 0, 20));
  if (f.has("suffix")) return bad_request("'suffix' is not supported", "suffix");
  if (r.params.min_tokens > r.params.max_tokens)
    return bad_request("'min_tokens' must not exceed 'max_tokens'", "min_tokens");
  return r;
}

std::variant<ChatRequest, ApiError> parse_chat_request(const json& body,
                                                       const ProtocolLimits& limits,
                                                       const nlohmann::ordered_json* ordered) {
  ChatRequest r;
  const JsonFields f(body);
  VESPER_FIELD(f.string("model", r.model));
  VESPER_FIELD(parse_messages(f, r.messages));
  r.params.max_tokens = -1;  // default: the rest of the context (set by the server)
  if (f.has("max_completion_tokens")) {
    VESPER_FIELD(f.integer("max_completion_tokens", r.params.max_tokens, 0, kMaxInt));
    r.max_tokens_given = true;
  } else if (f.has("max_tokens")) {
    VESPER_FIELD(f.integer("max_tokens", r.params.max_tokens, 0, kMaxInt));
    r.max_tokens_given = true;
  }
  VESPER_FIELD(parse_sampling(f, limits, r.params, r.priority, r.stream, r.include_usage));
  VESPER_FIELD(f.boolean("logprobs", r.logprobs));
  VESPER_FIELD(f.integer("top_logprobs", r.top_logprobs, 0, 20));
  if (f.has("top_logprobs") && !r.logprobs)
    return bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
  if (r.logprobs) r.params.logprobs = r.top_logprobs;
  VESPER_FIELD(f.boolean("add_generation_prompt", r.add_generation_prompt, Null::kError));
  VESPER_FIELD(parse_template_kwargs(f, r.chat_template_kwargs));
  if (r.max_tokens_given && r.params.min_tokens > r.params.max_tokens)
    return bad_request("'min_tokens' must not exceed 'max_tokens'", "min_tokens");
  VESPER_FIELD(parse_output_constraint(f, ordered, r.constraint));
  VESPER_FIELD(parse_tools(f, ordered, r.tools, r.tool_choice, r.constraint));
  return r;
}

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(const json& body) {
  TokenizeRequest r;
  const JsonFields f(body);
  VESPER_FIELD(f.boolean("add_special_tokens", r.add_special_tokens, Null::kError));
  VESPER_FIELD(f.boolean("add_generation_prompt", r.add_generation_prompt, Null::kError));
  if (f.has("prompt")) {
    std::string text;
    VESPER_FIELD(f.string("prompt", text));
    r.prompt = std::move(text);
  } else if (f.has("messages")) {
    VESPER_FIELD(parse_messages(f, r.messages));
    VESPER_FIELD(parse_template_kwargs(f, r.chat_template_kwargs));
  } else {
    return bad_request("'prompt' (a string) or 'messages' is required", "prompt");
  }
  return r;
}

std::variant<std::vector<int32_t>, ApiError> parse_detokenize_request(
    const json& body, const ProtocolLimits& limits) {
  const JsonFields f(body);
  const json* tokens = nullptr;
  VESPER_FIELD(f.require_array("tokens", tokens));
  std::vector<int32_t> ids;
  VESPER_FIELD(token_ids(*tokens, "tokens", limits.n_vocab, ids));
  return ids;
}

nlohmann::json completion_logprobs_json(const std::vector<sample::LogprobEntry>& entries,
                                        const std::function<std::string(int32_t)>& piece_of,
                                        size_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
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
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

nlohmann::json chat_logprobs_json(const std::vector<sample::LogprobEntry>& entries,
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
    content.push_back({{"token", piece},
                       {"logprob", e.logprob},
                       {"bytes", bytes_of(piece)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

}  // namespace vesper::server
