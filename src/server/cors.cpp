#include "server/cors.h"

#include <algorithm>
#include <cctype>

namespace vesper::server {

namespace {

// What "*" in --allowed-methods stands for in a preflight answer.
constexpr const char* kAllMethods = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";
// Headers browsers send without asking, always allowed.
const std::vector<std::string> kSafelistedHeaders = {"accept", "accept-language",
                                                     "content-language", "content-type"};
// How long a browser may cache a preflight answer.
constexpr int kMaxAgeSeconds = 600;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool contains(const std::vector<std::string>& list, const std::string& v) {
  return std::find(list.begin(), list.end(), v) != list.end();
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

// Header values carry no line breaks (a configured value or an echoed request header).
std::string header_safe(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return c == '\r' || c == '\n'; }),
          s.end());
  return s;
}

}  // namespace

CorsPolicy::CorsPolicy(CorsConfig config) : config_(std::move(config)) {
  any_origin_ = contains(config_.allowed_origins, "*");
  any_method_ = contains(config_.allowed_methods, "*");
  any_header_ = contains(config_.allowed_headers, "*");
  for (auto& m : config_.allowed_methods) m = header_safe(m);
  for (auto& h : config_.allowed_headers) h = lower(header_safe(h));
}

bool CorsPolicy::is_preflight(const std::string& method, const std::string& origin,
                              const std::string& request_method) {
  return method == "OPTIONS" && !origin.empty() && !request_method.empty();
}

bool CorsPolicy::origin_allowed(const std::string& origin) const {
  return any_origin_ || contains(config_.allowed_origins, origin);
}

std::string CorsPolicy::allow_origin_value(const std::string& origin) const {
  // With credentials a browser refuses "*": the origin itself is named.
  return any_origin_ && !config_.allow_credentials ? "*" : header_safe(origin);
}

CorsPolicy::Preflight CorsPolicy::preflight(const std::string& origin,
                                            const std::string& request_method,
                                            const std::string& request_headers) const {
  Preflight p;
  std::vector<std::string> refused;
  if (!origin_allowed(origin)) refused.push_back("origin");
  if (!any_method_ && !contains(config_.allowed_methods, request_method))
    refused.push_back("method");
  if (!any_header_) {
    size_t start = 0;
    while (start <= request_headers.size()) {
      size_t comma = request_headers.find(',', start);
      if (comma == std::string::npos) comma = request_headers.size();
      const std::string h = lower(trim(request_headers.substr(start, comma - start)));
      if (!h.empty() && !contains(config_.allowed_headers, h) && !contains(kSafelistedHeaders, h)) {
        refused.push_back("headers");
        break;
      }
      start = comma + 1;
    }
  }
  if (!refused.empty()) {
    p.status = 400;
    p.refusal = "Disallowed CORS " + join(refused);
  }
  if (origin_allowed(origin)) {
    p.headers += "Access-Control-Allow-Origin: " + allow_origin_value(origin) + "\r\n";
    if (!(any_origin_ && !config_.allow_credentials)) p.headers += "Vary: Origin\r\n";
  }
  p.headers += std::string("Access-Control-Allow-Methods: ") +
               (any_method_ ? kAllMethods : join(config_.allowed_methods)) + "\r\n";
  if (any_header_) {
    if (!request_headers.empty())
      p.headers += "Access-Control-Allow-Headers: " + header_safe(request_headers) + "\r\n";
  } else {
    std::vector<std::string> allowed = kSafelistedHeaders;
    for (const auto& h : config_.allowed_headers)
      if (!contains(allowed, h)) allowed.push_back(h);
    p.headers += "Access-Control-Allow-Headers: " + join(allowed) + "\r\n";
  }
  if (config_.allow_credentials) p.headers += "Access-Control-Allow-Credentials: true\r\n";
  p.headers += "Access-Control-Max-Age: " + std::to_string(kMaxAgeSeconds) + "\r\n";
  return p;
}

std::string CorsPolicy::response_headers(const std::string& origin) const {
  std::string h;
  const bool echoes = !(any_origin_ && !config_.allow_credentials);
  if (!origin.empty() && origin_allowed(origin)) {
    h += "Access-Control-Allow-Origin: " + allow_origin_value(origin) + "\r\n";
    if (config_.allow_credentials) h += "Access-Control-Allow-Credentials: true\r\n";
  }
  // Caches must not hand one origin's answer to another.
  if (echoes && !origin.empty()) h += "Vary: Origin\r\n";
  return h;
}

}  // namespace vesper::server
