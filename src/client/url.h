// Url: the base URL of an OpenAI-compatible server, "http://HOST[:PORT][/PATH]". Plain HTTP only
// (benchmarks run next to the server); IPv6 hosts go in brackets ("http://[::1]:8000").
#pragma once

#include <string>
#include <string_view>

#include "core/result.h"

namespace vesper::client {

struct Url {
  std::string host;    // without brackets
  std::string port;    // "80" when not given
  std::string prefix;  // path before the endpoint, without a trailing '/', may be empty

  static Result<Url> parse(std::string_view text);
  // The Host header value: host, bracketed if IPv6, with ":port" unless it is 80.
  std::string host_header() const;
  // "http://host:port" + prefix + path.
  std::string str(std::string_view path = {}) const;
};

}  // namespace vesper::client
