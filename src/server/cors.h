// CorsPolicy: Cross-Origin Resource Sharing as vLLM's server offers it (FastAPI's CORSMiddleware
// behind --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials, each
// defaulting to "*" but credentials to false), so a browser page on another origin can call the
// API. The HTTP connection asks it for the headers of each response and answers preflight
// requests (OPTIONS with Origin and Access-Control-Request-Method) itself, before a request
// reaches the service.
#pragma once

#include <string>
#include <vector>

namespace vesper::server {

struct CorsConfig {
  std::vector<std::string> allowed_origins = {"*"};  // --allowed-origins
  std::vector<std::string> allowed_methods = {"*"};  // --allowed-methods
  std::vector<std::string> allowed_headers = {"*"};  // --allowed-headers
  bool allow_credentials = false;                    // --allow-credentials
};

class CorsPolicy {
 public:
  explicit CorsPolicy(CorsConfig config);

  // A preflight: OPTIONS carrying Origin and Access-Control-Request-Method.
  static bool is_preflight(const std::string& method, const std::string& origin,
                           const std::string& request_method);

  struct Preflight {
    int status = 200;     // 200, or 400 when the origin, method or a header is refused
    std::string headers;  // "Name: value\r\n" lines
    std::string refusal;  // why, for a 400 ("Disallowed CORS origin", ...)
  };
  Preflight preflight(const std::string& origin, const std::string& request_method,
                      const std::string& request_headers) const;

  // Headers for an ordinary response to a request from `origin` ("" when the request had no
  // Origin header: none are added, except Vary where the answer depends on the origin).
  std::string response_headers(const std::string& origin) const;

 private:
  bool origin_allowed(const std::string& origin) const;
  // The Access-Control-Allow-Origin value for an allowed origin.
  std::string allow_origin_value(const std::string& origin) const;

  CorsConfig config_;
  bool any_origin_ = false;
  bool any_method_ = false;
  bool any_header_ = false;
};

}  // namespace vesper::server
