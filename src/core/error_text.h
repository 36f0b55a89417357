// Pieces of error messages that several modules write the same way: a tensor's shape, and an
// excerpt of a long body (an HTTP response, a stream event) short enough for one log line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vesper {

// "[a, b, c]", as GGUF and safetensors list a tensor's dimensions.
inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The first `max` characters of `s` on one line (line breaks become spaces), "..." when cut.
inline std::string excerpt(std::string_view s, size_t max = 300) {
  std::string out(s.substr(0, max));
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  return s.size() > max ? out + "..." : out;
}

}  // namespace vesper
