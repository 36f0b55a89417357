// BlockHash: the identity of a full KV block's content for automatic prefix caching.
//
// A block's K/V depend on every token before it, so its key is a hash chain: the hash of the
// parent block's hash and this block's token ids. The chain starts from a root hash of
// everything else that changes the KV for the same tokens (a request's cache salt and its
// adapter), so requests only share blocks when their KV would be identical.
//
// SHA-256 (OpenSSL): two different prefixes never share a key in practice, so a cache hit
// cannot silently serve another prefix's KV. The block pool additionally keeps each cached
// block's tokens and compares them on every hit.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace vesper::kv {

struct BlockHash {
  std::array<uint8_t, 32> bytes{};

  bool operator==(const BlockHash&) const = default;
};

// For unordered containers: the first 8 bytes of a SHA-256 digest are already uniform.
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    uint64_t v;
    std::memcpy(&v, h.bytes.data(), sizeof(v));
    return static_cast<size_t>(v);
  }
};

// The chain's root for requests that share KV when their tokens agree: `salt` is whatever
// else the KV depends on (empty for a plain request).
// `adapter` identifies the LoRA / VeRA adapter the KV is computed with (0: the base model):
// each adapter has a chain of its own.
BlockHash root_block_hash(std::string_view salt, uint64_t adapter = 0);

// The hash of a full block holding `tokens`, following the block whose hash is `parent`
// (or the root hash for the first block).
BlockHash chain_block_hash(const BlockHash& parent, std::span<const int32_t> tokens);

}  // namespace vesper::kv
