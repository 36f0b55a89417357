#include "server/random_id.h"

#include <openssl/rand.h>

#include <array>
#include <random>

namespace vesper::server {

std::string random_id(std::string_view prefix) {
  std::array<unsigned char, 16> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    // OpenSSL's generator failed to seed (no entropy source): the kernel's, directly.
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<unsigned char>(rd());
  }
  static const char* kHex = "0123456789abcdef";
  std::string id(prefix);
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

}  // namespace vesper::server
