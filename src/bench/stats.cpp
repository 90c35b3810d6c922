#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace glms::bench {

double percentile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0;
  p = std::clamp(p, 0.0, 100.0);
  const double pos = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  // numpy computes a + (b - a) * t; same here so ties and equal neighbours stay exact.
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

double percentile(std::span<const double> values, double p) {
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  return percentile_sorted(v, p);
}

Summary summarize(std::span<const double> values) {
  Summary s;
  if (values.empty()) return s;
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  s.count = v.size();
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  s.stdev = std::sqrt(sq / static_cast<double>(v.size()));
  s.min = v.front();
  s.max = v.back();
  s.median = percentile_sorted(v, 50);
  s.p90 = percentile_sorted(v, 90);
  s.p95 = percentile_sorted(v, 95);
  s.p99 = percentile_sorted(v, 99);
  return s;
}

Histogram histogram(std::span<const double> values, size_t bins, double lo, double hi) {
  Histogram h;
  h.counts.assign(std::max<size_t>(bins, 1), 0);
  if (hi <= lo) {
    if (values.empty()) {
      lo = 0;
      hi = 1;
    } else {
      auto [mn, mx] = std::minmax_element(values.begin(), values.end());
      lo = *mn;
      hi = *mx > *mn ? *mx : *mn + 1;
      // Put the maximum inside the last bucket like np.histogram's closed last bin.
    }
  }
  h.lo = lo;
  h.hi = hi;
  const double width = h.bin_width();
  const size_t n = h.counts.size();
  for (double x : values) {
    size_t b = 0;
    if (x >= hi) b = n - 1;
    else if (x > lo) b = std::min(n - 1, static_cast<size_t>((x - lo) / width));
    ++h.counts[b];
  }
  return h;
}

}  // namespace glms::bench
