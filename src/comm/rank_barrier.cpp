#include "comm/rank_barrier.h"

#include "core/error.h"

namespace glms::comm {

void RankBarrier::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  if (!abort_reason_.empty()) fail("collective aborted: " + abort_reason_);
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    wake_.notify_all();
    return;
  }
  wake_.wait(lock, [&] { return generation_ != generation || !abort_reason_.empty(); });
  if (generation_ == generation) fail("collective aborted: " + abort_reason_);
}

void RankBarrier::abort(const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "a peer rank failed" : reason;
  wake_.notify_all();
}

void RankBarrier::reset() {
  std::lock_guard lock(mutex_);
  abort_reason_.clear();
  arrived_ = 0;
  ++generation_;
}

}  // namespace glms::comm
