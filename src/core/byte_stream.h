// ByteWriter / ByteReader: a compact, explicit binary encoding for messages that cross a thread,
// a process or a machine (the engine's step plan). Integers are little-endian varints (signed
// ones zigzag-encoded), vectors are a length then their elements. The reader checks every length
// against the bytes left, so truncated or corrupt input is an error value, never an overread.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace vesper {

class ByteWriter {
 public:
  void u64(uint64_t v) {
    while (v >= 0x80) {
      bytes_.push_back(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    bytes_.push_back(static_cast<uint8_t>(v));
  }
  void i64(int64_t v) { u64((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  template <class Int>
  void ints(std::span<const Int> values) {
    u64(values.size());
    for (Int v : values) i64(static_cast<int64_t>(v));
  }
  // A float by its bits (exact, NaNs and infinities included).
  void f32(float v) { u64(std::bit_cast<uint32_t>(v)); }
  void boolean(bool v) { u64(v ? 1 : 0); }
  void str(std::string_view s) {
    u64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  bool done() const { return at_ == bytes_.size(); }
  size_t offset() const { return at_; }

  Result<uint64_t> u64() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= bytes_.size()) return make_error("truncated at byte " + std::to_string(at_));
      const uint8_t b = bytes_[at_++];
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return make_error("a varint longer than 10 bytes at byte " + std::to_string(at_));
  }
  Result<int64_t> i64() {
    auto u = u64();
    if (!u) return u.error();
    return static_cast<int64_t>((*u >> 1) ^ (~(*u & 1) + 1));
  }
  // A count of items that each take at least one byte: larger than what is left is corrupt.
  Result<size_t> count() {
    auto n = u64();
    if (!n) return n.error();
    if (*n > bytes_.size() - at_)
      return make_error("a count of " + std::to_string(*n) + " at byte " + std::to_string(at_) +
                        " exceeds the " + std::to_string(bytes_.size() - at_) + " bytes left");
    return static_cast<size_t>(*n);
  }
  template <class Int>
  Status ints(std::vector<Int>& out) {
    auto n = count();
    if (!n) return n.error();
    out.resize(*n);
    for (Int& v : out) {
      auto x = i64();
      if (!x) return x.error();
      v = static_cast<Int>(*x);
      if (static_cast<int64_t>(v) != *x)
        return make_error("a value out of range at byte " + std::to_string(at_));
    }
    return {};
  }
  Result<float> f32() {
    auto u = u64();
    if (!u) return u.error();
    if (*u > UINT32_MAX) return make_error("a float out of range at byte " + std::to_string(at_));
    return std::bit_cast<float>(static_cast<uint32_t>(*u));
  }
  Result<bool> boolean() {
    auto u = u64();
    if (!u) return u.error();
    if (*u > 1) return make_error("a flag other than 0 or 1 at byte " + std::to_string(at_));
    return *u == 1;
  }
  Status str(std::string& out) {
    auto n = count();
    if (!n) return n.error();
    out.assign(reinterpret_cast<const char*>(bytes_.data() + at_), *n);
    at_ += *n;
    return {};
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

}  // namespace vesper
