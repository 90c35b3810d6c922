#include "runtime/worker.h"

#include "core/error.h"

namespace glms::runtime {

Worker::Worker() : thread_([this] { loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Worker::start(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    GLMS_CHECK(!busy_, "Worker::start while a job runs");
    job_ = std::move(job);
    busy_ = true;
    error_ = nullptr;
  }
  wake_.notify_all();
}

std::exception_ptr Worker::wait() {
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [&] { return !busy_; });
  return error_;
}

void Worker::loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || job_; });
    if (!job_) return;  // stopping with nothing in hand
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    busy_ = false;
    wake_.notify_all();
  }
}

}  // namespace glms::runtime
