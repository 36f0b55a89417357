// What a validated OpenAI request promises (server/openai_protocol.h), checked on every request
// the fuzz targets get through validation: both the body target and the HTTP target use it.
#pragma once

#include <set>
#include <string>
#include <variant>

#include "core/check.h"
#include "server/json_body.h"
#include "server/openai_protocol.h"

namespace vesper::fuzz {

// stories260K's vocabulary size: any value works, the checks are relative to it.
inline constexpr int32_t kFuzzVocab = 512;

inline void check_ids(const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    VESPER_CHECK(id >= 0 && id < kFuzzVocab, "token id %d escaped validation", id);
}

inline void check_params(const sample::SamplingParams& p) {
  const Status st = p.validate();
  VESPER_CHECK(st.ok(), "a validated request has invalid sampling parameters: %s",
               st.error().message.c_str());
  check_ids(p.stop_token_ids);
  VESPER_CHECK(p.stop.size() <= 16, "more than 16 stop strings");
  for (const auto& s : p.stop) VESPER_CHECK(!s.empty(), "an empty stop string");
}

inline void check_messages(const nlohmann::json& messages) {
  static const std::set<std::string> kRoles = {"system", "user", "assistant", "tool", "developer"};
  VESPER_CHECK(messages.is_array() && !messages.empty(), "messages not a non-empty array");
  for (const auto& m : messages) {
    VESPER_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                     kRoles.count(m["role"].get<std::string>()),
                 "a message without a valid role");
    VESPER_CHECK(m.contains("content") && m["content"].is_string(),
                 "a message whose content is not text");
  }
}

inline void check_error(const server::ApiError& e) {
  VESPER_CHECK(e.status >= 400 && e.status < 500, "validation answered %d", e.status);
  VESPER_CHECK(!e.message.empty(), "an error without a message");
  // The error must serialise (it is sent as JSON).
  (void)e.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Runs one body through parse_json_body and the parser of `endpoint` (0 completions, 1 chat,
// 2 tokenize, 3 detokenize), checking whichever answer comes.
inline void check_body(std::string_view body, int endpoint) {
  const server::ProtocolLimits limits{kFuzzVocab};
  auto doc = server::parse_json_body(body);
  if (auto* e = std::get_if<server::ApiError>(&doc)) return check_error(*e);
  const nlohmann::json& j = std::get<nlohmann::json>(doc);
  VESPER_CHECK(j.is_object(), "parse_json_body let a non-object through");
  switch (endpoint % 4) {
    case 0: {
      auto r = server::parse_completion_request(j, limits);
      if (auto* e = std::get_if<server::ApiError>(&r)) return check_error(*e);
      const auto& c = std::get<server::CompletionRequest>(r);
      VESPER_CHECK(!c.prompts.empty() && c.prompts.size() <= 1024, "prompt count out of range");
      for (const auto& p : c.prompts)
        if (auto* ids = std::get_if<std::vector<int32_t>>(&p)) {
          VESPER_CHECK(!ids->empty(), "an empty id prompt");
          check_ids(*ids);
        }
      check_params(c.params);
      return;
    }
    case 1: {
      auto r = server::parse_chat_request(j, limits);
      if (auto* e = std::get_if<server::ApiError>(&r)) return check_error(*e);
      auto c = std::get<server::ChatRequest>(r);
      check_messages(c.messages);
      VESPER_CHECK(c.chat_template_kwargs.is_object(), "chat_template_kwargs not an object");
      // The server sets the default (the rest of the context) before the engine sees it.
      if (!c.max_tokens_given) c.params.max_tokens = std::max<int64_t>(c.params.min_tokens, 100);
      check_params(c.params);
      return;
    }
    case 2: {
      auto r = server::parse_tokenize_request(j);
      if (auto* e = std::get_if<server::ApiError>(&r)) return check_error(*e);
      const auto& t = std::get<server::TokenizeRequest>(r);
      if (!t.prompt) check_messages(t.messages);
      return;
    }
    default: {
      auto r = server::parse_detokenize_request(j, limits);
      if (auto* e = std::get_if<server::ApiError>(&r)) return check_error(*e);
      check_ids(std::get<std::vector<int32_t>>(r));
      return;
    }
  }
}

}  // namespace vesper::fuzz
