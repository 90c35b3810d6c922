// One thread that runs what it is handed, one job at a time: a rank's worker. Everything a rank
// owns (its runner, its device's state) is made and used on this thread.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace glms::runtime {

class Worker {
 public:
  Worker();
  ~Worker();  // finishes the job in hand, then stops
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts `job` on the worker's thread (the previous one must have been waited for).
  void start(std::function<void()> job);
  // Waits for the job started last; returns what it threw (null when it finished).
  std::exception_ptr wait();

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> job_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace glms::runtime
