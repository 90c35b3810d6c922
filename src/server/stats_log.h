// The engine's state in the log every few seconds, as vLLM's engine logs it: prompt and
// generation throughput over the interval, running and waiting requests, KV cache use, the
// interval's prefix-cache hit rate and, with speculation, the acceptance length.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "server/backend.h"

namespace glms::server {

// The line for the interval between two snapshots `seconds` apart.
std::string engine_stats_line(const BackendStats& before, const BackendStats& now, double seconds);

// Writes engine_stats_line every `interval_seconds` while anything ran or waited in it.
class StatsLogger {
 public:
  StatsLogger(const Backend& backend, double interval_seconds);
  ~StatsLogger();  // stops the thread
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

 private:
  void run();
  const Backend& backend_;
  double interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace glms::server
