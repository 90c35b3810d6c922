#include "bench/resilience.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace glms::bench {

double RetryPolicy::delay(int attempt) const {
  if (attempt < 1) return 0;
  return std::min(max_s, base_s * std::ldexp(1.0, std::min(attempt - 1, 60)));
}

CircuitBreaker::CircuitBreaker(int threshold, double open_s) : threshold_(threshold), open_s_(open_s) {}

bool CircuitBreaker::allow(double now) {
  if (!enabled() || open_until_ < 0) return true;
  if (now < open_until_) return false;
  if (trial_in_flight_) return false;
  trial_in_flight_ = true;
  return true;
}

void CircuitBreaker::record(bool success, double now) {
  if (!enabled()) return;
  const bool was_trial = trial_in_flight_;
  trial_in_flight_ = false;
  if (success) {
    consecutive_ = 0;
    open_until_ = -1;
    return;
  }
  ++consecutive_;
  if (was_trial || (open_until_ < 0 && consecutive_ >= threshold_)) {
    open_until_ = now + open_s_;
    ++opened_;
  }
}

CircuitBreaker parse_circuit_breaker(const std::string& spec) {
  const size_t colon = spec.find(':');
  char* end = nullptr;
  const long k = std::strtol(spec.c_str(), &end, 10);
  const bool k_ok = colon != std::string::npos && end == spec.c_str() + colon && k >= 1;
  double t = 0;
  bool t_ok = false;
  if (k_ok) {
    const char* ts = spec.c_str() + colon + 1;
    t = std::strtod(ts, &end);
    t_ok = end != ts && *end == '\0' && t > 0;
  }
  if (!k_ok || !t_ok)
    fail("--circuit-breaker: expected K:T (open after K consecutive failures for T seconds), e.g. 5:30; got '" +
         spec + "'");
  return CircuitBreaker(static_cast<int>(k), t);
}

}  // namespace glms::bench
