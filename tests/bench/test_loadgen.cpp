// The HTTP/SSE load generator against an in-test fake server: closed and open loop, hundreds
// of concurrent streams, failures counted with their errors, retries, the circuit breaker, and
// a whole `run_bench` writing its files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/loadgen.h"
#include "core/error.h"
#include "fake_server.h"

using namespace glms::bench;
using glms::bench::testing::FakeServer;
using glms::bench::testing::FakeServerOptions;

namespace {

ClientOptions client_for(int port) {
  ClientOptions c;
  c.endpoint = parse_base_url("http://127.0.0.1:" + std::to_string(port));
  c.timeout_s = 30;
  return c;
}

std::vector<RequestTemplate> templates(size_t n, int out) {
  std::vector<RequestTemplate> t;
  for (size_t i = 0; i < n; ++i)
    t.push_back({"{\"model\":\"m\",\"prompt\":[1,2,3,4],\"max_tokens\":" + std::to_string(out) + ",\"stream\":true}", 4, out});
  return t;
}

size_t failures(const LevelResult& r) {
  size_t n = 0;
  for (const auto& rec : r.records) n += !rec.success;
  return n;
}

}  // namespace

TEST(BaseUrl, Parses) {
  Endpoint e = parse_base_url("http://localhost:8000/");
  EXPECT_EQ(e.host, "localhost");
  EXPECT_EQ(e.port, "8000");
  EXPECT_EQ(e.base_path, "");
  e = parse_base_url("http://10.0.0.1/proxy/");
  EXPECT_EQ(e.port, "80");
  EXPECT_EQ(e.base_path, "/proxy");
  e = parse_base_url("http://[::1]:9000");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, "9000");
  EXPECT_THROW(parse_base_url("https://x"), glms::Error);
  EXPECT_THROW(parse_base_url("localhost:8000"), glms::Error);
  EXPECT_THROW(parse_base_url("http://h:p"), glms::Error);
}

TEST(LoadGen, ClosedLoopKeepsTheConcurrencyAndTimesTokens) {
  FakeServer server;
  CircuitBreaker off;
  LoadSpec load;
  load.max_concurrency = 4;
  load.num_requests = 20;
  int progress_calls = 0;
  const LevelResult r = run_level(client_for(server.port()), load, templates(5, 8), off,
                                  [&](const Progress&) { ++progress_calls; }, 0.01);
  ASSERT_EQ(r.records.size(), 20u);
  EXPECT_EQ(failures(r), 0u);
  EXPECT_EQ(server.max_active(), 4);
  EXPECT_LT(server.connections(), 20) << "keep-alive connections are reused";
  EXPECT_GE(progress_calls, 1);
  for (const auto& rec : r.records) {
    EXPECT_TRUE(rec.success) << rec.error;
    EXPECT_EQ(rec.attempts, 1);
    EXPECT_EQ(rec.completion_tokens, 8);
    EXPECT_EQ(rec.cached_tokens, 2);
    EXPECT_EQ(rec.token_events, 8);
    EXPECT_EQ(rec.itl_s.size(), 7u);
    EXPECT_GT(rec.ttft_s, 0);
    EXPECT_GE(rec.end_s - rec.start_s, rec.ttft_s);
  }
  EXPECT_GT(r.duration_s, 0);
}

TEST(LoadGen, OpenLoopFollowsTheSchedule) {
  FakeServer server;
  CircuitBreaker off;
  LoadSpec load;
  load.request_rate = 40;
  load.num_requests = 30;
  load.seed = 5;
  const LevelResult r = run_level(client_for(server.port()), load, templates(30, 4), off);
  ASSERT_EQ(r.records.size(), 30u);
  EXPECT_EQ(failures(r), 0u);
  for (const auto& rec : r.records) {
    EXPECT_GE(rec.start_s + 1e-3, rec.scheduled_s);
    EXPECT_LT(rec.start_s - rec.scheduled_s, 0.25) << "sent late";
  }
  EXPECT_GT(r.records.back().scheduled_s, 0.2);  // 30 requests at 40/s span most of a second
}

TEST(LoadGen, HundredsOfConcurrentStreams) {
  FakeServerOptions o;
  o.token_delay_us = 20000;
  FakeServer server(o);
  CircuitBreaker off;
  LoadSpec load;
  load.max_concurrency = 300;
  load.num_requests = 300;
  const LevelResult r = run_level(client_for(server.port()), load, templates(300, 6), off);
  ASSERT_EQ(r.records.size(), 300u);
  EXPECT_EQ(failures(r), 0u) << r.records[0].error;
  EXPECT_GE(server.max_active(), 256);
}

TEST(LoadGen, FailuresAreCountedWithTheirErrors) {
  FakeServerOptions o;
  o.fail_every = 3;
  FakeServer server(o);
  CircuitBreaker off;
  LoadSpec load;
  load.max_concurrency = 1;
  load.num_requests = 12;
  const LevelResult r = run_level(client_for(server.port()), load, templates(12, 3), off);
  ASSERT_EQ(r.records.size(), 12u);
  EXPECT_EQ(failures(r), 4u);
  for (const auto& rec : r.records)
    if (!rec.success) {
      EXPECT_EQ(rec.error, "HTTP 500: injected failure");
      EXPECT_EQ(rec.http_status, 500);
    }
  const LevelMetrics m = compute_metrics(r, std::nullopt, {}, {});
  EXPECT_EQ(m.completed + m.failed, 12u);
  EXPECT_EQ(m.errors.at("HTTP 500: injected failure"), 4u);
}

TEST(LoadGen, RetriesWithBackoffRecover) {
  FakeServerOptions o;
  o.fail_every = 3;
  FakeServer server(o);
  CircuitBreaker off;
  ClientOptions c = client_for(server.port());
  c.retry = {2, 0.01, 0.05};
  LoadSpec load;
  load.max_concurrency = 1;
  load.num_requests = 12;
  const LevelResult r = run_level(c, load, templates(12, 3), off);
  EXPECT_EQ(failures(r), 0u);
  size_t retried = 0;
  for (const auto& rec : r.records) retried += rec.attempts > 1;
  EXPECT_GE(retried, 3u);
  EXPECT_EQ(server.posts(), 12 + static_cast<int>(retried));
}

TEST(LoadGen, CircuitBreakerFailsFastAndIsCounted) {
  FakeServerOptions o;
  o.fail_every = 1;
  o.fail_status = 503;
  FakeServer server(o);
  CircuitBreaker breaker = parse_circuit_breaker("2:60");
  LoadSpec load;
  load.max_concurrency = 1;
  load.num_requests = 10;
  const LevelResult r = run_level(client_for(server.port()), load, templates(10, 3), breaker);
  ASSERT_EQ(r.records.size(), 10u);
  EXPECT_EQ(failures(r), 10u);
  EXPECT_EQ(server.posts(), 2);
  EXPECT_EQ(r.breaker_opened, 1);
  EXPECT_EQ(r.records[0].error.rfind("HTTP 503", 0), 0u);
  EXPECT_EQ(r.records[5].error, "circuit breaker open: not sent");
  EXPECT_EQ(r.records[5].attempts, 0);
}

TEST(LoadGen, RefusedConnectionsAreFailuresNotDrops) {
  int port;
  { FakeServer gone; port = gone.port(); }
  CircuitBreaker off;
  LoadSpec load;
  load.num_requests = 5;
  const LevelResult r = run_level(client_for(port), load, templates(5, 3), off);
  ASSERT_EQ(r.records.size(), 5u);
  EXPECT_EQ(failures(r), 5u);
  EXPECT_EQ(r.records[0].error.rfind("connect:", 0), 0u) << r.records[0].error;
  EXPECT_THROW(http_get(client_for(port), "/metrics"), glms::Error);
}

TEST(LoadGen, DurationModeKeepsSending) {
  FakeServer server;
  CircuitBreaker off;
  LoadSpec load;
  load.max_concurrency = 2;
  load.duration_s = 0.3;
  const LevelResult r = run_level(client_for(server.port()), load, templates(3, 2), off);
  EXPECT_GT(r.records.size(), 6u);
  EXPECT_EQ(failures(r), 0u);
  for (const auto& rec : r.records) EXPECT_LT(rec.start_s, 0.3 + 1e-3);
}

TEST(RunBench, WritesTablesAndFilesAndAccountsForEveryRequest) {
  FakeServerOptions o;
  o.fail_every = 7;
  FakeServer server(o);
  BenchConfig cfg;
  cfg.base_url = "http://127.0.0.1:" + std::to_string(server.port());
  cfg.model = "tiny";
  cfg.tokenizer = GLMS_SOURCE_DIR "/models/glm5-tiny-code";
  cfg.workload.input_len = 32;
  cfg.workload.output_len = 5;
  cfg.workload.prefix_hit = 0.5;
  cfg.token_id_prompts = true;
  cfg.request_rates = {20, 40};
  cfg.concurrencies = {1, 4};
  cfg.num_prompts = 10;
  cfg.warmup = 1;
  cfg.slo = parse_slo("ttft:2000,tpot:50");
  cfg.cost = {8, 3.41, 1400};
  cfg.progress = false;
  const auto dir = std::filesystem::path(GLMS_BINARY_DIR) / "tests" / "bench" / "run_bench_out";
  std::filesystem::remove_all(dir);
  cfg.output_dir = dir.string();
  const BenchOutcome out = run_bench(cfg);
  ASSERT_EQ(out.levels.size(), 4u);
  EXPECT_EQ(out.scheduled, 40u);
  EXPECT_EQ(out.completed + out.failed, out.scheduled);
  EXPECT_GT(out.failed, 0u);
  for (const LevelMetrics& m : out.levels) {
    EXPECT_EQ(m.scheduled, 10u);
    EXPECT_EQ(m.completed + m.failed, m.scheduled);
    EXPECT_TRUE(m.accept_rate);  // the fake server's spec counters, differenced
    EXPECT_GT(m.output_throughput, 0);
  }
  EXPECT_NE(out.report.find("Offered RPS"), std::string::npos);
  EXPECT_NE(out.report.find("tok/s/user"), std::string::npos);
  EXPECT_NE(out.report.find("injected failure"), std::string::npos);
  for (const char* f : {"bench.json", "bench.csv", "requests.csv", "report.md", "report.html",
                        "throughput_vs_interactivity.svg", "ttft_vs_request_rate.svg", "ttft_vs_concurrency.svg"})
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
  // report.html: the tables as HTML tables and the three charts inline, nothing fetched.
  std::ifstream html_in(dir / "report.html");
  const std::string html((std::istreambuf_iterator<char>(html_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("<th>Offered RPS</th>"), std::string::npos);
  size_t svgs = 0;
  for (size_t at = 0; (at = html.find("<svg", at)) != std::string::npos; ++at) ++svgs;
  EXPECT_EQ(svgs, 3u);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  std::ifstream in(dir / "bench.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["totals"]["scheduled"], 40);
  EXPECT_EQ(j["levels"].size(), 4u);
  // requests.csv: one row per measured request.
  std::ifstream rc(dir / "requests.csv");
  size_t rows = 0;
  for (std::string line; std::getline(rc, line);) ++rows;
  EXPECT_EQ(rows, 41u);
}

// vLLM's --request-id-prefix: every request carries X-Request-Id, the prefix and its number in
// the run, counted across levels; without it, none.
TEST(LoadGen, RequestIdsCountAcrossLevels) {
  FakeServer server;
  ClientOptions client = client_for(server.port());
  client.request_id_prefix = "run7-";
  CircuitBreaker breaker;
  LoadSpec load;
  load.max_concurrency = 3;
  load.num_requests = 5;
  run_level(client, load, templates(5, 2), breaker);
  run_level(client, load, templates(5, 2), breaker);
  std::vector<std::string> ids = server.request_ids();
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> expected;
  for (int i = 0; i < 10; ++i) expected.push_back("run7-" + std::to_string(i));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(ids, expected);
  run_level(client_for(server.port()), load, templates(5, 2), breaker);
  EXPECT_EQ(server.request_ids().size(), 10u) << "no prefix, no header";
}

// SGLang's --flush-cache: the server's prefix cache is emptied in each level between its warm-up
// and its measured requests; a server that serves neither /flush_cache nor /reset_prefix_cache
// stops the run with what to do.
TEST(RunBench, FlushCacheBeforeEachLevel) {
  auto config = [](int port) {
    BenchConfig cfg;
    cfg.base_url = "http://127.0.0.1:" + std::to_string(port);
    cfg.model = "tiny";
    cfg.tokenizer = GLMS_SOURCE_DIR "/models/glm5-tiny-code";
    cfg.workload.input_len = 16;
    cfg.workload.output_len = 2;
    cfg.token_id_prompts = true;
    cfg.concurrencies = {1, 2};
    cfg.num_prompts = 2;
    cfg.warmup = 1;
    cfg.progress = false;
    cfg.scrape_metrics = false;
    cfg.flush_cache = true;
    return cfg;
  };
  FakeServer server;
  EXPECT_EQ(run_bench(config(server.port())).completed, 4u);
  EXPECT_EQ(server.flushes(), 2);
  EXPECT_EQ(server.post_log(), (std::vector<std::string>{"request", "flush", "request", "request", "request", "flush",
                                                          "request", "request"}))
      << "a level: its warm-up, the flush, its measured requests";
  FakeServerOptions without;
  without.serves_flush_cache = false;
  FakeServer vllm_like(without);
  try {
    run_bench(config(vllm_like.port()));
    ADD_FAILURE() << "a server without a cache reset ran";
  } catch (const glms::Error& e) {
    EXPECT_NE(std::string(e.what()).find("VLLM_SERVER_DEV_MODE"), std::string::npos) << e.what();
  }
  EXPECT_EQ(vllm_like.posts(), 1) << "the first level's warm-up, then nothing measured";
}
