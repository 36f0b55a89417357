// Arrival times: seeded, Poisson at the asked mean rate, gamma burstiness, infinite rate.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "client/arrivals.h"

namespace vesper::client {
namespace {

struct GapStats {
  double mean = 0;
  double cv = 0;  // standard deviation / mean
};

GapStats gap_stats(const std::vector<double>& t) {
  const double n = static_cast<double>(t.size() - 1);
  GapStats s;
  s.mean = (t.back() - t.front()) / n;
  double sq = 0;
  for (size_t i = 1; i < t.size(); ++i)
    sq += (t[i] - t[i - 1] - s.mean) * (t[i] - t[i - 1] - s.mean);
  s.cv = std::sqrt(sq / n) / s.mean;
  return s;
}

TEST(ArrivalOffsets, SameSeedSameTimesOtherSeedOtherTimes) {
  EXPECT_EQ(arrival_offsets(100, 8.0, 1.0, 42), arrival_offsets(100, 8.0, 1.0, 42));
  EXPECT_NE(arrival_offsets(100, 8.0, 1.0, 42), arrival_offsets(100, 8.0, 1.0, 43));
}

TEST(ArrivalOffsets, StartsAtZeroAndNeverGoesBack) {
  const auto t = arrival_offsets(1000, 8.0, 1.0, 1);
  ASSERT_EQ(t.size(), 1000u);
  EXPECT_EQ(t[0], 0.0);
  for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i], t[i - 1]);
}

TEST(ArrivalOffsets, PoissonAtTheAskedMeanRate) {
  for (uint64_t seed : {0u, 1u, 2u}) {
    SCOPED_TRACE(std::string("seed ") + std::to_string(seed));
    const auto t = arrival_offsets(40001, 8.0, 1.0, seed);
    const GapStats s = gap_stats(t);
    // 40000 exponential gaps: the sample mean is within 1.5% of 1/8 s (3 standard errors), and
    // an exponential distribution's standard deviation equals its mean.
    EXPECT_NEAR(s.mean, 0.125, 0.125 * 0.015);
    EXPECT_NEAR(s.cv, 1.0, 0.03);
  }
}

TEST(ArrivalOffsets, BurstinessIsTheGammaShape) {
  const uint64_t seed = 7;
  SCOPED_TRACE(std::string("seed ") + std::to_string(seed));
  // Shape k: mean unchanged, coefficient of variation 1/sqrt(k).
  const GapStats regular = gap_stats(arrival_offsets(40001, 4.0, 4.0, seed));
  EXPECT_NEAR(regular.mean, 0.25, 0.25 * 0.015);
  EXPECT_NEAR(regular.cv, 0.5, 0.02);
  const GapStats bursty = gap_stats(arrival_offsets(40001, 4.0, 0.25, seed));
  EXPECT_NEAR(bursty.mean, 0.25, 0.25 * 0.05);
  EXPECT_NEAR(bursty.cv, 2.0, 0.1);
}

TEST(ArrivalOffsets, InfiniteRateSendsAllAtOnce) {
  const auto t = arrival_offsets(50, std::numeric_limits<double>::infinity(), 1.0, 3);
  ASSERT_EQ(t.size(), 50u);
  for (double x : t) EXPECT_EQ(x, 0.0);
}

}  // namespace
}  // namespace vesper::client
