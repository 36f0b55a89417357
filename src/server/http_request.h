// HttpRequest: one HTTP request as the OpenAI service sees it, independent of Beast, and the
// pieces of HTTP the service interprets itself: the request target's path and the bearer token.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace vesper::server {

// Largest request head (request line and headers) a connection reads; longer gets 431.
inline constexpr size_t kMaxHeaderBytes = 64 * 1024;

struct HttpRequest {
  std::string method;
  std::string target;  // as sent: origin-form "/path?query", or absolute-form "http://host/path"
  std::string content_type;
  std::string authorization;
  std::string body;
};

// The path of a request target, without query or fragment: origin-form ("/v1/models?x") and
// absolute-form ("http://host:8000/v1/models", which HTTP/1.1 servers must accept, RFC 9112
// 3.2.2) alike. An absolute-form target with no path is "/".
std::string request_path(std::string_view target);

// The token of an "Authorization: Bearer <token>" header, or nullopt for any other scheme. The
// scheme is case-insensitive (RFC 9110 11.1); spaces around the token are not part of it.
std::optional<std::string_view> bearer_token(std::string_view authorization);

}  // namespace vesper::server
