#include "kv/block_hash.h"

#include <openssl/sha.h>

#include <vector>

namespace vesper::kv {
namespace {

// Distinguishes this scheme's digests from any other SHA-256 use and from later versions.
constexpr std::string_view kRootDomain = "vesper prefix cache v1:";

BlockHash sha256(const uint8_t* data, size_t size) {
  BlockHash h;
  SHA256(data, size, h.bytes.data());
  return h;
}

}  // namespace

BlockHash root_block_hash(std::string_view salt, uint64_t adapter) {
  // The domain, then (only with an adapter, so plain requests keep their roots) the byte 0xff
  // and the adapter id as 8 little-endian bytes, then the salt. No salt can imitate an adapter:
  // salts are UTF-8 text, which never holds the byte 0xff.
  std::vector<uint8_t> buf(kRootDomain.begin(), kRootDomain.end());
  if (adapter != 0) {
    buf.push_back(0xff);
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<uint8_t>(adapter >> (8 * i)));
  }
  buf.insert(buf.end(), salt.begin(), salt.end());
  return sha256(buf.data(), buf.size());
}

BlockHash chain_block_hash(const BlockHash& parent, std::span<const int32_t> tokens) {
  // parent digest, then the token ids as little-endian int32 (fixed width, so no two token
  // lists serialise to the same bytes).
  thread_local std::vector<uint8_t> buf;
  buf.resize(parent.bytes.size() + tokens.size() * 4);
  std::memcpy(buf.data(), parent.bytes.data(), parent.bytes.size());
  uint8_t* p = buf.data() + parent.bytes.size();
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    p[0] = static_cast<uint8_t>(u);
    p[1] = static_cast<uint8_t>(u >> 8);
    p[2] = static_cast<uint8_t>(u >> 16);
    p[3] = static_cast<uint8_t>(u >> 24);
    p += 4;
  }
  return sha256(buf.data(), buf.size());
}

}  // namespace vesper::kv
