// /metrics text: names, types and histogram shape, checked by a strict format validator.
#include <gtest/gtest.h>

#include "prom_validator.h"
#include "server/metrics.h"

using namespace glms::server;
using glms::test::PromSample;
using glms::test::validate_prometheus;

namespace {
double find(const std::vector<PromSample>& samples, const std::string& name,
            const std::map<std::string, std::string>& labels = {}) {
  for (const PromSample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels)
      if (!s.labels.count(k) || s.labels.at(k) != v) match = false;
    if (match) return s.value;
  }
  return -1;
}
}  // namespace

TEST(Metrics, ExpositionIsValidAndComplete) {
  ServerMetrics m("glm5-\"tiny\"\\code");
  m.time_to_first_token.observe(0.03);
  m.time_to_first_token.observe(3.0);
  m.inter_token_latency.observe(0.02);
  m.e2e_request_latency.observe(1.2);
  m.count_finished("stop");
  m.count_finished("length");
  m.count_finished("length");
  m.count_http(200, "/v1/completions", "POST");
  m.count_http(429, "/v1/completions", "POST");
  m.count_http(413, "", "");
  BackendStats s;
  s.num_running = 2;
  s.num_waiting = 3;
  s.kv_cache_usage = 0.25;
  s.prefix_cache_queries = 100;
  s.prefix_cache_hits = 60;
  s.num_preemptions = 1;
  s.prompt_tokens_total = 11;
  s.generation_tokens_total = 5;
  const std::string text = m.render(s);
  std::vector<PromSample> samples;
  ASSERT_EQ(validate_prometheus(text, &samples), "") << text;
  EXPECT_EQ(find(samples, "glmserve:num_requests_running"), 2);
  EXPECT_EQ(find(samples, "glmserve:num_requests_waiting"), 3);
  EXPECT_EQ(find(samples, "glmserve:kv_cache_usage_perc"), 0.25);
  EXPECT_EQ(find(samples, "glmserve:prefix_cache_queries_total"), 100);
  EXPECT_EQ(find(samples, "glmserve:prefix_cache_hits_total"), 60);
  EXPECT_EQ(find(samples, "glmserve:num_preemptions_total"), 1);
  EXPECT_EQ(find(samples, "glmserve:prompt_tokens_total"), 11);
  EXPECT_EQ(find(samples, "glmserve:generation_tokens_total"), 5);
  EXPECT_EQ(find(samples, "glmserve:request_success_total", {{"finished_reason", "length"}}), 2);
  EXPECT_EQ(find(samples, "glmserve:request_success_total", {{"finished_reason", "abort"}}), 0);
  EXPECT_EQ(find(samples, "glmserve:time_to_first_token_seconds_count"), 2);
  EXPECT_EQ(find(samples, "glmserve:time_to_first_token_seconds_bucket", {{"le", "0.04"}}), 1);
  EXPECT_EQ(find(samples, "glmserve:time_to_first_token_seconds_bucket", {{"le", "+Inf"}}), 2);
  EXPECT_NEAR(find(samples, "glmserve:time_to_first_token_seconds_sum"), 3.03, 1e-9);
  EXPECT_EQ(find(samples, "glmserve:http_requests_total",
                 {{"status", "429"}, {"handler", "/v1/completions"}, {"method", "POST"}}),
            1);
  EXPECT_EQ(find(samples, "glmserve:http_requests_total", {{"status", "413"}}), 1);
  EXPECT_GT(find(samples, "process_resident_memory_bytes"), 0);
  EXPECT_GE(find(samples, "process_cpu_seconds_total"), 0);
  EXPECT_GT(find(samples, "process_start_time_seconds"), 1e9);
  // The label value round-trips through the escaping.
  EXPECT_EQ(samples[0].labels.at("model_name"), "glm5-\"tiny\"\\code");
  EXPECT_NE(text.find("# TYPE glmserve:e2e_request_latency_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE glmserve:prompt_tokens_total counter\n"), std::string::npos);
}

TEST(Metrics, SpeculativeDecodingCountersWhenOn) {
  ServerMetrics m("tiny");
  BackendStats s;
  std::vector<PromSample> samples;
  ASSERT_EQ(validate_prometheus(m.render(s), &samples), "");
  EXPECT_EQ(find(samples, "glmserve:spec_decode_num_draft_tokens_total"), -1) << "absent without speculation";
  s.spec_drafts = 10;
  s.spec_draft_tokens = 30;
  s.spec_accepted_tokens = 17;
  s.spec_accepted_per_position = {9, 6, 2};
  const std::string text = m.render(s);
  ASSERT_EQ(validate_prometheus(text, &samples), "") << text;
  EXPECT_EQ(find(samples, "glmserve:spec_decode_num_drafts_total"), 10);
  EXPECT_EQ(find(samples, "glmserve:spec_decode_num_draft_tokens_total"), 30);
  EXPECT_EQ(find(samples, "glmserve:spec_decode_num_accepted_tokens_total"), 17);
  EXPECT_EQ(find(samples, "glmserve:spec_decode_num_accepted_tokens_per_pos", {{"position", "1"}}), 6);
  EXPECT_EQ(find(samples, "glmserve:spec_decode_num_accepted_tokens_per_pos", {{"position", "2"}}), 2);
}

TEST(Metrics, ValidatorRejectsBrokenText) {
  EXPECT_NE(validate_prometheus("a 1"), "");                                     // no final newline
  EXPECT_NE(validate_prometheus("a{b=\"x} 1\n"), "");                            // unterminated value
  EXPECT_NE(validate_prometheus("a{b=\"\\q\"} 1\n"), "");                        // bad escape
  EXPECT_NE(validate_prometheus("1a 1\n"), "");                                  // bad name
  EXPECT_NE(validate_prometheus("a one\n"), "");                                 // bad value
  EXPECT_NE(validate_prometheus("a 1\na 2\n"), "");                              // duplicate series
  EXPECT_NE(validate_prometheus("a 1\nb 1\na{x=\"1\"} 1\n"), "");                // not contiguous
  EXPECT_NE(validate_prometheus("# TYPE a counter\n# TYPE a gauge\na 1\n"), "");  // two TYPEs
  EXPECT_NE(validate_prometheus("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
                                "h_sum 1\nh_count 1\n"), "");                      // not cumulative
  EXPECT_NE(validate_prometheus("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"), "");  // no +Inf
  EXPECT_EQ(validate_prometheus("# HELP a x\n# TYPE a gauge\na{l=\"v\"} 1.5e3\nb -Inf\n"), "");
}

TEST(Metrics, HistogramBuckets) {
  Histogram h({1.0, 2.0});
  h.observe(0.5);
  h.observe(1.0);  // le is inclusive
  h.observe(1.5);
  h.observe(9.0);
  std::string out;
  h.render(out, "x", "");
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"2\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count 4\n"), std::string::npos) << out;
}

TEST(Metrics, VllmRequestPhasesIterationTokensCacheConfigAndNames) {
  ServerMetrics m("tiny");
  glms::engine::RequestOutput done;
  done.finished = true;
  done.completion_tokens = 11;
  done.queued_seconds = 0.2;
  done.prefill_seconds = 0.4;
  done.decode_seconds = 2.0;
  done.inference_seconds = 2.4;
  m.observe_request_phases(done);
  BackendStats s;
  s.iteration_token_buckets = {1, 8, 16};
  s.iteration_tokens = {3, 0, 2, 1};  // 3 steps of 1 token, 2 of 9-16, 1 above 16
  s.iteration_tokens_sum = 3 + 24 + 40;
  s.block_size = 16;
  s.num_blocks = 128;
  s.gpu_memory_utilization = 0.9;
  std::vector<PromSample> samples;
  const std::string text = m.render(s, /*also_vllm_names=*/true);
  ASSERT_EQ(validate_prometheus(text, &samples), "") << text;
  EXPECT_EQ(find(samples, "glmserve:request_queue_time_seconds_bucket", {{"le", "0.3"}}), 1);
  EXPECT_NEAR(find(samples, "glmserve:request_prefill_time_seconds_sum"), 0.4, 1e-12);
  EXPECT_NEAR(find(samples, "glmserve:request_decode_time_seconds_sum"), 2.0, 1e-12);
  EXPECT_EQ(find(samples, "glmserve:request_inference_time_seconds_count"), 1);
  EXPECT_NEAR(find(samples, "glmserve:time_per_output_token_seconds_sum"), 0.2, 1e-12);  // 2 s over 10 tokens
  EXPECT_EQ(find(samples, "glmserve:iteration_tokens_total_bucket", {{"le", "8"}}), 3);
  EXPECT_EQ(find(samples, "glmserve:iteration_tokens_total_bucket", {{"le", "16"}}), 5);
  EXPECT_EQ(find(samples, "glmserve:iteration_tokens_total_count"), 6);
  EXPECT_EQ(find(samples, "glmserve:cache_config_info", {{"block_size", "16"}, {"num_gpu_blocks", "128"}}), 1);
  // Each glmserve: metric once more as vllm:, and the process metrics once.
  EXPECT_EQ(find(samples, "vllm:iteration_tokens_total_count"), 6);
  EXPECT_EQ(find(samples, "vllm:num_requests_running"), 0);
  size_t process_lines = 0;
  for (const PromSample& p : samples) process_lines += p.name == "process_open_fds";
  EXPECT_EQ(process_lines, 1u);
  EXPECT_EQ(m.render(s).find("vllm:"), std::string::npos);
}

// Memory: each rank's weights and KV cache, each GPU's memory in use and in all (only where a
// GPU is read), and the cache's dtype in cache_config_info.
TEST(Metrics, MemoryOfEachRankAndGpu) {
  ServerMetrics m("tiny");
  BackendStats s;
  s.block_size = 16;
  s.cache_dtype = "fp8_e4m3";
  s.rank_memory = {{1000, 400}, {1200, 400}};
  std::vector<PromSample> samples;
  std::string text = m.render(s);
  ASSERT_EQ(validate_prometheus(text, &samples), "") << text;
  EXPECT_EQ(find(samples, "glmserve:model_weights_bytes", {{"rank", "1"}}), 1200);
  EXPECT_EQ(find(samples, "glmserve:kv_cache_bytes", {{"rank", "0"}}), 400);
  EXPECT_EQ(find(samples, "glmserve:cache_config_info", {{"cache_dtype", "fp8_e4m3"}}), 1);
  EXPECT_EQ(text.find("gpu_memory_used_bytes"), std::string::npos) << "no GPU read, no GPU metric";
  s.device_memory = {{0, 90, 141}, {1, 10, 141}};
  samples.clear();
  text = m.render(s);
  ASSERT_EQ(validate_prometheus(text, &samples), "") << text;
  EXPECT_EQ(find(samples, "glmserve:gpu_memory_used_bytes", {{"gpu", "0"}}), 90);
  EXPECT_EQ(find(samples, "glmserve:gpu_memory_total_bytes", {{"gpu", "1"}}), 141);
  s.rank_memory = {{0, 400}};  // the CPU: weights mapped from the checkpoint, not counted
  text = m.render(s);
  EXPECT_EQ(text.find("model_weights_bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("glmserve:kv_cache_bytes{model_name=\"tiny\",rank=\"0\"} 400"), std::string::npos) << text;
}
