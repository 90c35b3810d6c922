// Prometheus metrics in the text exposition format (version 0.0.4), named after vLLM's with the
// prefix "glmserve:". Counters and histograms are updated lock-free from any thread; gauges
// and engine counters are read from the backend when /metrics is scraped.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "server/backend.h"

namespace glms::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines (without HELP/TYPE) for metric `name`.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_.load(); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // non-cumulative, one per bound + Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

class ServerMetrics {
 public:
  ServerMetrics(std::string model_name);

  Histogram time_to_first_token;
  Histogram inter_token_latency;
  Histogram e2e_request_latency;
  Histogram request_prompt_tokens;
  Histogram request_generation_tokens;
  // vLLM's request phases (engine::RequestOutput of a finished request).
  Histogram request_queue_time;
  Histogram request_prefill_time;
  Histogram request_decode_time;
  Histogram request_inference_time;
  Histogram request_time_per_output_token;

  void count_finished(const std::string& finish_reason);  // request_success_total
  // http_requests_total{handler, method, status}: `handler` a served path or "other", "" (with
  // `method` "") for answers given before the request was read (413, 431, 400).
  void count_http(int status, const std::string& handler, const std::string& method);
  void observe_request_phases(const engine::RequestOutput& finished);

  // The whole exposition text: server metrics, engine gauges/counters from `stats`, and
  // process metrics (resident memory, CPU seconds, start time, open fds). With
  // `also_vllm_names`, every glmserve: metric a second time as vllm: (existing dashboards).
  std::string render(const BackendStats& stats, bool also_vllm_names = false) const;

 private:
  std::string render_prefixed(const BackendStats& stats) const;  // the glmserve: metrics
  std::string labels_;  // model_name="..."
  mutable std::mutex mu_;
  std::map<std::string, int64_t> finished_;
  std::map<std::tuple<std::string, std::string, int>, int64_t> http_;  // (handler, method, status)
};

// Escapes a label value (backslash, double quote, newline).
std::string escape_label(const std::string& value);

}  // namespace glms::server
