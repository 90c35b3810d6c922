// Open-loop arrival schedules. Inter-arrival gaps follow a gamma distribution with shape
// `burstiness` and mean 1/rate, as vLLM's bench does: burstiness 1 is a Poisson process,
// smaller values are burstier (gap coefficient of variation 1/sqrt(burstiness)), larger ones
// more regular. The first request is sent at t = 0, request i after i gaps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace glms::bench {

struct ArrivalSpec {
  double rate = 0;        // requests per second; <= 0 or infinity: everything at t = 0
  double burstiness = 1;  // gamma shape, > 0
  uint64_t seed = 0;
};

// splitmix64: a generator seed from a user seed, so that nearby seeds (0, 1, 2, ...) give
// unrelated states (mt19937_64 seeded directly with neighbouring integers gives visibly
// correlated first draws).
uint64_t mix_seed(uint64_t seed);

// Send times in seconds from the start of the run, non-decreasing, `count` of them.
std::vector<double> arrival_times(const ArrivalSpec& spec, size_t count);
// Send times up to (excluding) `duration` seconds; at most `max_count` of them.
std::vector<double> arrival_times_for(const ArrivalSpec& spec, double duration, size_t max_count);

}  // namespace glms::bench
