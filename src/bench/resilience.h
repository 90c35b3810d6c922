// Client-side resilience for bench runs, both off by default: retries with exponential backoff
// and a circuit breaker. Times are seconds on any monotonic clock the caller chooses.
#pragma once

#include <string>

namespace glms::bench {

struct RetryPolicy {
  int retries = 0;       // extra attempts after the first; 0 = no retries
  double base_s = 0.5;   // delay before retry 1; retry k waits base * 2^(k-1)
  double max_s = 30;     // cap on one delay
  // Delay before retry `attempt` (1-based).
  double delay(int attempt) const;
};

// Closed: requests pass. After `threshold` consecutive failures it opens for `open_s` seconds
// and requests fail fast without being sent. Then it is half-open: one trial request passes;
// its success closes the breaker, its failure opens it again for another `open_s`.
class CircuitBreaker {
 public:
  CircuitBreaker() = default;  // disabled: always allows
  CircuitBreaker(int threshold, double open_s);
  bool enabled() const { return threshold_ > 0; }
  // Whether a request may be sent at `now`; a true answer in half-open state is the trial.
  bool allow(double now);
  void record(bool success, double now);
  int times_opened() const { return opened_; }

 private:
  int threshold_ = 0;
  double open_s_ = 0;
  int consecutive_ = 0;
  double open_until_ = -1;  // < 0: closed
  bool trial_in_flight_ = false;
  int opened_ = 0;
};

// Parses "K:T" (K consecutive failures, T seconds open), e.g. "5:30". Throws glms::Error.
CircuitBreaker parse_circuit_breaker(const std::string& spec);

}  // namespace glms::bench
