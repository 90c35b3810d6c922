// Submits a request to an engine and collects its outputs, for the engine tests.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <mutex>
#include <random>
#include <vector>

#include "engine/engine.h"

namespace glms::testing {

// `count` token ids uniform in [3, vocab): the random test models' ids 1 and 2 are EOS.
inline std::vector<int32_t> prompt_tokens(int count, int vocab, uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, vocab - 1);
  std::vector<int32_t> tokens(count);
  for (auto& t : tokens) t = dist(rng);
  return tokens;
}

// A greedy request for `max_tokens` tokens past EOS.
inline engine::RequestParams greedy_request(std::vector<int32_t> prompt, int max_tokens) {
  engine::RequestParams params;
  params.prompt_ids = std::move(prompt);
  params.max_tokens = max_tokens;
  params.sampling.temperature = 0.0f;
  params.ignore_eos = true;
  return params;
}

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

// Submits `params` and cancels the request from its own output callback (as the server does on a
// stop string) once `outputs` outputs with new tokens have come; returns the finishing output.
inline engine::RequestOutput cancel_from_callback(engine::Engine& engine, engine::RequestParams params, int outputs) {
  std::promise<engine::RequestOutput> finished;
  std::atomic<uint64_t> id{0};
  std::atomic<int> seen{0};
  id = engine.submit(std::move(params), [&](const engine::RequestOutput& out) {
    if (!out.new_tokens.empty() && ++seen == outputs) {
      while (id == 0) std::this_thread::yield();
      engine.cancel(id);
    }
    if (out.finished) finished.set_value(out);
  });
  return finished.get_future().get();
}

}  // namespace glms::testing
