// Statistics and arrival schedules against known values. Expected percentiles are numpy's
// default (linear) method, worked out by hand: position p/100*(n-1), linear interpolation.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "bench/arrivals.h"
#include "bench/stats.h"

using namespace glms::bench;

TEST(Stats, PercentilesMatchNumpyLinear) {
  // np.percentile([15, 20, 35, 40, 50], [0, 5, 30, 40, 50, 100]) = [15, 16, 23, 29, 35, 50]
  const std::vector<double> v = {50, 15, 40, 35, 20};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 15);
  EXPECT_DOUBLE_EQ(percentile(v, 5), 16);
  EXPECT_DOUBLE_EQ(percentile(v, 30), 23);
  EXPECT_DOUBLE_EQ(percentile(v, 40), 29);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 35);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 50);
  // np.percentile([1, 2, 3, 4], [25, 50, 90, 99]) = [1.75, 2.5, 3.7, 3.97]
  const std::vector<double> w = {4, 3, 2, 1};
  EXPECT_DOUBLE_EQ(percentile(w, 25), 1.75);
  EXPECT_DOUBLE_EQ(percentile(w, 50), 2.5);
  EXPECT_NEAR(percentile(w, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(w, 99), 3.97, 1e-12);
  // One value: every percentile is it; none: 0.
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{}, 50), 0);
}

TEST(Stats, SummaryOfOneToHundred) {
  std::vector<double> v(100);
  std::iota(v.begin(), v.end(), 1.0);  // 1..100
  const Summary s = summarize(v);
  EXPECT_EQ(s.count, 100u);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.median, 50.5);
  EXPECT_NEAR(s.p90, 90.1, 1e-9);   // pos 89.1
  EXPECT_NEAR(s.p95, 95.05, 1e-9);  // pos 94.05
  EXPECT_NEAR(s.p99, 99.01, 1e-9);  // pos 98.01
  EXPECT_NEAR(s.stdev, std::sqrt((100.0 * 100 - 1) / 12), 1e-9);  // np.std (ddof=0) of 1..100
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_EQ(summarize(std::vector<double>{}).count, 0u);
}

TEST(Stats, Histogram) {
  // np.histogram([0, 0.5, 1, 1.5, 2, 9.99, 10], bins=5, range=(0, 10)) -> [4, 1, 0, 0, 2]:
  // bins of width 2; the last one is closed, so 10 falls in [8, 10].
  const std::vector<double> v = {0, 0.5, 1, 1.5, 2, 9.99, 10};
  const Histogram h = histogram(v, 5, 0, 10);
  ASSERT_EQ(h.counts.size(), 5u);
  EXPECT_EQ(h.counts, (std::vector<size_t>{4, 1, 0, 0, 2}));
  EXPECT_DOUBLE_EQ(h.bin_width(), 2);
  // Out-of-range values are clipped into the end buckets; counts always sum to n.
  const Histogram c = histogram(std::vector<double>{-5, 3, 50}, 2, 0, 10);
  EXPECT_EQ(c.counts, (std::vector<size_t>{2, 1}));
  // Range from the data: np.histogram([1, 2, 3, 4], bins=3) -> [1, 1, 2].
  const Histogram d = histogram(std::vector<double>{1, 2, 3, 4}, 3);
  EXPECT_EQ(d.counts, (std::vector<size_t>{1, 1, 2}));
  EXPECT_DOUBLE_EQ(d.lo, 1);
  EXPECT_DOUBLE_EQ(d.hi, 4);
}

namespace {
std::vector<double> gaps(const std::vector<double>& t) {
  std::vector<double> g;
  for (size_t i = 1; i < t.size(); ++i) g.push_back(t[i] - t[i - 1]);
  return g;
}
}  // namespace

TEST(Arrivals, PoissonMeanRateAndSeeding) {
  const ArrivalSpec spec{2.4, 1.0, 42};
  const std::vector<double> t = arrival_times(spec, 20001);
  ASSERT_EQ(t.size(), 20001u);
  EXPECT_DOUBLE_EQ(t[0], 0);
  for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  const Summary g = summarize(gaps(t));
  EXPECT_NEAR(g.mean, 1 / 2.4, 0.02 / 2.4);        // mean rate within 2%
  EXPECT_NEAR(g.stdev / g.mean, 1.0, 0.03);         // exponential: CV 1
  EXPECT_EQ(arrival_times(spec, 100), arrival_times(spec, 100));  // same seed, same schedule
  EXPECT_NE(arrival_times(spec, 100), arrival_times({2.4, 1.0, 43}, 100));
}

TEST(Arrivals, BurstinessSetsTheSpreadNotTheRate) {
  for (double k : {0.25, 4.0}) {
    const Summary g = summarize(gaps(arrival_times({1.5, k, 7}, 40001)));
    EXPECT_NEAR(g.mean, 1 / 1.5, 0.03 / 1.5) << "burstiness " << k;
    EXPECT_NEAR(g.stdev / g.mean, 1 / std::sqrt(k), 0.05 / std::sqrt(k)) << "burstiness " << k;  // gamma CV
  }
}

TEST(Arrivals, InfiniteRateAndDuration) {
  const std::vector<double> t = arrival_times({0, 1, 1}, 5);
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
  const std::vector<double> d = arrival_times_for({10, 1, 3}, 60, 1'000'000);
  EXPECT_NEAR(static_cast<double>(d.size()), 600, 4 * std::sqrt(600.0));
  EXPECT_LT(d.back(), 60);
  EXPECT_EQ(arrival_times_for({10, 1, 3}, 60, 5).size(), 5u);
}

TEST(Arrivals, NeighbouringSeedsAreIndependent) {
  // Short schedules from seeds 0, 1, 2, ... (one per bench level) must each have the right mean
  // rate on average: 9 gaps of mean 1/20 s span 0.45 s.
  double sum = 0;
  for (uint64_t seed = 0; seed < 4000; ++seed) sum += arrival_times({20, 1, seed}, 10).back();
  EXPECT_NEAR(sum / 4000, 0.45, 0.012);  // 5 standard errors
}
