#include "server/json_body.h"

#include <string>

#include "core/json_nesting.h"

namespace vesper::server {

using nlohmann::json;

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c >> 5) == 0x6) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c >> 4) == 0xE) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c >> 3) == 0x1E) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace {

// nlohmann's message reads "[json.exception.parse_error.101] parse error at line 1, column 9:
// syntax error while parsing value - invalid literal; last read: '...'": the part after the
// position is what a client needs.
std::string describe_parse_error(const json::exception& e) {
  std::string what = e.what();
  if (const size_t tag = what.find("] "); tag != std::string::npos) what = what.substr(tag + 2);
  if (const size_t at = what.find(": ");
      what.rfind("parse error", 0) == 0 && at != std::string::npos)
    what = what.substr(at + 2);
  return what;
}

}  // namespace

std::variant<json, ApiError> parse_json_body(std::string_view body, int max_depth) {
  if (const size_t bad = find_invalid_utf8(body); bad != std::string_view::npos)
    return bad_request("The request body is not valid UTF-8 (at byte " + std::to_string(bad) + ")");
  if (const size_t deep = find_json_nesting_over(body, max_depth); deep != std::string_view::npos)
    return bad_request("The request body nests arrays and objects deeper than " +
                       std::to_string(max_depth) + " levels (at byte " + std::to_string(deep) +
                       ")");
  json doc;
  try {
    doc = json::parse(body.begin(), body.end());
  } catch (const json::parse_error& e) {
    // e.byte counts from 1 and points just past the offending character.
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    return bad_request("The request body is not valid JSON at byte " + std::to_string(offset) +
                       ": " + describe_parse_error(e));
  } catch (const json::out_of_range& e) {
    // A number past a double's range (1e999): nlohmann refuses it rather than make it infinite.
    return bad_request("The request body holds a number out of range: " + describe_parse_error(e));
  }
  if (!doc.is_object()) return bad_request("The request body must be a JSON object");
  return doc;
}

}  // namespace vesper::server
