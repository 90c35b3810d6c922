#include "server/stats_log.h"

#include <fmt/format.h>

#include <chrono>

#include "log/log.h"

namespace glms::server {

std::string engine_stats_line(const BackendStats& before, const BackendStats& now, double seconds) {
  const double dt = seconds > 0 ? seconds : 1.0;
  const double prompt = static_cast<double>(now.prompt_tokens_total - before.prompt_tokens_total) / dt;
  const double generation = static_cast<double>(now.generation_tokens_total - before.generation_tokens_total) / dt;
  const int64_t queries = now.prefix_cache_queries - before.prefix_cache_queries;
  const int64_t hits = now.prefix_cache_hits - before.prefix_cache_hits;
  std::string line = fmt::format(
      "Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, Running: {} reqs, "
      "Waiting: {} reqs, KV cache usage: {:.1f}%, Prefix cache hit rate: {:.1f}%",
      prompt, generation, now.num_running, now.num_waiting, now.kv_cache_usage * 100,
      queries > 0 ? 100.0 * static_cast<double>(hits) / static_cast<double>(queries) : 0.0);
  const int64_t drafts = now.spec_drafts - before.spec_drafts;
  if (drafts > 0)
    line += fmt::format(", Spec acceptance length: {:.2f}",
                        1.0 + static_cast<double>(now.spec_accepted_tokens - before.spec_accepted_tokens) /
                                  static_cast<double>(drafts));
  if (now.num_preemptions > before.num_preemptions)
    line += fmt::format(", Preemptions: {}", now.num_preemptions - before.num_preemptions);
  return line;
}

StatsLogger::StatsLogger(const Backend& backend, double interval_seconds)
    : backend_(backend), interval_(interval_seconds), thread_([this] { run(); }) {}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StatsLogger::run() {
  using Clock = std::chrono::steady_clock;
  BackendStats before = backend_.stats();
  Clock::time_point at = Clock::now();
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::duration<double>(interval_), [this] { return stop_; })) {
    const BackendStats now = backend_.stats();
    const Clock::time_point t = Clock::now();
    const bool active = now.num_running > 0 || now.num_waiting > 0 ||
                        now.generation_tokens_total != before.generation_tokens_total ||
                        now.prompt_tokens_total != before.prompt_tokens_total;
    if (active) log::info(engine_stats_line(before, now, std::chrono::duration<double>(t - at).count()));
    before = now;
    at = t;
  }
}

}  // namespace glms::server
