// Submits a request to an engine and collects its outputs, for the engine tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <vector>

#include "engine/engine.h"

namespace glms::testing {

struct Collected {
  std::vector<int32_t> tokens;
  engine::RequestOutput last;
};

// Submits and collects a request's outputs; get() waits for the finishing output.
class Pending {
 public:
  Pending(engine::Engine& engine, engine::RequestParams params) {
    id_ = engine.submit(std::move(params), [this](const engine::RequestOutput& out) {
      std::lock_guard lock(mutex_);
      for (const auto& token : out.new_tokens) result_.tokens.push_back(token.token);
      if (out.finished) {
        result_.last = out;
        done_.set_value();
      }
    });
  }
  Collected get() {
    EXPECT_EQ(done_.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
    std::lock_guard lock(mutex_);
    return result_;
  }
  uint64_t id() const { return id_; }

 private:
  std::mutex mutex_;
  std::promise<void> done_;
  Collected result_;
  uint64_t id_ = 0;
};

}  // namespace glms::testing
