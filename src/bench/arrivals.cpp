#include "bench/arrivals.h"

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"

namespace glms::bench {

namespace {

class GapSource {
 public:
  explicit GapSource(const ArrivalSpec& spec) : rng_(mix_seed(spec.seed)), infinite_(!(spec.rate > 0) || std::isinf(spec.rate)) {
    if (!(spec.burstiness > 0)) fail("--burstiness must be > 0 (1 = Poisson arrivals)");
    if (!infinite_) gamma_ = std::gamma_distribution<double>(spec.burstiness, 1.0 / (spec.rate * spec.burstiness));
  }
  double next() { return infinite_ ? 0.0 : gamma_(rng_); }

 private:
  std::mt19937_64 rng_;
  bool infinite_;
  std::gamma_distribution<double> gamma_;
};

}  // namespace

uint64_t mix_seed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<double> arrival_times(const ArrivalSpec& spec, size_t count) {
  GapSource gaps(spec);
  std::vector<double> t;
  t.reserve(count);
  double now = 0;
  for (size_t i = 0; i < count; ++i) {
    t.push_back(now);
    now += gaps.next();
  }
  return t;
}

std::vector<double> arrival_times_for(const ArrivalSpec& spec, double duration, size_t max_count) {
  GapSource gaps(spec);
  std::vector<double> t;
  double now = 0;
  while (now < duration && t.size() < max_count) {
    t.push_back(now);
    now += gaps.next();
  }
  return t;
}

}  // namespace glms::bench
