// Tests of core/large_buffer.h: alignment, usable size, and huge-page advice on large buffers.
#include "core/large_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace vesper {
namespace {

bool aligned(const void* p, uintptr_t to) {
  return reinterpret_cast<uintptr_t>(p) % to == 0;
}

TEST(LargeBuffer, SmallBuffersAreCacheLineAlignedAndWritable) {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{65}, size_t{4096}, (size_t{2} << 20) - 1}) {
    auto b = allocate_large_buffer(bytes);
    ASSERT_NE(b, nullptr) << bytes;
    EXPECT_TRUE(aligned(b.get(), 64)) << bytes;
    std::memset(b.get(), 0xAB, bytes);
    EXPECT_EQ(b[bytes - 1], std::byte{0xAB});
  }
}

TEST(LargeBuffer, LargeBuffersStartOnA2MiBBoundaryAndHoldEveryByte) {
  const size_t bytes = (size_t{3} << 20) + 5;
  auto a = allocate_large_array<float>(bytes / sizeof(float));
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(aligned(a.get(), size_t{2} << 20));
  for (size_t i = 0; i < bytes / sizeof(float); ++i) a[i] = static_cast<float>(i);
  EXPECT_EQ(a[bytes / sizeof(float) - 1], static_cast<float>(bytes / sizeof(float) - 1));
}

// Where the kernel offers transparent huge pages on request, a large buffer's mapping carries the
// request (VmFlags "hg" in /proc/self/smaps); elsewhere there is nothing to check.
TEST(LargeBuffer, LargeBuffersAreAdvisedAsHugePages) {
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!mode || !std::getline(mode, line) || line.find("[never]") != std::string::npos)
    GTEST_SKIP() << "no transparent huge pages here";
  auto b = allocate_large_buffer(size_t{4} << 20);
  ASSERT_NE(b, nullptr);
  const auto addr = reinterpret_cast<uintptr_t>(b.get());
  std::ifstream smaps("/proc/self/smaps");
  bool in_mapping = false, advised = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(' ') > 8) {
      in_mapping = lo <= addr && addr < hi;
    } else if (in_mapping && line.rfind("VmFlags:", 0) == 0) {
      advised = line.find(" hg") != std::string::npos;
      break;
    }
  }
  EXPECT_TRUE(advised);
}

}  // namespace
}  // namespace vesper
