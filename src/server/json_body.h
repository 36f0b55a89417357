// Request bodies as JSON: the one place a request's bytes become a JSON document. It bounds what
// the rest of the server may assume about a document: valid UTF-8, nesting at most
// kMaxJsonDepth levels (so every later recursive walk, copy or dump is bounded), numbers finite,
// and a JSON object at the top. Each fault is an ApiError that says what is wrong and at which
// byte offset of the body.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <variant>

#include "server/api_error.h"

namespace vesper::server {

// Deepest nesting of arrays and objects a request body may have. OpenAI's own requests nest a
// handful of levels (messages -> content parts, JSON schemas a few more); a bound this size
// leaves any real request room and keeps recursive code far from the stack's end.
inline constexpr int kMaxJsonDepth = 64;

// Parses `body` into a JSON object, or answers 400 naming the fault and its byte offset.
std::variant<nlohmann::json, ApiError> parse_json_body(std::string_view body,
                                                       int max_depth = kMaxJsonDepth);

// The byte offset of the first invalid UTF-8 sequence in `s`, or npos when it is all valid.
// Overlong encodings, surrogates and code points past U+10FFFF are invalid (RFC 3629).
size_t find_invalid_utf8(std::string_view s);

}  // namespace vesper::server
