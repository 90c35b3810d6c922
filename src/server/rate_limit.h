// Token-bucket rate limiting per client key (API key identity, JWT subject, or peer address).
// Each key gets `burst` tokens, refilled at `rate` per second; a request takes one token.
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>

namespace glms::server {

class RateLimiter {
 public:
  // rate <= 0 disables limiting. burst < 1 is treated as max(1, rate).
  RateLimiter(double rate, double burst);
  bool enabled() const { return rate_ > 0; }
  // 0 when the request may proceed (a token was taken); otherwise the seconds until a token is
  // available (for Retry-After). `now` is a monotonic time in seconds.
  double acquire(const std::string& key, double now);
  size_t tracked_keys() const;

 private:
  struct Bucket {
    double tokens = 0;
    double updated = 0;
  };
  double rate_ = 0;
  double burst_ = 1;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_;
  double last_prune_ = 0;
};

}  // namespace glms::server
