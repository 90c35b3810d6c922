// Test doubles for the API service: a scripted engine on its own thread, and a Responder that
// records what the service sends.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "server/backend.h"
#include "server/http_types.h"

namespace glms::test {

// Emits script(params) one token per output (on its worker thread), then finishes with "stop"
// (the script's last token is taken to be EOS) or "length" at max_tokens. cancel() ends a
// request with "abort" at once.
class FakeBackend final : public server::Backend {
 public:
  std::function<std::vector<int32_t>(const engine::RequestParams&)> script;
  bool last_is_eos = true;
  bool queue_full = false;
  int cached_tokens = 0;
  bool sampled_below_top = false;  // top_logprobs: tokens likelier than the sampled one, not it
  int max_len = 256;
  std::chrono::milliseconds delay{0};
  std::mutex mu;
  std::vector<engine::RequestParams> submitted;
  std::vector<uint64_t> cancelled;

  FakeBackend() : worker_([this] { run(); }) {}
  ~FakeBackend() override {
    {
      std::lock_guard lock(mu);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  uint64_t submit(engine::RequestParams params, engine::OutputCallback cb) override {
    std::lock_guard lock(mu);
    if (queue_full) throw engine::QueueFull{};
    const uint64_t id = ++next_id_;
    submitted.push_back(params);
    std::vector<int32_t> tokens = script ? script(params) : std::vector<int32_t>{};
    active_[id] = Req{std::move(params), std::move(cb), std::move(tokens), 0, false};
    cv_.notify_all();
    return id;
  }
  void cancel(uint64_t id) override {
    std::lock_guard lock(mu);
    cancelled.push_back(id);
    auto it = active_.find(id);
    if (it != active_.end()) it->second.cancel = true;
    cv_.notify_all();
  }
  server::BackendStats stats() const override {
    std::lock_guard lock(const_cast<std::mutex&>(mu));
    server::BackendStats s;
    s.num_running = static_cast<int>(active_.size());
    s.num_blocks = 100;
    s.num_free_blocks = 100 - 2 * s.num_running;
    s.kv_cache_usage = 0.02 * s.num_running;
    return s;
  }
  int max_model_len() const override { return max_len; }
  int vocab_size() const override { return 8192; }
  void drain(double) override {
    std::unique_lock lock(mu);
    idle_cv_.wait(lock, [this] { return active_.empty(); });
  }
  // As the engine: nothing while requests are in flight, else the cached blocks (then none).
  std::optional<int> reset_prefix_cache() override {
    std::lock_guard lock(mu);
    if (!active_.empty()) return std::nullopt;
    return std::exchange(cached_blocks, 0);
  }
  int cached_blocks = 0;
  size_t num_active() {
    std::lock_guard lock(mu);
    return active_.size();
  }
  std::vector<uint64_t> cancelled_ids() {
    std::lock_guard lock(mu);
    return cancelled;
  }

 private:
  struct Req {
    engine::RequestParams params;
    engine::OutputCallback cb;
    std::vector<int32_t> tokens;
    size_t next = 0;
    bool cancel = false;
  };

  void run() {
    std::unique_lock lock(mu);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !active_.empty(); });
      if (stop_) return;
      std::vector<std::pair<engine::OutputCallback, engine::RequestOutput>> outs;
      for (auto it = active_.begin(); it != active_.end();) {
        Req& r = it->second;
        engine::RequestOutput out;
        out.request_id = it->first;
        out.prompt_tokens = static_cast<int>(r.params.prompt_ids.size());
        out.cached_prompt_tokens = cached_tokens;
        if (r.cancel) {
          out.finished = true;
          out.finish_reason = "abort";
        } else if (r.next < r.tokens.size()) {
          engine::GeneratedToken g;
          g.token = r.tokens[r.next++];
          g.logprob = -0.5f;
          if (r.params.top_logprobs > 0)
            for (int k = 0; k < r.params.top_logprobs; ++k)
              g.top_logprobs.push_back(sampled_below_top ? engine::TokenLogprob{g.token + 1 + k, -0.1f - k}
                                                         : engine::TokenLogprob{g.token + k, -0.5f - k});
          out.new_tokens.push_back(g);
          const bool length = static_cast<int>(r.next) >= r.params.max_tokens;
          const bool eos = r.next == r.tokens.size() && last_is_eos;
          if (eos) out.finish_reason = "stop";
          else if (length || r.next == r.tokens.size()) out.finish_reason = "length";
          out.finished = !out.finish_reason.empty();
        } else {
          out.finished = true;
          out.finish_reason = "length";
        }
        out.completion_tokens = static_cast<int>(r.next);
        outs.emplace_back(r.cb, std::move(out));
        if (outs.back().second.finished) it = active_.erase(it);
        else ++it;
      }
      if (active_.empty()) idle_cv_.notify_all();
      lock.unlock();
      for (auto& [cb, out] : outs) cb(out);
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      lock.lock();
    }
  }

  std::map<uint64_t, Req> active_;
  uint64_t next_id_ = 0;
  bool stop_ = false;
  std::condition_variable cv_, idle_cv_;
  std::thread worker_;
};

class RecordingResponder final : public server::Responder {
 public:
  void reply(server::HttpResponse r) override {
    std::lock_guard lock(mu_);
    response = std::move(r);
    done_ = true;
    cv_.notify_all();
  }
  void begin_stream(server::HttpResponse head) override {
    std::lock_guard lock(mu_);
    response = std::move(head);
    streaming = true;
  }
  void write(std::string data) override {
    std::lock_guard lock(mu_);
    EXPECT_TRUE(streaming);
    EXPECT_FALSE(done_);
    body += data;
    ++writes;
    cv_.notify_all();
  }
  void end_stream() override {
    std::lock_guard lock(mu_);
    EXPECT_FALSE(done_);
    done_ = true;
    cv_.notify_all();
  }
  void on_disconnect(std::function<void()> callback) override {
    std::lock_guard lock(mu_);
    on_disconnect_ = std::move(callback);
  }
  void disconnect() {
    std::function<void()> cb;
    {
      std::lock_guard lock(mu_);
      cb = on_disconnect_;
    }
    if (cb) cb();
  }
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return done_; });
  }
  bool wait_writes(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return writes >= n; });
  }
  std::string stream_body() {
    std::lock_guard lock(mu_);
    return body;
  }

  server::HttpResponse response;
  bool streaming = false;
  std::string body;  // stream data
  int writes = 0;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::function<void()> on_disconnect_;
};

}  // namespace glms::test
