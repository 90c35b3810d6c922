// A tiny OpenAI-style streaming server for bench tests (POSIX sockets, one thread per
// connection, HTTP/1.1 keep-alive, chunked SSE). POST answers stream `max_tokens` (or
// `max_completion_tokens`) one-token events, then a usage event and [DONE]; GET /metrics
// answers speculative-decoding counters; POST /flush_cache (SGLang's) is counted and answered
// 200 where served. Each POST's X-Request-Id is recorded. Failures can be injected.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace glms::bench::testing {

struct FakeServerOptions {
  int fail_every = 0;         // every k-th POST (1-based count) answers `fail_status`; 0: never
  int fail_status = 500;
  int token_delay_us = 1000;  // between token events
  bool send_usage = true;
  bool serves_flush_cache = true;  // POST /flush_cache: 200, else 404 (as vLLM without its dev mode)
};

class FakeServer {
 public:
  explicit FakeServer(FakeServerOptions options = {});
  ~FakeServer();
  int port() const { return port_; }
  int posts() const { return posts_.load(); }
  int max_active() const { return max_active_.load(); }
  int connections() const { return connections_.load(); }
  int flushes() const { return flushes_.load(); }
  // The POSTs in arrival order: "flush", or "request" (answered requests).
  std::vector<std::string> post_log() {
    std::lock_guard lock(mu_);
    return post_log_;
  }
  std::vector<std::string> request_ids() {
    std::lock_guard lock(mu_);
    return request_ids_;
  }

 private:
  void accept_loop();
  void serve(int fd);

  FakeServerOptions opt_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> posts_{0}, active_{0}, max_active_{0}, connections_{0}, flushes_{0};
  std::vector<std::string> request_ids_;  // guarded by mu_
  std::vector<std::string> post_log_;     // guarded by mu_
  std::atomic<long long> tokens_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
  std::vector<int> fds_;
};

}  // namespace glms::bench::testing
