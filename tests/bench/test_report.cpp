// Metrics from synthetic request records, cost formulas, SLO/circuit-breaker parsing, the SSE
// and Prometheus parsers, and the well-formedness of the SVG, CSV and JSON outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "bench/metrics.h"
#include "bench/prom.h"
#include "bench/report.h"
#include "bench/resilience.h"
#include "bench/sse.h"
#include "bench/svg.h"
#include "core/error.h"

using namespace glms::bench;

namespace {

RequestRecord ok_record(double start, double ttft, double end, int out, int cached = -1) {
  RequestRecord r;
  r.success = true;
  r.attempts = 1;
  r.start_s = start;
  r.ttft_s = ttft;
  r.end_s = end;
  r.prompt_tokens = 100;
  r.completion_tokens = out;
  r.expected_output_tokens = out;
  r.cached_tokens = cached;
  r.has_usage = true;
  const double step = out > 1 ? (end - start - ttft) / (out - 1) : 0;
  for (int i = 1; i < out; ++i) r.itl_s.push_back(step);
  return r;
}

// A small XML well-formedness check: balanced tags, quoted attributes, escaped text.
bool well_formed_xml(const std::string& doc, std::string& why) {
  std::vector<std::string> stack;
  size_t i = doc.find("<svg");
  if (i == std::string::npos) return (why = "no <svg>", false);
  while (i < doc.size()) {
    const size_t lt = doc.find('<', i);
    const std::string text = doc.substr(i, (lt == std::string::npos ? doc.size() : lt) - i);
    if (text.find('>') != std::string::npos) return (why = "stray > in text: " + text, false);
    for (size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1))
      if (!std::regex_search(text.substr(a), std::regex("^&(amp|lt|gt|quot|apos);"))) return (why = "bad entity", false);
    if (lt == std::string::npos) break;
    const size_t gt = doc.find('>', lt);
    if (gt == std::string::npos) return (why = "unterminated tag", false);
    std::string tag = doc.substr(lt + 1, gt - lt - 1);
    i = gt + 1;
    if (tag.rfind("/", 0) == 0) {
      if (stack.empty() || stack.back() != tag.substr(1)) return (why = "mismatched </" + tag + ">", false);
      stack.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    static const std::regex attrs(R"(^[A-Za-z][\w:-]*(\s+[\w:-]+="[^"<]*")*\s*$)");
    if (!std::regex_match(tag, attrs)) return (why = "bad tag <" + tag + ">", false);
    if (!self_closing) stack.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
  }
  if (!stack.empty()) return (why = "unclosed <" + stack.back() + ">", false);
  return true;
}

size_t csv_columns(const std::string& line) {
  size_t n = 1;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) ++n;
  }
  return n;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    out.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

}  // namespace

TEST(Metrics, ThroughputLatencyGoodputAndCache) {
  LevelResult res;
  res.records.push_back(ok_record(0.0, 0.5, 2.5, 21, 60));   // TPOT 100 ms
  res.records.push_back(ok_record(1.0, 1.5, 3.5, 11, 40));   // TTFT 1500, TPOT 100
  res.records.push_back(ok_record(2.0, 3.0, 6.0, 41));       // TTFT 3000, TPOT 25 ms; no cached info
  RequestRecord bad;
  bad.attempts = 2;
  bad.error = "HTTP 503: overloaded";
  bad.start_s = 3;
  bad.end_s = 3.5;
  res.records.push_back(bad);
  res.duration_s = 6.0;
  const LevelMetrics m = compute_metrics(res, std::nullopt, parse_slo("ttft:2000,tpot:50"), CostSpec{});
  EXPECT_EQ(m.scheduled, 4u);
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(m.failed, 1u);
  EXPECT_EQ(m.completed + m.failed, m.scheduled);
  EXPECT_EQ(m.retried, 1u);
  EXPECT_EQ(m.errors.at("HTTP 503: overloaded"), 1u);
  EXPECT_DOUBLE_EQ(m.success_rate, 0.75);
  EXPECT_DOUBLE_EQ(m.request_throughput, 3 / 6.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 73 / 6.0);
  EXPECT_DOUBLE_EQ(m.input_throughput, 300 / 6.0);
  EXPECT_DOUBLE_EQ(m.total_throughput, 373 / 6.0);
  EXPECT_DOUBLE_EQ(m.ttft_ms.median, 1500);
  EXPECT_NEAR(m.ttft_ms.mean, 5000.0 / 3, 1e-9);
  EXPECT_NEAR(m.tpot_ms.median, 100, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p90, 1500 + (3000 - 1500) * 0.8, 1e-9);  // {500, 1500, 3000}: position 1.8
  EXPECT_NEAR(m.e2el_ms.p99, 2500 + (4000 - 2500) * 0.98, 1e-9);  // {2500, 2500, 4000}: position 1.98
  // Goodput: only requests with TTFT <= 2 s and TPOT <= 50 ms: none of the three (first has
  // TPOT 100, third TTFT 3 s).
  EXPECT_EQ(m.good, 0u);
  EXPECT_DOUBLE_EQ(m.goodput, 0);
  ASSERT_TRUE(m.cached_share);
  EXPECT_DOUBLE_EQ(*m.cached_share, 100.0 / 200);  // only the two requests reporting cached tokens
  const LevelMetrics loose = compute_metrics(res, std::nullopt, parse_slo("ttft:5000"), CostSpec{});
  EXPECT_EQ(loose.good, 3u);
  EXPECT_DOUBLE_EQ(loose.goodput, 3 / 6.0);
}

TEST(Metrics, SpeculativeAcceptanceFromServerCounters) {
  LevelResult res;
  res.records.push_back(ok_record(0, 0.1, 1.1, 101));  // 100 decode tokens
  res.duration_s = 1.1;
  MetricSums before = parse_prometheus(
      "glmserve:spec_decode_num_accepted_tokens_total 10\nglmserve:spec_decode_num_draft_tokens_total 20\n");
  MetricSums after = parse_prometheus(
      "glmserve:spec_decode_num_accepted_tokens_total 70\nglmserve:spec_decode_num_draft_tokens_total 140\n");
  // 60 accepted of 120 drafted; 100 decode tokens in 100 - 60 = 40 steps: 2.5 tokens per step.
  LevelMetrics m = compute_metrics(res, difference(before, after), {}, {});
  ASSERT_TRUE(m.accept_rate && m.accept_length);
  EXPECT_DOUBLE_EQ(*m.accept_rate, 0.5);
  EXPECT_DOUBLE_EQ(*m.accept_length, 2.5);
  EXPECT_EQ(m.accept_length_source, "estimate from output tokens");
  // With vLLM's drafts counter the length is 1 + accepted / drafts.
  before = parse_prometheus("vllm:spec_decode_num_accepted_tokens_total 0\nvllm:spec_decode_num_drafts_total 0\n"
                            "vllm:spec_decode_num_draft_tokens_total 0\n");
  after = parse_prometheus("vllm:spec_decode_num_accepted_tokens_total{engine=\"0\"} 60\n"
                           "vllm:spec_decode_num_drafts_total{engine=\"0\"} 40\n"
                           "vllm:spec_decode_num_draft_tokens_total{engine=\"0\"} 120\n");
  m = compute_metrics(res, difference(before, after), {}, {});
  ASSERT_TRUE(m.accept_length);
  EXPECT_DOUBLE_EQ(*m.accept_length, 2.5);
  EXPECT_EQ(m.accept_length_source, "drafts counter");
  // Without spec counters: nothing.
  m = compute_metrics(res, difference({}, parse_prometheus("glmserve:prompt_tokens_total 5\n")), {}, {});
  EXPECT_FALSE(m.accept_length);
}

TEST(Metrics, CostFormulas) {
  // The write-up: 8 x MI355X at $3.41/GPU-hour, 1400 W each, 2626 output tok/s.
  const CostFigures c = cost_figures({8, 3.41, 1400}, 2626, 2626 * 21, 1000.0 / 71);
  EXPECT_NEAR(*c.usd_per_million_output, 8 * 3.41 / 3600 / 2626 * 1e6, 1e-9);
  EXPECT_NEAR(*c.usd_per_million_output, 2.886, 0.001);
  EXPECT_NEAR(*c.output_tok_s_per_mw, 2626 / 0.0112, 1e-6);
  EXPECT_NEAR(c.output_tok_s_per_gpu, 328.25, 1e-9);
  EXPECT_NEAR(c.total_tok_s_per_gpu, 2626 * 21 / 8.0, 1e-9);
  EXPECT_NEAR(c.tok_s_per_user, 71, 1e-9);
  // $19,900 per month for 8 GPUs is $3.41 per GPU-hour (730 h months).
  EXPECT_NEAR(19900.0 / 8 / (365.0 * 24 / 12), 3.41, 0.01);
  const CostFigures none = cost_figures({1, 0, 0}, 100, 200, 0);
  EXPECT_FALSE(none.usd_per_million_output);
  EXPECT_FALSE(none.output_tok_s_per_mw);
  EXPECT_DOUBLE_EQ(none.tok_s_per_user, 0);
}

TEST(Parsing, SloAndCircuitBreakerSpecs) {
  const SloSpec s = parse_slo("ttft:2000,tpot:50");
  EXPECT_EQ(*s.ttft_ms, 2000);
  EXPECT_EQ(*s.tpot_ms, 50);
  EXPECT_FALSE(s.e2el_ms);
  EXPECT_TRUE(parse_slo("").empty());
  EXPECT_THROW(parse_slo("ttft=2000"), glms::Error);
  EXPECT_THROW(parse_slo("latency:5"), glms::Error);
  EXPECT_THROW(parse_slo("tpot:-1"), glms::Error);
  EXPECT_TRUE(parse_circuit_breaker("5:30").enabled());
  EXPECT_THROW(parse_circuit_breaker("5"), glms::Error);
  EXPECT_THROW(parse_circuit_breaker("0:3"), glms::Error);
  EXPECT_THROW(parse_circuit_breaker("2:x"), glms::Error);
}

TEST(Resilience, BackoffAndBreakerStates) {
  RetryPolicy p{5, 0.5, 3};
  EXPECT_DOUBLE_EQ(p.delay(1), 0.5);
  EXPECT_DOUBLE_EQ(p.delay(2), 1.0);
  EXPECT_DOUBLE_EQ(p.delay(3), 2.0);
  EXPECT_DOUBLE_EQ(p.delay(4), 3.0);  // capped
  CircuitBreaker b(3, 10);
  EXPECT_TRUE(b.allow(0));
  b.record(false, 0);
  b.record(false, 1);
  EXPECT_TRUE(b.allow(1.5));
  b.record(false, 2);  // third in a row: open until 12
  EXPECT_EQ(b.times_opened(), 1);
  EXPECT_FALSE(b.allow(5));
  EXPECT_TRUE(b.allow(12));   // half-open: one trial
  EXPECT_FALSE(b.allow(12));  // only one
  b.record(false, 13);        // trial failed: open again until 23
  EXPECT_EQ(b.times_opened(), 2);
  EXPECT_FALSE(b.allow(20));
  EXPECT_TRUE(b.allow(23));
  b.record(true, 24);  // closed
  EXPECT_TRUE(b.allow(24));
  EXPECT_TRUE(b.allow(24));
  CircuitBreaker off;
  for (int i = 0; i < 100; ++i) off.record(false, i);
  EXPECT_TRUE(off.allow(100));
}

TEST(Sse, SplitAnywhereAndLineEndings) {
  const std::string stream =
      ": keep-alive comment\r\n\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n"
      "event: x\ndata:{\"choices\":[{\"text\":\"b\"}]}\n\n"
      "data: line1\rdata: line2\r\r"
      "data: [DONE]\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseParser p;
    std::vector<std::string> ev;
    p.feed(std::string_view(stream).substr(0, cut), ev);
    p.feed(std::string_view(stream).substr(cut), ev);
    ASSERT_EQ(ev.size(), 4u) << "cut at " << cut;
    EXPECT_EQ(ev[0], "{\"choices\":[{\"text\":\"a\"}]}");
    EXPECT_EQ(ev[1], "{\"choices\":[{\"text\":\"b\"}]}");
    EXPECT_EQ(ev[2], "line1\nline2");
    EXPECT_EQ(ev[3], "[DONE]");
  }
  SseParser p;
  std::vector<std::string> ev;
  p.feed("data: tail", ev);
  EXPECT_TRUE(ev.empty());
  EXPECT_EQ(p.finish(), "tail");
}

TEST(Sse, InterpretCompletionChatUsageAndErrors) {
  StreamEvent e = interpret_event(R"({"choices":[{"index":0,"text":"hi","finish_reason":null}]})");
  EXPECT_TRUE(e.token);
  EXPECT_EQ(e.text, "hi");
  e = interpret_event(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})");
  EXPECT_FALSE(e.token);
  e = interpret_event(R"({"choices":[{"delta":{"reasoning_content":"think"}}]})");
  EXPECT_TRUE(e.token);
  e = interpret_event(R"({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}}]})");
  EXPECT_TRUE(e.token);
  e = interpret_event(
      R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}})");
  EXPECT_FALSE(e.token);
  EXPECT_TRUE(e.has_usage);
  EXPECT_EQ(e.prompt_tokens, 7);
  EXPECT_EQ(e.completion_tokens, 3);
  EXPECT_EQ(e.cached_tokens, 4);
  e = interpret_event(R"({"choices":[{"text":"x","finish_reason":"length"}],"usage":null})");
  EXPECT_FALSE(e.has_usage);
  EXPECT_EQ(e.finish_reason, "length");
  e = interpret_event(R"({"error":{"message":"boom","type":"server_error"}})");
  EXPECT_EQ(e.error, "boom");
  EXPECT_TRUE(interpret_event("[DONE]").done);
  EXPECT_TRUE(interpret_event("not json").malformed);
  // Counts no int holds are absent, not undefined conversions (found by fuzz/fuzz_sse).
  e = interpret_event(R"({"choices":[],"usage":{"prompt_tokens":9999999990.02,"completion_tokens":-3}})");
  EXPECT_EQ(e.prompt_tokens, 0);
  EXPECT_EQ(e.completion_tokens, 0);
}

TEST(Prometheus, SumsLabelSetsAndSkipsComments) {
  const MetricSums m = parse_prometheus(
      "# HELP glmserve:request_success_total Count\n# TYPE glmserve:request_success_total counter\n"
      "glmserve:request_success_total{model_name=\"t\",finished_reason=\"stop\"} 3\n"
      "glmserve:request_success_total{model_name=\"a}\\\"b\",finished_reason=\"length\"} 4 1700000000\n"
      "glmserve:kv_cache_usage_perc 0.25\r\n\nbroken line\n");
  EXPECT_DOUBLE_EQ(m.at("glmserve:request_success_total"), 7);
  EXPECT_DOUBLE_EQ(m.at("glmserve:kv_cache_usage_perc"), 0.25);
  EXPECT_FALSE(m.count("broken"));
  EXPECT_EQ(*first_of(m, {"vllm:kv_cache_usage_perc", "glmserve:kv_cache_usage_perc"}), 0.25);
}

namespace {
std::vector<LevelMetrics> sample_levels() {
  std::vector<LevelMetrics> v;
  for (int i = 0; i < 3; ++i) {
    LevelMetrics m;
    m.label = "rate " + std::to_string(i + 1);
    m.request_rate = i + 1;
    m.scheduled = m.completed = 10;
    m.output_throughput = 100 * (i + 1);
    m.total_throughput = 1000 * (i + 1);
    m.ttft_ms.median = 800 + 100 * i;
    m.ttft_ms.p95 = 2200 + 100 * i;
    m.tpot_ms.median = 10 * (i + 1);
    m.success_rate = 1;
    m.errors["HTTP 500: a \"quoted\", <odd> & message"] = 1;
    m.cost = cost_figures({8, 3.41, 1400}, m.output_throughput, m.total_throughput, m.tpot_ms.median);
    v.push_back(m);
  }
  LevelMetrics c = v[0];
  c.label = "concurrency 4";
  c.request_rate = std::numeric_limits<double>::infinity();
  c.max_concurrency = 4;
  v.push_back(c);
  return v;
}
}  // namespace

TEST(Report, TablesHaveTheWriteUpColumns) {
  const auto levels = sample_levels();
  const std::string t = rate_table({levels[0], levels[1], levels[2]});
  EXPECT_NE(t.find("| Offered RPS | Sustained req/s | Aggregate tok/s | TTFT p50 / p95"), std::string::npos) << t;
  EXPECT_NE(t.find("0.80 s / 2.20 s"), std::string::npos) << t;
  EXPECT_NE(t.find("100%"), std::string::npos);
  const std::string s = sweep_table({levels[3]});
  EXPECT_NE(s.find("tok/s/GPU"), std::string::npos);
  EXPECT_NE(s.find("tok/s/user"), std::string::npos);
  const std::string d = detail_block(levels[0], parse_slo("ttft:2000"));
  for (const char* label : {"Successful requests:", "Request throughput (req/s):", "Request goodput (req/s):",
                            "Output token throughput (tok/s):", "Total Token throughput (tok/s):", "Median TTFT (ms):",
                            "P99 TPOT (ms):", "Mean ITL (ms):", "P95 E2EL (ms):", "Errors"})
    EXPECT_NE(d.find(label), std::string::npos) << label;
  EXPECT_NE(cost_table(levels, {8, 3.41, 1400}).find("$/M output tok"), std::string::npos);
  EXPECT_TRUE(cost_table(levels, {1, 0, 0}).empty());
}

TEST(Report, SvgCsvAndJsonAreWellFormed) {
  const auto levels = sample_levels();
  std::string why;
  for (const std::string& svg : {throughput_interactivity_svg(levels), ttft_svg(levels, true), ttft_svg(levels, false),
                                 ttft_svg({}, true)}) {
    EXPECT_TRUE(well_formed_xml(svg, why)) << why << "\n" << svg;
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  }
  Chart c;
  c.title = "a < b & \"c\"";
  c.series.push_back({"s<1>", {{1, 2, "x&y"}, {NAN, 3, ""}, {2, 5, ""}}});
  EXPECT_TRUE(well_formed_xml(render_svg(c), why)) << why;
  EXPECT_DOUBLE_EQ(nice_step(10, 5), 2);
  EXPECT_DOUBLE_EQ(nice_step(0.7, 5), 0.2);
  EXPECT_DOUBLE_EQ(nice_step(2626, 5), 1000);

  const auto rows = lines(levels_csv(levels));
  ASSERT_EQ(rows.size(), levels.size() + 1);
  for (const auto& r : rows) EXPECT_EQ(csv_columns(r), csv_columns(rows[0])) << r;
  EXPECT_EQ(csv_field("a,\"b\""), "\"a,\"\"b\"\"\"");

  LevelResult res;
  RequestRecord r1 = ok_record(0, 0.1, 0.5, 5);
  RequestRecord r2;
  r2.error = "connect: refused, \"really\"";
  res.records = {r1, r2};
  const auto req_rows = lines(requests_csv({{"rate 1", &res}}));
  ASSERT_EQ(req_rows.size(), 3u);
  for (const auto& r : req_rows) EXPECT_EQ(csv_columns(r), csv_columns(req_rows[0])) << r;

  nlohmann::json j = nlohmann::json::parse(level_json(levels[3]).dump());
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_TRUE(j.contains("p99_ttft_ms"));
  EXPECT_TRUE(j["usd_per_million_output_tokens"].is_number());
}
