// Tests of core/page_warmer.h: every page of every region ends resident, contents written before
// or during warming survive, and a warmer stops cleanly whether or not it was waited for.
#include "core/page_warmer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/large_buffer.h"

namespace vesper {
namespace {

// Pages of [p, p + bytes) that are not resident (mincore).
size_t missing_pages(const std::byte* p, size_t bytes) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  std::vector<unsigned char> resident((end - begin + page - 1) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), end - begin, resident.data()), 0);
  size_t missing = 0;
  for (unsigned char r : resident) missing += (r & 1) == 0;
  return missing;
}

TEST(PageWarmer, MakesEveryRegionResidentAndKeepsWhatWasWritten) {
  const size_t a_bytes = (size_t{6} << 20) + 12345, b_bytes = (size_t{3} << 20) + 5;
  auto a = allocate_large_buffer(a_bytes);
  auto b = allocate_large_buffer(b_bytes);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::memset(a.get() + 100, 0x5A, 4096);          // written before: stays
  ASSERT_GT(missing_pages(b.get(), b_bytes), 0u);  // reserved, not touched
  PageWarmer warmer({{a.get(), a_bytes}, {b.get(), b_bytes}}, size_t{2} << 20);
  std::memset(b.get() + b_bytes - 7, 0x3C, 7);  // written while it runs: stays
  warmer.wait();
  if (warmer.unsupported()) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE";
  EXPECT_EQ(warmer.warmed_bytes(), a_bytes + b_bytes);
  EXPECT_EQ(missing_pages(a.get(), a_bytes), 0u);
  EXPECT_EQ(missing_pages(b.get(), b_bytes), 0u);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(a[100 + i], std::byte{0x5A}) << i;
  for (size_t i = 0; i < 7; ++i) ASSERT_EQ(b[b_bytes - 7 + i], std::byte{0x3C}) << i;
  EXPECT_EQ(a[a_bytes - 1], std::byte{0});  // anonymous memory reads as zeros once resident
}

TEST(PageWarmer, StopsWhenDestroyedWaitedForOrNot) {
  const size_t bytes = size_t{64} << 20;
  auto buffer = allocate_large_buffer(bytes);
  ASSERT_NE(buffer, nullptr);
  { PageWarmer running({{buffer.get(), bytes}}, size_t{2} << 20); }  // destroyed mid-way
  PageWarmer waited({{buffer.get(), bytes}}, size_t{2} << 20);
  waited.wait();
  waited.wait();  // a second wait, then the destructor: nothing left to join
  if (!waited.unsupported()) {
    EXPECT_EQ(waited.warmed_bytes(), bytes);
  }
}

}  // namespace
}  // namespace vesper
