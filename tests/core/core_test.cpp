// core: thread pool coverage and reuse, half-precision conversions, Result, mapped files.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>
#include <vector>

#include "core/fp16.h"
#include "core/mapped_file.h"
#include "core/result.h"
#include "core/thread_pool.h"

namespace vesper {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{1000}}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << threads << " threads, n=" << n;
    }
  }
}

TEST(ThreadPool, ForEachPieceRunsEveryPieceOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1000}}) {
      for (int round = 0; round < 3; ++round) {  // the shares are set afresh each call
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.for_each_piece(n, [&](int64_t p) { hits[static_cast<size_t>(p)].fetch_add(1); });
        for (int64_t p = 0; p < n; ++p)
          EXPECT_EQ(hits[static_cast<size_t>(p)].load(), 1) << threads << " threads, n=" << n;
      }
    }
  }
}

// A thread held up in a piece (as one descheduled on a shared machine) leaves the rest of that
// share to the others: the piece that holds it waits for the share's remaining pieces, which only
// another thread can run (a thread that took them in turn would never get there).
TEST(ThreadPool, ForEachPieceLeavesAHeldUpThreadsShareToTheOthers) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    constexpr int64_t kPieces = 60;
    const int64_t held = kPieces * (threads - 1) / threads;  // the last share's first piece
    std::atomic<int64_t> rest_done{0};
    bool all_done = false;
    pool.for_each_piece(kPieces, [&](int64_t p) {
      if (p > held) rest_done.fetch_add(1);
      if (p != held) return;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (rest_done.load() < kPieces - held - 1 && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      all_done = rest_done.load() == kPieces - held - 1;
    });
    EXPECT_TRUE(all_done) << threads << " threads";
  }
}

// The first phase runs each call once and is done, everything it wrote visible, before any
// piece starts; a thread held up in the first phase leaves the rest of it to the others.
TEST(ThreadPool, ForEachPieceRunsTheFirstPhaseBeforeEveryPiece) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n_first : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{64}}) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{200}}) {
        std::vector<int64_t> written(static_cast<size_t>(n_first), 0);  // plain writes
        std::vector<std::atomic<int>> first_hits(static_cast<size_t>(n_first));
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<bool> saw_all{true};
        pool.for_each_piece(
            n_first,
            [&](int64_t i) {
              first_hits[static_cast<size_t>(i)].fetch_add(1);
              written[static_cast<size_t>(i)] = i + 1;
            },
            n,
            [&](int64_t p) {
              hits[static_cast<size_t>(p)].fetch_add(1);
              for (int64_t i = 0; i < n_first; ++i)
                if (written[static_cast<size_t>(i)] != i + 1) saw_all = false;
            });
        for (int64_t i = 0; i < n_first; ++i)
          EXPECT_EQ(first_hits[static_cast<size_t>(i)].load(), 1) << threads << " threads";
        for (int64_t p = 0; p < n; ++p)
          EXPECT_EQ(hits[static_cast<size_t>(p)].load(), 1) << threads << " threads";
        EXPECT_TRUE(saw_all.load()) << threads << " threads, " << n_first << " first";
      }
    }
  }
  // Call 0 holds its thread until the other 9 are done, which only another thread can do.
  ThreadPool pool(2);
  std::atomic<int64_t> rest_done{0};
  bool all_done = false;
  pool.for_each_piece(
      10,
      [&](int64_t i) {
        if (i != 0) {
          rest_done.fetch_add(1);
          return;
        }
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (rest_done.load() < 9 && std::chrono::steady_clock::now() < give_up)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        all_done = rest_done.load() == 9;
      },
      4, [](int64_t) {});
  EXPECT_TRUE(all_done);
}

TEST(ThreadPool, RunsManyJobsBackToBack) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 5000; ++job)
    pool.run([&](int index, int count) {
      EXPECT_EQ(count, 3);
      total.fetch_add(index + 1);
    });
  EXPECT_EQ(total.load(), 5000 * 6);
}

TEST(Fp16, KnownValuesAndRoundTrip) {
  EXPECT_EQ(f32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_fp16(1e6f), 0x7C00);  // overflow to infinity
  EXPECT_FLOAT_EQ(fp16_to_f32(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(fp16_to_f32(0x0001), 5.960464477539063e-08f);  // smallest subnormal
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7E00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0) continue;  // NaNs
    EXPECT_EQ(f32_to_fp16(fp16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
  // Round to nearest even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(f32_to_fp16(1.0f + 1.0f / 2048.0f), 0x3C00);
  EXPECT_EQ(f32_to_fp16(1.0f + 3.0f / 2048.0f), 0x3C02);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie -> even
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

Result<int> parse_positive(int v) {
  if (v <= 0) return make_error("value must be positive, got " + std::to_string(v));
  return v;
}

Result<int> doubled(int v) {
  VESPER_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

TEST(Result, PropagatesErrorsAndValues) {
  EXPECT_EQ(*doubled(4), 8);
  auto r = doubled(-1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "value must be positive, got -1");
}

TEST(MappedFile, MapsAFileAndNamesMissingOnes) {
  auto f = MappedFile::open("../shared/models/stories260K.gguf");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->size(), 1185376u);
  EXPECT_EQ(f->data()[0], 'G');
  auto missing = MappedFile::open("no/such/file.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no/such/file.gguf"), std::string::npos);
  auto dir = MappedFile::open("../shared/models");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.error().message.find("not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace vesper
