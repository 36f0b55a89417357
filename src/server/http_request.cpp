#include "server/http_request.h"

#include <cctype>

namespace vesper::server {
namespace {

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

}  // namespace

std::string request_path(std::string_view target) {
  for (std::string_view scheme : {"http://", "https://"}) {
    if (starts_with_nocase(target, scheme)) {
      const size_t slash = target.find('/', scheme.size());
      target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
      break;
    }
  }
  return std::string(target.substr(0, target.find_first_of("?#")));
}

std::optional<std::string_view> bearer_token(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer";
  if (!starts_with_nocase(authorization, kScheme) || authorization.size() == kScheme.size() ||
      authorization[kScheme.size()] != ' ')
    return std::nullopt;
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  return token;
}

}  // namespace vesper::server
