// Order statistics for bench latencies. Percentiles use numpy's default method ("linear":
// position p/100 * (n-1) in the sorted data, linear interpolation between neighbours), so the
// numbers match `vllm bench serve` / `sglang.bench_serving`, which call np.percentile.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace glms::bench {

// p in [0, 100]. `sorted` must be ascending. Empty input gives 0 (nothing to report).
double percentile_sorted(std::span<const double> sorted, double p);
// Copies and sorts. Empty input gives 0.
double percentile(std::span<const double> values, double p);

// The figures every latency metric reports. All zero (and count 0) for empty input.
struct Summary {
  size_t count = 0;
  double mean = 0, stdev = 0;  // stdev: population (numpy's np.std default, ddof=0)
  double min = 0, max = 0;
  double median = 0, p90 = 0, p95 = 0, p99 = 0;
};
Summary summarize(std::span<const double> values);

// Fixed-width histogram over [lo, hi): `bins` buckets; values below lo go to the first bucket
// and values >= hi to the last (so counts always sum to the number of values), matching
// np.histogram on data clipped into range except that np.histogram's last bin is closed.
struct Histogram {
  double lo = 0, hi = 0;
  std::vector<size_t> counts;
  double bin_width() const { return counts.empty() ? 0 : (hi - lo) / static_cast<double>(counts.size()); }
};
// bins >= 1; when hi <= lo the range is taken from the data (min, max; a single value
// gives [v, v+1)).
Histogram histogram(std::span<const double> values, size_t bins, double lo = 0, double hi = 0);

}  // namespace glms::bench
