// What ranks that are threads of one process share to exchange data: a reusable barrier that a
// failing rank can abort (every rank waiting in it, or arriving later, gets glms::Error), and
// one published pointer per rank for the collective under way.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace glms::comm {

class RankBarrier {
 public:
  explicit RankBarrier(int size) : size_(size), published_(static_cast<size_t>(size), nullptr) {}
  int size() const { return size_; }

  // Blocks until all ranks have arrived; throws glms::Error once aborted.
  void arrive_and_wait();
  // Publishes `buffer` as `rank`'s and waits for every rank to have published (so that peers'
  // buffers may be read until the next arrive_and_wait).
  void publish(int rank, const void* buffer) {
    published_[rank] = buffer;  // read by peers only after the barrier
    arrive_and_wait();
  }
  const void* published(int rank) const { return published_[rank]; }
  const std::vector<const void*>& all_published() const { return published_; }

  void abort(const std::string& reason);
  void reset();  // usable again; only once no rank waits

 private:
  int size_;
  std::vector<const void*> published_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string abort_reason_;
};

}  // namespace glms::comm
