#include "server/rate_limit.h"

#include <algorithm>

namespace glms::server {

RateLimiter::RateLimiter(double rate, double burst) : rate_(rate), burst_(burst >= 1 ? burst : std::max(1.0, rate)) {}

double RateLimiter::acquire(const std::string& key, double now) {
  if (!enabled()) return 0.0;
  std::lock_guard lock(mu_);
  // Full buckets carry no information: drop them now and then so the map stays small.
  if (now - last_prune_ > 60.0 || buckets_.size() > 100000) {
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      if (it->second.tokens + (now - it->second.updated) * rate_ >= burst_) it = buckets_.erase(it);
      else ++it;
    }
    last_prune_ = now;
  }
  auto [it, inserted] = buckets_.try_emplace(key, Bucket{burst_, now});
  Bucket& b = it->second;
  b.tokens = std::min(burst_, b.tokens + std::max(0.0, now - b.updated) * rate_);
  b.updated = std::max(b.updated, now);
  if (b.tokens >= 1.0) {
    b.tokens -= 1.0;
    return 0.0;
  }
  return (1.0 - b.tokens) / rate_;
}

size_t RateLimiter::tracked_keys() const {
  std::lock_guard lock(mu_);
  return buckets_.size();
}

}  // namespace glms::server
