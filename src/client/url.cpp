#include "client/url.h"

#include <charconv>

namespace vesper::client {

Result<Url> Url::parse(std::string_view text) {
  std::string quoted = "\"";
  quoted.append(text).push_back('"');
  constexpr std::string_view kScheme = "http://";
  if (text.substr(0, 8) == "https://")
    return make_error(
        quoted + ": https is not supported; use http:// (run the benchmark next to the server)");
  if (text.substr(0, kScheme.size()) != kScheme)
    return make_error(quoted + ": expected http://HOST[:PORT][/PATH]");
  std::string_view rest = text.substr(kScheme.size());
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (path.find_first_of("?#") != std::string_view::npos)
    return make_error(quoted + ": a base URL has no query or fragment");
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (authority.find('@') != std::string_view::npos)
    return make_error(quoted + ": user info in the URL is not supported; use --api-key");
  Url url;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return make_error(quoted + ": unclosed '[' in the host");
    url.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':')
        return make_error(quoted + ": expected ':PORT' after the IPv6 host");
      port = after.substr(1);
      if (port.empty()) return make_error(quoted + ": empty port");
    }
  } else {
    const size_t colon = authority.find(':');
    url.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return make_error(quoted + ": empty port");
    }
  }
  if (url.host.empty()) return make_error(quoted + ": no host");
  if (!port.empty()) {
    int value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value < 1 || value > 65535)
      return make_error(quoted + ": port \"" + std::string(port) +
                        "\" is not a number in 1..65535");
    url.port = std::to_string(value);
  } else {
    url.port = "80";
  }
  url.prefix = std::string(path);
  return url;
}

std::string Url::host_header() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if (port != "80") h += ":" + port;
  return h;
}

std::string Url::str(std::string_view path) const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return "http://" + h + ":" + port + prefix + std::string(path);
}

}  // namespace vesper::client
